"""What a checkpoint store holds and how it is named: paths, the records folder, the views and
verdicts a `Store` passes around, and the errors a backend raises.

    checkpoints/checkpoint-N/   HF Trainer's checkpoint + kit_manifest.json (a "kit" candidate)
    last-checkpoint/            HF Trainer's hub_strategy="checkpoint" folder (a "vanilla" one)
    kit/...                     small job records (lease, sessions, job.json), see record_path
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import StoreError, UsageError
from kit.checkpoints.manifest import MANIFEST_NAME, bad_entry, read_manifest

CKPT_DIR = "checkpoints"
FINAL = "final"  # a finished job's deliverable; one of an earlier target is kept as final-step-N (kept_final_name)
VANILLA_DIR = "last-checkpoint"
RECORDS_DIR = "kit"
CKPT_RE = re.compile(r"^checkpoints/checkpoint-(\d+)/(.+)$")
_WEIGHTS_RE = re.compile(r"^(adapter_model|model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$")


def final_step_of(folder) -> int | None:
    """The step of a final/ folder (its eval_results.json), None without a readable one."""
    from kit.files import parse_json

    try:
        results = parse_json((Path(folder) / "eval_results.json").read_bytes())
    except (OSError, ValueError):
        return None
    step = results.get("step") if isinstance(results, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def kept_final_name(step: int | None, taken) -> str:
    """Where a `final/` of an earlier target (step `step`) is kept when a job's final/ of another step
    replaces it, beside it, locally and in a store: final-step-4, or final-step-4-2 when taken holds that."""
    base = f"{FINAL}-step-{step}" if step is not None else f"{FINAL}-earlier"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


class TransientStoreError(StoreError):
    """A failure worth retrying: timeout, dropped connection, 429 or 5xx."""


class StaleHead(StoreError):
    """The store changed between our read and our write (Hub: 412 on ``parent_commit``)."""


@dataclass
class Snapshot:
    """One consistent view of the store: file sizes by path, and what that view is pinned to."""

    version: str | None  # Hub: commit sha; directory: None
    files: dict[str, int]
    sha256: dict[str, str] = field(default_factory=dict)  # where the backend knows it for free
    ids: dict[str, str] = field(default_factory=dict)  # what changes when a file's bytes do (blob id)


@dataclass
class Candidate:
    step: int
    prefix: str  # "checkpoints/checkpoint-N" or "last-checkpoint"
    kind: str  # "kit" | "vanilla"
    files: dict[str, int]  # path relative to prefix -> size


@dataclass
class Verdict:
    """What :meth:`Store.inspect` found for one candidate."""

    cand: Candidate
    ok: bool
    reason: str

    @property
    def step(self) -> int:
        return self.cand.step


def check_vanilla(files: dict[str, int]) -> tuple[bool, str]:
    missing = [n for n in ("trainer_state.json", "optimizer.pt") if n not in files]
    if not any(_WEIGHTS_RE.match(n) for n in files):
        missing.append("adapter/model weights")
    if missing:
        return False, "vanilla Trainer checkpoint lacks " + ", ".join(missing)
    return True, "vanilla Trainer checkpoint (no kit manifest; checked by file presence)"


def record_path(name: str) -> str:
    """``sessions.jsonl`` or ``kit/sessions.jsonl`` → ``kit/sessions.jsonl``; rejects escapes."""
    name = name.removeprefix(RECORDS_DIR + "/")
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise UsageError(f"job record name {name!r} must be a relative path under {RECORDS_DIR}/")
    return f"{RECORDS_DIR}/{name}"


def local_files(local_ckpt_dir: Path, step: int) -> tuple[dict, list[str]]:
    """The manifest of a local checkpoint about to be published, and the files to send."""
    local_ckpt_dir = Path(local_ckpt_dir)
    if not local_ckpt_dir.is_dir():
        raise StoreError(f"checkpoint folder {local_ckpt_dir} does not exist")
    manifest = read_manifest(local_ckpt_dir)
    if manifest is None:
        raise StoreError(f"{local_ckpt_dir} has no valid {MANIFEST_NAME}: call kit.checkpoints.manifest.write_manifest "
                         "before publishing")
    if int(manifest["step"]) != step:
        raise StoreError(f"{local_ckpt_dir}/{MANIFEST_NAME} says step {manifest['step']}, not {step}")
    if bad := bad_entry(manifest):  # a file outside the checkpoint would be sent to the store
        raise StoreError(f"{local_ckpt_dir}: {bad}")
    for rel, want in manifest["files"].items():
        path = local_ckpt_dir / rel
        if not path.is_file() or path.stat().st_size != want["size"]:
            raise StoreError(f"{local_ckpt_dir}: {rel} is missing or changed since the manifest was written")
    return manifest, sorted(manifest["files"]) + [MANIFEST_NAME]
