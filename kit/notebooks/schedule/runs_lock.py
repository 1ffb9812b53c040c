"""One scheduler per runs folder: a lock file that a second `kit schedule` on this machine refuses at."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from kit.errors import UsageError

LOCK_NAME = ".kit-schedule.lock"


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
