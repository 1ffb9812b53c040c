"""Resume a job unattended: run `notebooks/resume.ipynb` with papermill until the job is complete.

This module checks what a schedule is given (no token as a parameter, a resume notebook, a
reachable store) and loops; one run is `kit.notebooks.schedule.papermill_run`, the lock that keeps a
second scheduler off the runs folder `kit.notebooks.schedule.runs_lock`, the cron/systemd units
`kit.notebooks.schedule.unattended`, when to stop `kit.notebooks.schedule.stops`, and a Kaggle session instead of
a local run `kit.notebooks.schedule.kaggle_run`. Two schedulers never train at once: the store's lease
guards the store (inside training), the runs folder's lock the machine.

Tokens never travel as parameters: papermill writes every parameter into the output notebook
(nteract/papermill#271, #416, #706). The training script finds the token itself
(`kit.auth.find_token`: the environment, or a Kaggle/Colab secret).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from kit import auth
from kit.errors import UsageError, shown
from kit.files import json_problem, parse_json, read_text, regular_file
from kit.redaction import holds_token, redact
from kit.notebooks.schedule.papermill_run import Plan, execute, is_done, is_failure
from kit.notebooks.schedule.runs_lock import RunsLock

PARAMETERS = ("config", "time_budget_minutes", "store", "nproc", "overrides")
_TOKEN_VALUE_RE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_SECRET_KEY_RE = re.compile(r"(?i)token|key|secret|passw")  # the name of a parameter that holds one


# -- checks before anything runs --------------------------------------------------------------
def refuse_tokens(values: list[str]) -> None:
    """Raise UsageError when any parameter looks like, names or contains a token or a tracker's key
    (WANDB_API_KEY's value in the environment, a `wandb_api_key=` override), never echoing it."""
    known = auth.find_token()
    for value in values:
        key = value.split("=", 1)[0] if "=" in value else ""
        if (_SECRET_KEY_RE.search(key) or _TOKEN_VALUE_RE.search(value) or holds_token(value)
                or (known and len(known) >= 8 and known in value)):
            shown = f"{key}=…" if key else "a parameter"
            raise UsageError(f"refusing to pass a token as a parameter ({shown}): papermill writes every "
                             "parameter into the run notebook; set HF_TOKEN (or a tracker's key, WANDB_API_KEY) in "
                             "the environment or a Kaggle/Colab secret of that name instead")


def check_notebook(path: Path) -> Path:
    """The resume notebook must be a valid notebook with a `parameters` cell naming our parameters."""
    import nbformat

    path = Path(path)
    if regular_file(path, f"--notebook {path}") is None:  # a folder, pipe or device: refused by name
        raise UsageError(f"--notebook {path}: no such file")
    try:
        raw = parse_json(read_text(path, "--notebook"))
    except ValueError as err:
        raise UsageError(f"--notebook {path} is not a notebook ({json_problem(err)})") from None
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)
        nbformat.validate(nb)
    except (nbformat.ValidationError, KeyError, TypeError, AttributeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"--notebook {path} is not a valid Jupyter notebook: {first[:200]}") from None
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not tagged:
        raise UsageError(f"--notebook {path} has no cell tagged `parameters`: papermill could not set "
                         f"{', '.join(PARAMETERS)}; use notebooks/resume.ipynb")
    return path


def check_store(cfg) -> str | None:
    """Open the job's store and find its newest checkpoint, so an unreachable store fails here, in one line.

    Returns:
        The store's description (None when the job has no store).
    Raises:
        StoreError: unreachable, refused, no token for a Hub store, or a directory we cannot write.
    """
    if not cfg.store:
        return None
    from kit.checkpoints.store import connect

    store = connect(cfg.store)  # the checks kit status and the training script make, in one line
    store.check_writable()  # training must be able to publish there
    store.latest_valid()
    return store.describe()


def loop(plan: Plan, *, repeat: bool, every_minutes: float, max_runs: int | None, verbose: bool = False,
         say=print, sleep=time.sleep) -> int:
    """Run until complete (or once). Returns 0 when every run paused or completed; on a failed run the
    training's own exit code when it said one of kit's (2 bad input, 3 cannot train here, 4 store), else
    1, also for a run that made no progress (the stop rules of `kit.notebooks.schedule.stops`)."""
    from kit.notebooks.schedule import stops

    n, before = 0, None
    with RunsLock(plan.runs_dir):
        while True:
            n += 1
            outcome, out = execute(plan, n, verbose)
            # The outcome is the notebook's own words and the paths the user's: one line each, escaped.
            say(shown(f"run {n}: outcome: {outcome}  ({out})", limit=None), flush=True)
            if is_failure(outcome):  # the reason once more, as kit's one error line on stderr
                said = outcome.split("error: ", 1)[1] if "error: " in outcome else outcome
                print(shown(redact(f"error: run {n} failed: {said} (its notebook: {out})"), limit=None),
                      file=sys.stderr, flush=True)
                return failure_code(outcome)
            after = stops.step_of(outcome)
            decision = stops.decide(stops.Session(outcome, before, after), used_hours=0.0)
            if isinstance(decision, stops.Stop) and not decision.ok:
                say(shown(f"stopped: {decision.reason}", limit=None), flush=True)
                print(shown(f"error: stopped after run {n}: {decision.reason}", limit=None), file=sys.stderr, flush=True)
                return 1
            before = after
            if is_done(outcome) or not repeat or (max_runs is not None and n >= max_runs):
                if repeat and not is_done(outcome):
                    say(f"stopped after --max-runs {max_runs}; the job is not complete yet", flush=True)
                return 0
            say(f"next run in {every_minutes:g} min", flush=True)
            sleep(every_minutes * 60)


def failure_code(outcome: str) -> int:
    """kit's exit code a failed run's outcome line carries (`failed (exit code 2): …`), else 1."""
    found = re.search(r"exit code (\d+)", outcome)
    return int(found.group(1)) if found and found.group(1) in ("2", "3", "4") else 1
