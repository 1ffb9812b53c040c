"""How long `kit bootstrap` takes against the cheapest way torch can look at the GPU.

    python bench/bootstrap_time.py --out bench/results/bootstrap_time.json [--runs 7]

Times N runs of `python -m kit bootstrap --json` with an empty cache ("cold": the first cell of a
fresh Kaggle session), N with a filled one ("warm"), and N of
`python -c "import torch; torch.cuda.is_available()"`, interleaved so all see the same machine
state. Also checks that the arch list kit read (from the library's bytes, or a subprocess) is the
one torch reports. Target: both medians ≤ 0.6 × the torch median. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_RATIO = 0.6
TORCH_CMD = [sys.executable, "-c", "import torch; torch.cuda.is_available()"]
BOOTSTRAP_CMD = [sys.executable, "-m", "kit", "bootstrap", "--json"]
# What torch.cuda.get_arch_list() would print, without its is_available() call.
TORCH_FLAGS = "import torch; f = getattr(torch._C, '_cuda_getArchFlags', None); print((f() or '') if f else '')"


def timed(argv: list[str], env: dict) -> tuple[float, str]:
    """Seconds one run of `argv` took, and its stdout; exit codes other than 0 and 3 are errors."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 3):  # 3 is bootstrap's "cannot train", e.g. on a CPU-only machine
        sys.exit(f"{' '.join(argv)} failed with exit code {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds, done.stdout


def summary(times: list[float]) -> dict:
    return {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
            "max_s": round(max(times), 4), "runs_s": [round(t, 4) for t in times]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each command (default 7)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bootstrap_time.json"))
    args = parser.parse_args()

    cold, warm, baseline = [], [], []
    with tempfile.TemporaryDirectory() as warm_cache:
        warm_env = dict(os.environ, KIT_CACHE_DIR=warm_cache)
        facts = json.loads(timed(BOOTSTRAP_CMD, warm_env)[1])  # fills the warm cache
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as empty:  # a fresh cache: the first cell of a new session
                cold.append(timed(BOOTSTRAP_CMD, dict(os.environ, KIT_CACHE_DIR=empty))[0])
            warm.append(timed(BOOTSTRAP_CMD, warm_env)[0])
            baseline.append(timed(TORCH_CMD, warm_env)[0])
    from_torch = subprocess.run([sys.executable, "-c", TORCH_FLAGS], capture_output=True, text=True).stdout.split()

    result = {
        "machine": platform.node(),
        "gpus": [g["name"] for g in facts["gpus"]] or ["none (CPU only)"],
        "gpu_source": facts["gpu_source"],
        "torch": facts["torch"]["version"],
        "python": facts["python"],
        "runs": args.runs,
        "bootstrap_cold": summary(cold),
        "bootstrap_warm": summary(warm),
        "torch_import_is_available": summary(baseline),
        "ratio_warm_to_torch": round(statistics.median(warm) / statistics.median(baseline), 3),
        "ratio_cold_to_torch": round(statistics.median(cold) / statistics.median(baseline), 3),
        "target_ratio": TARGET_RATIO,
        "arch_list_kit": facts["torch"]["arch_list"],
        "arch_list_torch": from_torch,
    }
    result["arch_list_matches_torch"] = result["arch_list_kit"] == from_torch
    result["meets_target"] = max(result["ratio_warm_to_torch"], result["ratio_cold_to_torch"]) <= TARGET_RATIO

    rows = [("kit bootstrap --json, empty cache", *(summary(cold)[k] for k in ("median_s", "min_s", "max_s"))),
            ("kit bootstrap --json, warm cache", *(summary(warm)[k] for k in ("median_s", "min_s", "max_s"))),
            ("import torch; torch.cuda.is_available()",
             *(summary(baseline)[k] for k in ("median_s", "min_s", "max_s")))]
    print(f"machine {result['machine']}, GPUs {', '.join(result['gpus'])}, torch {result['torch']}, {args.runs} runs")
    print(f"{'command':<44} {'median s':>9} {'min s':>8} {'max s':>8}")
    for name, med, lo, hi in rows:
        print(f"{name:<44} {med:>9.3f} {lo:>8.3f} {hi:>8.3f}")
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"cold/torch = {result['ratio_cold_to_torch']}, warm/torch = {result['ratio_warm_to_torch']} "
          f"({verdict} the target ≤ {TARGET_RATIO}); arch list as torch reports it: {result['arch_list_matches_torch']}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
