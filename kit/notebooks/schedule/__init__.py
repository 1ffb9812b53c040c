"""Scheduling a job across sessions: where each session runs (papermill here, or a Kaggle
kernel), when to start another one, and when to stop (`stops`)."""
