"""What resuming costs a new session on the 8B shape: launch to first step, by phase (issue #16).

    python bench/resume_setup_gpu.py --models /tmp/kit-models --out bench/results/resume_setup_h200.json

Qwen3-8B shape (random weights), QLoRA nf4, LoRA r16 all-linear, seq 2048 × batch 4, the Hub being
tests/hubserver.py on 127.0.0.1 throttled to --mbps (50 MB/s by default, both directions; LFS), the
real huggingface_hub client in kit's script:
  1. a session trains --steps steps and pushes its last checkpoint (adapter + optimizer states);
  2. its local output deleted, a new session with one more step resumes from the Hub.
Session 2's output lines, stamped with seconds since launch, give the phases: imports (launch to the
script's first line), model load, checkpoint download, and the first step; the total is set against a
12 h Kaggle session. Phase boundaries are the lines listed under "marks" in the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"  # the test server speaks LFS, not Xet
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_gpu import timed_run  # noqa: E402
from bench.gpu_common import bench_env, common_overrides, make_long_text, make_random_model, render  # noqa: E402
from tests.hubserver import WRITE_TOKEN, HubServer  # noqa: E402

SESSION_S = 12 * 3600
MARKS = {  # phase end -> the first line that shows it
    "script_started": re.compile(r"^\[kit\]"),
    "resume_found": re.compile(r"resuming from step"),
    "model_loaded": re.compile(r"trainable parameters"),
    "first_step": re.compile(r"['\"]loss['\"]:"),
}


def marks(lines) -> dict:
    found = {}
    for t, line in lines:
        for name, rx in MARKS.items():
            if name not in found and rx.search(line):
                found[name] = (round(t, 2), line.strip()[:160])
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--mbps", type=float, default=50.0)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--out", default="bench/results/resume_setup_h200.json")
    p.add_argument("--cpu-dry-run", action="store_true", help="the tiny model on the CPU: checks the bench itself")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kit-resume-"))
    data = make_long_text(Path(a.models) / "long.jsonl")
    if a.cpu_dry_run:
        model, method, seq, prec, gpus = Path("models/tiny-qwen3").resolve(), "lora", 256, "fp32", "cpu"
    else:
        model, method, seq, prec, gpus = make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b"), "qlora", 2048, "bf16", "1xH200"

    def overrides(steps: int) -> list[str]:
        base = common_overrides(model, data, work / "out", method=method, seq=seq, batch=4, gc=True, steps=steps)
        return [o for o in base if not o.startswith(("save_steps=", "precision="))] + [
            f"save_steps={a.steps}", "save_every_minutes=1000", f"precision={prec}", "store=hf://bench/resume"]

    script = work / "train.py"
    render(overrides(a.steps), script, gpus=gpus)
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        server.throttle_bps = a.mbps * 1e6
        server.lfs_threshold = 1_000_000
        env = bench_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0")
        first = timed_run([sys.executable, str(script), *overrides(a.steps)], env, work / "first.log", a.timeout)
        ckpt = work / "out" / f"checkpoint-{a.steps}"
        ckpt_mib = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 2**20
        shutil.rmtree(work / "out")
        resumed = timed_run([sys.executable, str(script), *overrides(a.steps + 1)], env, work / "resume.log", a.timeout)
    log = "".join(line for _, line in resumed)
    if f"resuming from step {a.steps} (store" not in log:
        raise SystemExit(f"session 2 did not resume from the Hub:\n{log[-3000:]}")
    m, cold = marks(resumed), marks(first)
    t = {k: v[0] for k, v in m.items()}
    # The script resumes after loading the model or before it: phases follow the order the lines came in.
    order = sorted((k for k in ("resume_found", "model_loaded") if k in t), key=t.get)
    phases, prev = {"imports_and_plan_s": t["script_started"]}, t["script_started"]
    for k in order + ["first_step"]:
        label = {"resume_found": "checkpoint_found_and_downloaded_s", "model_loaded": "model_load_s",
                 "first_step": "to_first_step_s"}[k]
        phases[label] = round(t[k] - prev, 2)
        prev = t[k]
    result = {"what": __doc__.splitlines()[0], "machine": platform.node(), "mbps": a.mbps,
              "checkpoint_mib": round(ckpt_mib, 1), "phases_s": phases, "order": order,
              "resume_launch_to_first_step_s": t["first_step"],
              "cold_launch_to_first_step_s": cold.get("first_step", (None,))[0],
              "fraction_of_12h_session": round(t["first_step"] / SESSION_S, 5),
              "marks": {k: v[1] for k, v in m.items()},
              "resume_kit_lines": [f"{t_:.1f} {line.strip()[:200]}" for t_, line in resumed if line.startswith("[kit]")][:25]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
