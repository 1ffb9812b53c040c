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
CADENCE = {"save_steps": 20, "lease_heartbeat_seconds": 0.5, "logging_steps": 1}


def job_args(steps: int) -> list[str]:
    return [f"max_steps={steps}", "keep_checkpoints=2", "eval_steps=null", *(f"{k}={v}" for k, v in CADENCE.items())]


class LoadSampler:
    """The machine's 1-minute load average, sampled while a job runs (the cores are shared)."""

    def __init__(self, every_s: float = 20.0):
        import threading
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        import os
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(every_s):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict:
        s = self.samples or [0.0]
        return {"mean_load_1min": round(sum(s) / len(s), 2), "max_load_1min": round(max(s), 2), "samples": len(s)}


def run_job(tmp: Path, cuts: dict[int, float], steps: int = STEPS, run_timeout_s: float = 900) -> dict:
    from tests.hubserver import WRITE_TOKEN, HubServer
    from tests.kaggleserver import KaggleServer
    from tests.test_kaggle_schedule import KEY, USER, kaggle_env, session_env

    store = "hf://me/bench-goodput"
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub, \
            KaggleServer(tmp / "kaggle", users={USER: KEY}, kernel_env=session_env(hub.url), cut_after_s=cuts,
                         run_timeout_s=run_timeout_s) as k, LoadSampler() as load:
        env = kaggle_env(tmp, hub.url, k)
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "kit", "schedule", "--kaggle", f"{USER}/kit-resume", "--config",
                            "configs/default.yaml", "--kit-repo", str(ROOT), "--runs-dir", str(tmp / "runs"),
                            "--poll", "0.5", "--nproc", "1", "--loop", *job_args(steps), f"store={store}",
                            f"output_dir={tmp / 'local'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=4 * 3600)
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
            "wall_s": round(wall, 1), "kernel_s": kernel_s, "load": load.summary(), "ledger": led}


def stayed_s(rows: list[dict], i: int) -> float:
    """Session i's useful time: the steps of it that stayed (up to where the next session resumed,
    or its last step) at its own speed. Where the ledger lacks the steps (older results files), its
    training time less the time of the redone steps.

    A cut session's record ends at its last heartbeat, so its span misses the steps it trained and
    published after it; the next session's start step does not.
    """
    r = rows[i]
    if r.get("start_step") is None or not r.get("step_s"):
        return max(0.0, r["train_s"] - r["time_lost_s"])
    until = rows[i + 1]["start_step"] if i + 1 < len(rows) else r["end_step"]
    return max(0, until - r["start_step"]) * r["step_s"]


