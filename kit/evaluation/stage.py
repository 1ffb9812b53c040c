"""The evaluation steps of a training job: `open_run` at start, `before` the first step, `after` the last.

Rank 0 does all of it (reads and writes the store, measures on the unwrapped model); `kit.train.job`
broadcasts the outcome so every rank raises the same one-line error or carries on together.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kit import files
from kit.evaluation import heldout, identity, preference, results, rewards


def open_run(cfg, store) -> dict:
    """The job's run record ({run_id, created, base_revision?}); a new one on the job's first start.

    Nothing is written here: a start refused for bad data must leave output_dir as it was. The
    record is saved by `bind_base`, once the model and data have loaded.
    """
    local = Path(cfg.output_dir) / identity.RUN_LOCAL
    record = identity.parse_record(store.read_text(identity.RUN_RECORD)) if store is not None else None
    if record is None and local.exists():
        record = identity.parse_record(local.read_text())
    return record or {"run_id": identity.new_run_id(), "created": time.time(), "model": cfg.model}


def save_run(record: dict, cfg, store, *, to_store: bool = True) -> None:
    text = json.dumps(record, indent=1)
    files.write_atomic(Path(cfg.output_dir) / identity.RUN_LOCAL, text, mkdir=True)
    if store is not None and to_store:
        store.write_text(identity.RUN_RECORD, text)


def bind_base(run: dict, cfg, model, store, force: bool) -> list[str]:
    """Tie the run to the base weights just loaded; refuse another revision unless forced."""
    current = identity.base_revision(cfg.model, getattr(model, "config", None))
    warning = identity.check_same_base(run.get("base_revision"), current, f"run {run['run_id']}", force)
    changed = run.get("base_revision") != current
    if changed and warning:
        run.setdefault("forced_base_revisions", []).append(current)
    elif changed:
        run["base_revision"] = current
    save_run(run, cfg, store, to_store=changed)  # the store is written only when the record changes
    return [warning] if warning else []


def _skip_reason(cfg, dataset, which: str) -> str | None:
    # Set by the job for plans where rank 0 alone cannot run the model (FSDP shards it over all ranks).
    if getattr(cfg, "eval_skip_reason", None):
        return cfg.eval_skip_reason
    if not getattr(cfg.eval, which):
        return f"eval.{which} is false"
    if dataset.eval is None or len(dataset.eval) == 0:
        if cfg.data.eval_fraction == 0:
            return "no held-out data (data.eval_fraction is 0)"
        return "no held-out data (too few rows to split off an eval set)"
    return None


def measure(cfg, model, tokenizer, dataset, batch_size: int, which: str, reference: dict | None = None, *,
            reward_funcs=None) -> dict:
    """One evaluation record: {data_format, rows, skipped | result}, the same rows every time.

    `reference`: the baseline record, for preference data (its log-probabilities are the reference
    where the model has no adapter to disable). `reward_funcs`: the job's reward functions, for
    prompt data (trainer grpo)."""
    preferences = dataset.format in preference.FORMATS
    prompts = dataset.format in rewards.FORMATS
    # A metric the data cannot have: UsageError
    metric, why = (None, None) if preferences or prompts else heldout.metric_plan(cfg.eval, dataset.format)
    record = {"data_format": dataset.format, "when": time.time(), "skipped": _skip_reason(cfg, dataset, which),
              "result": None}
    if not record["skipped"] and prompts and not reward_funcs:
        record["skipped"] = "no reward functions were given to the evaluation"
    if record["skipped"]:
        return record
    idx = heldout.choose_rows(len(dataset.eval), cfg.eval.subset, cfg.seed)
    rows = dataset.eval.select(idx)[:]
    record["rows"] = idx
    try:
        if preferences:
            record["result"] = preference.measure(model, tokenizer, rows, cfg, batch_size, reference,
                                                  starting=which == "baseline")
        elif prompts:
            record["result"] = rewards.measure(model, tokenizer, rows, idx, reward_funcs, cfg, batch_size)
        else:
            record["result"] = heldout.measure(model, tokenizer, rows, metric=metric, skip_reason=why,
                                               eval_cfg=cfg.eval, batch_size=batch_size)
    except rewards.RewardFailed as e:  # the user's reward function, named: the job is kept, as below
        record["skipped"] = str(e)
    except (RuntimeError, ValueError) as e:  # CUDA out of memory, a backend that cannot generate: say so,
        # and keep the job: its checkpoints and final/ matter more than one measurement.
        record["skipped"] = f"the evaluation failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return record


def before(run: dict, cfg, model, tokenizer, dataset, store, batch_size: int, force: bool, *,
           reward_funcs=None) -> tuple[dict, list[str]]:
    """The job's baseline: the one kept from an earlier session, or measured now and kept."""
    if dataset.format not in preference.FORMATS + rewards.FORMATS:
        heldout.metric_plan(cfg.eval, dataset.format)
    notes = bind_base(run, cfg, model, store, force)
    found, where = results.read_baseline(cfg.output_dir, store)
    if found is not None and found.get("run_id") == run["run_id"]:
        notes.append(f"baseline: kept from {where} ({results.words(found)})")
        return found, notes
    record = {"run_id": run["run_id"], "step": 0,
              **measure(cfg, model, tokenizer, dataset, batch_size, "baseline", reward_funcs=reward_funcs)}
    notes += results.write_baseline(record, cfg.output_dir, store)
    notes.append(f"baseline: {results.words(record)}" +
                 (f" in {record['result']['seconds']:.1f} s" if record.get("result") else ""))
    return record, notes


def after(run: dict, baseline: dict | None, cfg, model, tokenizer, dataset, batch_size: int, step: int, *,
          reward_funcs=None) -> dict:
    """eval_results.json's content: the final evaluation beside the baseline."""
    final = {"run_id": run["run_id"], "step": step,
             **measure(cfg, model, tokenizer, dataset, batch_size, "final", reference=baseline,
                       reward_funcs=reward_funcs)}
    return results.eval_results(cfg, run, baseline, final, step)

