"""How `kit convert`'s time and memory grow with the size of a notebook's code cell.

    python bench/convert_scale.py --out bench/results/convert_scale_cpu.json [--sizes 1,2,5,10]

Writes notebooks with one code cell of N MB (plus a Trainer cell) in the shapes a big cell takes,
and converts each in a fresh process, recording its CPU seconds (user + system: steady on a busy
machine, where wall time is not) and its peak memory:

- `list`: a data literal, `ROWS = [{"q": "question 1", "a": "answer number 1"}, ...]`;
- `string`: one long string literal (an embedded file, base64);
- `statements`: N MB of small statements (`x_1 = [1, 1 + 1, 'abcdefghij' * 2]`), at smaller sizes.

Linear means the CPU seconds per MB stay flat as N grows. Target: a 10 MB data cell in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD = "from trl import SFTTrainer, SFTConfig\n"
TRAIN = "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'), train_dataset=d)\ntrainer.train()\n"
CHILD = """
import sys
from kit.notebooks.convert import convert_notebook
conversion = convert_notebook(sys.argv[1])
print(len(conversion.source))
"""


def cell(shape: str, mb: float) -> str:
    n = int(mb * 1_000_000)
    if shape == "list":
        rows, size, i = [], 0, 0
        while size < n:
            rows.append(f'{{"q": "question {i}", "a": "answer number {i}"}}')
            size += len(rows[-1]) + 2
            i += 1
        return "ROWS = [" + ", ".join(rows) + "]\n"
    if shape == "string":
        return "DATA = " + repr("abcdefghij " * (n // 11)) + "\n"
    lines, size, i = [], 0, 0
    while size < n:
        lines.append(f"x_{i} = [{i}, {i} + 1, 'abcdefghij' * 2]\n")
        size += len(lines[-1])
        i += 1
    return "".join(lines)


def notebook(path: str, source: str) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source},
             {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": TRAIN}]
    with open(path, "w") as f:
        json.dump({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, f)


def measure(path: str) -> dict:
    """CPU seconds and peak memory of one conversion in a fresh process."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, path], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its CPU time and peak memory
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"converting {path} failed: {err.read().decode()[-800:]}")
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_mb": round(usage.ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="1,2,5,10", help="MB, for the list and string shapes")
    parser.add_argument("--statement-sizes", default="0.05,0.1,0.2", help="MB, for the statements shape")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = os.path.join(tmp, "empty.ipynb")
        notebook(baseline, HEAD)
        start = measure(baseline)
        for shape, sizes in (("statements", args.statement_sizes), ("string", args.sizes), ("list", args.sizes)):
            for mb in [float(s) for s in sizes.split(",")]:
                path = os.path.join(tmp, f"{shape}_{mb}.ipynb")
                notebook(path, HEAD + cell(shape, mb))
                got = measure(path)
                cpu = max(0.0, got["cpu_s"] - start["cpu_s"])
                rows.append({"shape": shape, "mb": mb, "cpu_s": got["cpu_s"], "cpu_s_per_mb": round(cpu / mb, 2),
                             "peak_mb": got["peak_mb"]})
                print(json.dumps(rows[-1]), flush=True)
    result = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "startup_cpu_s": start["cpu_s"], "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
