"""Notebooks: `kit convert` and the scheduled resumes (papermill here, or Kaggle)."""
