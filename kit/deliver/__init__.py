"""What a finished job hands over.

- `final`: `output_dir/final/` (adapter, tokenizer, config, eval results, samples, model card).
- `card`: the model card with the Hub's YAML metadata.
- `wrapup`: the end of a job: final evaluation, final/, its push, the closing lines.
- `export`: `kit export`, the adapter merged into 16-bit weights and checked; `gguf` via llama.cpp.
"""
