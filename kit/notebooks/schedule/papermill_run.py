"""One local run: papermill executes the resume notebook once in a real `python3` kernel.

Its output notebook is kept as `runs/<UTC timestamp>-<n>.ipynb`. The run's outcome is the session
record the training job appended (`output_dir/kit_sessions.jsonl`, docs/CONTRACTS.md), not printed
text; a run that left no record (it died before training began, e.g. in its first cell, or the
token was missing) is a failure, worded with the last `outcome: …` line the notebook printed or
papermill's error. No parameter is ever a token (`kit.notebooks.schedule.loop.refuse_tokens`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.notebooks.schedule.stops import words_of

OUTCOME_RE = re.compile(r"^outcome: (.+)$", re.M)
DONE = ("complete", "already complete")


@dataclass
class Plan:
    """What to run: the resume notebook, its parameters, where its output notebooks go."""

    notebook: Path
    runs_dir: Path
    parameters: dict
    cwd: Path = field(default_factory=Path.cwd)
    run_timeout_s: float | None = None  # the training cell is interrupted after this: training pauses
    sessions: Path | None = None  # the job's kit_sessions.jsonl: a run's outcome is the record it appends


# -- one run ----------------------------------------------------------------------------------
def asyncio_reports_to(path: Path) -> None:
    """What asyncio reports from here on goes to `path` (the run's kernel log), not the terminal.

    A Ctrl-C that stops `kit schedule` mid-cell leaves the notebook client's cell task to fail once
    the kernel is shut down (DeadKernelError); asyncio reports it ("Task exception was never
    retrieved", with a traceback) only when that task is garbage-collected, which can be after
    "interrupted" was printed and stderr is the terminal again. The handler stays for the rest of the
    process (the report comes that late), one at a time: the latest run's log."""
    import logging

    logger = logging.getLogger("asyncio")
    for old in [h for h in logger.handlers if getattr(h, "kit_run_log", False)]:
        logger.removeHandler(old)
        old.close()
    handler = logging.FileHandler(path, delay=True)
    handler.kit_run_log = True
    logger.addHandler(handler)
    logger.propagate = False


@contextlib.contextmanager
def kernel_stderr(path: Path):
    """Send what the Jupyter kernel (a child process) writes to stderr to `path`, not the terminal: its
    log lines, and the ZMQ traceback it prints when Ctrl-C stops `kit schedule` mid-message. The
    kernel keeps the file after this returns, so its shutdown noise lands there too; asyncio's late
    reports of the interrupted cell go there as well (`asyncio_reports_to`)."""
    asyncio_reports_to(path)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run_path(runs_dir: Path, n: int, now: float | None = None) -> Path:
    """`runs/20261202T132500Z-1.ipynb`; never the name of an existing run notebook."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    while (path := runs_dir / f"{stamp}-{n}.ipynb").exists():
        n += 1
    return path


def outcome_of(output_nb: Path) -> str | None:
    """The last `outcome: …` line the run notebook printed, without the prefix."""
    import nbformat

    try:
        nb = nbformat.read(str(output_nb), as_version=4)
    except (OSError, ValueError) as err:
        return f"failed: the run notebook {output_nb} is unreadable ({err})"
    found = None
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                for m in OUTCOME_RE.finditer(out.get("text", "")):
                    found = m.group(1).strip()
    return found


def execute(plan: Plan, n: int, verbose: bool = False) -> tuple[str, Path]:
    """Run the resume notebook once. Returns (outcome words, output notebook path)."""
    import papermill
    from papermill.exceptions import PapermillException

    from kit.auth import scrub_file
    from kit.redaction import redact

    plan.runs_dir.mkdir(parents=True, exist_ok=True)
    out = run_path(plan.runs_dir, n)
    began, error = time.time(), None
    log = out.with_suffix(".kernel.log")
    try:
        with contextlib.nullcontext() if verbose else kernel_stderr(log):
            papermill.execute_notebook(str(plan.notebook), str(out), parameters=plan.parameters,
                                       kernel_name="python3", cwd=str(plan.cwd), progress_bar=False,
                                       log_output=verbose, request_save_on_cell_execute=True,
                                       execution_timeout=plan.run_timeout_s, interrupt_on_timeout=True)
    except PapermillException as err:  # a cell raised: the notebook's outcome line says why
        lines = str(err).strip().splitlines()
        error = f"failed: {type(err).__name__}: {lines[-1][:200] if lines else 'no message'}"
    except RuntimeError as err:  # the kernel died or could not start
        error = f"failed: the kernel stopped: {str(err).splitlines()[0][:200]}"
    finally:  # a cell may have printed the token (the user's own print, a library's debug line)
        scrub_file(out)
        if log.exists():
            scrub_file(log)
    printed = outcome_of(out) if out.exists() else None
    # The outcome goes to the terminal and the runs record: a token a cell raised with is shown as ***.
    said = redact(printed or error or "failed: the notebook printed no outcome line")
    if plan.sessions is None:
        return said, out
    record = session_since(plan.sessions, began)
    if record is None:
        why = said if said.startswith("failed") else f"it printed {said!r}"
        return f"failed: the session left no record in {plan.sessions} (it ended before training began): " \
               f"{why.removeprefix('failed: ')}", out
    if record.get("outcome") == "paused" or record.get("outcome") in DONE or not said.startswith("failed"):
        return words_of(record), out
    return said, out  # a failed session: the notebook's words carry its error


def session_since(path: Path, began: float) -> dict | None:
    """The last session record in `path` of a session that started at or after `began` (this run's)."""
    from kit.checkpoints import session_records

    # A torn last line (a cut session), bytes that are not UTF-8 or a field of the wrong type: skipped.
    found = [r for r in session_records.read(path) if r.get("started") is not None and r["started"] >= began]
    return found[-1] if found else None


def is_done(outcome: str) -> bool:
    return outcome.startswith(DONE)


def is_failure(outcome: str) -> bool:
    return outcome.startswith("failed")
