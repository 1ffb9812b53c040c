"""Where to resume from: the newest complete checkpoint, local first, then the store.

A checkpoint is complete when its kit manifest verifies (every file present with its size and
sha256). A folder without one (a save cut by a kill) is skipped with a warning: HF Trainer's own
`get_last_checkpoint` would pick it and fail (huggingface/transformers#35782, #35525).
A vanilla Trainer checkpoint is accepted only when named explicitly (`resume: PATH`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit import config, manifest
from kit.errors import UsageError

_CKPT = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class Decision:
    resume_from: str | None = None   # a local checkpoint folder, or None to start fresh
    step: int = 0
    source: str = "none"             # local | store | path | none
    complete: bool = False
    max_steps: int | None = None
    world_size: int | None = None    # of the run that wrote the checkpoint
    warnings: list = field(default_factory=list)


def local_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """`checkpoint-N` folders under `output_dir`, newest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CKPT.match(p.name))]
    return sorted(found, reverse=True)


def newest_local(output_dir, warnings: list) -> tuple[int, Path] | None:
    for step, path in local_checkpoints(output_dir):
        ok, why = manifest.verify(path)
        if ok:
            return step, path
        warnings.append(f"skipping local {path.name}: {why}")
    return None


def trainer_state(path: Path) -> dict:
    try:
        return json.loads((Path(path) / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not a Trainer checkpoint (trainer_state.json: {e})") from e


def check_fingerprint(path: Path, cfg, force: bool, warnings: list) -> None:
    """Refuse a checkpoint written for another model, method, LoRA shape or data, unless forced."""
    found = (manifest.read_manifest(path) or {}).get("fingerprint")
    if found is None:
        return
    diff = config.diff_fingerprints(found, config.fingerprint(cfg))
    if not diff:
        return
    words = "; ".join(diff)
    if not force:
        raise UsageError(f"checkpoint {path.name} was written for a different job ({words}); "
                         "pass --force to resume anyway, or use another output_dir/store")
    warnings.append(f"--force: resuming {path.name} despite: {words}")


def _fetch_newer(output_dir, store, local_step: int | None, warnings: list) -> Path | None:
    """Download the store's newest complete checkpoint if it is newer than `local_step`.

    A checkpoint that fails to download or verify is skipped for the next older one (the store
    logs why). Nothing local is deleted: an incomplete local folder of the same step is set aside.
    """
    if store is None:
        return None
    remote = store.latest_valid()
    if remote is None or (local_step is not None and remote <= local_step):
        return None
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / ".kit-download"
    step = store.fetch_latest(staging)
    if step is None or (local_step is not None and step <= local_step):
        shutil.rmtree(staging, ignore_errors=True)
        return None
    if step != remote:
        warnings.append(f"store checkpoint-{remote} did not verify; using checkpoint-{step}")
    dest = root / f"checkpoint-{step}"
    if dest.exists():
        aside = dest.with_name(f"{dest.name}.incomplete-{int(time.time())}")
        dest.rename(aside)
        warnings.append(f"kept the incomplete local {dest.name} as {aside.name}")
    staging.rename(dest)
    return dest


def current_target(configured: int | None, step: int | None, recorded: int | None) -> int | None:
    """The job's step target now: one rule for the script, `kit status` and `kit schedule`.

    The configured max_steps, while the job has not reached it. A job already past it was extended
    (`max_steps=100` on the command line of a 60-step config): then the target it was extended to,
    as recorded by the checkpoint or the last session, is the current one — never "step 100 of 60".
    """
    if configured and (step is None or step < configured):
        return configured
    if recorded and recorded > (configured or 0):
        return recorded
    return configured or recorded


def choose(cfg, store, world_size: int, force: bool = False) -> Decision:
    """Rank 0's decision. Downloads from `store` into `cfg.output_dir` when the store is newer."""
    d = Decision()
    if cfg.resume == "never":
        existing = local_checkpoints(cfg.output_dir)
        if existing:
            raise UsageError(f"resume=never, but {cfg.output_dir} holds checkpoints (newest checkpoint-{existing[0][0]}) "
                             "that training would overwrite; use another output_dir or resume=auto")
        return d
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        if not path.is_dir():
            raise UsageError(f"resume={cfg.resume}: no such checkpoint folder")
        d.resume_from, d.source = str(path), "path"
    else:
        local = newest_local(cfg.output_dir, d.warnings)
        fetched = _fetch_newer(cfg.output_dir, store, local[0] if local else None, d.warnings)
        if fetched is not None:
            d.resume_from, d.source = str(fetched), "store"
        elif local is not None:
            d.resume_from, d.source = str(local[1]), "local"
    if d.resume_from is None:
        return d
    path = Path(d.resume_from)
    check_fingerprint(path, cfg, force, d.warnings)
    state = trainer_state(path)
    d.step = int(state.get("global_step", 0))
    d.max_steps = current_target(cfg.max_steps, d.step, state.get("max_steps"))
    d.complete = bool(d.max_steps) and d.step >= d.max_steps
    d.world_size = (manifest.read_manifest(path) or {}).get("world_size")
    if d.world_size and d.world_size != world_size and not d.complete:
        d.warnings.append(
            f"checkpoint was written by {d.world_size} processes, this run has {world_size}: the global batch "
            f"is kept, but the data order after step {d.step} differs from an uninterrupted run and ranks "
            f"without a saved RNG state start from a fresh one")
    return d
