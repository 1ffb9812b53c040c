"""One scheduler per runs folder: a second `kit schedule` on this machine refuses at once.

The lock is `filelock`'s (flock on Linux): the runs folder is local to the scheduler, and the OS
drops the lock when its process dies, kill -9 included, so nothing is left to take over. A side
file names the holder, for the refusal. (The directory store's lease stays an O_EXCL file: see
kit/checkpoints/store/leasing.py.)
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from kit.errors import UsageError
from kit.files import parse_json, regular_file

LOCK_NAME = ".kit-schedule.lock"  # who holds it (JSON); the OS lock is on LOCK_NAME + ".flock"


def check_runs_dir(runs_dir: Path) -> Path:
    """Refuse, before any work, a runs folder kit cannot use: a file there, or a folder or pipe where
    the lock files go. Creates nothing (`--print-cron` only prints)."""
    runs_dir = Path(runs_dir)
    there = next((p for p in (runs_dir, *runs_dir.parents) if p.exists()), None)  # itself, or what it goes in
    if there is not None and not there.is_dir():
        what = "is a file" if there == runs_dir else f"{there} is a file"
        raise UsageError(f"--runs-dir {runs_dir}: {what}, not a folder: choose another --runs-dir")
    for name in (LOCK_NAME, LOCK_NAME + ".flock"):
        regular_file(runs_dir / name, f"--runs-dir {runs_dir}: its lock file {name}")
    return runs_dir


class RunsLock:
    def __init__(self, runs_dir: Path):
        self.path = Path(runs_dir) / LOCK_NAME
        self._lock = FileLock(f"{self.path}.flock", timeout=0)
        self.held = False

    def __enter__(self) -> "RunsLock":
        runs_dir = check_runs_dir(self.path.parent)
        try:
            runs_dir.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except Timeout:
            other = self._read()
            who = f"pid {other.get('pid')} on {other.get('host')}" if other else "another scheduler"
            raise UsageError(f"another `kit schedule` ({who}) is running with {runs_dir}; "
                             "wait for it to finish") from None
        except OSError as err:  # a parent that is a file, a read-only folder
            raise UsageError(f"--runs-dir {runs_dir}: cannot lock it: {err.strerror or err}") from None
        self.held = True
        try:
            self.path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}))
        except OSError as err:
            self.__exit__()
            raise UsageError(f"--runs-dir {runs_dir}: cannot write {LOCK_NAME}: {err.strerror or err}") from None
        return self

    def _read(self) -> dict | None:
        try:
            data = parse_json(self.path.read_bytes())
        except (OSError, ValueError):
            return None  # not written yet, or being written
        return data if isinstance(data, dict) else None

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self._lock.release()
            self.held = False
