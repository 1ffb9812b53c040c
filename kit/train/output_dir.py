"""The output folder, checked before anything is loaded: Trainer would find out only at its first save."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kit.errors import UsageError


def check_output_dir(path: str) -> None:
    """Refuse an output_dir that cannot hold checkpoints, before anything is loaded (UsageError, exit 2).

    Trainer would find out only at its first save, after the model load and the first steps. The
    folder is created (Trainer would create it anyway) and a file is written into it and removed:
    permission bits say little when running as root or on a read-only mount.
    """
    out = Path(path)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == out else f"is under {blocker}, which is a file"
        raise UsageError(f"output_dir {out} {where}, not a directory: choose another output_dir")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out, prefix=".kit-write-check-"):
            pass
    except OSError as e:
        raise UsageError(f"output_dir {out} is not writable ({e.strerror or e}): choose another output_dir") from None
