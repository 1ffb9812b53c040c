"""A real small filesystem for disk-full tests: a tmpfs of a given size, mounted for one test.

Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the test is skipped, saying so.
A full disk cannot be faked faithfully: what matters is the real ENOSPC from the kernel and the
real error each library wraps it in (safetensors' SafetensorError, torch's zip writer).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """Mount a tmpfs of `size` ("1M", "256k") at `path` (created) for the block; unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here (needs root or CAP_SYS_ADMIN): {r.stderr.strip()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave: int) -> Path:
    """Write a filler file into `path` so that about `leave` bytes stay free; returns it."""
    import shutil

    filler = path / "filler.bin"
    free = shutil.disk_usage(path).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler
