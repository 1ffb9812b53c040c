"""Generate kit's embedded GRPO prompts from the same Home Assistant requests as the SFT default.

Each row is a request as chat messages (the system line and the user's request) and the service
call it asks for, in a column `answer` the reward functions of configs/grpo_rewards.py read. Built
from the word lists with a fixed seed, so re-running gives the same bytes:

    python scripts/make_prompt_data.py     # writes data/grpo_prompts.jsonl (trainer grpo)
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_ha_data import SYSTEM, examples, write_jsonl  # noqa: E402


def main() -> None:
    here = Path(__file__).resolve().parent.parent / "data"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(here / "grpo_prompts.jsonl"))
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = examples()
    rng.shuffle(rows)
    items = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], "answer": a}
             for q, a in rows[: args.rows]]
    write_jsonl(Path(args.out), items)


if __name__ == "__main__":
    main()
