"""Does `batching: auto`'s packing with folded accumulation change what training learns? (issue #17)

    python bench/fold_loss_cpu.py --out bench/results/fold_loss_cpu.json

The repo's train_ddp.py (rendered for 2×T4, so its plan has padding-free batches) on the tiny
default, one process on the CPU: micro-batch 8 × accumulation 2 = 16 rows a step. "auto" packs the
short rows (60 tokens of seq_len 256, ~4 to a sequence) into 4 sequences × 1 micro-batch, ~16 rows
a step; "padded" keeps 8 rows × 2. A packed step holds other rows than a padded one, so the curves
cannot match step by step; what must agree is what the job delivers: the held-out loss after the
same number of steps. The yardstick is the spread between two padded runs with different seeds
(LoRA init and data order), measured in the same run.

Tolerance, fixed before the run: the auto run's final held-out loss is within 2 % of the padded
run's, or no further from it than the other seed's padded run is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {"padded": ["batching=padded"], "padded_seed43": ["batching=padded", "seed=43"], "auto": []}
TOLERANCE = 0.02


def run(name: str, extra: list[str], steps: int, work: Path) -> dict:
    out = work / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    r = subprocess.run([sys.executable, "train_ddp.py", f"output_dir={out}", f"max_steps={steps}",
                        "logging_steps=1", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{name} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-1500:]}")
    results = json.loads((out / "final" / "eval_results.json").read_text())
    state = json.loads(sorted(out.glob("checkpoint-*/trainer_state.json"))[-1].read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    kit_lines = [line for line in r.stdout.splitlines() if line.startswith("[kit] batching")]
    return {"name": name, "overrides": extra, "wall_s": round(time.time() - t0, 1),
            "baseline_loss": results["baseline"]["result"]["loss"], "final_loss": results["final"]["result"]["loss"],
            "train_losses": losses, "batching_line": kit_lines[-1] if kit_lines else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=48, help="optimizer steps (24 are one epoch of the default data)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kit-fold-") as tmp:
        rows = {name: run(name, extra, a.steps, Path(tmp)) for name, extra in RUNS.items()}
    ref = rows["padded"]["final_loss"]
    auto_diff = abs(rows["auto"]["final_loss"] - ref) / ref
    seed_diff = abs(rows["padded_seed43"]["final_loss"] - ref) / ref
    result = {
        "bench": "fold_loss_cpu", "machine": "CPU, tiny default, 1 process", "steps": a.steps,
        "tolerance": TOLERANCE, "runs": rows,
        "auto_vs_padded_final_loss_rel": round(auto_diff, 4), "seed_vs_seed_final_loss_rel": round(seed_diff, 4),
        "matches": auto_diff <= TOLERANCE or auto_diff <= seed_diff,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    for name, r in rows.items():
        print(f"{name}: final held-out loss {r['final_loss']:.4f} (baseline {r['baseline_loss']:.4f}), "
              f"{r['wall_s']} s; {r['batching_line']}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
