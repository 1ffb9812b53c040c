"""The ratios a bench/speed.py results file holds: each row's speed and memory against one row, its
loss curve against another, step by step (rows of one file trained on the same batches).

    python bench/ratios.py bench/results/speed_h200_session10_fill_casts.json --to unsloth_direct --loss-vs plain
    python bench/ratios.py bench/results/speed_h200_session10_chat_compile.json --to padding_free_liger --from-step 3

Speed: tokens/s (fill rows: the median step) or trained tokens/s (chat rows: the whole epoch); with
--from-step N, also the sum of the probe's step times from step N on (bench/trainer_probe.py), which
leaves the compiling first steps out. Losses: the mean and largest |relative difference| per step.
"""

from __future__ import annotations

import argparse
import json
import sys


def ratios(result: dict, to: str, loss_vs: str | None, from_step: int | None) -> list[dict]:
    rows = {r["name"]: r for r in result["rows"] if "error" not in r}
    if to not in rows or (loss_vs and loss_vs not in rows):
        raise SystemExit(f"no row {to if to not in rows else loss_vs!r} in the file: it has {sorted(rows)}")
    speed = "tokens_per_s" if "tokens_per_s" in rows[to] else "trained_tokens_per_s"
    out = []
    for name, r in rows.items():
        line = {"name": name, "speed": r[speed], "speed_vs": round(r[speed] / rows[to][speed], 3),
                "memory_gib": r["peak_allocated_gib"],
                "memory_vs": round(r["peak_allocated_gib"] / rows[to]["peak_allocated_gib"], 3)}
        if from_step:
            mine, theirs = ((x.get("probe") or {}).get("step_s") for x in (r, rows[to]))
            if mine and theirs:  # less time is more speed
                line["speed_vs_from_step"] = round(sum(theirs[from_step - 1:]) / sum(mine[from_step - 1:]), 3)
        if loss_vs:
            rel = [abs(a - b) / b for a, b in zip(r["losses"], rows[loss_vs]["losses"])]
            if rel:
                line.update(loss_mean_rel_diff=round(sum(rel) / len(rel), 5), loss_max_rel_diff=round(max(rel), 5))
        out.append(line)
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
