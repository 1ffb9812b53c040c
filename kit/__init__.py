"""kit: fine-tune LLMs on free and cheap notebook GPUs, and survive the session cutoff.

`%run kit bootstrap` looks at the machine (without starting CUDA), plans, writes `train_ddp.py`
and prints the command to run next. See README.md.
"""

__version__ = "0.1.0"
