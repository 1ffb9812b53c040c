"""Experiment tracking: which tracker a run logs to, and whether that tracker is installed.

    tracker, reason = choose("auto", installed_here())   # ("trackio", Reason("tracker_auto_trackio")) where installed

`report_to` is none | auto | trackio | wandb | tensorboard, for every trainer: it becomes the
TrainingArguments field of the same name on rank 0 (kit.train.tracking). `auto` picks trackio
where it is installed, else none: trackio logs to a local database with no account and no key, and
is installed only by someone who wants it. Kaggle's and Colab's images come with wandb and
tensorboard preinstalled, so their presence says nothing of intent, and wandb would ask for an
account. A tracker named but not installed is refused (exit 2) at plan, render and launch, before
any model loads, with the pip package to install.
"""

from __future__ import annotations

import importlib.util

from kit.errors import UsageError
from kit.planning.reasons import Reason, why

TRACKERS = ("trackio", "wandb", "tensorboard")
CHOICES = ("none", "auto") + TRACKERS
# The pip package that brings each tracker (TensorBoard's writer is torch's, which needs the package).
PIP = {"trackio": "trackio", "wandb": "wandb", "tensorboard": "tensorboard"}
# The environment variable (or Kaggle/Colab secret of that name) that holds a tracker's key; kit.redaction
# scrubs these values too. trackio needs none locally (a Space uses HF_TOKEN; a self-hosted server this).
KEY_VARS = {"wandb": "WANDB_API_KEY", "trackio": "TRACKIO_WRITE_TOKEN"}


def installed_here() -> dict[str, bool]:
    """Which trackers this Python can import (found, not imported: importing trackio starts a lot)."""
    found = {name: importlib.util.find_spec(name) is not None for name in TRACKERS}
    # transformers' TensorBoard callback also takes tensorboardX's writer.
    found["tensorboard"] = found["tensorboard"] or importlib.util.find_spec("tensorboardX") is not None
    return found


def installed_in(packages: dict | None) -> dict[str, bool | None]:
    """Which trackers a machine's facts (`kit probe --json` packages) show installed; None = not known
    (facts from before kit probed trackers, or a machine assumed with --gpus)."""
    packages = packages or {}
    return {name: (bool(packages[name]) if name in packages else None) for name in TRACKERS}


def not_installed(tracker: str, where: str = "here") -> UsageError:
    return UsageError(f"report_to={tracker}, but {tracker} is not installed {where}: `pip install {PIP[tracker]}`, "
                      "or set report_to=none")


def choose(report_to: str, installed: dict, where: str = "here") -> tuple[str, Reason | None]:
    """(tracker or "none", the Reason for it, or None when there is nothing to say).

    `installed` maps each tracker to True, False or None (not known). Raises UsageError (exit 2)
    for a value kit does not know or a named tracker shown not installed.
    """
    if report_to not in CHOICES:
        raise UsageError(f"report_to is {report_to!r}; expected one of {'|'.join(CHOICES)}")
    if report_to == "none":
        return "none", None
    if report_to == "auto":
        if installed.get("trackio"):
            return "trackio", why("tracker_auto_trackio")
        if installed.get("trackio") is None:
            return "none", why("tracker_auto_unknown")
        return "none", why("tracker_auto_none")
    if installed.get(report_to) is False:
        raise not_installed(report_to, where)
    return report_to, why("tracker_named", tracker=report_to, known=bool(installed.get(report_to)),
                          key=KEY_VARS.get(report_to))
