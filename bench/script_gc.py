"""The CPU time of the generated script's whole run with and without its garbage-collection lines.

    python bench/script_gc.py --out bench/results/script_gc_cpu.json [--runs 4]

The script renders `gc.disable()` before the libraries load and `gc.collect(); gc.freeze();
gc.enable()` after them. This runs the tiny default (`python train_ddp.py`, one process, the CPU,
60 steps, its evaluation and final/) as rendered, and a copy with those lines taken out,
interleaved, and records each run's user + sys CPU seconds (`resource.getrusage` of the child).
Also times the imports alone the same two ways. Only the standard library is used here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GC_LINES = ("import gc\n", "gc.disable()", "gc.collect()\n", "gc.freeze()\n", "gc.enable()\n")
IMPORTS = ("from peft import LoraConfig\nfrom transformers import BitsAndBytesConfig, set_seed\n"
           "from trl import SFTConfig, SFTTrainer\nfrom kit.train.job import Job\n")


def without_gc_lines(source: str) -> str:
    kept = [line for line in source.splitlines(keepends=True) if not line.startswith(GC_LINES)]
    assert len(kept) == len(source.splitlines()) - len(GC_LINES), "the script's gc lines were not all found"
    return "".join(kept)


def child_cpu(argv: list[str], env: dict, cwd: Path) -> float:
    """user + sys CPU seconds of one child process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "KIT_PLATFORM": "local", "PYTHONPATH": str(ROOT)}
    work = Path(tempfile.mkdtemp(prefix="kit-gc-"))
    rendered = (ROOT / "train_ddp.py").read_text()
    scripts = {"as_rendered": ROOT / "train_ddp.py", "without_gc_lines": work / "train_ddp_no_gc.py"}
    scripts["without_gc_lines"].write_text(without_gc_lines(rendered))
    imports = {"as_rendered": f"import gc\ngc.disable()\n{IMPORTS}gc.collect()\ngc.freeze()\ngc.enable()\n",
               "without_gc_lines": IMPORTS}
    runs = {name: [] for name in scripts}
    import_runs = {name: [] for name in scripts}
    for i in range(a.runs):
        for name, script in scripts.items():
            out = work / f"{name}-{i}"
            runs[name].append(child_cpu([sys.executable, str(script), f"output_dir={out}"], env, ROOT))
            import_runs[name].append(child_cpu([sys.executable, "-c", imports[name]], env, ROOT))
            print(f"[bench] {name} run {i}: {runs[name][-1]} CPU-s, imports {import_runs[name][-1]} CPU-s", flush=True)
    med = {n: statistics.median(v) for n, v in runs.items()}
    imp = {n: statistics.median(v) for n, v in import_runs.items()}
    result = {
        "what": "user + sys CPU seconds of `python train_ddp.py` (the tiny default, one process, CPU: 60 steps, "
                "baseline and final evaluation, final/) as rendered and with its gc lines taken out, interleaved; "
                "and of the script's imports alone, the same two ways",
        "command": f"python bench/script_gc.py --out OUT --runs {a.runs}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "whole_run_cpu_s": runs, "imports_cpu_s": import_runs,
        "median_whole_run_cpu_s": med, "median_imports_cpu_s": imp,
        "saved_whole_run_cpu_s": round(med["without_gc_lines"] - med["as_rendered"], 2),
        "saved_imports_cpu_s": round(imp["without_gc_lines"] - imp["as_rendered"], 2),
    }
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[bench] whole run {med} imports {imp} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
