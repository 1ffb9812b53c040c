"""The errors kit reports to users, each carrying the exit code the CLI returns.

Exit codes are part of kit's contract: 0 success, 2 bad usage or config, 3 the machine cannot
train this job, 4 the checkpoint store failed. A `KitError` is printed as one line, never as a
traceback, and never carries a token (its message is redacted when it is made).
"""

from kit.redaction import redact
from kit.shown import shown

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANNOT_TRAIN = 3
EXIT_STORE = 4


class KitError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        # Messages echo values (a config value, a path, a server's reply): a token among them is
        # scrubbed here, once, so no message can carry one to a terminal, a log or another rank.
        # They echo untrusted text too (a path, a GPU name, a key): one line, shown escaped and bounded.
        super().__init__(shown(redact(message), limit=MESSAGE_LIMIT, word_limit=WORD_LIMIT))
        if exit_code is not None:
            self.exit_code = exit_code


MESSAGE_LIMIT = 4000  # characters of a whole message: no real one comes near it
WORD_LIMIT = 1000  # characters of one unbroken run in a message (a path, a value): a real path is far shorter


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

