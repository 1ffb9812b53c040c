"""Training: the job around `trainer.train()`, model loading, data, callbacks, smoke checks, the deadline, distributed setup."""

import warnings

# transformers 5.2x renamed gradient_checkpointing to activation_checkpointing; the old names
# still work and are the only ones older 5.x releases (e.g. 5.17) know, so kit keeps them.
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
