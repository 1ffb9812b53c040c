"""Goodput of a multi-session job run through `kit schedule --kaggle`, on the CPU.

The real `kaggle` client talks to tests/kaggleserver.py, whose kernels run the pushed notebook
with papermill (the tiny default, one process) into a Hub store on tests/hubserver.py; sessions
1..N-1 are cut with kill -9 at seeded random moments after their first checkpoint reached the
store. Then `kit status --json` gives the ledger. The same job run uninterrupted (one session)
is the reference: goodput against it = its GPU time ÷ the cut job's.

    python bench/kaggle_goodput.py --out bench/results/kaggle_goodput_cpu.json

On this tiny model a session's setup (kernel start, clone, imports, model load, resume download:
seconds) is as long as its training, so the CPU figure is dominated by setup; the projection for a
12 h Kaggle session uses the measured setup and loss per cut.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 400
JOB = [f"max_steps={STEPS}", "save_steps=20", "keep_checkpoints=2", "lease_heartbeat_seconds=0.5",
       "eval_steps=null", "logging_steps=1"]


def job_args(steps: int) -> list[str]:
    return [f"max_steps={steps}", *JOB[1:]]


def run_job(tmp: Path, cuts: dict[int, float], steps: int = STEPS) -> dict:
    from tests.hubserver import WRITE_TOKEN, HubServer
    from tests.kaggleserver import KaggleServer
    from tests.test_kaggle_schedule import KEY, USER, kaggle_env, session_env

    store = "hf://me/bench-goodput"
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub, \
            KaggleServer(tmp / "kaggle", users={USER: KEY}, kernel_env=session_env(hub.url), cut_after_s=cuts) as k:
        env = kaggle_env(tmp, hub.url, k)
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "kit", "schedule", "--kaggle", f"{USER}/kit-resume", "--config",
                            "configs/default.yaml", "--kit-repo", str(ROOT), "--runs-dir", str(tmp / "runs"),
                            "--poll", "0.5", "--nproc", "1", "--loop", *job_args(steps), f"store={store}",
                            f"output_dir={tmp / 'local'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=1800)
        wall = time.time() - t0
        if r.returncode != 0:
            raise SystemExit(f"the schedule failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
        shown = subprocess.run([sys.executable, "-m", "kit", "status", "--config", "configs/default.yaml",
                                *job_args(steps), f"store={store}", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=120)
        facts = json.loads(shown.stdout)
        kernel_s = [round((v.ended or 0) - v.started, 1) for v in k.versions]
    led = facts["goodput"]
    return {"sessions": len(facts["sessions"]), "outcomes": [s["outcome"] for s in facts["sessions"]],
            "wall_s": round(wall, 1), "kernel_s": kernel_s, "ledger": led}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuts", type=int, default=3)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out", type=Path)
    p.add_argument("--steps", type=int, default=STEPS, help="the job's max_steps (longer: setup a smaller share)")
    p.add_argument("--cut-max-s", type=float, default=2.5,
                   help="cuts fall at a random moment up to this many seconds after a session's first publish")
    args = p.parse_args()
    rng = random.Random(args.seed)
    cuts = {n: round(rng.uniform(0.3, args.cut_max_s), 2) for n in range(1, args.cuts + 1)}
    with tempfile.TemporaryDirectory(prefix="kit-goodput-") as a, tempfile.TemporaryDirectory(prefix="kit-ref-") as b:
        cut = run_job(Path(a), cuts, args.steps)
        ref = run_job(Path(b), {}, args.steps)
    used, ref_used = cut["ledger"]["gpu_hours"] * 3600, ref["ledger"]["gpu_hours"] * 3600
    rows = cut["ledger"]["sessions"]
    setup = [r["setup_s"] for r in rows if r["setup_s"] is not None]
    lost = [r["time_lost_s"] for r in rows[:-1]]
    twelve_h = 12 * 3600
    projected = 1 - (sum(setup) / len(setup) + (sum(lost) / len(lost) if lost else 0)) / twelve_h
    result = {
        "bench": "kaggle_goodput", "machine": "CPU (2 shared cores), tiny default, 1 process",
        "when": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "max_steps": args.steps, "cut_after_first_publish_s": cuts,
        "cut_job": cut, "uninterrupted_job": ref,
        "goodput_ledger": cut["ledger"]["goodput"],
        "goodput_vs_uninterrupted": ref_used / used if used else None,
        "steps_recomputed": cut["ledger"]["steps_recomputed"],
        "mean_setup_s": sum(setup) / len(setup), "mean_time_lost_per_cut_s": (sum(lost) / len(lost)) if lost else 0,
        "projected_goodput_12h_session": projected,
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("cut_job", "uninterrupted_job")}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
