"""FSDP with QLoRA at world size 1 on one GPU: the 4-bit FSDP path loads, trains, saves, resumes.

    python bench/fsdp_qlora_gpu.py --models /tmp/kit-models --out $OUT/fsdp_qlora_h200.json

The script kit renders with strategy=fsdp (FSDP2 through Trainer/accelerate, bnb_4bit_quant_storage
= the compute dtype), run under torchrun with one process, for a Qwen3 shape with random weights:
  1. bf16: --steps steps, a checkpoint every --steps/2, then the same command with more steps must
     resume from the last checkpoint (its "resuming from step" line) and finish;
  2. fp16 (the T4's precision, on the H200): a few steps, to see the fp16 quant-storage path train.
Peak memory (max_memory_allocated of the training steps, from the session record) is compared with
kit's estimate for the same plan. One rank measures everything FSDP adds except the communication
buffers of a real all-gather between GPUs (and NCCL's own memory): those need two GPUs.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import GIB, ROOT, bench_env, common_overrides, make_long_text, make_random_model, render  # noqa: E402


def run(script: Path, overrides: list[str], log: Path, timeout: float) -> tuple[int, str, float]:
    started = time.monotonic()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script), *overrides]
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, cwd=ROOT, env=bench_env(), stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, log.read_text(errors="replace"), time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/tmp/kit-models")
    ap.add_argument("--model", default="Qwen/Qwen3-4B")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="bench/results/fsdp_qlora_h200.json")
    args = ap.parse_args()
    work = Path(args.models)
    model = make_random_model(args.model, work / args.model.split("/")[-1])
    data = make_long_text(work / "long.jsonl")
    logs = Path(args.out).parent
    results = {"model_shape": args.model, "seq_len": args.seq, "per_device_batch": args.batch,
               "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                     text=True).stdout.strip(), "python": platform.python_version(), "runs": []}
    import torch
    import transformers

    results.update(torch=torch.__version__, transformers=transformers.__version__)
    for precision, steps, resume in (("bf16", args.steps, True), ("fp16", 2, False)):
        out = work / f"out-{precision}"
        over = common_overrides(model, data, out, method="qlora", seq=args.seq, batch=args.batch, gc=True, steps=steps)
        over = [o for o in over if not o.startswith(("precision=", "save_steps="))]
        over += [f"precision={precision}", f"save_steps={max(1, steps // 2)}", "strategy=fsdp"]
        script = ROOT / f"train_fsdp_{precision}.py"
        plan = render(over, script)
        entry = {"precision": precision, "strategy": plan["strategy"], "launch": plan["launch"],
                 "estimate_allocated_gib": round(plan["memory"]["allocated_bytes"] / GIB, 3),
                 "estimate_total_gib": round(plan["memory"]["per_gpu_bytes"] / GIB, 3),
                 "estimate_terms_gib": {k: round(v / GIB, 3) for k, v in plan["memory"]["terms"].items()}}
        code, log, took = run(script, [], logs / f"fsdp_{precision}.log", 110)
        entry.update(exit_code=code, seconds=round(took, 1),
                     checkpoints=sorted(p.name for p in out.glob("checkpoint-*")),
                     log_tail=[line for line in log.splitlines() if line.startswith("[kit]") or "Error" in line][-8:])
        record = out / "kit_sessions.jsonl"
        if record.exists():
            last = json.loads(record.read_text().splitlines()[-1])
            entry["session"] = last
            if "peak_allocated_bytes" in last:
                entry["measured_peak_allocated_gib"] = round(last["peak_allocated_bytes"] / GIB, 3)
                entry["estimate_error_pct"] = round(
                    100 * (plan["memory"]["allocated_bytes"] - last["peak_allocated_bytes"]) / last["peak_allocated_bytes"], 1)
        if resume and code == 0:
            code2, log2, took2 = run(script, [f"max_steps={steps + 2}"], logs / f"fsdp_{precision}_resume.log", 90)
            m = re.search(r"resuming from step (\d+)", log2)
            entry["resume"] = {"exit_code": code2, "seconds": round(took2, 1), "resumed_from_step": int(m.group(1)) if m else None,
                               "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
                               "log_tail": [ln for ln in log2.splitlines() if ln.startswith("[kit]") or "Error" in ln][-6:]}
        results["runs"].append(entry)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(json.dumps(entry, indent=2)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
