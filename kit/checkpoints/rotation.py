"""Local checkpoint rotation: the newest `keep_checkpoints` folders named `checkpoint-<step>` stay.

HF Trainer's own rotation (`save_total_limit`) globs `checkpoint-*` and, on some filesystems, sorts
by modification time: a user's `checkpoint-best` folder counted and was deleted with what it held,
and a junk `checkpoint-abc` newer than a real checkpoint pushed that one out. kit leaves Trainer's
limit off and rotates here, after each checkpoint is sealed (rank 0): only folders whose name is
exactly `checkpoint-<digits>` count, ordered by step; the checkpoint just written is never removed;
anything else in output_dir is the user's. The store keeps its own copies (`store/retention.py`),
and the background upload works from a staged copy, so a rotated folder is never mid-upload.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from kit.checkpoints.resume import local_checkpoints

log = logging.getLogger("kit.checkpoints")


def rotate(output_dir, keep: int, current: Path) -> list[Path]:
    """Remove the oldest `checkpoint-<step>` folders beyond `keep`, never `current`; the ones removed."""
    found = [p for _, p in reversed(local_checkpoints(output_dir)) if not p.is_symlink()]  # oldest step first
    doomed = [p for p in found[:-keep] if p != Path(current)] if keep > 0 else []
    removed = []
    for path in doomed:
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as e:  # a file held open elsewhere: it stays, and the next save tries again
            log.warning("could not remove the old checkpoint %s (%s); it stays for now", path, e.strerror or e)
    return removed
