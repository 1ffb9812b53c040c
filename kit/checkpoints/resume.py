"""Where to resume from: the newest complete checkpoint, local first, then the store.

A checkpoint is complete when its kit manifest verifies (every file present with its size and
sha256). A folder without one (a save cut by a kill) is skipped with a warning: HF Trainer's own
`get_last_checkpoint` would pick it and fail (huggingface/transformers#35782, #35525).
A vanilla Trainer checkpoint is accepted only when named explicitly (`resume: PATH`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.checkpoints import fingerprint, leftovers, manifest
from kit.errors import UsageError
from kit.files import json_problem, parse_json

STEP_DIR = re.compile(r"checkpoint-(\d+)")  # a checkpoint folder kit wrote (Trainer's name)


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
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))]
    return sorted(found, reverse=True)


def newest_local(output_dir, warnings: list, invalid: list | None = None) -> tuple[int, Path] | None:
    """The newest local checkpoint that verifies; the ones newer that do not go into ``invalid``."""
    for step, path in local_checkpoints(output_dir):
        ok, why = manifest.verify(path)
        if ok:
            return step, path
        warnings.append(f"skipping local {path.name}: {why}")
        if invalid is not None:
            invalid.append(path)
    return None


def set_aside(path: Path, warnings: list, why: str = "does not verify") -> Path:
    """Rename a checkpoint folder that must not be trained over to ``invalid-checkpoint-N-<time>``.

    The next save of the same step would otherwise write into it in place, mixing old and new
    files. The name does not start with ``checkpoint-``, so neither kit nor HF Trainer's rotation
    (``checkpoint-*``) takes it for a checkpoint; nothing in it is deleted.
    """
    path = Path(path)
    aside = path.with_name(f"invalid-{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    path.rename(aside)
    warnings.append(f"set {path.name} aside as {aside.name} ({why}); delete it when you no longer need it")
    return aside


def trainer_state(path: Path) -> dict:
    try:
        state = parse_json((Path(path) / "trainer_state.json").read_bytes())
    except OSError as e:
        raise UsageError(f"{path} is not a Trainer checkpoint (trainer_state.json: {e.strerror or e})") from None
    except ValueError as e:
        raise UsageError(f"{path} is not a Trainer checkpoint (trainer_state.json is {json_problem(e)})") from None
    if not isinstance(state, dict):
        raise UsageError(f"{path} is not a Trainer checkpoint (trainer_state.json is not a JSON object)")
    for key in ("global_step", "max_steps"):
        value = state.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise UsageError(f"{path} is not a Trainer checkpoint (trainer_state.json's {key} is "
                             f"{json.dumps(state.get(key))[:40]}, not a step count)")
    return state


def check_fingerprint(path: Path, cfg, force: bool, warnings: list) -> None:
    """Refuse a checkpoint written for another model, method, LoRA shape or data, unless forced.

    A change of tensor shapes (model, LoRA rank or target modules, full vs adapter) is refused
    even with ``force``: loading it would fail with a size mismatch deep inside torch.
    """
    found = (manifest.read_manifest(path) or {}).get("fingerprint")
    if found is None:
        return
    diff, shape = fingerprint.differences(found, cfg)
    if shape:
        raise UsageError(f"checkpoint {path.name} has other tensor shapes than this config ({'; '.join(shape)}): "
                         "it cannot be resumed, even with --force; use another output_dir/store, or the "
                         "checkpoint's settings")
    if not diff:
        return
    words = "; ".join(diff)
    if not force:
        raise UsageError(f"checkpoint {path.name} was written for a different job ({words}); "
                         "pass --force to resume anyway, or use another output_dir/store")
    warnings.append(f"--force: resuming {path.name} despite: {words}")


def _fetch_newer(output_dir, store, local_step: int | None, warnings: list) -> Path | None:
    """Download the store's newest complete checkpoint if it is newer than `local_step`.

    A checkpoint that fails to download or verify is skipped for the next older one (transient
    failures are retried first). Nothing local is deleted: an incomplete local folder of the same
    step is set aside.
    """
    if store is None:
        return None
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / leftovers.owned_name(".kit-download")
    skipped: list[str] = []
    step = store.fetch_latest(staging, newer_than=local_step, skipped=skipped)
    if step is None:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    if skipped:
        warnings.append(f"using the store's checkpoint-{step}; passed over: {'; '.join(skipped)}")
    dest = root / f"checkpoint-{step}"
    if dest.exists():
        set_aside(dest, warnings, "incomplete; the store's copy replaces it")
    staging.rename(dest)
    return dest


def current_target(configured: int | None, step: int | None, recorded: int | None,
                   given: bool = False) -> int | None:
    """The job's step target now: one rule for the script, `kit status` and `kit schedule`.

    The configured max_steps, while the job has not reached it. A job already past it was extended
    (`max_steps=100` on the command line of a 60-step config): then the target it was extended to,
    as recorded by the checkpoint or the last session, is the current one — never "step 100 of 60".
    A max_steps `given` on this command line is the target, also below the recorded one: that is how
    an extended job is ended early (`max_steps=80` of a job extended to 100 ends it at step 80).
    """
    if configured and (given or step is None or step < configured):
        return configured
    if recorded and recorded > (configured or 0):
        return recorded
    return configured or recorded


def final_step(output_dir: str | Path) -> int | None:
    """The step of the `final/` folder in `output_dir` (its eval_results.json), None without a readable one."""
    try:
        results = parse_json((Path(output_dir) / "final" / "eval_results.json").read_bytes())
    except (OSError, ValueError):
        return None
    step = results.get("step") if isinstance(results, dict) else None
    return step if isinstance(step, int) else None


def wrapped_up(output_dir: str | Path, store, step: int) -> bool:
    """Whether the wrap-up of `step` (final evaluation, final/) finished: a final/ of that step here or
    in the store. A session cut after its last checkpoint but before final/ has not finished the job."""
    return final_step(output_dir) == step or (store is not None and store.final_step() == step)


def _verify_explicit(path: Path) -> None:
    """An explicit ``resume=PATH`` is checked like any other: a kit checkpoint must verify.

    A folder without a kit manifest (a plain HF Trainer checkpoint) is taken as it is: that is
    what naming it explicitly is for.
    """
    if not (path / manifest.MANIFEST_NAME).exists():
        return
    ok, why = manifest.verify(path)
    if not ok:
        raise UsageError(f"resume={path}: the checkpoint does not verify ({why}); pick another "
                         "checkpoint, or resume=auto to take the newest one that does")


def choose(cfg, store, world_size: int, force: bool = False, steps_given: bool = False) -> Decision:
    """Rank 0's decision. Downloads from `store` into `cfg.output_dir` when the store is newer.

    `steps_given`: max_steps came from the command line, so it is the target (current_target).
    """
    d = Decision()
    if cfg.resume == "never":
        existing = local_checkpoints(cfg.output_dir)
        if existing:
            raise UsageError(f"resume=never, but {cfg.output_dir} holds checkpoints (newest checkpoint-{existing[0][0]}) "
                             "that training would overwrite; use another output_dir or resume=auto")
        return d
    if Path(cfg.output_dir).is_dir():
        for gone in leftovers.clean_output_dir(cfg.output_dir):
            d.warnings.append(f"removed {Path(gone).name}, a temporary folder left by a killed run")
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        if not path.is_dir():
            raise UsageError(f"resume={cfg.resume}: no such checkpoint folder")
        _verify_explicit(path)
        d.resume_from, d.source = str(path), "path"
    else:
        invalid: list[Path] = []
        local = newest_local(cfg.output_dir, d.warnings, invalid)
        fetched = _fetch_newer(cfg.output_dir, store, local[0] if local else None, d.warnings)
        if fetched is not None:
            d.resume_from, d.source = str(fetched), "store"
        elif local is not None:
            d.resume_from, d.source = str(local[1]), "local"
        resumed = int(STEP_DIR.fullmatch(Path(d.resume_from).name).group(1)) if d.resume_from else 0
        for path in invalid:  # training on from an older step saves these steps again, in place
            if path.exists() and int(STEP_DIR.fullmatch(path.name).group(1)) > resumed:
                set_aside(path, d.warnings)
    if d.resume_from is None:
        return d
    path = Path(d.resume_from)
    check_fingerprint(path, cfg, force, d.warnings)
    state = trainer_state(path)
    d.step = state.get("global_step") or 0
    d.max_steps = current_target(cfg.max_steps, d.step, state.get("max_steps"), steps_given)
    if steps_given and d.max_steps and d.step > d.max_steps:
        raise UsageError(f"max_steps={d.max_steps} is below the step of {path.name}, the checkpoint to resume: "
                         f"training cannot go back; max_steps={d.step} ends the job there, or resume=PATH "
                         "names an earlier checkpoint")
    d.complete = bool(d.max_steps) and d.step >= d.max_steps
    if d.complete and not wrapped_up(cfg.output_dir, store, d.step):
        d.complete = False  # the trainer resumes at its target, trains no step, and the wrap-up runs
        d.warnings.append(f"{path.name} is the job's last step, but its wrap-up (final evaluation and final/) did "
                          "not finish: it runs now")
    d.world_size = (manifest.read_manifest(path) or {}).get("world_size")
    if d.world_size and d.world_size != world_size and not d.complete:
        d.warnings.append(
            f"checkpoint was written by {d.world_size} processes, this run has {world_size}: the global batch "
            f"is kept, but the data order after step {d.step} differs from an uninterrupted run and ranks "
            f"without a saved RNG state start from a fresh one")
    return d
