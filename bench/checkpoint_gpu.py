"""What checkpoints to the Hub cost a real GPU run: step time while one uploads, and resume time.

    python bench/checkpoint_gpu.py --models /tmp/kit-models --out bench/results/checkpoint_h200.json

Qwen3-8B shape (random weights), QLoRA r16 all-linear, seq 2048 × batch 4, checkpointing on:
each checkpoint is ~500 MiB (fp32 adapter + AdamW states). The Hub is tests/hubserver.py on
127.0.0.1, throttled to --mbps (50 MB/s by default), large files over LFS as on the Hub; the real
huggingface_hub client talks to it from kit's background uploader.

  1. no store: the step times to compare with, and the cold start (launch → first logged step).
  2. store=hf://…: every --save-steps a checkpoint is pushed in the background; steps whose
     interval overlaps an upload (save → "published") are compared with run 1's.
  3. the local output deleted, the same command with more steps: it must resume from the Hub;
     launch → first logged step, against run 1's cold start.
Intervals that contain a save itself (the step after each save) are left out of both.
Target: step-time overhead ≤ 3 %.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"  # the test server speaks LFS, not Xet
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import ROOT, bench_env, common_overrides, make_long_text, make_random_model, render  # noqa: E402
from tests.hubserver import WRITE_TOKEN, HubServer  # noqa: E402

SEQ, BATCH = 2048, 4
LOSS = re.compile(r"'loss':")
PUBLISHED = re.compile(r"\[kit\] store: step (\d+) published")


def timed_run(argv: list[str], env: dict, log: Path, timeout: float) -> list[tuple[float, str]]:
    """Run `argv`, returning (seconds since launch, line) for every output line."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines: list[tuple[float, str]] = []
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - started, line))
        proc.wait()
    finally:
        killer.cancel()
        log.write_text("".join(f"{t:9.3f} {line}" for t, line in lines))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return lines


def step_ends(lines) -> list[float]:
    """When each logged optimizer step ended (logging_steps=1: one loss line per step)."""
    return [t for t, line in lines if LOSS.search(line)]


def intervals(ends: list[float], first_step: int, save_steps: int) -> list[tuple[int, float, float]]:
    """(step, start, end) of every step after the first two, leaving out those that contain a save."""
    out = []
    for i in range(1, len(ends)):
        step = first_step + i  # the step that ended at ends[i]
        if i < 2 or (step - 1) % save_steps == 0:
            continue
        out.append((step, ends[i - 1], ends[i]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-steps", type=int, default=6)
    p.add_argument("--mbps", type=float, default=50.0)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint_h200.json"))
    p.add_argument("--cpu-dry-run", action="store_true", help="the tiny default on the CPU: checks the bench itself")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kit-ckpt-"))
    data = make_long_text(Path(a.models) / "long.jsonl")
    script = work / "train.py"
    if a.cpu_dry_run:
        model, method, seq, extra, gpus = ROOT / "models" / "tiny-qwen3", "lora", 256, ["precision=fp32"], "cpu"
    else:
        model, method, seq, extra, gpus = make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b"), "qlora", SEQ, [], "1xH200"

    def overrides(out: Path, steps: int) -> list[str]:
        base = common_overrides(model, data, out, method=method, seq=seq, batch=BATCH, gc=True, steps=steps)
        return [o for o in base if not o.startswith(("save_steps=", "precision="))] + [
            f"save_steps={a.save_steps}", "save_every_minutes=1000", *(extra or ["precision=bf16"])]

    render(overrides(work / "unused", a.steps), script, gpus=gpus)
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        server.throttle_bps = a.mbps * 1e6
        server.lfs_threshold = 1_000_000
        env = bench_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0")

        # 1. No store.
        plain = timed_run([sys.executable, str(script), *overrides(work / "plain", a.steps)], env,
                          work / "plain.log", a.timeout)
        plain_ends = step_ends(plain)
        plain_steps = [e - s for _, s, e in intervals(plain_ends, 1, a.save_steps)]

        # 2. With the Hub store: uploads in flight.
        store = "store=hf://bench/ckpt"
        pushed = timed_run([sys.executable, str(script), *overrides(work / "hub", a.steps), store], env,
                           work / "hub.log", a.timeout)
        ends = step_ends(pushed)
        published = {int(m.group(1)): t for t, line in pushed if (m := PUBLISHED.search(line))}
        # An upload starts when its checkpoint is sealed, i.e. by the time step N+1 starts.
        windows = [(ends[n - 1], published[n]) for n in published if n < len(ends)]
        during, outside = [], []
        for _step, s, e in intervals(ends, 1, a.save_steps):
            (during if any(s < w_end and e > w_start for w_start, w_end in windows) else outside).append(e - s)
        ckpt = work / "hub" / f"checkpoint-{a.steps}"
        ckpt_mib = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 2**20

        # 3. Resume from the Hub in a new session (no local output).
        shutil.rmtree(work / "hub")
        resumed = timed_run([sys.executable, str(script), *overrides(work / "hub", a.steps + 6), store], env,
                            work / "resume.log", a.timeout)
        log = "".join(line for _, line in resumed)
        if f"resuming from step {a.steps} (store" not in log:
            raise SystemExit(f"run 3 did not resume from the Hub:\n{log[-3000:]}")

    base = statistics.mean(plain_steps)
    result = {
        "what": "Qwen3-8B-shape QLoRA (seq 2048 x batch 4) on one GPU; checkpoints pushed by kit's background "
                f"uploader through huggingface_hub to tests/hubserver.py throttled to {a.mbps} MB/s (LFS)",
        "machine": platform.node(), "checkpoint_mib": round(ckpt_mib, 1), "save_steps": a.save_steps,
        "step_s_no_store": {"mean": round(base, 4), "n": len(plain_steps)},
        "step_s_upload_in_flight": {"mean": round(statistics.mean(during), 4) if during else None, "n": len(during)},
        "step_s_store_idle": {"mean": round(statistics.mean(outside), 4) if outside else None, "n": len(outside)},
        "overhead_pct": round(100 * (statistics.mean(during) / base - 1), 2) if during else None,
        "overhead_vs_store_idle_pct": (round(100 * (statistics.mean(during) / statistics.mean(outside) - 1), 2)
                                       if during and outside else None),
        "upload_s": {str(n): round(t - ends[n - 1], 2) for n, t in published.items() if n < len(ends)},
        "cold_start_to_first_step_s": round(plain_ends[0], 2),
        "resume_from_hub_to_first_step_s": round(step_ends(resumed)[0], 2),
        "target_overhead_pct": 3.0,
    }
    result["resume_minus_cold_s"] = round(result["resume_from_hub_to_first_step_s"] - result["cold_start_to_first_step_s"], 2)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
