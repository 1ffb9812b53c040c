"""Where a resumed session's setup goes: launch → first training step, phase by phase, on the CPU.

A Kaggle session that resumes a job (the tiny default, one process, a Hub store on
tests/hubserver.py, the local output gone as on a fresh Kaggle machine) is timed from the moment
its process is launched to the end of its first optimizer step. The child runs the repo's
train_ddp.py through `runpy` with timing wrappers around kit's phases (this bench's own
instrumentation: nothing in kit is changed by it); the wrappers only read the clock.

    python bench/session_setup.py --runs 3 --out bench/results/session_setup_cpu.json

Phases (seconds since launch): interpreter up; the imports train_ddp.py makes (torch,
transformers, peft, trl, kit); dist.init; the plan; Job.start (store open, lease, the resume
decision with its verified download, the run identity); model load; LoRA; data prep; the
baseline-evaluation check; the trainer's construction; trainer.train up to its first step
(checkpoint load, data skip); the first step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import json, os, sys, time
T0 = float(os.environ["KIT_BENCH_T0"])
marks = [("interpreter up", time.time())]
def mark(name): marks.append((name, time.time()))
import torch; mark("import torch")
import transformers; mark("import transformers")
import peft; mark("import peft")
import trl; from trl import SFTTrainer; mark("import trl")
from kit.train import data, dist, modeling; from kit.train.job import Job; from kit.planning import settle
from kit.checkpoints import resume, lease as lease_mod; from kit.evaluation import stage; import kit.checkpoints.store as store_mod
from kit.train import callbacks
mark("import kit")

def timed(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*a, **k):
        start = time.time()
        try:
            return original(*a, **k)
        finally:
            spans.append((label, start, time.time()))
    setattr(owner, name, wrapper)
spans = []
for owner, name, label in [(dist, "init", "dist.init"), (settle, "for_rank", "plan"), (Job, "start", "Job.start"),
                           (store_mod, "connect", "  store open"), (lease_mod.Lease, "acquire", "  lease acquire"),
                           (resume, "choose", "  resume decision (incl. download, verification)"),
                           (stage, "open_run", "  run identity"),
                           (modeling, "load", "model load"), (modeling, "add_lora", "LoRA"),
                           (data, "prepare", "data prep"), (Job, "evaluate_before", "baseline-eval check"),
                           (SFTTrainer, "__init__", "trainer construction")]:
    timed(owner, name, label)
began = callbacks.Meter.on_train_begin
def on_train_begin(self, *a, **k):
    spans.append(("trainer.train to its first step (checkpoint load)", train_called[0], time.time()))
    return began(self, *a, **k)
callbacks.Meter.on_train_begin = on_train_begin
train_called = [None]
from transformers import Trainer
train = Trainer.train
def train_wrapper(self, *a, **k):
    train_called[0] = time.time()
    return train(self, *a, **k)
Trainer.train = train_wrapper
ended = callbacks.Meter.on_step_end
def on_step_end(self, *a, **k):
    out = ended(self, *a, **k)
    t = time.time()
    spans.append(("first optimizer step", self.began_at, t))
    result = {"marks": [(n, t - T0) for n, t in marks],
              "spans": [(n, s - T0, e - T0) for n, s, e in spans], "first_step_done": t - T0}
    with open(os.environ["KIT_BENCH_OUT"], "w") as f:
        json.dump(result, f)
    os._exit(0)  # a cut right after the first step: the next run takes the lease over (same host)
callbacks.Meter.on_step_end = on_step_end
if os.environ.get("KIT_BENCH_PROFILE"):  # cProfile of Job.start, for finding where it goes
    import cProfile
    start = Job.start
    def profiled(self, *a, **k):
        prof = cProfile.Profile()
        try:
            return prof.runcall(start, self, *a, **k)
        finally:
            prof.dump_stats(os.environ["KIT_BENCH_PROFILE"])
    Job.start = profiled
import runpy
sys.argv = ["train_ddp.py", *sys.argv[1:]]
runpy.run_path("train_ddp.py", run_name="__main__")
'''


def main() -> int:
    from tests.hubserver import WRITE_TOKEN, HubServer
    from tests.scripts import cpu_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path)
    p.add_argument("--label", default="")
    p.add_argument("--profile", type=Path, help="write a cProfile of the last run's Job.start here")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kit-setup-"))
    runs = []
    try:
        with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
            env = cpu_env(HF_ENDPOINT=hub.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
            job = ["store=hf://bench/setup", "save_steps=10", "eval_steps=null", "logging_steps=10",
                   "lease_heartbeat_seconds=30"]
            first = subprocess.run([sys.executable, "train_ddp.py", "--config", "configs/default.yaml",
                                    f"output_dir={work / 'out'}", "max_steps=10", *job], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=900)
            if first.returncode != 0:
                raise SystemExit(f"the first session failed: {first.stdout[-2000:]}{first.stderr[-2000:]}")
            for i in range(a.runs):
                shutil.rmtree(work / "out", ignore_errors=True)  # a fresh machine: resume from the store
                out = work / f"run{i}.json"
                env_i = dict(env, KIT_BENCH_OUT=str(out), KIT_BENCH_T0=repr(time.time()))
                if a.profile:
                    env_i["KIT_BENCH_PROFILE"] = str(a.profile)
                r = subprocess.run([sys.executable, "-c", CHILD, "--config", "configs/default.yaml",
                                    f"output_dir={work / 'out'}", "max_steps=1000", *job], cwd=ROOT, env=env_i,
                                   capture_output=True, text=True, timeout=900)
                if not out.exists():
                    raise SystemExit(f"run {i} failed ({r.returncode}): {r.stdout[-3000:]}{r.stderr[-3000:]}")
                runs.append(json.loads(out.read_text()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows: dict[str, list[float]] = {}
    for run in runs:
        last = 0.0
        for name, t in run["marks"]:
            rows.setdefault(name, []).append(t - last)
            last = t
        for name, s, e in run["spans"]:
            rows.setdefault(name, []).append(e - s)
        rows.setdefault("launch → first step done", []).append(run["first_step_done"])
    table = {name: round(statistics.median(v), 3) for name, v in rows.items()}
    result = {"bench": "session_setup", "label": a.label, "machine": "CPU (2 shared cores), tiny default, 1 process, Hub on tests/hubserver.py",
              "load_1min": os.getloadavg()[0], "runs": a.runs, "median_s": table, "all_runs": runs}
    print(json.dumps({k: v for k, v in result.items() if k != "all_runs"}, indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
