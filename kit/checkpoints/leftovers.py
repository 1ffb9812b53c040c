"""Temporary folders that name the process that owns them, and the cleanup of those nobody owns.

A run killed with kill -9 (a cut notebook session) leaves its temporary folders behind:
``.kit-staging/checkpoint-N-…`` (hard links that hold a whole checkpoint once the trainer has
rotated the original away) and ``.<name>.fetch-…`` from a resume download. On Kaggle's ~20 GB
``/kaggle/working`` that is a slow disk leak. Each such folder carries its owner — a short tag of
the host name and the pid — so the next run removes exactly the ones whose process is gone, and
never one that a live process (a second job in the same folder, a notebook cell) still uses.

Example:
    >>> owned_name("checkpoint-12")
    'checkpoint-12-h3f9a1c-p4242'
    >>> clean_output_dir("outputs")   # at start, on rank 0: ['outputs/.kit-staging/checkpoint-9-h…']
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path

log = logging.getLogger("kit.checkpoints.leftovers")

STAGING = ".kit-staging"
_OWNER_RE = re.compile(r"-h([0-9a-f]{6})-p(\d+)(?:-|$)")
# Folders of kit's temporary shapes that carry no owner (written by kit before owners were
# recorded) are removed once they are this old: no save or download takes that long.
UNOWNED_AGE_S = 6 * 3600
_TEMP_SHAPES = (re.compile(r"^\..+\.fetch-"), re.compile(r"^\..+\.old-"), re.compile(r"^\.kit-download-"))


def host_tag(host: str | None = None) -> str:
    """Six hex digits for the host (host names may hold any character; the tag is safe in a file name)."""
    return hashlib.sha1((host or socket.gethostname()).encode()).hexdigest()[:6]


def owned_name(base: str) -> str:
    """``base`` with this process as owner: ``base-h<host tag>-p<pid>``."""
    return f"{base}-h{host_tag()}-p{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def orphaned(name: str, mtime: float, now: float | None = None) -> bool:
    """True when the folder ``name`` belongs to a process of this host that is gone.

    A folder owned by another host is never judged (its pid means nothing here). One without an
    owner tag counts as orphaned only when older than ``UNOWNED_AGE_S``.
    """
    m = _OWNER_RE.search(name)
    if m is None:
        return (time.time() if now is None else now) - mtime > UNOWNED_AGE_S
    tag, pid = m.group(1), int(m.group(2))
    return tag == host_tag() and pid != os.getpid() and not _alive(pid)


def clean_output_dir(output_dir: str | Path) -> list[str]:
    """Remove the temporary folders under ``output_dir`` that no live process owns; returns their paths."""
    root = Path(output_dir)
    found: list[Path] = []
    if root.is_dir():
        found += [p for p in root.iterdir() if p.is_dir() and any(r.match(p.name) for r in _TEMP_SHAPES)]
    staging = root / STAGING
    if staging.is_dir():
        found += [p for p in staging.iterdir() if p.is_dir()]
    removed = []
    for path in sorted(found):
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:  # its owner finished meanwhile
            continue
        if not orphaned(path.name, mtime):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
            log.info("removed %s, left behind by a run that was killed", path)
    return removed
