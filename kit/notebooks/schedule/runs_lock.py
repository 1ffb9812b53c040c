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

LOCK_NAME = ".kit-schedule.lock"  # who holds it (JSON); the OS lock is on LOCK_NAME + ".flock"


class RunsLock:
    def __init__(self, runs_dir: Path):
        self.path = Path(runs_dir) / LOCK_NAME
        self._lock = FileLock(f"{self.path}.flock", timeout=0)
        self.held = False

    def __enter__(self) -> "RunsLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            other = self._read()
            who = f"pid {other.get('pid')} on {other.get('host')}" if other else "another scheduler"
            raise UsageError(f"another `kit schedule` ({who}) is running with {self.path.parent}; "
                             "wait for it to finish") from None
        self.held = True
        self.path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}))
        return self

    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # not written yet, or being written
        return data if isinstance(data, dict) else None

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self._lock.release()
            self.held = False
