"""How far a job is, as plain data: what its store (or output_dir) holds, its sessions, its lease.

`gather(cfg)` reads; `format_text(status)` words it. Nothing here writes, and nothing imports
torch, so `kit status` is safe in a notebook kernel next to a running job.

Example:
    >>> from kit import config, status
    >>> s = status.gather(config.load("configs/default.yaml", ["store=hf://me/x"]))
    >>> s["latest_step"], s["max_steps"], s["complete"]
    (40, 200, False)
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from kit.checkpoints import goodput, resume, session_records
from kit.checkpoints.session_records import is_integer, is_number
from kit.errors import StoreError, UsageError, shown
from kit.files import GIB, parse_json, regular_file

log = logging.getLogger("kit.checkpoints.status")

SESSIONS_LOCAL = session_records.LOCAL
SESSIONS_STORE = session_records.IN_STORE


def gather(cfg, now: float | None = None, steps_given: bool = False) -> dict:
    """Facts about the job `cfg` describes.

    Returns:
        A JSON-able dict: ``store`` (its description, or None), ``output_dir``, ``checkpoints``
        (steps present, ascending), ``verified`` (each checkpoint newest first: step, where, state
        ``verified`` | ``invalid``, why), ``latest_step`` (the newest that verifies, or None), ``final_step`` (of
        the final/ folder, or None), ``max_steps``, ``complete`` (the target reached and final/ of it
        written), ``progress`` (0..1 or None), ``run_id`` (None before the first start),
        ``log_history`` (the newest checkpoint's Trainer log: loss by step), ``rewards`` (trainer grpo: the mean
        reward TRL logged at each step, and each reward function's, `reward_history`; [] otherwise), ``sessions`` (the session records, oldest
        first), ``lease`` (holder, since, heartbeat, heartbeat_age_s, released; None when the job
        never took one) and ``warnings``.
    `steps_given`: max_steps came from the command line, so it is the target (resume.current_target).

    Raises:
        StoreError, UsageError: the store cannot be opened or read.
    """
    now = time.time() if now is None else now
    warnings: list[str] = []
    if cfg.store:
        facts = _from_store(cfg, now)
    else:
        facts = _from_output_dir(cfg, warnings)
    # The same rule as resume.choose, so status, the script and schedule name one target.
    state_max_steps = facts.pop("state_max_steps", None)
    latest = facts["latest_step"]
    recorded = max((m for m in (state_max_steps, _last_max_steps(facts["sessions"])) if m), default=None)
    max_steps = resume.current_target(cfg.max_steps, latest, recorded, steps_given)
    facts.update(
        output_dir=cfg.output_dir,
        max_steps=max_steps,
        # At the target, the job is complete once its wrap-up wrote final/ of that step (resume.wrapped_up).
        complete=bool(max_steps) and latest is not None and latest >= max_steps and facts["final_step"] == latest,
        progress=(min(1.0, (latest or 0) / max_steps) if max_steps else None),
        warnings=warnings + facts.get("warnings", []),
    )
    facts["goodput"] = goodput.ledger(facts["sessions"], max_steps=max_steps, latest_step=latest)
    facts["rewards"] = reward_history(facts["log_history"])
    return facts


REWARD_KEY = re.compile(r"rewards/(.+)/mean")  # TRL's GRPOTrainer logs each reward function's mean so


def reward_history(history: list[dict]) -> list[dict]:
    """What a GRPO job's log says of its progress: its loss is no measure of it (near 0 by construction), the
    rewards are. Each logged step's mean reward over its completions (TRL's `reward`, the sum of the weighted
    reward functions) and each function's mean (`rewards/NAME/mean`):
    ``[{"step": 1, "reward": 0.54, "rewards": {"json_format": 0.0, "brevity": 0.54}}, …]``; [] for a log without
    rewards (sft, dpo, kto: their `rewards/chosen` and the like are not means of reward functions)."""
    out = []
    for h in history:
        if not is_number(h.get("reward")):
            continue
        each = {m.group(1): v for k, v in h.items() if (m := REWARD_KEY.fullmatch(k)) and is_number(v)}
        out.append({"step": h["step"], "reward": h["reward"], "rewards": each})
    return out


def _from_store(cfg, now: float) -> dict:
    from kit.checkpoints.store import connect

    store = connect(cfg.store)
    verdicts = store.inspect()
    latest = next((v.step for v in verdicts if v.ok), None)
    state = None
    if latest is not None:
        raw = store.read_checkpoint_file(latest, "trainer_state.json")
        state = _json(raw, f"checkpoint-{latest}/trainer_state.json")
    try:
        lease_raw, released_if_absent = store.read_lease()
    except UnicodeDecodeError as err:  # not UTF-8: _json below says so and ignores it
        lease_raw, released_if_absent = err.object, False
    run = _json(_store_read(store, "run.json"), "kit/run.json") or {}
    return {
        "store": store.describe(),
        "run_id": _text_or_none(run.get("run_id")),
        "checkpoints": sorted({v.step for v in verdicts if v.cand.kind == "kit"}),
        "verified": _verified(verdicts),
        "latest_step": latest,
        "final_step": store.final_step(),
        **_trainer_state(state, f"checkpoint-{latest}/trainer_state.json"),
        "sessions": records(_store_read(store, SESSIONS_STORE), f"the store's kit/{SESSIONS_STORE}"),
        "lease": _lease(_json(lease_raw, "kit lease"), now, released_if_absent and lease_raw is None),
    }


def _store_read(store, name: str) -> str | bytes | None:
    """A job record from the store; its bytes when they are not all UTF-8, so that each line (or
    the whole record) is judged, and skipped with a warning, where it is parsed."""
    try:
        return store.read_text(name)
    except UnicodeDecodeError as err:
        return err.object


def _verified(verdicts) -> list[dict]:
    """Each checkpoint, newest first: ``{step, where, state ("verified" | "invalid"), why}``."""
    return [{"step": v.step, "where": v.cand.prefix, "state": "verified" if v.ok else "invalid",
             "why": "" if v.ok else v.reason} for v in verdicts]


def _from_output_dir(cfg, warnings: list) -> dict:
    from kit.checkpoints import manifest
    from kit.checkpoints.store.base import Candidate, Verdict

    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"output_dir {out} is a file, not a folder: set output_dir to the job's folder")
    verdicts = [Verdict(Candidate(step, path.name, "kit", {}), *manifest.verify(path))
                for step, path in resume.local_checkpoints(out)]
    latest_path = next((out / v.cand.prefix for v in verdicts if v.ok), None)
    latest = next((v.step for v in verdicts if v.ok), None)
    state = None
    if latest_path is not None:
        state = _json(_read(latest_path / "trainer_state.json"), f"{latest_path.name}/trainer_state.json")
    run = _json(_read(out / "kit_run.json"), "kit_run.json") or {}
    return {
        "store": None,
        "run_id": _text_or_none(run.get("run_id")),
        "checkpoints": sorted(v.step for v in verdicts),
        "verified": _verified(verdicts),
        "latest_step": latest,
        "final_step": resume.final_step(out),
        **_trainer_state(state, f"{latest_path.name if latest_path else ''}/trainer_state.json"),
        "sessions": records(_read(out / SESSIONS_LOCAL), str(out / SESSIONS_LOCAL)),
        "lease": None,
    }


def _read(path: Path) -> bytes | None:
    """A local job file's bytes (None when absent); a folder, pipe or device there is refused by name."""
    try:
        return path.read_bytes() if regular_file(path, f"cannot read {path}") else None
    except OSError as err:
        raise StoreError(f"cannot read {path}: {err.strerror or err}") from None


