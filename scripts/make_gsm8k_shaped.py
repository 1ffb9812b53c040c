"""Write data/gsm8k_shaped.jsonl: 40 made-up word problems in GSM8K's row shape (`question`; `answer` with
worked steps, calculator annotations and the final number after `#### `), for
configs/qwen3-4b-grpo-kaggle-t4x2.yaml and its rewards (configs/gsm8k_rewards.py). No GSM8K text is used.

    python scripts/make_gsm8k_shaped.py
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "gsm8k_shaped.jsonl"


def main() -> None:
    rng = random.Random(0)
    items = ["apples", "pencils", "stickers", "marbles", "books", "cookies"]
    names = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]
    rows = []
    for _ in range(40):
        n, it = rng.choice(names), rng.choice(items)
        a, b, c = rng.randint(3, 40), rng.randint(2, 9), rng.randint(1, 20)
        total = a * b - c
        q = (f"{n} buys {b} boxes of {it} with {a} {it} in each box and gives {c} {it} away. "
             f"How many {it} does {n} have left?")
        ans = (f"{n} buys {b} * {a} = <<{b}*{a}={a*b}>>{a*b} {it}.\n"
               f"After giving {c} away, {n} has {a*b} - {c} = <<{a*b}-{c}={total}>>{total} {it}.\n#### {total}")
        rows.append({"question": q, "answer": ans})
    with open(OUT, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
