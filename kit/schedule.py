"""Resume a job unattended: run `notebooks/resume.ipynb` with papermill until the job is complete.

One run = one papermill execution of the resume notebook in a real `python3` kernel; its output
notebook is kept as `runs/<UTC timestamp>-<n>.ipynb` and its outcome line is printed. Two
schedulers never train at once: the store's lease guards the store (inside training), and a lock
file in the runs folder makes a second scheduler on the same machine refuse at once.

Tokens never travel as parameters: papermill writes every parameter into the output notebook
(nteract/papermill#271, #416, #706). The training script finds the token itself
(`kit.auth.find_token`: the environment, or a Kaggle/Colab secret).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit import auth
from kit.errors import UsageError

PARAMETERS = ("config", "time_budget_minutes", "store", "nproc", "overrides")
LOCK_NAME = ".kit-schedule.lock"
OUTCOME_RE = re.compile(r"^outcome: (.+)$", re.M)
_TOKEN_VALUE_RE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
DONE = ("complete", "already complete")


@dataclass
class Plan:
    """What to run: the resume notebook, its parameters, where its output notebooks go."""

    notebook: Path
    runs_dir: Path
    parameters: dict
    cwd: Path = field(default_factory=Path.cwd)
    run_timeout_s: float | None = None  # the training cell is interrupted after this: training pauses


# -- checks before anything runs --------------------------------------------------------------
def refuse_tokens(values: list[str]) -> None:
    """Raise UsageError when any parameter looks like, names or contains a token (never echoing it)."""
    known = auth.find_token()
    for value in values:
        key = value.split("=", 1)[0] if "=" in value else ""
        if ("token" in key.lower() or _TOKEN_VALUE_RE.search(value)
                or (known and len(known) >= 8 and known in value)):
            shown = f"{key}=…" if key else "a parameter"
            raise UsageError(f"refusing to pass a token as a parameter ({shown}): papermill writes every "
                             "parameter into the run notebook; set HF_TOKEN in the environment or a "
                             "Kaggle/Colab secret named HF_TOKEN instead")


def check_notebook(path: Path) -> Path:
    """The resume notebook must be a valid notebook with a `parameters` cell naming our parameters."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--notebook {path}: no such file")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"--notebook {path} is not a notebook (not UTF-8 text)") from None
    except ValueError as err:
        raise UsageError(f"--notebook {path} is not a notebook (invalid JSON: {err})") from None
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
    from kit.store import connect

    store = connect(cfg.store)  # the checks kit status and the training script make, in one line
    store.check_writable()  # training must be able to publish there
    store.latest_valid()
    return store.describe()


# -- one run ----------------------------------------------------------------------------------
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

    plan.runs_dir.mkdir(parents=True, exist_ok=True)
    out = run_path(plan.runs_dir, n)
    error = None
    try:
        papermill.execute_notebook(str(plan.notebook), str(out), parameters=plan.parameters,
                                   kernel_name="python3", cwd=str(plan.cwd), progress_bar=False,
                                   log_output=verbose, request_save_on_cell_execute=True,
                                   execution_timeout=plan.run_timeout_s, interrupt_on_timeout=True)
    except PapermillException as err:  # a cell raised: the notebook's outcome line says why
        lines = str(err).strip().splitlines()
        error = f"failed: {type(err).__name__}: {lines[-1][:200] if lines else 'no message'}"
    except RuntimeError as err:  # the kernel died or could not start
        error = f"failed: the kernel stopped: {str(err).splitlines()[0][:200]}"
    outcome = outcome_of(out) if out.exists() else None
    return outcome or error or "failed: the notebook printed no outcome line", out


def is_done(outcome: str) -> bool:
    return outcome.startswith(DONE)


def is_failure(outcome: str) -> bool:
    return outcome.startswith("failed")


# -- one scheduler per runs folder ------------------------------------------------------------
class RunsLock:
    """An O_EXCL lock file in the runs folder; a lock left by a dead process of this host is taken over."""

    def __init__(self, runs_dir: Path):
        self.path = Path(runs_dir) / LOCK_NAME
        self.held = False

    def __enter__(self) -> "RunsLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                other = self._read()
                if other is None or not self._dead(other):
                    who = f"pid {other['pid']} on {other['host']}" if other else "another scheduler"
                    raise UsageError(f"another `kit schedule` ({who}) is running with {self.path.parent}; "
                                     f"wait for it, or remove {self.path} if it is gone") from None
                self.path.unlink(missing_ok=True)  # its process is gone: take over
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise UsageError(f"could not take {self.path}: it keeps changing")

    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"host": "?", "pid": "?", "gone": True}
        except ValueError:
            return None  # being written right now: treat as held
        return data if isinstance(data, dict) else None

    @staticmethod
    def _dead(other: dict) -> bool:
        if other.get("gone"):
            return True
        if other.get("host") != socket.gethostname() or not isinstance(other.get("pid"), int):
            return False
        try:
            os.kill(other["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


# -- unattended: cron and systemd -------------------------------------------------------------
def unattended(command: list[str], cwd: Path, every_minutes: float, runs_dir: Path) -> str:
    """A crontab line and a systemd service/timer pair that run `command` every `every_minutes`.

    The token is read from a private env file, never written into the units or the crontab.
    """
    every = max(1, round(every_minutes))
    cron_when = f"*/{every} * * * *" if every < 60 else f"0 */{max(1, every // 60)} * * *"
    env_file = "~/.config/kit/hf.env"
    cmd = shlex.join(command)
    log = shlex.quote(str(Path(runs_dir).resolve() / "schedule.log"))
    return "\n".join([
        f"# Unattended: every {every} min (the runs folder's lock skips a run while one is going).",
        f"# Put HF_TOKEN=... in {env_file} (chmod 600); it is never a parameter.",
        "# crontab -e:",
        f"{cron_when} cd {shlex.quote(str(cwd))} && set -a && . {env_file} && set +a && {cmd} >> {log} 2>&1",
        "# ~/.config/systemd/user/kit-schedule.service:",
        "[Unit]\nDescription=kit: resume the fine-tuning job\n[Service]\nType=oneshot",
        f"WorkingDirectory={cwd}\nEnvironmentFile=%h/.config/kit/hf.env\nExecStart={cmd}",
        "# ~/.config/systemd/user/kit-schedule.timer (then: systemctl --user enable --now kit-schedule.timer):",
        f"[Unit]\nDescription=kit: resume every {every} min\n[Timer]\nOnBootSec=2min\n"
        f"OnUnitActiveSec={every}min\nPersistent=true\n[Install]\nWantedBy=timers.target",
    ])


def loop(plan: Plan, *, repeat: bool, every_minutes: float, max_runs: int | None, verbose: bool = False,
         say=print, sleep=time.sleep) -> int:
    """Run until complete (or once). Returns 0 when every run paused or completed, 1 on a failed run."""
    n = 0
    with RunsLock(plan.runs_dir):
        while True:
            n += 1
            outcome, out = execute(plan, n, verbose)
            say(f"run {n}: outcome: {outcome}  ({out})", flush=True)
            if is_failure(outcome):
                return 1
            if is_done(outcome) or not repeat or (max_runs is not None and n >= max_runs):
                if repeat and not is_done(outcome):
                    say(f"stopped after --max-runs {max_runs}; the job is not complete yet", flush=True)
                return 0
            say(f"next run in {every_minutes:g} min", flush=True)
            sleep(every_minutes * 60)


def python_command() -> list[str]:
    return [sys.executable, "-m", "kit"]

