"""The end of a finished job (rank 0): final evaluation, `final/`, its push, and the closing lines.

    [kit] eval loss 5.91 → 1.02, perplexity 369 → 2.77; exact match 0 % → 12 % (on 42 held-out rows)
    [kit] final: outputs/default/final (adapter, tokenizer, config, eval results, samples, model card)
    [kit] pushed: https://huggingface.co/me/ha-ckpts/tree/main/final
    [kit] export: python -m kit export --adapter outputs/default/final -o outputs/default/merged

A final push that fails leaves `final/` complete locally and exits 4; running the same command
again finds the job complete and pushes it then.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kit.deliver.final import FINAL_DIR, write_final
from kit.machine.command import launch_command, shell_word
from kit.errors import EXIT_STORE, StoreError
from kit.evaluation import stage
from kit.evaluation.results import change_line
from kit.files import parse_json


def rerun_command(world_size: int) -> str:
    script, *args = sys.argv
    return " ".join([launch_command(world_size, script=script), *map(shell_word, args)])


def _facts(job, sessions: list[dict]) -> dict:
    cuda = job.ctx.device.type == "cuda"
    hardware = f"{job.ctx.world_size} × {job.ctx.device.type}"
    if cuda:
        import torch

        hardware = f"{job.ctx.world_size} × {torch.cuda.get_device_name(job.ctx.device)}"
    hours = sum(max(0.0, (s.get("ended") or 0) - (s.get("started") or 0)) * (s.get("world_size") or 1)
                for s in sessions) / 3600 if cuda else 0.0
    plan = (f"{job.plan.precision}, batch {job.plan.per_device_batch} × accumulation {job.plan.grad_accum} × "
            f"{job.ctx.world_size} = {job.plan.global_batch}")
    store = job.store.describe() if job.store is not None else None
    return {"plan": plan, "hardware": hardware, "sessions": len(sessions) + 1, "gpu_hours": hours,
            "command": rerun_command(job.ctx.world_size),
            "export_command": export_command(job.cfg) if job.cfg.method != "full" else None,
            "hub_repo": store[5:] if store and store.startswith("hf://") else None}


def export_command(cfg) -> str:
    out = Path(cfg.output_dir)  # quoted: a user pastes it, and output_dir may hold a space, a `$(…)` or a leading -
    return (f"python -m kit export --adapter {shell_word(out / FINAL_DIR, path=True)} "
            f"-o {shell_word(out / 'merged', path=True)}")


def _sessions(job) -> list[dict]:
    """This job's usable session records (a torn or hand-edited line is skipped with a warning, so the
    finished job's model card is still written)."""
    from kit.checkpoints import session_records

    return session_records.read(Path(job.cfg.output_dir) / session_records.LOCAL)


def deliver(job, trainer, step: int) -> tuple[int, list[str], dict]:
    """Final evaluation, final/, push. Returns (exit code, lines to print, what to record)."""
    tokenizer, dataset = job.eval_inputs
    results = stage.after(job.run, job.baseline, job.cfg, trainer.model, tokenizer, dataset,
                          job.plan.per_device_batch, step, reward_funcs=getattr(job, "reward_funcs", None))
    sharded = getattr(job.plan, "strategy", "ddp") == "fsdp" and job.ctx.world_size > 1
    adapter_from = Path(job.cfg.output_dir) / f"checkpoint-{step}" if sharded else None
    final, kept = write_final(job.cfg, trainer.model, tokenizer, results, job.run, _facts(job, _sessions(job)),
                              adapter_from=adapter_from)
    full = job.cfg.method == "full"
    lines = [change_line(results),
             f"final: {final} ({'model weights' if full else 'adapter'}, tokenizer, config, eval results, samples, "
             "model card)"]
    if kept is not None:
        lines.append(kept_words(final, kept, step))
    code, record = push(job, final, lines)
    if full:  # nothing to merge: `kit export` takes adapters
        lines.append(f"use: AutoModelForCausalLM.from_pretrained({str(final)!r}) loads it as it is; GGUF: llama.cpp's "
                     "convert_hf_to_gguf.py on that folder")
    else:
        lines.append(f"export: {export_command(job.cfg)}   (16-bit weights for transformers; --gguf with llama.cpp)")
    record["primary_metric"] = results["primary_metric"]
    return code, lines, record


def push(job, final: Path, lines: list[str]) -> tuple[int, dict]:
    if job.store is None:
        return 0, {"final": str(final)}
    try:
        where, kept = job.store.publish_final(final)
    except StoreError as e:
        lines.append(f"error: final/ was not pushed to {job.store.describe()}: {e}; it is complete in {final} — "
                     "fix that and run the same command again to push it")
        return EXIT_STORE, {"final": str(final), "final_push": f"failed: {e}"}
    lines.append(f"pushed: {where}")
    if kept is not None:
        lines.append(f"the store's earlier final/ was of another step: it is kept there as {kept}/")
    return 0, {"final": str(final), "final_push": where}


def kept_words(final: Path, kept: Path, step: int) -> str:
    """The line for a final/ of an earlier target kept aside (kit.deliver.final.write_final)."""
    return (f"the earlier {final.name}/ was of another step than this job's {step}: it is kept as {kept} "
            "(delete it when you no longer need it)")


def push_if_missing(job, step: int) -> tuple[int, list[str]]:
    """On a job found complete: push a local final/ of that step the store does not hold yet."""
    final = Path(job.cfg.output_dir) / FINAL_DIR
    if job.store is None or not (final / "eval_results.json").is_file():
        return 0, []
    try:
        local = parse_json((final / "eval_results.json").read_bytes())
    except (OSError, ValueError):  # damaged: nothing known to push (the next final evaluation rewrites it)
        return 0, [f"note: {final / 'eval_results.json'} is unreadable; its final/ is not pushed"]
    local_step = local.get("step") if isinstance(local, dict) else None
    if local_step != step or job.store.final_step() == step:
        return 0, []
    lines: list[str] = []
    code, _ = push(job, final, lines)
    return code, lines
