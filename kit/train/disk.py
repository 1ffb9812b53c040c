"""Disk space for checkpoints: checked before each save, and a disk that fills up during one.

A full disk used to surface as a raw `SafetensorError … No space left on device` traceback, exit 1,
with a half-written checkpoint folder left behind. Now:

- `Room` estimates what the next checkpoint takes (the last one's size; before the first, the
  trainable parameters with two fp32 Adam states each) and `Room.short(folder)` says, before the
  save, when the folder's disk has less free (`kit.files.free_bytes`, the export's check too);
- `full_disk_stops(output_dir)` turns a disk that fills up during a save anyway (ENOSPC, or a
  library's error wrapping it) into one `StoreError` line, exit 4, after removing the partial
  checkpoint; the checkpoints before it stay.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from kit.checkpoints.manifest import MANIFEST_NAME
from kit.checkpoints.resume import local_checkpoints
from kit.errors import StoreError
from kit.files import free_bytes, is_disk_full, size_words

MARGIN = 1.05  # a checkpoint of the same model varies little: its size, plus a little
SLACK = 64 << 10  # trainer_state.json, the manifest, filesystem blocks (the tokenizer is in the measured size)


def folder_bytes(path) -> int:
    """The bytes of every file under `path` (0 when it is not there)."""
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.is_dir() else 0


class Room:
    """What the next checkpoint needs, and whether a folder's disk has it."""

    def __init__(self, model=None):
        self.last_bytes: int | None = None  # the newest checkpoint's size, once one is saved
        self.model = model

    def need(self) -> int:
        if self.last_bytes is not None:
            return int(self.last_bytes * MARGIN) + SLACK
        trainable = [p for p in self.model.parameters() if p.requires_grad] if self.model is not None else []
        # The weights saved (an adapter: the trainable ones) and Adam's two fp32 states for each.
        return int(sum(p.numel() * (p.element_size() + 8) for p in trainable) * MARGIN) + SLACK

    def saved(self, ckpt_dir) -> None:
        self.last_bytes = folder_bytes(ckpt_dir) or self.last_bytes

    def short(self, folder) -> str | None:
        """Why the next checkpoint does not fit into `folder`, or None when it does."""
        need, free = self.need(), free_bytes(folder)
        if free >= need:
            return None
        return (f"no room for the next checkpoint in {folder}: {size_words(free)} free on its disk, a checkpoint "
                f"needs ~{size_words(need)}; the checkpoints saved so far are kept: free some space (or lower "
                "keep_checkpoints) or choose another output_dir, and run the same command to resume")


@contextlib.contextmanager
def full_disk_stops(output_dir: str):
    """Around `trainer.train()`: a disk full during a save is one line, exit 4, the partial checkpoint removed."""
    try:
        yield
    except Exception as e:  # safetensors' SafetensorError and torch's RuntimeError wrap the OSError
        if not is_disk_full(e, output_dir):
            raise
        partial = _remove_partial(output_dir)
        gone = f"; the partial {partial} was removed" if partial else ""
        kept = _newest_sealed(output_dir)
        has = f", {kept} is kept" if kept else ""
        raise StoreError(f"the disk of {output_dir} is full ({size_words(free_bytes(output_dir))} free) while saving "
                         f"a checkpoint{gone}{has}: free some space (or lower keep_checkpoints) or choose another "
                         "output_dir, and run the same command to resume") from None


def _remove_partial(output_dir) -> str | None:
    """Remove the newest checkpoint folder when it has no kit manifest (its save was cut); its name, or None."""
    found = local_checkpoints(output_dir)
    if not found or (found[0][1] / MANIFEST_NAME).exists():
        return None
    shutil.rmtree(found[0][1], ignore_errors=True)
    return found[0][1].name


def _newest_sealed(output_dir) -> str | None:
    return next((p.name for _, p in local_checkpoints(output_dir) if (p / MANIFEST_NAME).exists()), None)
