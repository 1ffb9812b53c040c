"""The errors kit reports to users, each carrying the exit code the CLI returns.

Exit codes are part of kit's contract: 0 success, 2 bad usage or config, 3 the machine cannot
train this job, 4 the checkpoint store failed. A `KitError` is printed as one line, never as a
traceback, and never carries a token (its message is redacted when it is made).
"""

import re
from pathlib import PurePath

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANNOT_TRAIN = 3
EXIT_STORE = 4


class KitError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        from kit.auth import redact

        # Messages echo values (a config value, a path, a server's reply): a token among them is
        # scrubbed here, once, so no message can carry one to a terminal, a log or another rank.
        # They echo untrusted text too (a path, a GPU name, a key): one line, shown escaped and bounded.
        super().__init__(shown(redact(message), limit=MESSAGE_LIMIT, word_limit=WORD_LIMIT))
        if exit_code is not None:
            self.exit_code = exit_code


SHOWN_LIMIT = 200  # characters of one echoed value (a key, a path, a setting) in a message
MESSAGE_LIMIT = 4000  # characters of a whole message: no real one comes near it
WORD_LIMIT = 1000  # characters of one unbroken run in a message (a path, a value): a real path is far shorter
# What must not reach a terminal raw: C0/C1 controls (newline, carriage return, ESC, which starts a
# colour or cursor sequence), DEL, the soft hyphen and other invisible format characters, bidi
# embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069, which make a name read
# backwards), zero-width characters, line/paragraph separators, the BOM, interlinear annotations,
# tag characters and lone surrogates (an undecodable byte of a file name).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\u3164\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value, limit: int | None = SHOWN_LIMIT, *, quote: bool = False, keep: str = "",
          word_limit: int | None = None) -> str:
    """`value` as it may be printed on a terminal: every character that could recolour it, move its
    cursor, start a line of its own or make text read backwards shown escaped as Python writes it
    (`\\n`, `\\x1b`, `\\u202e`), and the whole cut to `limit` characters with an ellipsis.

    The one way kit puts a string it did not write (a path, a name, a GPU name, a repo id, a setting,
    a value from the store or the data) into a message, a plan, a report or a note. `quote` gives
    it in quotes as `repr` does (for `got 'x'`); `keep` lists characters let through (the newlines
    of kit's own multi-line output); `word_limit` cuts each run without a space the same way (a
    message that echoes a 100 kB path or value it did not cut itself). Non-strings are shown by
    their `repr` (paths by their text).

        shown("GPU\\n\\x1b[31mred")     # 'GPU\\\\n\\\\x1b[31mred'
        shown("x" * 10_000, 5)         # 'xxxxx… (10,000 characters)'
    """
    if isinstance(value, PurePath):  # a path is shown as its text, not as PosixPath('…')
        value = str(value)
    text = value if isinstance(value, str) else repr(value)
    if word_limit is not None and len(text) > word_limit:
        text = re.sub(f"\\S{{{word_limit + 1},}}", lambda m: shown(m.group(), word_limit, quote=False, keep=keep), text)
    cut = limit is not None and len(text) > limit
    head = text[:limit] if cut else text
    if quote and isinstance(value, str):
        head = repr(head)  # repr escapes every character str.isprintable() refuses: a superset of _UNSAFE
    head = _UNSAFE.sub(lambda m: _escape(m.group()) if m.group() not in keep else m.group(), head)
    return f"{head}… ({len(text):,} characters)" if cut else head


def _escape(c: str) -> str:
    n = ord(c)
    return _NAMED.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


class UsageError(KitError):
    """Bad flags, a bad config value, a missing or unreadable input file."""

    exit_code = EXIT_USAGE


class CannotTrain(KitError):
    """The hardware or the plan cannot run this job."""

    exit_code = EXIT_CANNOT_TRAIN


class StoreError(KitError):
    """The checkpoint store is unreachable, refuses us, or holds something unusable."""

    exit_code = EXIT_STORE


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun (torch.distributed.run) started."""
    import os

    return "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ


def exit_words(code: int) -> str:
    """What to add to a rank's last line so kit's exit code survives torchrun.

    torchrun turns any non-zero rank exit into its own exit 1 and a ChildFailedError report;
    kit's code (2 usage/config, 3 cannot train, 4 store) then shows only inside that report.
    """
    if not under_torchrun():
        return ""
    return f" [kit exit {code}; torchrun exits 1 and reports it below as a ChildFailedError]"

