"""Run a job on Kaggle, one session at a time: push the run notebook, poll, fetch, decide.

Each session's output (`kit-outcome.json`, the log) is kept in `runs/<UTC stamp>-<n>/`, and the
hours it used in `runs/kaggle-sessions.jsonl`, so a schedule started by cron every hour counts the
week's GPU hours across its invocations. The store, not the kernel, says how far the job is.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kit.auth import scrub_file
from kit.files import parse_json
from kit.notebooks.schedule import kaggle_api, stops
from kit.notebooks.schedule.kaggle_notebook import OUTCOME_FILE
from kit.retry import retry

log = logging.getLogger("kit.notebooks.schedule")

POLL_S = (10, 20, 30, 60)  # then every 60 s
TEXT_SUFFIXES = (".log", ".txt", ".json", ".jsonl", ".ipynb", ".md", ".py", ".yaml", ".csv")
RETRY_S = (30, 60, 120)  # a status poll or the output download that got no answer is asked again after these
SESSION_LIMIT_S = 12.5 * 3600  # Kaggle ends a GPU session after 12 h
HOURS_FILE = "kaggle-sessions.jsonl"
WEEK_S = 7 * 24 * 3600
TERMINAL = ("complete", "error", "cancelAcknowledged")


@dataclass
class KaggleJob:
    ref: str  # USER/SLUG
    folder: Path  # the prepared notebook + kernel-metadata.json
    runs_dir: Path
    progress: Callable[[], tuple[int | None, bool]]  # the store's newest step, and whether the job is complete
    poll_s: tuple[float, ...] = POLL_S
    retry_s: tuple[float, ...] = RETRY_S


def hours_this_week(runs_dir: Path, now: float) -> tuple[float, float]:
    """(GPU hours used in the last 7 days, the longest session) from earlier sessions' records."""
    path = Path(runs_dir) / HOURS_FILE
    used = longest = 0.0
    for n, line in enumerate(path.read_bytes().splitlines() if path.is_file() else [], 1):
        if not line.strip():
            continue
        rec = _hours_record(line)
        if rec is None:  # a torn line from a cut write, or one that is not kit's
            log.warning("%s line %d is not a record of a session's hours; ignoring it", path, n)
        elif now - rec["ended"] < WEEK_S:
            used += rec["hours"]
            longest = max(longest, rec["hours"])
    return used, longest


def _hours_record(line: bytes) -> dict | None:
    """One line of HOURS_FILE with a numeric `ended` and `hours`; None for anything else."""
    from kit.checkpoints.session_records import is_number

    try:
        rec = parse_json(line)
    except ValueError:  # UnicodeDecodeError too
        return None
    if not isinstance(rec, dict) or not is_number(rec.get("ended")) or not is_number(rec.get("hours")):
        return None
    return rec


def _read_outcome(folder: Path) -> dict | None:
    try:
        data = parse_json((folder / OUTCOME_FILE).read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _log_tail(folder: Path, ref: str, outcome: dict | None) -> str:
    if outcome and outcome.get("log_tail"):
        return outcome["log_tail"]
    log = folder / f"{ref.split('/')[1]}.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""


def run_session(job: KaggleJob, n: int, *, say=print, sleep=time.sleep,
                clock=time.time) -> tuple[stops.Session, bool, str]:
    """Push, wait for the kernel to end, fetch its output. Returns (session, complete, log tail)."""
    before, _ = job.progress()
    started = clock()
    running = kaggle_api.current(job.ref)
    if running is not None and running.state in ("queued", "running"):
        # Started elsewhere (the web UI, another machine's schedule): wait for it, never push over it.
        version = None
        say(f"session {n}: {job.ref} is already {running.state}; waiting for that session instead of pushing",
            flush=True)
    else:
        version = kaggle_api.push(job.folder)
        say(f"session {n}: pushed {job.ref} (version {version}); waiting for it to run", flush=True)
    waits = list(job.poll_s)
    while True:
        # Hours into a session, one unanswered poll must not end the schedule: ask again (a
        # refusal is not retried). Pushing is not idempotent, so it is never retried.
        state = retry(lambda: kaggle_api.status(job.ref), pauses=job.retry_s, what=f"asking Kaggle about {job.ref}",
                      transient=(kaggle_api.KaggleUnavailable,), log=log, sleep=sleep)
        if state.state in TERMINAL:
            break
        if clock() - started > SESSION_LIMIT_S:
            raise kaggle_api.KaggleError(f"{job.ref} still reports {state.state} after "
                                         f"{SESSION_LIMIT_S / 3600:.1f} h: look at it on kaggle.com")
        sleep(waits.pop(0) if len(waits) > 1 else waits[0])
    ended = clock()
    hours = (ended - started) / 3600
    with open(Path(job.runs_dir) / HOURS_FILE, "a") as f:
        f.write(json.dumps({"ref": job.ref, "version": version, "started": started, "ended": ended,
                            "hours": hours, "state": state.state}) + "\n")
    folder = Path(job.runs_dir) / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(ended))}-{n}"
    retry(lambda: kaggle_api.output(job.ref, folder), pauses=job.retry_s, what=f"fetching {job.ref}'s output",
          transient=(kaggle_api.KaggleUnavailable,), log=log, sleep=sleep)
    for f in folder.rglob("*"):  # the kernel's log and text files: a cell may have printed a token
        if f.suffix in TEXT_SUFFIXES and f.is_file():
            scrub_file(f)
    record = _read_outcome(folder)
    session = (record or {}).get("session")
    if (record or {}).get("returncode") == 0 and isinstance(session, dict) and session.get("outcome") in (
            "paused", "complete", "already complete"):
        outcome = stops.words_of(session)  # the session record the job wrote, not the words it printed
    else:  # a failed session (or one that left no record): the kernel's own words say why
        outcome = (record or {}).get("outcome") or (
            f"failed: kernel {state.state}" + (f": {state.message}" if state.message else "") + " (no kit-outcome.json)")
    after, complete = job.progress()
    return stops.Session(outcome, before, after, hours), complete, _log_tail(folder, job.ref, record)


def loop(job: KaggleJob, *, repeat: bool, max_hours: float | None, say=print, sleep=time.sleep,
         clock=time.time) -> int:
    """Sessions until a stop rule says stop (or one, without `repeat`). 0: complete or paused; 1: stopped."""
    Path(job.runs_dir).mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        n += 1
        used, longest = hours_this_week(job.runs_dir, clock())
        if max_hours is not None and used + longest > max_hours:
            say(f"stopped: {stops.quota_words(used, max_hours, longest)}", flush=True)
            return 1
        session, complete, tail = run_session(job, n, say=say, sleep=sleep, clock=clock)
        used, longest = hours_this_week(job.runs_dir, clock())
        say(f"session {n}: outcome: {session.outcome}  (store step {session.before} → {session.after}; "
            f"{session.hours:.2f} h, {used:.2f} h this week)", flush=True)
        decision = stops.decide(session, used_hours=used, max_hours=max_hours, next_hours=longest,
                                complete=complete, log_tail=tail)
        if isinstance(decision, stops.Stop):
            say(f"{'done' if decision.ok else 'stopped'}: {decision.reason}", flush=True)
            return 0 if decision.ok else 1
        if not repeat:
            return 0
