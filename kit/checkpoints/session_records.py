"""The session record: one JSON line per training session, `output_dir/kit_sessions.jsonl` and the
store's `kit/sessions.jsonl` (fields in docs/CONTRACTS.md). Written and read here alone.

    of_session(run_id=..., ...)           # a session's record, at its end (or when it fails)
    of_cut(lease)                         # the record of a session cut by kill -9, from its lease
    append(output_dir, store, record)     # the line appended locally and, with a store, in the store
    read(path) -> [record, ...]           # the usable records of a local file, in file order ([] if none)
    parse(raw, where) -> [record, ...]    # the same of a file's text or bytes

Readers (`kit status`, the goodput ledger, the progress plot, `kit schedule`, the closing lines)
compute with its numbers, so each line is judged once, here: a line that is not UTF-8, not JSON (a
torn last line from a cut write), not an object, or that has a field of the wrong type is skipped
with a one-line warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path

from kit.errors import KitError
from kit.files import parse_json

log = logging.getLogger("kit.checkpoints.status")

LOCAL = "kit_sessions.jsonl"  # in output_dir
IN_STORE = "sessions.jsonl"   # in the store's kit/ folder

# Each field must be null/absent or of this type; they are what the readers compute with.
INTEGERS = ("start_step", "end_step", "max_steps", "stored_step", "world_size", "gpu_count")
NUMBERS = ("started", "ended", "setup_s", "step_s", "tokens_per_s", "peak_allocated_bytes",
           "peak_reserved_bytes", "peak_rss_bytes")
WORDS = ("run_id", "host", "outcome", "gpu_name")
HUGE = 2**53  # above any step count or byte count; floats stop counting exactly here
LATEST = 1e11  # epoch seconds (year 5138): later than this breaks time.gmtime and datetime
_TOP = {"started": LATEST, "ended": LATEST}


def of_session(*, run_id: str | None, started: float, start_step: int, end_step: int, max_steps: int | None,
               outcome: str, setup_s: float | None, stored_step: int | None, devices: dict,
               measured: dict | None = None) -> dict:
    """The record of this session (on this host, ending now): `devices` is gpu_name, gpu_count and
    world_size; `measured` what the training meter and the wrap-up add."""
    return {"run_id": run_id, "host": socket.gethostname(), "started": started, "ended": time.time(),
            "start_step": start_step, "end_step": end_step, "max_steps": max_steps,
            "world_size": devices.get("world_size"), "outcome": outcome, "setup_s": setup_s,
            "stored_step": stored_step, **devices, **(measured or {})}


def of_cut(lease: dict) -> dict | None:
    """The record of the session whose lease we took over: it was cut (kill -9) and recorded nothing.

    Its last heartbeat is all we know: ``ended`` and ``end_step`` are as of then, at most one
    heartbeat interval (``lease_heartbeat_seconds``) before the cut. None for a lease from before
    training began (or an older kit): nothing to account.
    """
    progress = lease.get("progress") or {}
    if not isinstance(progress, dict) or "step" not in progress:
        return None
    return {"host": str(lease.get("holder", "?")).rpartition(" pid ")[0] or "?",
            "started": progress.get("started"), "ended": lease.get("heartbeat"),
            "start_step": progress.get("start_step"), "end_step": progress.get("step"),
            "max_steps": progress.get("max_steps"), "world_size": progress.get("world_size"),
            "outcome": "cut", "setup_s": progress.get("setup_s"),
            "stored_step": progress.get("stored_step"), "gpu_name": progress.get("gpu_name"),
            "gpu_count": progress.get("gpu_count"), "from": "its last lease heartbeat"}


def append(output_dir, store, record: dict) -> None:
    """`record` as one line of `output_dir/kit_sessions.jsonl` and, with a store, of its `kit/sessions.jsonl`."""
    line = json.dumps(record) + "\n"
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, LOCAL), "a") as f:
        f.write(line)
    if store is not None:
        try:
            store.append_text(IN_STORE, line)
        except KitError as e:  # the checkpoint is what matters; a lost record is only a warning
            print(f"[kit] warning: could not record the session in the store: {e}", file=sys.stderr)


def read(path) -> list[dict]:
    """The usable records of the local file `path` (`output_dir/kit_sessions.jsonl`), in file order;
    [] when there is no such file yet."""
    path = Path(path)
    return parse(path.read_bytes(), str(path)) if path.is_file() else []


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
