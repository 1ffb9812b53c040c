"""A checkpoint store in a directory (a mounted drive, a persistent disk, ``/kaggle/working``).

Publishing copies into a temp folder inside the store, checks every byte against the manifest
while copying, fsyncs, then renames to ``checkpoints/checkpoint-N``: a reader sees the whole
checkpoint or none of it. Old checkpoints are renamed into a trash folder before removal, so a
half-deleted one is never mistaken for a checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from kit.errors import StoreError
from kit.files import write_atomic
from kit.checkpoints.manifest import verify_files
from kit.checkpoints.store.base import (
    CKPT_DIR,
    FINAL,
    RECORDS_DIR,
    Candidate,
    Snapshot,
    Store,
    _swap_into,
    final_step_of,
    kept_final_name,
    local_files,
    record_path,
)
from kit.checkpoints.store import leasing
from kit.checkpoints.store.retention import prune

log = logging.getLogger("kit.checkpoints.store")
_CHUNK = 1 << 20


class DirStore(Store):
    """Checkpoints under ``root/checkpoints/``, job records under ``root/kit/``."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()

    def describe(self) -> str:
        return f"directory {self.root}"

    # ---- reading ------------------------------------------------------------------------------
    def preflight(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is a file, not a directory: pick a directory (it is created "
                             "if missing) or an hf://owner/name store")
        for sub in (self.root / CKPT_DIR, self.root / RECORDS_DIR):
            if sub.exists() and not sub.is_dir():
                raise StoreError(f"store {self.root}: {sub.name} is a file where kit keeps a folder; "
                                 "move it away or pick another store")
        try:
            self._snapshot()
        except OSError as err:
            raise StoreError(f"cannot read store {self.root}: {err.strerror or err}") from None

    def _snapshot(self) -> Snapshot:
        files: dict[str, int] = {}
        ids: dict[str, str] = {}
        for top in (self.root / CKPT_DIR, self.root / "last-checkpoint"):
            if not top.is_dir():
                continue
            for p in top.rglob("*"):
                if p.is_file():
                    st = p.stat()
                    rel = p.relative_to(self.root).as_posix()
                    files[rel] = st.st_size
                    # Rewriting a file changes its mtime: a verdict is remembered only until then.
                    ids[rel] = f"{st.st_ino}:{st.st_mtime_ns}"
        return Snapshot(None, files, ids=ids)

    def _read_bytes(self, path: str, snap: Snapshot) -> bytes | None:
        try:
            return (self.root / path).read_bytes()
        except FileNotFoundError:
            return None

    def _deep_check(self, cand: Candidate, manifest: dict, snap: Snapshot) -> tuple[bool, str]:
        return verify_files(self.root / cand.prefix, manifest)

    def _download(self, paths: list[str], snap: Snapshot, dest_root: Path) -> None:
        for path in paths:
            out = dest_root / path
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(self.root / path, out)
            except FileNotFoundError as err:
                raise StoreError(f"{path} vanished from {self.describe()} during the fetch") from err

    # ---- writing ------------------------------------------------------------------------------
    def check_writable(self) -> None:
        self._writable_dir(self.root)

    def _writable_dir(self, path: Path) -> Path:
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".kit-write-probe-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise StoreError(f"store directory {path} is not writable ({err.strerror or err}): "
                             "pick a writable store path") from err
        return path

    def publish(self, local_ckpt_dir: Path, step: int, keep: int) -> None:
        """Copy ``local_ckpt_dir`` in as ``checkpoints/checkpoint-{step}`` atomically; keep the newest ``keep``."""
        manifest, names = local_files(local_ckpt_dir, step)
        if keep < 1:
            prune([], step, keep)  # raises the one-line UsageError
        doomed = prune(self.inspect(kinds=("kit",)), step, keep)
        ckpts = self._writable_dir(self.root / CKPT_DIR)
        _remove_leftovers(ckpts)
        tmp = ckpts / f".tmp-checkpoint-{step}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            for rel in names:
                want = manifest["files"].get(rel)
                digest = _copy_fsync(Path(local_ckpt_dir) / rel, tmp / rel)
                if want is not None and digest != want["sha256"]:
                    raise StoreError(f"{local_ckpt_dir}/{rel} changed since its manifest was written; "
                                     "not publishing a checkpoint that would not verify")
            _fsync_dir(tmp)
            _swap_into(tmp, ckpts / f"checkpoint-{step}")
            _fsync_dir(ckpts)
        except OSError as err:
            raise StoreError(f"publishing step {step} to {self.describe()} failed: {err}") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in doomed:
            trash = ckpts / f".trash-checkpoint-{old}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(ckpts / f"checkpoint-{old}", trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
            log.info("%s: removed checkpoint-%d (keeping the newest %d that verify)", self.describe(), old, keep)

    def publish_final(self, local_dir: Path) -> tuple[str, str | None]:
        """Copy ``local_dir`` in as ``final/``, renamed into place once whole; an earlier final/ of
        another step is renamed to ``final-step-N`` first (Store.publish_final)."""
        root = self._writable_dir(self.root)
        tmp = root / f".tmp-final-{uuid.uuid4().hex[:8]}"
        kept = None
        try:
            shutil.copytree(local_dir, tmp)
            earlier = self.final_step()
            if (root / FINAL).exists() and earlier != final_step_of(local_dir):
                kept = kept_final_name(earlier, {p.name for p in root.iterdir()})
                os.rename(root / FINAL, root / kept)
            _swap_into(tmp, root / FINAL)
        except OSError as err:
            raise StoreError(f"publishing final/ to {self.describe()} failed: {err}") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(root / FINAL), kept

    def read_text(self, name: str) -> str | None:
        try:
            return (self.root / record_path(name)).read_text()
        except FileNotFoundError:
            return None
        except OSError as err:  # a symlink loop, a path under a file, no permission: the store, exit 4
            raise StoreError(f"reading {record_path(name)} from {self.describe()} failed: "
                             f"{err.strerror or err}") from err

    def write_text(self, name: str, text: str) -> None:
        path = self.root / record_path(name)
        self._writable_dir(path.parent)
        try:
            write_atomic(path, text, fsync=True)
        except OSError as err:
            raise StoreError(f"writing {record_path(name)} to {self.describe()} failed: {err}") from err


    # ---- concurrency (store/leasing.py) --------------------------------------------------------
    def swap_lease(self, decide) -> None:  # an O_EXCL lock file: it must work on a Drive mount
        leasing.dir_swap(self, self.root / record_path(leasing.LOCK_NAME), decide)

    def read_lease(self) -> tuple[str | None, bool]:
        return self.read_text(leasing.LOCK_NAME), True  # release() deletes the lock file: absent is free

    def append_text(self, name: str, text: str) -> None:
        """A real append (O_APPEND), flushed to the device: a record line survives the VM going away."""
        path = self.root / record_path(name)
        self._writable_dir(path.parent)
        try:
            with open(path, "a") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            raise StoreError(f"appending to {record_path(name)} in {self.describe()} failed: {err}") from err


def _remove_leftovers(ckpts: Path, older_than_s: float = 3600) -> None:
    """Temp and trash folders left by a session that was cut mid-publish (one writer: the lease)."""
    now = time.time()
    for p in ckpts.glob(".*-checkpoint-*"):
        if p.name.startswith((".tmp-", ".trash-")) and now - p.stat().st_mtime > older_than_s:
            shutil.rmtree(p, ignore_errors=True)
            log.info("removed %s, left behind by an interrupted publish", p)


def _copy_fsync(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst``, fsync it, and return the sha256 of the bytes written."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
