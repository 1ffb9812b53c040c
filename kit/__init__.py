"""kit: fine-tune LLMs on free and cheap notebook GPUs, and survive the session cutoff.

`%run kit bootstrap` looks at the machine (without starting CUDA), plans, writes `train_ddp.py`
and prints the command to run next. See README.md.
"""

import os as _os

__version__ = "0.1.0"

# The checkout kit runs from: the folder that holds kit/, models/tiny-qwen3 and data/.
CHECKOUT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
