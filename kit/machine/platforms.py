"""Which notebook platform this is, how we know, and what that platform implies.

Detection reads only environment variables and paths, so it is instant and imports nothing.
The defaults here are the platforms' published limits; they are knowledge, not measurements.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

PLATFORMS = ("kaggle", "colab", "local", "other")

# Hosted notebooks we recognise but keep no special defaults for: variable -> service name.
_OTHER_HOSTED = {
    "SM_CURRENT_HOST": "SageMaker",
    "PAPERSPACE_NOTEBOOK_REPO_ID": "Paperspace Gradient",
    "LIGHTNING_CLOUD_PROJECT_ID": "Lightning AI Studio",
    "DATABRICKS_RUNTIME_VERSION": "Databricks",
}


@dataclass(frozen=True)
class PlatformDefaults:
    """What a platform implies for a training run.

    Attributes:
        session_hours: The longest a session may run before the platform stops it, or None when
            nothing stops it.
        working_dir: Where outputs survive the session on that platform, or None for "here".
        note: One line a user should know about the platform's limits.
        accelerator_hint: How to switch to a GPU that current torch builds support, or None where
            the user picks their own hardware.
    """

    session_hours: float | None
    working_dir: str | None
    note: str
    accelerator_hint: str | None


_DEFAULTS = {
    "kaggle": PlatformDefaults(
        12.0, "/kaggle/working",
        "Kaggle stops a session after 12 h; /kaggle/working is kept only when the version is saved.",
        "pick the T4×2 accelerator (Settings → Accelerator → GPU T4 x2)"),
    "colab": PlatformDefaults(
        12.0, None,
        "Colab stops a session after at most 12 h, often sooner on the free tier or when idle.",
        "switch the runtime to a T4 GPU (Runtime → Change runtime type)"),
    "local": PlatformDefaults(None, None, "No session limit is known for this machine.", None),
    "other": PlatformDefaults(None, None, "This hosted notebook's session limit is not known to kit.", None),
}


def detect(environ: dict | None = None, path_exists=os.path.exists) -> tuple[str, str]:
    """Tell which platform this process runs on.

    Args:
        environ: The environment to read; `os.environ` when None.
        path_exists: Checks a path; replaceable so tests need no /kaggle folder.

    Returns:
        `(platform, detected_by)`, e.g. `("kaggle", "KAGGLE_KERNEL_RUN_TYPE set")`; platform is
        one of `PLATFORMS`.
    """
    env = os.environ if environ is None else environ
    forced = env.get("KIT_PLATFORM")
    if forced in PLATFORMS:
        return forced, f"KIT_PLATFORM={forced}"
    for var in ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"):
        if var in env:
            return "kaggle", f"{var} set"
    if path_exists("/kaggle/working"):
        return "kaggle", "/kaggle/working exists"
    for var in ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION"):
        if var in env:
            return "colab", f"{var} set"
    # find_spec locates google.colab without importing it (importing it is slow off Colab).
    if _module_exists("google.colab"):
        return "colab", "google.colab importable"
    for var, service in _OTHER_HOSTED.items():
        if var in env:
            return "other", f"{var} set ({service})"
    return "local", "no hosted-notebook marker found"


def defaults(platform: str) -> PlatformDefaults:
    """The limits and hints of `platform` (one of `PLATFORMS`)."""
    return _DEFAULTS.get(platform, _DEFAULTS["other"])


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package ("google") is missing
        return False
