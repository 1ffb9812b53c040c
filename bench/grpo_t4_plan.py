"""The Kaggle 2×T4 GRPO plan for a Qwen3-4B LoRA, one rank of its script under a T4-sized allocator.

    python bench/grpo_t4_plan.py --out DIR [--model Qwen/Qwen3-4B] [--steps 8] [--cap-gib 14.06]

`kit render --gpus 2xT4` of configs/grpo-tiny.yaml for a random-weight Qwen3-4B (the shape from kit's
table, seeded bf16 weights built on the GPU and saved next to the tiny tokenizer; no downloads), LoRA
r16 on all linears, 8 generations × 256 tokens from prompts of up to 128 tokens, beta 0, and every
other choice kit's for 2×T4 (precision fp16, its micro-batch, gradient checkpointing, no Liger, no
compiled layers). precision=fp16 is set rather than left to "auto" only so that the script keeps fp16
on the H100 (a T4's "auto" is fp16; an H100's bf16): the plan is the same.

The script then runs as ONE rank of that plan: one process, its allocator capped at a T4's usable
14.06 GiB (torch.cuda.set_per_process_memory_fraction before the script runs), `global_batch=` one
rank's share of the plan's batch (its micro-batch × accumulation), so this process generates and
trains on exactly what each of the two T4 ranks would (one prompt's num_generations completions a
step for the Qwen3-4B plan). Baseline and final
evaluation are off (eval.baseline=false eval.final=false): the plan's training step is measured.

Reported: whether it completes (fits), the peak `max_memory_allocated` of the training steps against
the plan's estimate (allocated bytes, and the per-GPU figure with slack and context), the step times
TRL logs (the first compiles the decoding step) and kit's median. An H100's speed, not a T4's.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_common import GIB, bench_env, make_random_model  # noqa: E402

T4_CAP_GIB = 14.06
WORDS = ["turn", "on", "the", "kitchen", "light", "thermostat", "to", "degrees", "garage", "door", "in",
         "living", "room", "bedroom"]  # one token each in the tiny tokenizer
CAP_RUNNER = ("import sys, runpy, torch; total = torch.cuda.get_device_properties(0).total_memory; "
              "torch.cuda.set_per_process_memory_fraction(float(sys.argv[1]) * 2**30 / total, 0); "
              "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def make_prompts(path: Path, rows: int, words: int, seed: int = 0) -> Path:
    """`rows` plain-text prompts of `words` one-token words each."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            f.write(json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(words))}) + "\n")
    return path


