"""When a schedule starts another session, and when it stops: one pure function for both the
local papermill runs and Kaggle kernels.

A session is described by what it left behind: its outcome words (the notebook's `outcome:` line,
or Kaggle's status), the step the store held before and after it, and the hours it used.

Example:
    >>> decide(Session("paused at step 40 of 60", before=20, after=40, hours=0.1), used_hours=0.1)
    Next(reason='paused at step 40 of 60')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MISSING_TOKEN = "missing HF_TOKEN"
_STEP_RE = re.compile(r"(?:paused at|complete:|already complete:) step (\d+)")


@dataclass
class Session:
    outcome: str  # "paused at step 40 of 60", "complete: …", "failed …", "cut: …"
    before: int | None = None  # the store's newest checkpoint before the session
    after: int | None = None  # … and after it
    hours: float = 0.0  # session (GPU) hours it used


@dataclass
class Next:
    reason: str


@dataclass
class Stop:
    reason: str
    ok: bool  # True: the job is complete (exit 0); False: the user must act (exit 1)


def words_of(record: dict) -> str:
    """A session record as the outcome words the stop rules read (`kit.notebooks.schedule.stops`)."""
    outcome, step, of = record.get("outcome"), record.get("end_step"), record.get("max_steps")
    if outcome == "paused":
        return f"paused at step {step} of {of}"
    if outcome in ("complete", "already complete"):
        return f"{outcome}: step {step} of {of}"
    return f"failed: {record.get('error') or outcome}"


def step_of(outcome: str) -> int | None:
    m = _STEP_RE.search(outcome or "")
    return int(m.group(1)) if m else None


def decide(session: Session, *, used_hours: float, max_hours: float | None = None, next_hours: float = 0.0,
           complete: bool = False, log_tail: str = "") -> Next | Stop:
    """What to do after `session`.

    Args:
        used_hours: GPU hours all sessions so far used, this one included.
        max_hours: the quota to stay under (`--max-gpu-hours`).
        next_hours: how long the next session may take (the longest so far): it is started only
            if it still fits under `max_hours`.
        complete: the store says the job is complete.
        log_tail: the session's last log lines, quoted when it made no progress.
    """
    outcome = session.outcome or ""
    if complete or outcome.startswith(("complete", "already complete")):
        return Stop(f"complete ({outcome})", ok=True)
    if MISSING_TOKEN in outcome:
        return Stop(f"the session had no Hugging Face token: {outcome.split(MISSING_TOKEN, 1)[1].lstrip(': ')}",
                    ok=False)
    progressed = session.after is not None and (session.before is None or session.after > session.before)
    if not progressed:
        why = outcome if outcome else "no outcome"
        last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "")
        return Stop(f"the session made no progress (the store stayed at step {session.before}): {why}"
                    + (f"; its log ends: {last[:200]}" if last and last not in why else ""), ok=False)
    if max_hours is not None and used_hours + max(next_hours, 0.0) > max_hours:
        return Stop(quota_words(used_hours, max_hours, next_hours), ok=False)
    if outcome.startswith("failed"):  # it progressed, then failed: a cut, not a broken job
        return Next(f"cut at step {session.after} ({outcome[:200]})")
    return Next(outcome)


def quota_words(used_hours: float, max_hours: float, next_hours: float) -> str:
    return (f"the GPU quota is nearly spent: {used_hours:.2f} h used of --max-gpu-hours {max_hours:g}, "
            f"and a session takes up to {next_hours:.2f} h")
