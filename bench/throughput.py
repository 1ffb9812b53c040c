"""Training speed of the script kit generates against the scripts people write by hand.

    python bench/throughput.py --models /tmp/kit-models [--unsloth] --out bench/results/throughput_h200.json

Qwen3-8B shape (random weights; --model names another of kit's table), QLoRA nf4, LoRA r16 on all
linear layers, seq 2048 × batch 4, gradient checkpointing, bf16, one GPU; every row fills seq_len,
so tokens/step = 8,192 for all.
Runs one after another, alone on the GPU:
  1. bench/reference_trainer.py: transformers Trainer + PEFT + prepare_model_for_kbit_training
  2. the same without prepare_model_for_kbit_training (where kit's first gain comes from)
  3. kit: `kit render` for one H200, backend=transformers
  with --unsloth, also:
  4. bench/reference_unsloth.py: Unsloth driven directly
  5. kit with backend=unsloth
Targets: 3 ≥ 1.2 × 1; 5 ≥ 0.95 × 4.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import (GIB, ROOT, common_overrides, make_long_text, make_random_model,  # noqa: E402
                              render, session_record, start, tail)

SEQ, BATCH = 2048, 4


def run(argv: list[str], log: Path, timeout: float) -> None:
    started = time.monotonic()
    proc = start(argv, log)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"{' '.join(argv)} ran over {timeout:.0f} s:\n{tail(log)}") from None
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{tail(log)}")
    print(f"[bench] {log.stem}: {time.monotonic() - started:.0f} s", flush=True)


def row(name: str, r: dict) -> dict:
    return {"name": name, "tokens_per_s": r["tokens_per_s"], "step_s": r["step_s"], "steps_timed": r["steps_timed"],
            "peak_allocated_gib": round(r["peak_allocated_bytes"] / GIB, 2),
            "peak_reserved_gib": round(r["peak_reserved_bytes"] / GIB, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--model", default="Qwen/Qwen3-8B", help="the architecture (kit's table), random weights")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--unsloth", action="store_true", help="also Unsloth directly and kit's Unsloth backend")
    p.add_argument("--only-unsloth", action="store_true", help="only rows 4 and 5")
    p.add_argument("--only-kit", action="store_true",
                   help="only kit's rows (3, and 5 with --unsloth), against the reference rows of --baseline")
    p.add_argument("--kit-backends", default="transformers,unsloth",
                   help="with --only-kit: which of kit's rows, in this order (unsloth only with --unsloth)")
    p.add_argument("--baseline", default=str(ROOT / "bench" / "results" / "throughput_h200.json"),
                   help="with --only-kit: the earlier run whose reference rows the ratios use")
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "throughput_h200.json"))
    a = p.parse_args()

    import torch

    work = Path(tempfile.mkdtemp(prefix="kit-speed-"))
    model = make_random_model(a.model, Path(a.models) / a.model.split("/")[-1].lower())
    data = make_long_text(Path(a.models) / "long.jsonl")
    ref = [sys.executable, str(ROOT / "bench" / "reference_trainer.py"), "--model", str(model), "--data", str(data),
           "--seq-len", str(SEQ), "--batch", str(BATCH), "--steps", str(a.steps)]
    rows = []

    def kit_row(name: str, backend: str) -> None:
        out = work / name
        overrides = common_overrides(model, data, out, method="qlora", seq=SEQ, batch=BATCH, gc=True, steps=a.steps)
        script = work / f"{name}.py"
        render(overrides + [f"backend={backend}"], script)
        run([sys.executable, str(script)], work / f"{name}.log", a.timeout)
        rows.append(row(name, session_record(out)))
        print(f"[bench] {rows[-1]}", flush=True)

    def script_row(name: str, argv: list[str]) -> None:
        result = work / f"{name}.json"
        run(argv + ["--out", str(result)], work / f"{name}.log", a.timeout)
        rows.append(row(name, json.loads(result.read_text())))
        print(f"[bench] {rows[-1]}", flush=True)

    if a.only_kit:
        for backend in a.kit_backends.split(","):
            if backend == "transformers" or a.unsloth:
                kit_row(f"kit_{backend}", backend)
    if not a.only_unsloth and not a.only_kit:
        script_row("reference_trainer_kbit_prep", ref)
        script_row("reference_trainer_no_kbit_prep", ref + ["--no-kbit-prep"])
        kit_row("kit_transformers", "transformers")
    if (a.unsloth or a.only_unsloth) and not a.only_kit:
        script_row("reference_unsloth", [sys.executable, str(ROOT / "bench" / "reference_unsloth.py"), "--model",
                                         str(model), "--data", str(data), "--seq-len", str(SEQ), "--batch", str(BATCH),
                                         "--steps", str(a.steps)])
        kit_row("kit_unsloth", "unsloth")

    by = {r["name"]: r["tokens_per_s"] for r in rows}
    if a.only_kit:  # the references were measured before, on the same GPU and stack
        earlier = {r["name"]: r for r in json.loads(Path(a.baseline).read_text())["rows"]}
        by = {**{n: r["tokens_per_s"] for n, r in earlier.items() if n.startswith("reference")}, **by}
        for r in rows:
            before = earlier.get(r["name"])
            if before:
                r["before"] = {"tokens_per_s": before["tokens_per_s"], "peak_allocated_gib": before["peak_allocated_gib"]}
                r["tokens_per_s_vs_before"] = round(r["tokens_per_s"] / before["tokens_per_s"], 3)
    ratios = {}
    if "kit_transformers" in by:
        ratios["kit_transformers_vs_reference"] = round(by["kit_transformers"] / by["reference_trainer_kbit_prep"], 3)
        ratios["kit_transformers_vs_reference_no_kbit_prep"] = round(
            by["kit_transformers"] / by["reference_trainer_no_kbit_prep"], 3)
    if "kit_unsloth" in by:
        ratios["kit_unsloth_vs_unsloth_direct"] = round(by["kit_unsloth"] / by["reference_unsloth"], 3)
    result = {
        "what": f"tokens/s (median step after 2 warm-up steps of {a.steps}) and peak memory, {a.model} shape with "
                f"random weights, QLoRA nf4, LoRA r16 all-linear, seq {SEQ} x batch {BATCH}, gradient checkpointing, "
                "bf16, one GPU, each run alone",
        "machine": platform.node(), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "versions": {m: __import__(m).__version__ for m in ("transformers", "trl", "peft", "bitsandbytes")},
        "targets": {"kit_transformers_vs_reference": 1.2, "kit_unsloth_vs_unsloth_direct": 0.95},
        "rows": rows, "ratios": ratios,
    }
    out = Path(a.out)
    if out.exists() and a.only_unsloth:  # keep the transformers rows of an earlier run
        earlier = json.loads(out.read_text())
        result["rows"] = [r for r in earlier["rows"] if r["name"] not in by] + rows
        result["ratios"] = {**earlier.get("ratios", {}), **ratios}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for r in result["rows"]:
        print(f"[bench] {r['name']:<32} {r['tokens_per_s']:>9,.0f} tokens/s  {r['peak_allocated_gib']:6.2f} GiB")
    print(f"[bench] {result['ratios']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
