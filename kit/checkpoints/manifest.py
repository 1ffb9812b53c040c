"""The kit manifest: what a complete checkpoint holds, so a store can tell whole from partial.

``kit_manifest.json`` sits inside ``checkpoint-N/`` and lists every other file with its size and
sha256, plus the step, world size, the config fingerprint that must match to resume, and the
versions of the packages that wrote it. A checkpoint is complete exactly when it verifies.

Each entry is a path inside the checkpoint folder, in the one form `list_files` writes: relative,
"/"-separated, no "." or ".." part, no empty part, no backslash, NUL or other control character,
named once. An entry that could reach outside its folder (`../../etc/passwd`, `/etc/passwd`, a
symlink out of it) makes the manifest invalid wherever it is read: a local checkpoint, a directory
store or the Hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from importlib import metadata
from pathlib import Path

from kit.files import write_atomic

MANIFEST_NAME = "kit_manifest.json"
SCHEMA = 1
PACKAGES = ("kit", "torch", "transformers", "peft", "trl")
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    if out["kit"] is None:  # run from a clone (`%run kit`), not pip-installed
        import kit

        out["kit"] = getattr(kit, "__version__", None)
    return out


def list_files(ckpt_dir: Path) -> list[str]:
    """Every file under ``ckpt_dir`` as a posix relative path, the manifest itself excluded."""
    ckpt_dir = Path(ckpt_dir)
    return sorted(
        p.relative_to(ckpt_dir).as_posix()
        for p in ckpt_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    )


def build_manifest(ckpt_dir: Path, step: int, world_size: int, fingerprint: dict,
                   extra: dict | None = None) -> dict:
    """Describe ``ckpt_dir``: every file with size and sha256, plus step, world size and versions."""
    ckpt_dir = Path(ckpt_dir)
    files = {
        rel: {"size": (ckpt_dir / rel).stat().st_size, "sha256": sha256_file(ckpt_dir / rel)}
        for rel in list_files(ckpt_dir)
    }
    return {
        "schema": SCHEMA,
        "step": int(step),
        "world_size": int(world_size),
        "fingerprint": dict(fingerprint),
        "versions": _versions(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
        "extra": dict(extra or {}),
    }


def write_manifest(ckpt_dir: Path, step: int, world_size: int, fingerprint: dict,
                   extra: dict | None = None) -> dict:
    """Build the manifest and write it atomically (temp file + ``os.replace``) into ``ckpt_dir``."""
    ckpt_dir = Path(ckpt_dir)
    manifest = build_manifest(ckpt_dir, step, world_size, fingerprint, extra)
    write_atomic(ckpt_dir / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True), fsync=True)
    return manifest


def entry_problem(rel) -> str | None:
    """Why ``rel`` is not a file entry of a checkpoint folder (words for a one-line reason), or None.

    Only the form kit writes is accepted, so no entry can name a file outside the folder, and no two
    entries can name the same file (``a`` and ``./a``).
    """
    if not isinstance(rel, str) or not rel:
        return "is not a file name"
    if "\x00" in rel or any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "holds a NUL or control character"
    if "\\" in rel:
        return "holds a backslash"
    if rel.startswith("/") or re.match(r"[A-Za-z]:", rel):
        return "is an absolute path"
    parts = rel.split("/")
    if ".." in parts:
        return "leaves its checkpoint folder (a '..' part)"
    if any(part in ("", ".") for part in parts):
        return "is not a plain relative path (an empty or '.' part)"
    return None


def bad_entry(manifest: dict) -> str | None:
    """The first entry of ``manifest["files"]`` that is not a plain file of its folder, as a reason; else None."""
    for rel in manifest["files"]:
        problem = entry_problem(rel)
        if problem:
            return f"{MANIFEST_NAME} lists {_shown(rel)}, which {problem}: not a kit manifest"
    return None


def _shown(rel) -> str:
    text = repr(rel)  # escaped: a name from a file is never printed raw (a newline, a terminal escape)
    return text if len(text) <= 80 else text[:77] + "…"


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {_shown(key)} appears twice")
        out[key] = value
    return out


def parse_manifest(text: str | bytes) -> dict | None:
    """The manifest in ``text``, or None when it is not a kit manifest (a key given twice included:
    two entries for one file, of which JSON would silently keep the last)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or not _count(data.get("step")):
        return None
    # Every reader compares these: a wrong type here must mean "not a manifest", never a crash mid-resume.
    for want in data["files"].values():
        if not (isinstance(want, dict) and _count(want.get("size")) and isinstance(want.get("sha256"), str)):
            return None
    return data


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def read_manifest(ckpt_dir: Path) -> dict | None:
    """The manifest of ``ckpt_dir``, or None when missing or unreadable."""
    try:
        return parse_manifest((Path(ckpt_dir) / MANIFEST_NAME).read_bytes())
    except FileNotFoundError:
        return None


def verify(ckpt_dir: Path) -> tuple[bool, str]:
    """Check every file the manifest lists against the bytes on disk.

    Returns:
        ``(True, "ok: N files, B bytes")`` or ``(False, reason)`` naming the first bad file.
    """
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / MANIFEST_NAME).exists():
        return False, f"no {MANIFEST_NAME}"
    manifest = read_manifest(ckpt_dir)
    if manifest is None:
        return False, f"{MANIFEST_NAME} is not valid JSON or lacks files/step"
    return verify_files(ckpt_dir, manifest)


def verify_files(ckpt_dir: Path, manifest: dict) -> tuple[bool, str]:
    """Every listed file is a regular file inside ``ckpt_dir`` (no symlink on its way) with the
    listed size and sha256; ``(ok, reason)``."""
    bad = bad_entry(manifest)
    if bad:
        return False, bad
    total = 0
    for rel, want in sorted(manifest["files"].items()):
        path = Path(ckpt_dir) / rel
        link = _link_on_the_way(Path(ckpt_dir), rel)
        if link is not None:
            return False, f"{_shown(rel)} is reached through the symlink {_shown(link)}: a checkpoint holds its own files"
        if not path.is_file():
            return False, f"{rel} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return False, f"{rel} has {size} bytes, manifest says {want['size']}"
        if sha256_file(path) != want["sha256"]:
            return False, f"{rel} sha256 differs from the manifest"
        total += size
    return True, f"ok: {len(manifest['files'])} files, {total} bytes"


def _link_on_the_way(ckpt_dir: Path, rel: str) -> str | None:
    """The first part of ``rel`` (within ``ckpt_dir``) that is a symlink, as a relative path; None when none is."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        if (ckpt_dir / "/".join(parts[:i])).is_symlink():
            return "/".join(parts[:i])
    return None
