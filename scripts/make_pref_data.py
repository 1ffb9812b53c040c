"""Generate kit's embedded preference data from the same Home Assistant requests as the SFT default.

For each request (scripts/make_ha_data.py) the right service call is the preferred answer and a
plausible wrong one the dispreferred: the opposite action, another room's entity, or prose where
JSON was asked for. Built from the word lists with a fixed seed, so re-running gives the same bytes:

    python scripts/make_pref_data.py     # writes data/prefs_tiny.jsonl (dpo) and data/kto_tiny.jsonl (kto)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_ha_data import SYSTEM, examples, write_jsonl  # noqa: E402

OPPOSITE = {"turn_on": "turn_off", "turn_off": "turn_on", "open_cover": "close_cover", "close_cover": "open_cover",
            "lock": "unlock", "unlock": "lock", "media_play": "media_pause", "media_pause": "media_play"}
PROSE = ["Sure! I've taken care of that for you.", "Done, enjoy your evening!", "I can't do that right now.",
         "Okay, working on it."]


def wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer to the request whose right answer is `answer`."""
    call = json.loads(answer)
    domain, service = call["service"].split(".")
    kind = rng.randrange(3)
    if kind == 0 and service in OPPOSITE:
        call["service"] = f"{domain}.{OPPOSITE[service]}"
    elif kind <= 1:
        entity = call["target"]["entity_id"]
        others = ["kitchen", "office", "garage", "bedroom"]
        room = next(r for r in rng.sample(others, len(others)) if not entity.endswith(r))
        call["target"]["entity_id"] = f"{entity.split('.')[0]}.{room}"
    else:
        return rng.choice(PROSE)
    return json.dumps(call, separators=(",", ":"))


def prompt(request: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def main() -> None:
    here = Path(__file__).resolve().parent.parent / "data"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=str(here / "prefs_tiny.jsonl"))
    parser.add_argument("--kto", default=str(here / "kto_tiny.jsonl"))
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = examples()
    rng.shuffle(rows)
    rows = rows[: args.rows]
    pairs = [{"prompt": prompt(q), "chosen": answer(a), "rejected": answer(wrong(a, rng))} for q, a in rows]
    # KTO: the same requests, each with either its right answer (desirable) or a wrong one, half and half.
    kto = [{"prompt": prompt(q), "completion": answer(a if i % 2 == 0 else wrong(a, rng)), "label": i % 2 == 0}
           for i, (q, a) in enumerate(rows)]
    for path, items in ((Path(args.pairs), pairs), (Path(args.kto), kto)):
        write_jsonl(path, items)


if __name__ == "__main__":
    main()
