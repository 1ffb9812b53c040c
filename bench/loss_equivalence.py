"""Same weights, seed and data: does a speed-up change the loss curve? (issue #17's loss check)

    python bench/loss_equivalence.py --out bench/results/loss_equivalence_h200.json

Qwen3-8B shape (random weights, bench/gpu_common.py), QLoRA nf4, LoRA r16 all-linear (dropout 0),
seq_len 2048, micro-batch 4, gradient checkpointing, lr 1e-4, seed 42, one GPU, through the script
`kit render` writes; one epoch over --rows synthetic chat rows with LMSYS-Chat-1M's lengths
(bench/chat_lengths.py), loss on the assistant turns only: --rows / 4 optimizer steps. Each
configuration is a fresh process; padded and padding-free batches hold the same rows at every step
(same sampler, same seed), so every pair below is compared step by step:

  padded            vs padded + liger         Liger's Triton kernels (RMSNorm, SwiGLU, RoPE)
  padded            vs padding_free           rows laid end to end, block-diagonal mask
  padding_free      vs padding_free + liger   what `kernels: auto` would add to today's auto plan
  padded            vs padded (rerun)         the noise floor: the same run twice

Losses are the full-precision values of the Trainer's log_history (the last checkpoint's
trainer_state.json), not the rounded log lines. Tolerance, fixed before the run: a speed-up
"matches" when the mean relative difference over all steps is at most 1 % and no step differs by more
than 3 %, or when it differs from its reference no more than the rerun does (bf16 matmuls and
atomically-accumulated gradients are not bit-reproducible, and random-weight training amplifies
tiny differences on its steep early descent). Random weights: the values mean nothing, the curves'
agreement does.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import chat_lengths  # noqa: E402
from bench.gpu_common import (GIB, TOKENIZER, common_overrides, make_random_model, package_version,  # noqa: E402
                              render, session_record)
from bench.throughput import run  # noqa: E402

SEQ, BATCH = 2048, 4
CONFIGS = {
    "padded": ["batching=padded", "kernels=none"],
    "padded_liger": ["batching=padded", "kernels=liger"],
    "padding_free": ["batching=padding_free", "kernels=none"],
    "padding_free_liger": ["batching=padding_free", "kernels=liger"],
    "padded_rerun": ["batching=padded", "kernels=none"],
}
PAIRS = [("padded", "padded_liger"), ("padded", "padding_free"), ("padding_free", "padding_free_liger"),
         ("padded", "padded_rerun")]
MEAN_TOL, MAX_TOL = 0.01, 0.03


def history(out: Path) -> tuple[list[float], list[float]]:
    """Per-step training loss and grad norm from the last checkpoint's trainer_state.json."""
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    logs = json.loads((last / "trainer_state.json").read_text())["log_history"]
    steps = [e for e in logs if "loss" in e]
    return [float(e["loss"]) for e in steps], [float(e.get("grad_norm", "nan")) for e in steps]


