"""Run identity: one run id per job, and the exact base model revision its adapter belongs to.

A LoRA adapter is only meaningful on the weights it was trained against. The revision is the Hub
commit sha the weights were loaded from (transformers records it as `config._commit_hash`), or,
for a local folder, `local-sha256:` of its weight files (the whole bytes up to 1 GiB; above that
the safetensors headers, which name every tensor with its dtype, shape and offsets, plus the
sizes, so hashing a 16 GB model does not cost minutes). Resume, evaluation and export refuse a
different revision unless `--force`.
"""

from __future__ import annotations

import hashlib
import struct
import time
import uuid
from pathlib import Path

from kit.errors import UsageError
from kit.files import parse_json

RUN_RECORD = "run.json"          # in the store, under kit/
RUN_LOCAL = "kit_run.json"       # in output_dir, and in final/
FULL_HASH_LIMIT = 1 << 30
_WEIGHTS = ("*.safetensors", "*.bin")


def new_run_id() -> str:
    """`20261203-0812-3f9c1a`: sortable by start time, unique enough for one person's jobs."""
    return time.strftime("%Y%m%d-%H%M", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def local_revision(folder) -> str | None:
    """`local-sha256:<hex>` of a local model folder's weights, or None when it holds none."""
    folder = Path(folder)
    files = sorted(p for pattern in _WEIGHTS for p in folder.glob(pattern))
    if not files:
        return None
    full = sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{p.stat().st_size};".encode())
        with open(p, "rb") as f:
            if full:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            elif p.suffix == ".safetensors":
                (n,) = struct.unpack("<Q", f.read(8))
                h.update(f.read(n))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        h.update(index.read_bytes())
    return f"local-sha256:{h.hexdigest()[:32]}"


def base_revision(model_name: str, model_config=None) -> str:
    """The revision of the base weights: a Hub commit sha, a local hash, or `unknown (why)`."""
    if Path(model_name).is_dir():
        return local_revision(model_name) or f"unknown (no weight files in {model_name})"
    sha = getattr(model_config, "_commit_hash", None) if model_config is not None else None
    return f"hub:{sha}" if sha else "unknown (the loaded config names no Hub commit)"


def check_same_base(recorded: str | None, current: str, what: str, force: bool) -> str | None:
    """None when they match (or nothing was recorded); a warning under --force; else UsageError."""
    if not recorded or recorded == current:
        return None
    words = f"{what} was trained on base revision {recorded}, but the base model now is {current}"
    if not force:
        raise UsageError(f"{words}: an adapter only fits the weights it was trained on; restore that base "
                         "(model, revision) or pass --force")
    return f"--force: {words}"


def parse_record(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        data = parse_json(text)
    except ValueError:  # not JSON, a number past 4300 digits, or nested past the limit
        return None
    return data if isinstance(data, dict) and data.get("run_id") else None
