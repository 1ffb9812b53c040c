"""The generated script: `train_ddp.py` rendered from its template."""
