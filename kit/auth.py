"""Find the Hugging Face token without ever showing it.

Order: whatever ``huggingface_hub.get_token()`` finds (``HF_OIDC_RESOURCE``, ``HF_TOKEN``,
``HUGGING_FACE_HUB_TOKEN``, the token file ``hf auth login`` writes, Colab's secret), then a Kaggle
secret named ``HF_TOKEN`` (only on Kaggle; huggingface_hub does not know Kaggle's secret store),
then Colab's ``userdata`` again (huggingface_hub skips it on Colab Enterprise and when
``google.colab.errors`` is missing). The token is never printed, logged
or put in an exception; :func:`redact` scrubs it from any text that might carry it.
:func:`find_secret` looks up other keys (an experiment tracker's) the same way, by their own name.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from kit.errors import UsageError
from kit.files import write_atomic
from kit.redaction import ENV_VARS, holds_token, redact

log = logging.getLogger(__name__)

SECRET_NAME = "HF_TOKEN"


def on_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.isdir("/kaggle/working")


def on_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def _kaggle_secret(name: str = SECRET_NAME) -> str | None:
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
        return UserSecretsClient().get_secret(name) or None
    except errors as err:
        log.info("no Kaggle secret %s attached to this notebook (%s)", name, type(err).__name__)
        return None


def _colab_secret(name: str = SECRET_NAME) -> str | None:
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
        return userdata.get(name) or None
    except errors as err:
        log.info("no usable Colab secret %s (%s)", name, type(err).__name__)
        return None


def find_secret(name: str) -> tuple[str | None, str | None]:
    """(value, where it came from) of the secret `name` (e.g. ``WANDB_API_KEY``), or (None, None).

    The environment variable of that name first, then a Kaggle secret of that name (on Kaggle),
    then a Colab secret of that name (on Colab). The Hugging Face token has its own order
    (:func:`find_token`); this is for the other keys a run may need, such as a tracker's.

    Example:
        >>> key, source = find_secret("WANDB_API_KEY")   # never print `key`; `source` is safe to show
    """
    value = os.environ.get(name, "").strip()
    if value:
        return value, f"{name} env"
    if on_kaggle():
        value = (_kaggle_secret(name) or "").strip()
        if value:
            return value, "Kaggle secret"
    if on_colab():
        value = (_colab_secret(name) or "").strip()
        if value:
            return value, "Colab secret"
    return None, None


def _hub_token() -> str | None:
    try:
        from huggingface_hub import get_token
    except ImportError:  # kit plan/render work without huggingface_hub: then only env and secrets
        value = next((os.environ[v].strip() for v in ENV_VARS if os.environ.get(v, "").strip()), None)
        return value or None
    return (get_token() or "").strip() or None


def find_token() -> str | None:
    """Return the Hugging Face token, or None when none is configured.

    Example:
        >>> token = find_token()   # never print it; pass it on to HubStore
    """
    token = _hub_token()
    if token:
        return token
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
    hub = _hub_token()
    if hub:
        return "HF_OIDC_RESOURCE (OIDC)" if os.environ.get("HF_OIDC_RESOURCE") else \
            "Colab secret" if on_colab() and hub == _colab_secret() else "hf auth login (token file)"
    if on_kaggle() and _kaggle_secret():
        return "Kaggle secret"
    if on_colab() and _colab_secret():
        return "Colab secret"
    return None


def refuse_token(value, what: str, exit_code: int = 2) -> None:
    """Raise a KitError (never echoing the value) when `value` holds a token.

    For anything kit would write somewhere a token must never be: a config value (it goes into
    train_ddp.py, checkpoints and the store), a generated file.
    """
    if holds_token(value):
        raise UsageError(f"{what} holds what looks like a Hugging Face token or a tracker's key; kit never writes a "
                         "token or key into a setting or a file: keep it in HF_TOKEN (or WANDB_API_KEY, "
                         "TRACKIO_WRITE_TOKEN), or a Kaggle/Colab secret of that name", exit_code)


def scrub_file(path) -> bool:
    """Show the token as ``***`` in a text file kit keeps but did not write itself (an executed
    notebook, a downloaded Kaggle log). Returns whether anything was replaced; bytes that are not
    UTF-8 stay as they are."""
    path = Path(path)
    if not path.is_file():
        return False
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    clean = redact(text)
    if clean != text:
        write_atomic(path, clean.encode("utf-8", errors="surrogateescape"))
    return clean != text
