"""What must match for a checkpoint to resume this job — with the data judged by its content.

`config_fields(cfg)` holds the config fields (model, method, LoRA shape, data settings,
seq_len). The manifest stores :func:`of_job` instead: the same fields, but `data.path` replaced by
`data.content`, the size and sha256 of the data files. So `./data/x.jsonl` and `data/x.jsonl` are
the same dataset, and a file edited in place is not. Manifests written before `data.content`
existed still resume: their `data.path` is compared as a normalised path.

Some differences can be forced (`--force`: other data, revision, seq_len); a change of tensor
shapes cannot — loading would fail inside torch with a `size mismatch` traceback.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kit.planning.names import LOCAL_TYPES

_CHUNK = 1 << 20
_FINGERPRINT = ("model", "revision", "method", "lora.r", "lora.target_modules", "data.path",
                "data.format", "data.columns", "seq_len")


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def config_fields(cfg) -> dict:
    """The fields that must match for a checkpoint to resume this run."""
    out = {}
    for key in _FINGERPRINT:
        value = _get(cfg, key)
        out[key] = list(value) if isinstance(value, list) else (dict(value) if isinstance(value, dict) else value)
    # An SFT checkpoint records no trainer (as before trainers existed); a DPO/KTO one does, so neither
    # resumes as the other without --force.
    if getattr(cfg, "trainer", "sft") != "sft":
        out["trainer"] = cfg.trainer
    return out


def diff_lines(a: dict, b: dict) -> list[str]:
    """Human lines for each fingerprint field that differs, e.g. `lora.r: 16 (checkpoint) != 8 (config)`."""
    lines = []
    for key in sorted(set(a) | set(b), key=lambda k: (_FINGERPRINT + (k,)).index(k)):
        if a.get(key) != b.get(key):
            lines.append(f"{key}: {a.get(key)!r} (checkpoint) != {b.get(key)!r} (config)")
    return lines


def data_content(path: str) -> dict:
    """``{"size", "sha256"}`` of a local data file, or of a folder's data files (names included);
    ``{"dataset": id}`` for a Hub dataset id, whose bytes are not here to hash."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in LOCAL_TYPES and f.is_file())
    else:
        return {"dataset": str(path)}
    h, size = hashlib.sha256(), 0
    for f in files:
        if p.is_dir():
            h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def of_job(cfg) -> dict:
    """The fingerprint a checkpoint's manifest records for ``cfg``."""
    out = config_fields(cfg)
    out.pop("data.path", None)
    out["data.content"] = data_content(cfg.data.path)
    return out


def _words(content) -> str:
    if not isinstance(content, dict):
        return repr(content)
    if "sha256" in content:
        return f"{content.get('size')} bytes, sha256 {str(content['sha256'])[:12]}…"
    return f"dataset {content.get('dataset')!r}"


def _same_path(a, b) -> bool:
    if a is None or b is None:
        return a == b
    return os.path.normpath(os.path.expanduser(str(a))) == os.path.normpath(os.path.expanduser(str(b))) or (
        Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def differences(found: dict, cfg) -> tuple[list[str], list[str]]:
    """``(forceable, shape_changes)``: human lines for each field where ``found`` (a manifest's
    fingerprint) and ``cfg`` disagree."""
    current = config_fields(cfg)
    found = dict(found)
    lines: list[str] = []
    if "data.content" in found:
        mine, theirs = data_content(cfg.data.path), found.pop("data.content")
        if theirs != mine:
            lines.append(f"data: {cfg.data.path} ({_words(mine)}) is not the data the checkpoint was trained on "
                         f"({_words(theirs)})")
        found.pop("data.path", None)
        current.pop("data.path", None)
    elif "data.path" in found and _same_path(found["data.path"], current.get("data.path")):
        found.pop("data.path")  # an older manifest: the path as text, normalised
        current.pop("data.path", None)
    lines += diff_lines(found, current)
    shape = [line for line in lines if _changes_shapes(line, found, current)]
    return [line for line in lines if line not in shape], shape


def _changes_shapes(line: str, found: dict, current: dict) -> bool:
    key = line.split(":", 1)[0]
    if key not in found:  # a manifest that did not record it: a difference, but not a known shape change
        return False
    if key in ("model", "lora.r", "lora.target_modules"):
        return True
    if key == "method":  # lora <-> qlora keeps the adapter's shapes; full <-> adapter does not
        return "full" in (found.get("method"), current.get("method"))
    return False
