"""The experiment tracker at launch: checked before any model loads, turned on for rank 0 alone.

    tracking.settle(cfg, rank)                        # at launch: refuses a missing tracker or W&B key
    report_to = tracking.report_to(cfg, ctx, run_id)  # rank 0: ["tensorboard"]; the others: "none"

Every tracker's run is named by kit's run id (TrainingArguments.run_name), so a resumed job
continues the same tracked run:
- tensorboard: event files in output_dir/runs/<run_id> (TENSORBOARD_LOGGING_DIR), the same folder
  on every resume; TensorBoard shows a folder's event files as one run.
- wandb: WANDB_RUN_ID = run id and WANDB_RESUME=allow; its local files in output_dir/wandb
  (WANDB_DIR; wandb's default was the current folder, the kit checkout).
- trackio: transformers' callback asks for the run of that name with resume="allow"; its database
  stays in trackio's own home (TRACKIO_DIR, default HF_HOME/trackio), where `trackio show` finds it.

Tracker files are never in a checkpoint-<step> folder, so the store never receives them: a
checkpoint holds what resumes training, and a run's history across sessions on other machines is
what wandb or a trackio Space is for. A value the user set in the environment is kept.

Keys: WANDB_API_KEY from the environment or a Kaggle/Colab secret of that name (kit.auth.find_secret),
put into this process's environment only, where kit.redaction scrubs it from every line and file kit
writes. It never goes into a setting, the script, a checkpoint or a notebook's parameters.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from kit.errors import UsageError
from kit.planning import tracking

RUNS_DIR = "runs"  # output_dir/runs/<run_id>: TensorBoard's event files
_OFFLINE_WANDB = ("offline", "disabled", "dryrun")
_ours: dict[str, str] = {}  # the environment values kit set, so a second job in one process sets its own


def settle(cfg, rank: int = 0) -> str:
    """The tracker this run logs to ("none" too), checked at launch before any model loads.

    Raises UsageError (exit 2): the tracker is not installed here, or (rank 0) report_to=wandb finds
    no key in WANDB_API_KEY, a Kaggle/Colab secret of that name or `wandb login`'s ~/.netrc, with
    WANDB_MODE not offline: wandb would stop the job at its first log, after the model loaded.
    """
    tracker, _ = tracking.choose(cfg.report_to, tracking.installed_here())
    if tracker == "wandb" and rank == 0:
        _wandb_key()
    return tracker


def report_to(cfg, ctx, run_id: str | None) -> list[str] | str:
    """TrainingArguments.report_to for this rank: the tracker on rank 0, set up to log to the run named
    `run_id`; "none" on every other rank (Trainer logs from the main process, and an integration's
    setup on another rank could still open a run or a file)."""
    if not ctx.is_main or run_id is None:  # None: a smoke run (one step in a scratch folder), never tracked
        return "none"
    tracker = settle(cfg, ctx.rank)
    if tracker == "tensorboard":
        _set("TENSORBOARD_LOGGING_DIR", str(Path(cfg.output_dir) / RUNS_DIR / run_id))
    elif tracker == "wandb":
        _set("WANDB_RUN_ID", run_id)
        _set("WANDB_RESUME", "allow")
        _set("WANDB_DIR", str(Path(cfg.output_dir)))
    return "none" if tracker == "none" else [tracker]


def _wandb_key() -> None:
    from kit.auth import find_secret

    key, source = find_secret(tracking.KEY_VARS["wandb"])
    if key:
        if source != f"{tracking.KEY_VARS['wandb']} env":  # a Kaggle/Colab secret: wandb reads the environment
            os.environ[tracking.KEY_VARS["wandb"]] = key  # and kit.redaction scrubs values found there
        return
    if os.environ.get("WANDB_MODE", "").strip().lower() in _OFFLINE_WANDB or _netrc_has("api.wandb.ai"):
        return
    raise UsageError("report_to=wandb, but no W&B key: set WANDB_API_KEY (or a Kaggle/Colab secret of that name), "
                     "run `wandb login`, or set WANDB_MODE=offline")


def _netrc_has(host: str) -> bool:
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return False
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):  # unreadable: wandb could not use it either
        return False


def _set(name: str, value: str) -> None:
    """Set `name` for the tracker, unless the user set it (a value kit did not put there)."""
    if name in os.environ and _ours.get(name) != os.environ[name]:
        return
    os.environ[name] = _ours[name] = value