def step_times(log: str) -> list[float]:
    """TRL's logged `step_time` of each step (logging_steps=1), in order."""
    times = []
    for line in log.splitlines():
        if line.startswith("{") and "'step_time'" in line:
            times.append(float(ast.literal_eval(line)["step_time"]))
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="Qwen/Qwen3-4B", help="a shape from kit's table; tiny: the CPU check")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--completion-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=128, help="seq_len: the longest prompt")
    p.add_argument("--cap-gib", type=float, default=T4_CAP_GIB)
    p.add_argument("--precision", default="fp16", help="auto for the CPU check")
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--deadline-s", type=float, default=0, help="stop the script this long after this bench "
                   "started (0: no limit); what it logged is kept")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="grpo-t4-"))
    started = time.monotonic()
    model = ROOT / "models" / "tiny-qwen3" if args.model == "tiny" else make_random_model(args.model, work / "model")
    data = make_prompts(work / "prompts.jsonl", rows=64, words=args.prompt_tokens - 8)
    overrides = [f"model={model}", "method=lora", f"seq_len={args.prompt_tokens}",
                 f"grpo.num_generations={args.generations}", f"grpo.max_completion_length={args.completion_tokens}",
                 "per_device_batch=null", "global_batch=null", "gradient_checkpointing=auto",
                 f"precision={args.precision}", f"max_steps={args.steps}", "logging_steps=1", "warmup_steps=0",
                 "learning_rate=0.00001", f"save_steps={10 * args.steps}", "store=null", f"data.path={data}",
                 "data.format=auto", "data.eval_fraction=0", "eval.baseline=false", "eval.final=false",
                 f"output_dir={work / 'out'}"]
    where = ["--config", "configs/grpo-tiny.yaml", "--gpus", "2xT4"]
    base = [sys.executable, "-m", "kit"]
    plan = subprocess.run(base + ["plan", *where, *overrides, "--json"], cwd=ROOT, env=bench_env(),
                          capture_output=True, text=True)
    if plan.returncode != 0:
        raise SystemExit(f"kit plan exit {plan.returncode}: {(plan.stdout + plan.stderr)[-1500:]}")
    planned = json.loads(plan.stdout)
    script = work / "train_grpo.py"
    done = subprocess.run(base + ["render", *where, *overrides, "-o", str(script), "--force"], cwd=ROOT,
                          env=bench_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kit render exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    per_gpu = planned["per_device_batch"]
    one_rank = [f"global_batch={per_gpu * planned['grad_accum']}"]  # this process: one rank's share
    import torch

    cuda = torch.cuda.is_available()
    argv = ([sys.executable, "-c", CAP_RUNNER, str(args.cap_gib), str(script)] if cuda else
            [sys.executable, str(script)]) + one_rank
    log_path = args.out / "train.log"
    run_started = time.monotonic()
    left = args.deadline_s - (time.monotonic() - started) if args.deadline_s else None
    with open(log_path, "w") as f:
        try:
            rc = subprocess.run(argv, cwd=ROOT, env=bench_env(), stdout=f, stderr=subprocess.STDOUT,
                                timeout=left).returncode
        except subprocess.TimeoutExpired:
            rc = f"stopped after {left:.0f} s (--deadline-s)"
    log = log_path.read_text(errors="replace")
    sessions = work / "out" / "kit_sessions.jsonl"
    session = json.loads(sessions.read_text().splitlines()[-1]) if sessions.exists() else {}
    memory = planned["memory"]
    result = {
        "what": __doc__.split("\n")[0],
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft")},
        "render_command": " ".join(["python", "-m", "kit", "render", *where, *overrides]),
        "run_command": f"python -c CAP_RUNNER {args.cap_gib} train_grpo.py {' '.join(one_rank)}",
        "cap_gib": args.cap_gib if cuda else None,
        "plan": {k: planned.get(k) for k in ("strategy", "precision", "per_device_batch", "grad_accum", "global_batch",
                                              "gradient_checkpointing", "backend", "kernels", "compile_layers")},
        "estimate_allocated_gib": round(memory["allocated_bytes"] / GIB, 3),
        "estimate_per_gpu_gib": round(memory["per_gpu_bytes"] / GIB, 3),
        "budget_gib": round(memory["budget_bytes"] / GIB, 3),
        "reasons": planned.get("reasons"),
        "rc": rc,
        "fits": rc == 0 and "[kit] complete:" in log,
        "run_wall_s": round(time.monotonic() - run_started, 1),
        "total_wall_s": round(time.monotonic() - started, 1),
        "step_time_s": step_times(log),
        "kit_lines": [line for line in log.splitlines() if line.startswith("[kit]")][-12:],
        "session": session,
    }
    found = {}
    for v in session.values() if isinstance(session, dict) else ():
        if isinstance(v, dict):
            found.update({k: v[k] for k in ("peak_allocated_bytes", "peak_reserved_bytes", "step_s") if k in v})
    for k in ("peak_allocated_bytes", "peak_reserved_bytes", "step_s"):
        if k in session:
            found[k] = session[k]
    if "peak_allocated_bytes" in found:
        peak = found["peak_allocated_bytes"] / GIB
        result["peak_allocated_gib"] = round(peak, 3)
        result["peak_reserved_gib"] = round(found.get("peak_reserved_bytes", 0) / GIB, 3)
        result["estimate_vs_peak"] = round(memory["allocated_bytes"] / GIB / peak - 1, 3)
    if "step_s" in found:
        result["median_step_s"] = found["step_s"]
    if rc != 0:
        result["log_tail"] = log[-4000:]
    (args.out / "grpo_t4_plan.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("reasons", "session")}, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