def _json(raw: str | bytes | None, what: str) -> dict | None:
    """The JSON object in `raw`; None, with a warning, for anything else (not UTF-8, not JSON, not an object)."""
    if raw is None:
        return None
    try:
        data = parse_json(raw)
    except ValueError:
        log.warning("%s is not valid JSON; ignoring it", what)
        return None
    return data if isinstance(data, dict) else None


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) else None


def _trainer_state(state: dict | None, what: str) -> dict:
    """max_steps and the loss log of a checkpoint's trainer_state.json; entries of other types are left out."""
    state = state or {}
    top = state.get("max_steps")
    history = state.get("log_history")
    if not isinstance(history, list):
        history = []
    kept = [h for h in history if isinstance(h, dict) and is_number(h.get("step"))
            and all(_is_loss(h[k]) for k in ("loss", "eval_loss") if k in h)]
    if len(kept) < len(history):
        log.warning("%s: %d log entries without a numeric step and loss; ignoring them", what, len(history) - len(kept))
    return {"state_max_steps": top if is_integer(top) and top > 0 else None, "log_history": kept}


def _is_loss(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # NaN too: a diverged run shows


def records(raw: str | bytes | None, where: str = "sessions") -> list[dict]:
    """Usable session records, oldest first; a bad line is skipped with a warning (`session_records`)."""
    return sorted(session_records.parse(raw, where), key=lambda r: r.get("started") or 0)


def _last_max_steps(sessions: list[dict]) -> int | None:
    return next((s["max_steps"] for s in reversed(sessions) if s.get("max_steps")), None)


def _lease(record: dict | None, now: float, free: bool) -> dict | None:
    if record is None:
        return {"holder": None, "since": None, "heartbeat": None, "heartbeat_age_s": None,
                "released": True} if free else None
    beat = record.get("heartbeat")
    return {"holder": record.get("holder"), "since": record.get("since"), "heartbeat": beat,
            "heartbeat_age_s": round(now - beat, 1) if is_number(beat, 1e11) else None,
            "released": bool(record.get("released"))}


# -- words ------------------------------------------------------------------------------------
def _when(t) -> str:
    return time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(t)) if is_number(t, 1e11) else "?"


