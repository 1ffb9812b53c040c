"""The deliverable of a finished job: `output_dir/final/`, and its copy in the store.

`final/` holds the adapter (or the full model), the tokenizer, the config (kit_config.yaml), the
run record (kit_run.json), eval_results.json, samples.md and the model card (README.md). It is
written into a temp folder and renamed, so a cut never leaves half a `final/`. The checkpoints
stay where they are. With a store, `final/` is published in one step (the Hub: one commit that
also puts the card at the repo's root, where the Hub shows it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kit.redaction import redact
from kit.errors import StoreError
from kit.files import free_bytes, is_disk_full, size_words
from kit.checkpoints.store.layout import final_step_of, kept_final_name
from kit.planning import config
from kit.deliver import card
from kit.evaluation import identity
from kit.evaluation.results import samples_markdown

FINAL_DIR = "final"
FILES = ("README.md", "eval_results.json", "samples.md", "kit_config.yaml", identity.RUN_LOCAL)


def write_final(cfg, model, tokenizer, results: dict, run: dict, facts: dict,
                adapter_from: Path | None = None) -> tuple[Path, Path | None]:
    """Write `output_dir/final/`; returns its path, and where an earlier final/ of another step now is.

    An earlier final/ of the same step is replaced, once the new one is complete. One of another step
    (the job re-targeted: `max_steps=3` after a step-4 final/) is another deliverable: it is kept
    beside it as `final-step-4/` (`kept_final_name`), never replaced.

    `adapter_from`: a checkpoint folder whose (already gathered, plain PEFT) adapter files are copied
    instead of saving `model` — an FSDP-sharded model cannot be saved by rank 0 alone.
    """
    out = Path(cfg.output_dir) / FINAL_DIR
    tmp = out.with_name(f".{FINAL_DIR}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        if adapter_from is not None:
            for name in ("adapter_model.safetensors", "adapter_config.json"):
                shutil.copy2(Path(adapter_from) / name, tmp / name)
        else:
            model.save_pretrained(tmp)  # a PeftModel writes the adapter only: adapter_model.safetensors + config
        tokenizer.save_pretrained(tmp)
        # Sampled answers quote the data, which may hold a token (a pasted log): written as ***.
        texts = {"kit_config.yaml": config.dump_yaml(cfg), identity.RUN_LOCAL: json.dumps(run, indent=1),
                 "eval_results.json": json.dumps(results, indent=1), "samples.md": samples_markdown(results),
                 "README.md": card.render(cfg, run, results, {**facts, "final_dir": str(out)})}
        for name, text in texts.items():
            (tmp / name).write_text(redact(text))
        old, kept = out.with_name(f".{FINAL_DIR}.old-{os.getpid()}"), None
        earlier = final_step_of(out)
        if out.exists() and earlier != results.get("step"):
            kept = out.with_name(kept_final_name(earlier, set(os.listdir(out.parent))))
            os.rename(out, kept)
        elif out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except Exception as e:  # safetensors' and torch's errors wrap the OSError of a full disk
        if not is_disk_full(e, out.parent):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise StoreError(f"the disk of {out.parent} is full ({size_words(free_bytes(out.parent))} free) while writing "
                         f"{FINAL_DIR}/: none of it was kept, the checkpoints are: free some space and run the same "
                         f"command (it writes {FINAL_DIR}/ without training again)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, kept
