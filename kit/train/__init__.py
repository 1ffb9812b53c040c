"""Training: the job around `trainer.train()`, model loading, data, callbacks, smoke checks, the deadline, distributed setup."""
