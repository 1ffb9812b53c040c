"""Find the Hugging Face token without ever showing it.

Order: whatever ``huggingface_hub.get_token()`` finds (``HF_OIDC_RESOURCE``, ``HF_TOKEN``,
``HUGGING_FACE_HUB_TOKEN``, the token file ``hf auth login`` writes, Colab's secret), then a Kaggle
secret named ``HF_TOKEN`` (only on Kaggle; huggingface_hub does not know Kaggle's secret store),
then Colab's ``userdata`` again (huggingface_hub skips it on Colab Enterprise and when
``google.colab.errors`` is missing). The token is never printed, logged
or put in an exception; :func:`redact` scrubs it from any text that might carry it.
"""

from __future__ import annotations

import logging
import os
import re
import sys

log = logging.getLogger(__name__)

SECRET_NAME = "HF_TOKEN"
ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# The shape of a Hugging Face user access token ("hf_" and 34 letters/digits); 20+ so that shorter
# test tokens and future lengths are caught too, while names like `hf_home` are not.
TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")


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


def _env_tokens(token: str | None = None) -> set[str]:
    """The token values this process knows without asking a secret store (env, or given)."""
    return {v for v in {token, *(os.environ.get(v, "").strip() for v in ENV_VARS)} if v and len(v) >= 4}


def holds_token(text: str) -> bool:
    """Whether `text` holds a token: one shaped like a Hugging Face token, or this environment's."""
    text = str(text)
    return bool(TOKEN_RE.search(text)) or any(len(v) >= 8 and v in text for v in _env_tokens())


def redact(text: str, token: str | None = None) -> str:
    """Replace the token (given, or found in the environment) and anything token-shaped with ``***``."""
    text = str(text)
    for value in sorted(_env_tokens(token), key=len, reverse=True):
        text = text.replace(value, "***")
    return TOKEN_RE.sub("***", text)


def refuse_token(value, what: str, exit_code: int = 2) -> None:
    """Raise a KitError (never echoing the value) when `value` holds a token.

    For anything kit would write somewhere a token must never be: a config value (it goes into
    train_ddp.py, checkpoints and the store), a generated file.
    """
    if holds_token(value):
        from kit.errors import UsageError

        raise UsageError(f"{what} holds what looks like a Hugging Face token; kit never writes a token into a "
                       "setting or a file: keep it in HF_TOKEN (or a Kaggle/Colab secret named HF_TOKEN)",
                       exit_code)


class _Redacting:
    """A text stream that scrubs tokens from what is written, and shows escaped every character that
    could recolour the terminal or make a line read backwards (`kit.errors.shown`; newlines and tabs
    pass: kit's own output has them), delegating everything else."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        from kit.errors import shown

        return self._stream.write(shown(redact(text), limit=None, keep="\n\t"))

    def __getattr__(self, name):
        return getattr(self._stream, name)


class redacted_output:
    """`with redacted_output():` — stdout and stderr scrub tokens for the block's duration.

    The CLI's last line of defence: a message that echoes a value kit did not think to check
    (a facts file's platform, a server's reply) still never shows a token, nor an escape sequence.
    """

    def __enter__(self):
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Redacting(sys.stdout), _Redacting(sys.stderr)
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self._saved
        return False


def scrub_file(path) -> bool:
    """Show the token as ``***`` in a text file kit keeps but did not write itself (an executed
    notebook, a downloaded Kaggle log). Returns whether anything was replaced; bytes that are not
    UTF-8 stay as they are."""
    from pathlib import Path

    from kit.files import write_atomic

    path = Path(path)
    if not path.is_file():
        return False
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    clean = redact(text)
    if clean != text:
        write_atomic(path, clean.encode("utf-8", errors="surrogateescape"))
    return clean != text


def redact_tracebacks() -> None:
    """Make the tracebacks of uncaught exceptions (main thread and threads) show a token as ``***``.

    For the generated script: a crash still prints its whole traceback, for debugging, but a value in
    it (an environment variable, a path, a server's reply) never shows the token.
    """
    import threading
    import traceback

    def report(exc_type, exc, tb):
        sys.stderr.write(redact("".join(traceback.format_exception(exc_type, exc, tb))))

    def report_thread(args):
        if args.exc_type is SystemExit:
            return
        name = getattr(args.thread, "name", "?")
        sys.stderr.write(f"Exception in thread {name}:\n")
        report(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = report
    threading.excepthook = report_thread
