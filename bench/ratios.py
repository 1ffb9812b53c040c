"""The ratios a bench/speed.py results file holds: each row's speed and memory against one row, its
loss curve against another, step by step (rows of one file trained on the same batches).

    python bench/ratios.py bench/results/speed_h200_fill_compile_eager_rounding.json --to unsloth_direct --loss-vs plain
    python bench/ratios.py bench/results/speed_h200_chat_compile.json --to padding_free_liger --from-step 3

Speed: tokens/s (fill rows: the median step) or trained tokens/s (chat rows: the whole epoch); with
--from-step N, also the sum of the probe's step times from step N on (bench/trainer_probe.py), which
leaves the compiling first steps out. Losses: the mean and largest |relative difference| per step.

A file from `bench/speed.py --repeat N` holds each row once per pass (`NAME`, `NAME@2`, ...): a row
of pass k is compared with the --to row of the same pass, and a last line per configuration gives
its ratios pass by pass, their mean and the mean without pass 1 (which compiled from cold caches).

    python bench/ratios.py speed.json --to unsloth_direct --from-step 2
"""

from __future__ import annotations

import argparse
import json
import sys


def same_pass(rows: dict, base: str, name: str) -> dict:
    """The row `base` of `name`'s pass (`X@k` -> `base@k`), the first pass's where that pass has none."""
    k = name.partition("@")[2]
    return rows.get(f"{base}@{k}" if k else base) or rows[base]


def ratios(result: dict, to: str, loss_vs: str | None, from_step: int | None) -> list[dict]:
    rows = {r["name"]: r for r in result["rows"] if "error" not in r}
    if to not in rows or (loss_vs and loss_vs not in rows):
        raise SystemExit(f"no row {to if to not in rows else loss_vs!r} in the file: it has {sorted(rows)}")
    speed = "tokens_per_s" if "tokens_per_s" in rows[to] else "trained_tokens_per_s"
    out = []
    for name, r in rows.items():
        ref = same_pass(rows, to, name)
        line = {"name": name, "speed": r[speed], "speed_vs": round(r[speed] / ref[speed], 3),
                "memory_gib": r["peak_allocated_gib"],
                "memory_vs": round(r["peak_allocated_gib"] / ref["peak_allocated_gib"], 3)
                if ref["peak_allocated_gib"] else None}  # a CPU run records no GPU memory
        if from_step:
            mine, theirs = ((x.get("probe") or {}).get("step_s") for x in (r, ref))
            if mine and theirs:  # less time is more speed
                line["speed_vs_from_step"] = round(sum(theirs[from_step - 1:]) / sum(mine[from_step - 1:]), 3)
        if loss_vs:
            rel = [abs(a - b) / b for a, b in zip(r["losses"], same_pass(rows, loss_vs, name)["losses"])]
            if rel:
                line.update(loss_mean_rel_diff=round(sum(rel) / len(rel), 5), loss_max_rel_diff=round(max(rel), 5))
        out.append(line)
    return out + passes(out)


def passes(lines: list[dict]) -> list[dict]:
    """Per configuration run in more than one pass: its ratios pass by pass and their means."""
    by_config: dict[str, list[dict]] = {}
    for line in lines:
        by_config.setdefault(line["name"].partition("@")[0], []).append(line)
    out = []
    for config, runs in by_config.items():
        if len(runs) < 2:
            continue
        summary = {"config": config, "passes": len(runs)}
        for key in ("speed_vs", "speed_vs_from_step"):
            values = [x[key] for x in runs if key in x]
            if len(values) == len(runs):
                summary.update({key: values, f"{key}_mean": round(sum(values) / len(values), 3),
                                f"{key}_mean_after_pass_1": round(sum(values[1:]) / len(values[1:]), 3)})
        out.append(summary)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--to", required=True, help="the row speed and memory are divided by")
    p.add_argument("--loss-vs", help="the row whose losses the others' are compared with (default: --to)")
    p.add_argument("--from-step", type=int, help="also the step times from this step on (runs with --probe)")
    a = p.parse_args()
    with open(a.results) as f:
        result = json.load(f)
    for line in ratios(result, a.to, a.loss_vs or a.to, a.from_step):
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
