"""Keep the Hugging Face token, and the experiment trackers' keys, out of every text kit shows or writes.

The token's shape, the values this environment holds, and the scrubbing of text, of stdout/stderr
and of tracebacks. It imports only kit.shown, so errors, files and every stage can use it.
"""

from __future__ import annotations

import os
import re
import sys

from kit.shown import shown

ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# The experiment trackers' keys (kit.planning.tracking), read from the environment or a Kaggle/Colab secret
# of the same name (kit.auth.find_secret): scrubbed like the Hugging Face token, never written anywhere.
TRACKER_KEY_VARS = ("WANDB_API_KEY", "TRACKIO_WRITE_TOKEN")
# The shape of a Hugging Face user access token ("hf_" and 34 letters/digits); 20+ so that shorter
# test tokens and future lengths are caught too, while names like `hf_home` are not.
TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")


def _env_tokens(token: str | None = None) -> set[str]:
    """The token and key values this process knows without asking a secret store (env, or given)."""
    values = {token, *(os.environ.get(v, "").strip() for v in ENV_VARS + TRACKER_KEY_VARS)}
    return {v for v in values if v and len(v) >= 4}


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


class _Redacting:
    """A text stream that scrubs tokens from what is written, and shows escaped every character that
    could recolour the terminal or make a line read backwards (`kit.shown.shown`; newlines and tabs
    pass: kit's own output has them), delegating everything else."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
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