def compare(ref: list[float], other: list[float]) -> dict:
    n = min(len(ref), len(other))
    rel = [abs(a - b) / abs(a) for a, b in zip(ref[:n], other[:n])]
    worst = max(range(n), key=rel.__getitem__)
    return {"steps": n, "max_rel_diff": round(max(rel), 5), "max_rel_diff_at_step": worst + 1,
            "mean_rel_diff": round(statistics.mean(rel), 5),
            "final_loss": [round(ref[n - 1], 4), round(other[n - 1], 4)],
            "first_10_rel_diff": [round(r, 5) for r in rel[:10]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--rows", type=int, default=192, help="rows in the epoch (steps = rows / 4)")
    p.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    p.add_argument("--timeout", type=float, default=200)
    p.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--out", required=True)
    p.add_argument("--dry-run", action="store_true", help="on the CPU: the tiny model, fp32 LoRA, no Liger")
    a = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    seq = 1024 if a.dry_run else SEQ
    work = Path(tempfile.mkdtemp(prefix="kit-loss-"))
    model = TOKENIZER if a.dry_run else make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b")
    data = chat_lengths.write(Path(a.models) / f"chat-{a.rows}.jsonl", a.rows, AutoTokenizer.from_pretrained(TOKENIZER))
    base = common_overrides(model, data, work / "x", method="qlora", seq=seq, batch=BATCH, gc=True, steps=1)
    base = [o for o in base if not o.startswith(("max_steps=", "data.format=", "save_steps="))] + [
        "max_steps=null", "epochs=1", "data.format=messages", "save_steps=100000", "lora.dropout=0.0",
        "seed=42", "optimizer=adamw_torch"]
    if a.dry_run:
        base = [o for o in base if o not in ("method=qlora", "precision=bf16", "gradient_checkpointing=on")] + [
            "method=lora", "precision=fp32", "gradient_checkpointing=off"]
    names = a.only.split(",") if a.only else list(CONFIGS)
    if a.dry_run:
        names = [n for n in names if "liger" not in n]
    result = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "data_source": chat_lengths.SOURCE,
              "rows": a.rows, "seq_len": seq, "micro_batch": BATCH,
              "tolerance": {"mean_rel_diff": MEAN_TOL, "max_rel_diff": MAX_TOL,
                            "or": "within the padded-vs-rerun noise floor"},
              "machine": platform.node(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "versions": {m: package_version(m) for m in ("torch", "transformers", "trl", "peft", "bitsandbytes", "liger_kernel")},
              "runs": {}, "pairs": {}, "skipped": []}
    started = time.monotonic()
    for name in names:
        if a.budget_s and time.monotonic() - started > a.budget_s:
            result["skipped"].append(f"{name}: past --budget-s {a.budget_s:.0f}")
            continue
        out = work / name
        over = [o if not o.startswith("output_dir=") else f"output_dir={out}" for o in base] + CONFIGS[name]
        script = work / f"{name}.py"
        plan = render(over, script, gpus="cpu" if a.dry_run else "1xH200")
        try:
            run([sys.executable, str(script)], work / f"{name}.log", a.timeout)
        except SystemExit as e:  # a kernel that does not load is a result too
            result["runs"][name] = {"error": str(e)[-1500:]}
            _write(a, result)
            continue
        losses, norms = history(out)
        rec = session_record(out)
        result["runs"][name] = {"overrides": CONFIGS[name], "plan": {k: plan.get(k) for k in ("batching", "kernels")},
                                "steps": len(losses), "step_s_median": rec.get("step_s"),
                                "total_step_s": rec.get("total_step_s"),
                                "peak_allocated_gib": round(rec.get("peak_allocated_bytes", 0) / GIB, 2),
                                "losses": [round(x, 5) for x in losses], "grad_norms": [round(x, 4) for x in norms]}
        print(f"[bench] {name}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"{time.monotonic() - started:.0f} s in", flush=True)
        _pairs(result)
        _write(a, result)
    _pairs(result)
    _write(a, result)
    print(json.dumps(result["pairs"], indent=1))
    return 0


def _pairs(result: dict) -> None:
    runs = {k: v for k, v in result["runs"].items() if "losses" in v}
    floor = (compare(runs["padded"]["losses"], runs["padded_rerun"]["losses"])
             if {"padded", "padded_rerun"} <= runs.keys() else None)
    for ref, other in PAIRS:
        if ref in runs and other in runs:
            c = compare(runs[ref]["losses"], runs[other]["losses"])
            c["grad_norm"] = compare(runs[ref]["grad_norms"], runs[other]["grad_norms"])
            within = c["mean_rel_diff"] <= MEAN_TOL and c["max_rel_diff"] <= MAX_TOL
            if floor and other != "padded_rerun":
                within = within or (c["mean_rel_diff"] <= floor["mean_rel_diff"] and
                                    c["max_rel_diff"] <= floor["max_rel_diff"])
            c["within_tolerance"] = within
            result["pairs"][f"{other}_vs_{ref}"] = c


def _write(a, result: dict) -> None:
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