def own_speed_figures(result: dict) -> dict:
    """Goodput with each session judged at its own speed, so the load on shared cores cancels out.

    The cut job and the reference run minutes apart on cores others use too: their step times
    differ by more than the overhead being measured. Here a session's useful time is its training
    time less the time of the steps the next session redid (the ledger's), and what it was billed
    is its whole kernel time (papermill start, clone, imports, render, setup, training, and for a
    cut session the stretch after its last heartbeat, which its record cannot see). Useful time
    is `stayed_s`.
    """
    def one(job: dict) -> dict:
        rows = job["ledger"]["sessions"]
        useful = sum(stayed_s(rows, i) for i in range(len(rows)))
        billed = sum(job["kernel_s"])
        return {"useful_train_s": round(useful, 1), "kernel_s": round(billed, 1),
                "goodput": useful / billed if billed else None,
                "overhead_per_session_s": round((billed - useful) / len(job["kernel_s"]), 1),
                "step_s_per_session": [round(r["step_s"], 4) for r in rows]}

    cut, ref = one(result["cut_job"]), one(result["uninterrupted_job"])
    twelve_h = 12 * 3600
    per_session = cut["overhead_per_session_s"]
    takeover = 180.0  # on Kaggle a new session is another host: the lease's 3 missed heartbeats (bench/lease_takeover.py)
    return {
        "cut_job": cut, "uninterrupted_job": ref,
        "goodput_own_speed": cut["goodput"],
        "goodput_own_speed_relative_to_uninterrupted": cut["goodput"] / ref["goodput"] if ref["goodput"] else None,
        "projected_12h_sessions_ending_at_the_deadline": 1 - per_session / twelve_h,
        "projected_12h_sessions_each_cut_unannounced": 1 - (per_session + takeover) / twelve_h,
        "projection_inputs_s": {"overhead_per_session": per_session, "takeover_after_a_cut_at_most": takeover,
                                "session": twelve_h},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuts", type=int, default=3)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out", type=Path)
    p.add_argument("--steps", type=int, default=STEPS, help="the job's max_steps (longer: setup a smaller share)")
    p.add_argument("--cut-max-s", type=float, default=2.5,
                   help="cuts fall at a random moment up to this many seconds after a session's first publish")
    p.add_argument("--cut-min-s", type=float, default=0.3, help="... and at least this many")
    p.add_argument("--save-steps", type=int, default=CADENCE["save_steps"])
    p.add_argument("--heartbeat-s", type=float, default=CADENCE["lease_heartbeat_seconds"])
    p.add_argument("--logging-steps", type=int, default=CADENCE["logging_steps"])
    p.add_argument("--run-timeout-s", type=float, default=900, help="the test Kaggle's run-time limit per session")
    p.add_argument("--together", action="store_true",
                   help="run the cut job and the uninterrupted one at the same time (same load on both)")
    p.add_argument("--recompute", type=Path, help="only add the own-speed figures to this results file")
    args = p.parse_args()
    if args.recompute:
        result = json.loads(args.recompute.read_text())
        result["own_speed"] = own_speed_figures(result)
        args.recompute.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["own_speed"], indent=2))
        return 0
    CADENCE.update(save_steps=args.save_steps, lease_heartbeat_seconds=args.heartbeat_s,
                   logging_steps=args.logging_steps)
    rng = random.Random(args.seed)
    cuts = {n: round(rng.uniform(args.cut_min_s, args.cut_max_s), 2) for n in range(1, args.cuts + 1)}
    with tempfile.TemporaryDirectory(prefix="kit-goodput-") as a, tempfile.TemporaryDirectory(prefix="kit-ref-") as b:
        if args.together:  # one process each on the 2 cores: both jobs see the same load
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(2) as pool:
                cut_f = pool.submit(run_job, Path(a), cuts, args.steps, args.run_timeout_s)
                ref_f = pool.submit(run_job, Path(b), {}, args.steps, args.run_timeout_s)
                cut, ref = cut_f.result(), ref_f.result()
        else:
            cut = run_job(Path(a), cuts, args.steps, args.run_timeout_s)
            ref = run_job(Path(b), {}, args.steps, args.run_timeout_s)
    used, ref_used = cut["ledger"]["gpu_hours"] * 3600, ref["ledger"]["gpu_hours"] * 3600
    rows = cut["ledger"]["sessions"]
    setup = [r["setup_s"] for r in rows if r["setup_s"] is not None]
    lost = [r["time_lost_s"] for r in rows[:-1]]
    twelve_h = 12 * 3600
    projected = 1 - (sum(setup) / len(setup) + (sum(lost) / len(lost) if lost else 0)) / twelve_h
    # What a Kaggle job is billed: each session's whole kernel time (papermill start, clone, imports,
    # render, model load, resume download, training, recomputed steps), not the ledger's span alone.
    cut_kernel, ref_kernel = sum(cut["kernel_s"]), sum(ref["kernel_s"])
    extra_sessions = len(cut["kernel_s"]) - len(ref["kernel_s"])
    # Kernel time a session spends outside the ledger's training span: the imports and startup the
    # ledger cannot see, plus its own counted setup.
    outside = [k - r["train_s"] for k, r in zip(cut["kernel_s"], rows)]
    per_cut_s = (cut_kernel - ref_kernel) / extra_sessions if extra_sessions else None
    result = {
        "bench": "kaggle_goodput", "machine": "CPU (2 shared cores), tiny default, 1 process",
        "max_steps": args.steps, "cut_after_first_publish_s": cuts,
        "cut_job": cut, "uninterrupted_job": ref,
        "goodput_ledger": cut["ledger"]["goodput"],
        "goodput_vs_uninterrupted": ref_used / used if used else None,
        "steps_recomputed": cut["ledger"]["steps_recomputed"],
        "mean_setup_s": sum(setup) / len(setup), "mean_time_lost_per_cut_s": (sum(lost) / len(lost)) if lost else 0,
        "projected_goodput_12h_session": projected,
        "goodput_vs_uninterrupted_kernel_time": ref_kernel / cut_kernel if cut_kernel else None,
        "kernel_s_total": {"cut_job": round(cut_kernel, 1), "uninterrupted_job": round(ref_kernel, 1)},
        "per_session_outside_training_s": [round(x, 1) for x in outside],
        "mean_per_session_outside_training_s": round(sum(outside) / len(outside), 1),
        "kernel_s_per_cut": round(per_cut_s, 1) if per_cut_s is not None else None,
        "projected_goodput_12h_sessions_kernel_time": (1 - per_cut_s / twelve_h) if per_cut_s is not None else None,
        "cadence": dict(CADENCE),
        "load": {"cut_job": cut["load"], "uninterrupted_job": ref["load"]},
    }
    result["own_speed"] = own_speed_figures(result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("cut_job", "uninterrupted_job")}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
