"""Find the Hugging Face token without ever showing it.

Order: ``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, a Kaggle secret named ``HF_TOKEN`` (only on
Kaggle), a Colab secret named ``HF_TOKEN`` (only in Colab). The token is never printed, logged
or put in an exception; :func:`redact` scrubs it from any text that might carry it.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

SECRET_NAME = "HF_TOKEN"
ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def on_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.isdir("/kaggle/working")


def on_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def _kaggle_secret() -> str | None:
    try:
        from kaggle_secrets import UserSecretsClient
    except ImportError:
        log.debug("kaggle_secrets is not importable: no Kaggle secret lookup")
        return None
    # Kaggle's client raises these two for a missing/unattached secret; anything else is a real bug.
    errors: tuple[type[BaseException], ...] = ()
    try:
        from kaggle_secrets import BackendError, ValidationError
        errors = (BackendError, ValidationError)
    except ImportError:
        pass
    try:
        return UserSecretsClient().get_secret(SECRET_NAME) or None
    except errors as err:
        log.info("no Kaggle secret %s attached to this notebook (%s)", SECRET_NAME, type(err).__name__)
        return None


def _colab_secret() -> str | None:
    try:
        from google.colab import userdata
    except ImportError:
        log.debug("google.colab.userdata is not importable: no Colab secret lookup")
        return None
    errors = tuple(
        e for e in (getattr(userdata, "SecretNotFoundError", None), getattr(userdata, "NotebookAccessError", None))
        if isinstance(e, type)
    )
    try:
        return userdata.get(SECRET_NAME) or None
    except errors as err:
        log.info("no usable Colab secret %s (%s)", SECRET_NAME, type(err).__name__)
        return None


def find_token() -> str | None:
    """Return the Hugging Face token, or None when none is configured.

    Example:
        >>> token = find_token()   # never print it; pass it on to HubStore
    """
    for var in ENV_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    if on_kaggle():
        token = _kaggle_secret()
        if token:
            return token.strip()
    if on_colab():
        token = _colab_secret()
        if token:
            return token.strip()
    return None


def token_source() -> str | None:
    """Where the token would come from ("HF_TOKEN env", "Kaggle secret", ...), for status output."""
    for var in ENV_VARS:
        if os.environ.get(var, "").strip():
            return f"{var} env"
    if on_kaggle() and _kaggle_secret():
        return "Kaggle secret"
    if on_colab() and _colab_secret():
        return "Colab secret"
    return None


def redact(text: str, token: str | None = None) -> str:
    """Replace the token (given, or found) with ``***`` in ``text``."""
    for value in {token, *(os.environ.get(v) for v in ENV_VARS)}:
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text
