"""Time from `torchrun … train_ddp.py` to its first optimizer step: a cold start against a resume
whose checkpoint must come from the Hub (local output deleted), on the tiny default, CPU, gloo.

    python bench/resume_time.py [--runs 3] [--out bench/results/resume_time_cpu.json]

The Hub is tests/hubserver.py on 127.0.0.1, throttled to --mbps (50 MB/s by default) like a
good notebook uplink; the real huggingface_hub client downloads through it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hubserver import WRITE_TOKEN, HubServer  # noqa: E402
from tests.scripts import FAST, cpu_env, torchrun_cmd  # noqa: E402


def time_to_first_step(args, env) -> tuple[float, str]:
    """Seconds from launch to the first logged loss, and the whole log."""
    started = time.monotonic()
    proc = subprocess.Popen(torchrun_cmd() + args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and "'loss':" in line:
            first = time.monotonic() - started
    proc.wait()
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"run failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    return first, "".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mbps", type=float, default=50.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "resume_time_cpu.json"))
    a = p.parse_args()
    cold, resumed = [], []
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        server.throttle_bps = a.mbps * 1e6
        env = cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        for i in range(a.runs):
            work = Path(tempfile.mkdtemp(prefix="kit-bench-"))
            args = [f"output_dir={work / 'run'}", f"store=hf://bench/run{i}", "max_steps=8", "save_steps=4", *FAST]
            t, _ = time_to_first_step(args, env)
            cold.append(t)
            shutil.rmtree(work / "run")  # a new session: the checkpoint comes from the Hub
            t, log = time_to_first_step([*args[:-len(FAST) - 2], "max_steps=12", "save_steps=4", *FAST], env)
            assert "resuming from step 8 (store" in log, log[-2000:]
            resumed.append(t)
            shutil.rmtree(work)
    result = {
        "what": "seconds from torchrun launch to the first logged optimizer step, tiny default, 2 gloo ranks",
        "machine": platform.node(), "python": platform.python_version(), "hub_throttle_MBps": a.mbps,
        "cold_start_s": {"median": statistics.median(cold), "runs": cold},
        "resume_from_hub_s": {"median": statistics.median(resumed), "runs": resumed},
        "resume_overhead_s": statistics.median(resumed) - statistics.median(cold),
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"cold start {result['cold_start_s']['median']:.2f} s, resume from the Hub "
          f"{result['resume_from_hub_s']['median']:.2f} s (+{result['resume_overhead_s']:.2f} s) -> {a.out}")


if __name__ == "__main__":
    main()
