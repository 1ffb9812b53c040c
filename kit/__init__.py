"""kit: fine-tune LLMs on free and cheap notebook GPUs, and survive the session cutoff.

`%run kit bootstrap` looks at the machine (without starting CUDA), plans, writes `train_ddp.py`
and prints the command to run next. See README.md.
"""

import os as _os
import warnings as _warnings

# transformers 5.2x renamed gradient_checkpointing to activation_checkpointing; the old names still
# work and are the only ones older 5.x releases (e.g. 5.17) know, so kit (and TRL) keep them. Here,
# not in one stage, because training and `kit export` both load models.
_warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)

__version__ = "0.1.0"

# The checkout kit runs from: the folder that holds kit/, models/tiny-qwen3 and data/.
CHECKOUT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
