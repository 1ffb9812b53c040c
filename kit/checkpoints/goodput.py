"""The goodput ledger: of the GPU time a job's sessions used, how much trained steps that stayed.

A pure function of the session records (`kit.train.job` writes one per session; a session cut with
kill -9 writes none, so the session that takes its lease over writes one for it from the cut
holder's last heartbeat, `outcome: "cut"`).

Per session: its span (start → end), setup (start → first training step: install, model load,
resume download), steps done, steps lost (done, but redone by the next session because they never
reached the store), time lost (those steps at the session's speed). Over the job: goodput =
useful training time ÷ time used (both weighted by the session's processes — GPUs), steps
recomputed, GPU hours spent, hours left at the latest speed, sessions still needed.

Example:
    >>> led = ledger(status["sessions"], max_steps=200, latest_step=120)
    >>> led["goodput"], led["steps_recomputed"], led["hours_left"], led["sessions_needed"]
"""

from __future__ import annotations

import math


def _num(value) -> float | None:
    """A finite number as a float; None for anything else (`kit.checkpoints.session_records` has already
    skipped records with such fields: this keeps the ledger total for callers that did not)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63 else None


def session_ledger(rec: dict, next_rec: dict | None) -> dict:
    """One session's share of the ledger (None where its record lacks the facts)."""
    started, ended = _num(rec.get("started")), _num(rec.get("ended"))
    span = ended - started if started is not None and ended is not None else None
    setup = _num(rec.get("setup_s"))
    start_step, end_step = _num(rec.get("start_step")) or 0, _num(rec.get("end_step"))
    done = int(end_step - start_step) if end_step is not None else None
    if next_rec is not None and _num(next_rec.get("start_step")) is not None and end_step is not None:
        lost = max(0, int(end_step - _num(next_rec["start_step"])))  # the next session redid them
    elif end_step is not None and _num(rec.get("stored_step")) is not None:
        lost = max(0, int(end_step - _num(rec["stored_step"])))  # no next session yet: what never reached the store
    else:
        lost = 0
    train = span - setup if span is not None and setup is not None else span
    step_s = train / done if train is not None and done else _num(rec.get("step_s"))
    time_lost = lost * step_s if step_s else 0.0
    weight = int(_num(rec.get("gpu_count")) or _num(rec.get("world_size")) or 1)
    on_cpu = _num(rec.get("gpu_count")) == 0 or rec.get("gpu_name") == "cpu"  # its processes' time, not GPUs'
    return {"span_s": span, "setup_s": setup, "train_s": train, "start_step": int(start_step),
            "end_step": int(end_step) if end_step is not None else None, "steps_done": done, "steps_lost": lost,
            "time_lost_s": time_lost, "step_s": step_s, "weight": weight, "on_cpu": on_cpu,
            "outcome": rec.get("outcome"),
            "goodput": (max(0.0, train - time_lost) / span) if span and train is not None else None}


def ledger(sessions: list[dict], *, max_steps: int | None, latest_step: int | None,
           session_hours: float = 12.0) -> dict:
    """The job's ledger from its session records (oldest first): per session and in total."""
    runs = [s for s in sessions if s.get("outcome") != "already complete"]
    rows = [session_ledger(r, runs[i + 1] if i + 1 < len(runs) else None) for i, r in enumerate(runs)]
    timed = [r for r in rows if r["span_s"] is not None]
    used = sum(r["span_s"] * r["weight"] for r in timed)
    useful = sum(max(0.0, (r["train_s"] or 0.0) - r["time_lost_s"]) * r["weight"] for r in timed)
    setup = [r["setup_s"] for r in timed if r["setup_s"] is not None]
    step_s = next((r["step_s"] for r in reversed(rows) if r["step_s"]), None)
    left_steps = max(0, (max_steps or 0) - (latest_step or 0)) if max_steps else None
    hours_left = left_steps * step_s / 3600 if left_steps is not None and step_s else None
    if hours_left is None:
        needed = None
    elif left_steps == 0:
        needed = 0
    else:
        per_session = max(1e-9, session_hours - (max(setup) if setup else 0.0) / 3600)
        needed = math.ceil(hours_left / per_session)
    return {"sessions": rows, "goodput": useful / used if used else None,
            "useful_gpu_hours": useful / 3600, "gpu_hours": used / 3600,
            "steps_recomputed": sum(r["steps_lost"] for r in rows),
            "setup_s": sum(setup), "hours_left": hours_left, "sessions_needed": needed,
            "session_hours": session_hours, "on_cpu": bool(rows) and all(r["on_cpu"] for r in rows)}


def words(led: dict) -> str | None:
    """One line, e.g. `91.2 % goodput: 1.31 of 1.44 GPU h trained steps that stayed; 14 steps recomputed;
    42 s of setup; ~2.10 h left at the latest speed (1 more session of 12 h)` ("process h" on a CPU)."""
    if led.get("goodput") is None:
        return None
    unit = "process h" if led.get("on_cpu") else "GPU h"  # a CPU run's hours are its processes'
    redone = led["steps_recomputed"]
    out = (f"{100 * led['goodput']:.1f} % goodput: {led['useful_gpu_hours']:.2f} of {led['gpu_hours']:.2f} {unit} "
           f"trained steps that stayed; {redone} step{'s' if redone != 1 else ''} recomputed; "
           f"{led['setup_s']:.0f} s of setup")
    if led.get("hours_left") is not None:
        more = led["sessions_needed"]
        out += (f"; ~{led['hours_left']:.2f} h left at the latest speed"
                + (f" ({more} more session{'s' if more != 1 else ''} of {led['session_hours']:g} h)" if more else ""))
    return out
