"""The output folder, checked before anything is loaded: Trainer would find out only at its first save."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kit.checkpoints.resume import STEP_DIR
from kit.deliver.final import FINAL_DIR
from kit.errors import UsageError
from kit.files import refuse_shared_folder
from kit.evaluation.identity import RUN_LOCAL
from kit.evaluation.results import BASELINE_LOCAL
from kit.checkpoints.session_records import LOCAL as SESSIONS_LOCAL

# The files kit writes at output_dir's top: the run record, the baseline, the session records.
# (The model card is final/README.md; TRL's own card at the top is not written: without_card.)
FILES = (RUN_LOCAL, BASELINE_LOCAL, SESSIONS_LOCAL)
KIT_FINAL_FILES = ("eval_results.json", "kit_config.yaml")  # in every final/ kit writes (kit.deliver.final)


def check_output_dir(path: str) -> None:
    """Refuse an output_dir that cannot hold checkpoints, before anything is loaded (UsageError, exit 2).

    Trainer would find out only at its first save, after the model load and the first steps. The
    folder is created (Trainer would create it anyway) and a file is written into it and removed:
    permission bits say little when running as root or on a read-only mount.
    """
    refuse_shared_folder(path)  # again at launch: the script may run from another folder than it was rendered in
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
    _check_entries(out)


def lock(path: str) -> int | None:
    """Hold output_dir for this process: a second run into the same folder (a second notebook cell,
    a scheduled run while one still trains) is one line, exit 2, before it writes anything.

    Without a store there is no lease, and two runs both trained and saved checkpoint-<step> over
    each other. An OS lock (flock) on the folder itself, so no lock file is left behind: released
    when the process ends, however it ends (kill -9 too), so it never goes stale. Returns the
    descriptor to keep (and os.close) for the run; None where the OS or the filesystem has no flock
    (Windows; some network and FUSE mounts such as Colab's Drive): there two runs are not kept apart.
    """
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a folder some FUSE mounts will not open for reading: no lock there
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"output_dir {path} is in use by another kit run on this machine (a training still "
                         "running in another cell, terminal or scheduled run): wait for it to end, or choose "
                         "another output_dir") from None
    except OSError:  # a filesystem without flock (some network and FUSE mounts, e.g. Drive): no lock there
        os.close(fd)
        return None
    return fd


def _check_entries(out: Path) -> None:
    """What kit and Trainer write into output_dir must be free to be written: a folder where a file
    goes (kit_run.json) or a file or symlink named like a checkpoint would fail a save
    after hours of training, or resume from the wrong step."""
    for name in FILES:
        path = out / name
        if path.is_symlink() or path.exists() and not path.is_file():
            raise UsageError(f"output_dir {out} holds {name}, which is not a file (kit writes that file there): "
                             "move it away or choose another output_dir")
    final = out / FINAL_DIR
    if final.is_symlink() or final.exists() and not final.is_dir():
        raise UsageError(f"output_dir {out} holds {FINAL_DIR}, which is not a folder (kit writes the finished "
                         "adapter there): move it away or choose another output_dir")
    if final.is_dir() and not any((final / name).is_file() for name in KIT_FINAL_FILES) and any(final.iterdir()):
        # Anything else of a folder that is not kit's is left alone (kit adds only its own names);
        # a final/ would be replaced by the job's own.
        raise UsageError(f"output_dir {out} holds a {FINAL_DIR}/ folder that kit did not write (no "
                         f"{' or '.join(KIT_FINAL_FILES)} in it), which the finished job would replace: move it "
                         "away or choose another output_dir")
    for path in out.iterdir():
        if STEP_DIR.fullmatch(path.name) and (path.is_symlink() or not path.is_dir()):
            raise UsageError(f"output_dir {out} holds {path.name}, which is not a checkpoint folder (a file or a "
                             "link): move it away or choose another output_dir")


def without_card(trainer_class: type) -> type:
    """`trainer_class` (TRL's SFTTrainer, DPOTrainer, KTOTrainer, GRPOTrainer) whose saves write no model card.

    TRL's trainers write their card to output_dir/README.md at every save (`create_model_card`, from
    `_save_checkpoint`; no argument turns it off), over a README.md of the user's own kept there (their
    notes on the run). kit's card is final/README.md, written once the job is evaluated, so TRL's is
    not written at all. The subclass keeps the class's name: only the card differs.
    """
    return type(trainer_class.__name__, (trainer_class,),
                {"create_model_card": _no_card, "__module__": __name__, "__doc__": trainer_class.__doc__})


def _no_card(self, *args, **kwargs) -> None:
    return None