def _duration(seconds) -> str:
    if not is_number(seconds):
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def session_line(i: int, rec: dict, ledger_row: dict | None = None) -> str:
    """`#2  2026-12-02 13:20Z  host  40 → 200 of 200  complete  (12 s, 2 processes, ~7,080 tokens/s, peak 10.1 GiB)`."""
    span = (rec.get("ended") or 0) - (rec.get("started") or 0) if rec.get("ended") else None
    world = rec.get("world_size", "?")
    extra = [_duration(span), f"{world} process" if world == 1 else f"{world} processes"]
    if isinstance(rec.get("tokens_per_s"), (int, float)):
        extra.append(f"~{rec['tokens_per_s']:,.0f} tokens/s")
    if isinstance(rec.get("peak_allocated_bytes"), (int, float)):
        extra.append(f"peak {rec['peak_allocated_bytes'] / GIB:.1f} GiB")
    elif isinstance(rec.get("peak_rss_bytes"), (int, float)):
        extra.append(f"peak RAM {rec['peak_rss_bytes'] / GIB:.1f} GiB")
    if isinstance(rec.get("setup_s"), (int, float)):
        extra.append(f"setup {_duration(rec['setup_s'])}")
    if ledger_row and ledger_row.get("steps_lost"):
        extra.append(f"{ledger_row['steps_lost']} steps lost")
    return (f"#{i}  {_when(rec.get('started'))}  {rec.get('host', '?')}  {rec.get('start_step', '?')} → "
            f"{rec.get('end_step', '?')} of {rec.get('max_steps', '?')}  {rec.get('outcome', '?')}  "
            f"({', '.join(extra)})")


