"""Reading session records (`kit_sessions.jsonl`, the store's `kit/sessions.jsonl`): only usable ones.

`kit.train.sessions` writes one JSON line per session (fields in docs/CONTRACTS.md). Readers
(`kit status`, the goodput ledger, the progress plot, `kit schedule`) compute with its numbers, so
each line is judged once, here: a line that is not UTF-8, not JSON (a torn last line from a cut
write), not an object, or that has a field of the wrong type is skipped with a one-line warning.

    parse(raw, where) -> [record, ...]   # in file order; raw is the file's text or bytes
"""

from __future__ import annotations

import json
import logging
import math

from kit.files import parse_json

log = logging.getLogger("kit.checkpoints.status")

# Each field must be null/absent or of this type; they are what the readers compute with.
INTEGERS = ("start_step", "end_step", "max_steps", "stored_step", "world_size", "gpu_count")
NUMBERS = ("started", "ended", "setup_s", "step_s", "tokens_per_s", "peak_allocated_bytes",
           "peak_reserved_bytes", "peak_rss_bytes")
WORDS = ("run_id", "host", "outcome", "gpu_name")
HUGE = 2**53  # above any step count or byte count; floats stop counting exactly here
LATEST = 1e11  # epoch seconds (year 5138): later than this breaks time.gmtime and datetime
_TOP = {"started": LATEST, "ended": LATEST}


def is_number(value, top: float = HUGE) -> bool:
    """A finite int or float (not a bool) below `top` in size."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return abs(value) < top and (isinstance(value, int) or math.isfinite(value))


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < HUGE


def _field_ok(key: str, value) -> bool:
    if key in INTEGERS:
        return is_integer(value)
    if key in WORDS:
        return isinstance(value, str)
    return is_number(value, _TOP.get(key, HUGE))


def problem(rec) -> str | None:
    """Why a parsed record cannot be used (None: it can): not an object, or a field of the wrong type."""
    if not isinstance(rec, dict):
        return "is not a JSON object"
    for key in INTEGERS + NUMBERS + WORDS:
        value = rec.get(key)
        if value is not None and not _field_ok(key, value):
            kind = ("an integer" if key in INTEGERS else "text" if key in WORDS
                    else "a time in epoch seconds" if key in _TOP else "a finite number")
            return f"has {key}={json.dumps(value)[:40]}, not {kind}"
    return None


def _record(line: str | bytes) -> tuple[dict | None, str | None]:
    """(the record on `line`, None) or (None, why it is skipped); (None, None) for a blank line."""
    if not line.strip():
        return None, None
    try:
        rec = parse_json(line)
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except ValueError:
        return None, "is not valid JSON"
    why = problem(rec)
    return (None, why) if why else (rec, None)


def parse(raw: str | bytes | None, where: str = "sessions", warn=log.warning) -> list[dict]:
    """The usable records in `raw` (a file's text, or its bytes when they may not be UTF-8), in file order.

    Each skipped line is reported through `warn` as `<where> line N <why>; ignoring it`.
    """
    out = []
    for n, line in enumerate((raw or "").splitlines(), 1):
        rec, why = _record(line)
        if why:
            warn("%s line %d %s; ignoring it", where, n, why)
        elif rec is not None:
            out.append(rec)
    return out
