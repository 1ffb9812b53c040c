"""Generate kit's embedded dataset: Home-Assistant-style commands as chat examples.

Each example is a user request in plain English and the assistant's answer, a Home Assistant
service call as compact JSON. Everything is built from the word lists below with a fixed seed,
so re-running this script gives the same bytes:

    python scripts/make_ha_data.py            # writes data/ha_commands.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

SYSTEM = "You turn requests into Home Assistant service calls. Answer with JSON only."

ROOMS = ["kitchen", "living room", "bedroom", "office", "hallway", "bathroom", "garage", "porch"]
LIGHT_ON = ["turn on the {room} lights", "switch on the {room} light", "lights on in the {room}",
            "can you turn the {room} lights on", "please light up the {room}"]
LIGHT_OFF = ["turn off the {room} lights", "switch off the {room} light", "lights off in the {room}",
             "kill the lights in the {room}", "please turn the {room} lights off"]
DIM = ["dim the {room} lights to {pct} percent", "set the {room} light to {pct}%",
       "{room} lights at {pct} percent please"]
TEMP = ["set the {room} thermostat to {deg} degrees", "make the {room} {deg} degrees",
        "heat the {room} to {deg}"]
COVER = {"open": ["open the {room} blinds", "raise the {room} shades"],
         "close": ["close the {room} blinds", "lower the {room} shades"]}
LOCK = {"lock": ["lock the {door} door", "make sure the {door} door is locked"],
        "unlock": ["unlock the {door} door", "let me in through the {door} door"]}
DOORS = ["front", "back", "garage", "side"]
MEDIA = {"media_play": ["play music in the {room}", "resume the {room} speaker"],
         "media_pause": ["pause the {room} speaker", "stop the music in the {room}"]}


def _entity(domain: str, name: str) -> str:
    return f"{domain}.{name.replace(' ', '_')}"


def _call(service: str, entity_id: str, **data) -> str:
    call = {"service": service, "target": {"entity_id": entity_id}}
    if data:
        call["data"] = data
    return json.dumps(call, separators=(",", ":"))


def examples() -> list[tuple[str, str]]:
    """Every (request, answer) pair the word lists produce, in a fixed order."""
    out = []
    for room, t in itertools.product(ROOMS, LIGHT_ON):
        out.append((t.format(room=room), _call("light.turn_on", _entity("light", room))))
    for room, t in itertools.product(ROOMS, LIGHT_OFF):
        out.append((t.format(room=room), _call("light.turn_off", _entity("light", room))))
    for room, t, pct in itertools.product(ROOMS, DIM, [10, 25, 40, 50, 75]):
        out.append((t.format(room=room, pct=pct),
                     _call("light.turn_on", _entity("light", room), brightness_pct=pct)))
    for room, t, deg in itertools.product(ROOMS, TEMP, [18, 19, 20, 21, 22, 23]):
        out.append((t.format(room=room, deg=deg),
                     _call("climate.set_temperature", _entity("climate", room), temperature=deg)))
    for (action, templates), room in itertools.product(COVER.items(), ROOMS):
        for t in templates:
            out.append((t.format(room=room), _call(f"cover.{action}_cover", _entity("cover", room))))
    for (action, templates), door in itertools.product(LOCK.items(), DOORS):
        for t in templates:
            out.append((t.format(door=door), _call(f"lock.{action}", _entity("lock", f"{door} door"))))
    for (service, templates), room in itertools.product(MEDIA.items(), ROOMS):
        for t in templates:
            out.append((t.format(room=room), _call(f"media_player.{service}", _entity("media_player", room))))
    return out


def to_chat(request: str, answer: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": request},
                         {"role": "assistant", "content": answer}]}


def write_jsonl(path: Path, items: list[dict], what: str = "rows") -> None:
    """One JSON object per line, UTF-8 as is; the folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"wrote {len(items)} {what} to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data" / "ha_commands.jsonl"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = examples()
    random.Random(args.seed).shuffle(rows)
    write_jsonl(Path(args.out), [to_chat(request, answer) for request, answer in rows], "examples")


if __name__ == "__main__":
    main()