def _checkpoint_words(s: dict) -> str:
    """`20 (newest verified), verified: 10; 2 that do not verify (below)`."""
    found = s.get("verified")
    if found is None:  # a dict from before `verified` existed
        steps = s["checkpoints"]
        return ", ".join(map(str, steps[-6:])) + (f" (+{len(steps) - 6} older)" if len(steps) > 6 else "") or "none"
    if not found:
        return "none"
    good = [str(c["step"]) for c in found if c["state"] == "verified"]
    parts = []
    if good:
        parts.append(f"{good[0]} (newest verified)" + (", verified: " + ", ".join(good[1:6]) if good[1:] else ""))
    bad = [c for c in found if c["state"] == "invalid"]
    if bad:
        parts.append(f"{len(bad)} that do not verify (below)")
    return "; ".join(parts)


def reward_words(rewards: list[dict]) -> str:
    """`0.551 over steps 1-10 → 0.563 over steps 31-40 (brevity 0.551 → 0.563, json_format 0 → 0; TRL's mean
    reward of each step's completions)`: the first and the newest logged steps, a quarter of them each (at most
    10), since one step's few completions are a noisy measure."""
    n = max(1, min(10, len(rewards) // 4))
    first, last = rewards[:n], rewards[-n:]
    names = [k for k in last[-1]["rewards"] if all(k in r["rewards"] for r in first + last)]

    def mean(rows, key=None) -> str:
        values = [r["reward"] if key is None else r["rewards"][key] for r in rows]
        return f"{sum(values) / len(values):.3g}"

    def steps(rows) -> str:
        return f"step {rows[0]['step']}" if len(rows) == 1 else f"steps {rows[0]['step']}-{rows[-1]['step']}"

    if len(rewards) == 1:
        each = ", ".join(f"{k} {mean(last, k)}" for k in names)
        return f"{mean(last)} at {steps(last)} ({each + '; ' if each else ''}TRL's mean reward of the step's completions)"
    each = ", ".join(f"{k} {mean(first, k)} → {mean(last, k)}" for k in names)
    return (f"{mean(first)} over {steps(first)} → {mean(last)} over {steps(last)} ({each + '; ' if each else ''}"
            "TRL's mean reward of each step's completions)")


def format_text(s: dict) -> str:
    """A short aligned report of `gather()`'s dict."""
    rows = [("store", s["store"] or f"none (local {s['output_dir']})")]
    if s.get("run_id"):
        rows.append(("run id", s["run_id"]))
    rows.append(("checkpoints", _checkpoint_words(s)))
    rows += [("", f"{c['where']}: does not verify — {c['why']}") for c in s.get("verified", [])
             if c["state"] == "invalid"]
    latest, total = s["latest_step"], s["max_steps"]
    if latest is None:
        progress = f"not started (0 of {total or '?'} steps)"
    elif total:
        progress = f"step {latest} of {total} ({100 * s['progress']:.0f} %)"
    else:
        progress = f"step {latest}"
    if s["complete"]:
        progress += " — complete"
    elif latest is not None and total and latest >= total:
        progress += " — its wrap-up (final evaluation, final/) did not finish: the same command runs it"
    rows.append(("progress", progress))
    if s.get("rewards"):
        rows.append(("reward", reward_words(s["rewards"])))
    sessions = s["sessions"]
    rows.append(("sessions", str(len(sessions)) if sessions else "none recorded"))
    ledger = s.get("goodput") or {}
    by_session = iter(ledger.get("sessions", []))
    rows += [("", session_line(i, r, None if r.get("outcome") == "already complete" else next(by_session, None)))
             for i, r in enumerate(sessions, 1)]
    if goodput.words(ledger):
        rows.append(("goodput", goodput.words(ledger)))
    lease = s["lease"]
    if lease is not None:
        if lease["holder"] is None:
            words = "free"
        else:
            state = "released" if lease["released"] else "HELD"
            words = (f"{state}: {lease['holder']} since {_when(lease['since'])}, last heartbeat "
                     f"{_duration(lease['heartbeat_age_s'])} ago")
        rows.append(("lease", words))
    rows += [("warning", w) for w in s.get("warnings", [])]
    # Values come from the store (run id, holder, session records, a checkpoint's why): one line each, escaped.
    return "\n".join(f"{k:<12} {shown(v, limit=1000)}".rstrip() for k, v in rows)
