"""Reading and writing kit's local files: one atomic writer, one reader of UTF-8 inputs, GiB.

Every file kit writes where a reader (another rank, the next session, a user's editor) might look
goes through `atomic_path`/`write_atomic`: a temp file beside the target, then `os.replace`, so a
crash or a kill leaves the old file or the new one, never half of one. The temp file sits in the
target's folder (a rename across filesystems is a copy) and is removed when the write fails.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from kit.errors import UsageError

GIB = 2**30


@contextlib.contextmanager
def atomic_path(path, *, mode: int | None = None):
    """Yield a temp path beside `path`; once the block ends without error it becomes `path`.

    For writers that want a file name rather than a file object (matplotlib's `savefig`).
    `mode` sets the final file's permissions (e.g. 0o644 for a script a user runs).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path, data: str | bytes, *, fsync: bool = False, mode: int | None = None,
                 mkdir: bool = False) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically and return the path.

    `fsync`: flush to the device before the rename, for files that must survive a power cut or a
    VM being taken away (checkpoint manifests, store records), not only a killed process.
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, mode=mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return path


def read_text(path, what: str) -> str:
    """The UTF-8 text of `path`, or a one-line UsageError naming `what` ("config", "data file") and the cause."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
