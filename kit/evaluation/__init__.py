"""The evaluation that makes a fine-tune worth having: the starting model first, the trained one last.

- `heldout`: what is measured on the held-out rows (loss, perplexity, exact match, samples).
- `identity`: the run id and the base model's exact revision the adapter is tied to.
- `results`: where results live (local output_dir and the store), eval_results.json, samples.md.
- `stage`: what the training job calls, before the first step and after the last (rank 0 measures).
"""
