"""Where a model and a store live: a config's `model` and `store` names, checked when the config
is read (exit 2), not when the script reaches the Hub after the libraries load.

    model   a local folder, or a Hub repo id: owner/name, or a bare legacy name (gpt2); an
            absolute path is left to the script (it may exist only where the job runs)
    store   hf://owner/name, or a local directory (a mounted bucket is one)
    data    a local file (LOCAL_TYPES) or folder, or a Hub dataset id; checked when planning
            (`check_data`), since `kit status` and `kit export` read configs whose data has moved on
"""

from __future__ import annotations

import re
from pathlib import Path

from kit.errors import UsageError

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"  # the Hub's rule: no '.' or '-' at either end
REPO_ID_RE = re.compile(rf"^{_PART}/{_PART}$")
_BARE_RE = re.compile(rf"^{_PART}$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")  # gs:, s3:, https: (a Windows drive, C:, is one letter)
_HUB_URL_RE = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?:datasets/|spaces/)?([^/?#]+/[^/?#]+)")
LOCAL_TYPES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}  # datasets' builders
_ID_RULE = "owner/name: letters, digits, '-', '_', '.'; no '..' or '--'"


def valid_repo_id(text: str, bare: bool = False) -> bool:
    ok = REPO_ID_RE.match(text) or (bare and _BARE_RE.match(text))
    return bool(ok) and ".." not in text and "--" not in text


def parse_repo_id(spec: str) -> str:
    """The repo id of a Hub store `hf://owner/name`; UsageError in the Hub's own terms otherwise."""
    repo_id = spec.removeprefix("hf://").strip("/")
    if not valid_repo_id(repo_id):
        raise UsageError(f"invalid Hugging Face repo id {repo_id!r} in store {spec!r}: expected hf://owner/name "
                         f"({_ID_RULE})")
    return repo_id


def _scheme(text: str) -> str | None:
    m = _SCHEME_RE.match(text)
    return m.group(1).lower() if m and len(m.group(1)) > 1 else None


def _hub_url_id(text: str) -> str | None:
    m = _HUB_URL_RE.match(text)
    return m.group(1) if m else None


def _rooted(text: str) -> bool:
    """An absolute path (or ~): it may exist only where the job runs (/kaggle/input/…); the script checks it."""
    return text.startswith(("/", "~", "\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", text))


def check_model(value: str, key: str, where: str) -> str:
    text = value.strip()
    scheme = _scheme(text)
    if scheme == "hf":
        raise UsageError(f"config key {key!r}{where} is {value!r}: a model is named by its repo id alone, "
                         f"e.g. {text.split('://', 1)[-1].strip('/')!r} (hf:// is for the store)")
    if scheme in ("http", "https") and _hub_url_id(text):
        raise UsageError(f"config key {key!r}{where} is a web address: name the model by its repo id, "
                         f"{_hub_url_id(text)!r}")
    if scheme is not None:
        raise UsageError(f"config key {key!r}{where} is {value!r}: a model is a local folder or a Hub repo id "
                         f"({_ID_RULE}), not a {scheme}:// address: download it to a folder first")
    if valid_repo_id(text, bare=True) or _rooted(text) or Path(text).exists():
        return value
    raise UsageError(f"config key {key!r}{where} is {value!r}: no such folder here, and not a Hub repo id "
                     f"({_ID_RULE})")


def check_store(value: str, key: str, where: str) -> str:
    text = value.strip()
    scheme = _scheme(text)
    if scheme == "hf" and not text.lower().startswith("hf://"):
        raise UsageError(f"config key {key!r}{where} is {value!r}: a Hub store is written hf://owner/name")
    if scheme == "hf":
        try:
            parse_repo_id(text)
        except UsageError as e:
            raise UsageError(f"config key {key!r}{where}: {e}") from None
        return value
    if scheme in ("http", "https") and _hub_url_id(text):
        raise UsageError(f"config key {key!r}{where} is a web address: a Hub store is hf://{_hub_url_id(text)}")
    if scheme is not None:
        raise UsageError(f"config key {key!r}{where} is {value!r}: a store is hf://owner/name or a local directory; "
                         f"for a bucket ({scheme}://), mount it (gcsfuse, s3fs, rclone mount) and give the mounted path")
    return value


NAME_MAX = 255  # bytes in one file or folder name: ext4, xfs, btrfs, NTFS (in UTF-16 units), APFS


def check_name_lengths(value: str, key: str, where: str) -> None:
    """Refuse a path one of whose names no file system takes (OSError: File name too long, later)."""
    long = next((part for part in value.replace("\\", "/").split("/") if len(part.encode()) > NAME_MAX), None)
    if long is not None:
        raise UsageError(f"config key {key!r}{where}: the name {long[:24]!r}… is {len(long.encode())} bytes long, "
                         f"over the {NAME_MAX} a file system allows in one file or folder name: shorten it")


def check_data(path: str) -> None:
    """A relative data file that is not there, before any plan (the script found out after the model
    loaded). Absolute paths may exist only where the job runs (/kaggle/input/…): the script checks them."""
    p = Path(path)
    if _rooted(path) or p.exists() or p.suffix not in LOCAL_TYPES:
        return
    raise UsageError(f"data file {path} does not exist (data.path): run from the folder it is relative to, "
                     "or give its full path")
