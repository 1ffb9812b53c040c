"""Small files downloaded once per resume: a resume checks a checkpoint (its manifest, the small
files it hashes) and then fetches it at the same commit, and a file's bytes at a commit never
change, so the fetch may copy what the check already downloaded. Every file is still verified
against the manifest after the fetch (kit.checkpoints.store.base.Store.fetch).

    reuse = DownloadReuse(max_bytes)
    with reuse.active():
        kept = reuse.get(commit, path)          # a local copy, or None
        reuse.keep(commit, path, downloaded)    # after a real download
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path


class DownloadReuse:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._state: tuple[Path, dict, int] | None = None  # (folder, {(commit, path): copy}, thread id)

    @contextmanager
    def active(self):
        with tempfile.TemporaryDirectory(prefix="kit-hub-reuse-") as tmp:
            # This thread's reads only: the lease heartbeat reads from its own thread meanwhile.
            self._state = (Path(tmp), {}, threading.get_ident())
            try:
                yield
            finally:
                self._state = None

    def _mine(self):
        state = self._state
        return state if state and state[2] == threading.get_ident() else None

    def get(self, commit: str, path: str) -> Path | None:
        state = self._mine()
        return state[1].get((commit, path)) if state else None

    def keep(self, commit: str, path: str, downloaded: Path) -> None:
        state = self._mine()
        if state and downloaded.stat().st_size <= self.max_bytes:
            copy = state[0] / str(len(state[1]))
            shutil.copyfile(downloaded, copy)
            state[1][(commit, path)] = copy
