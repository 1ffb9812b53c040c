"""What a stop signal does at each stage of a training process, and a gone launcher as one.

    stage                       SIGTERM (and SIGINT)
    loading, setup, wrap-up     raises `Interrupted` (Ctrl-C: KeyboardInterrupt): one line, exit 128 + N
    training (`StopSignals`)    the first asks for a clean pause (save, push, exit 0); a second acts at once
    finished (`finished`)       the outcome line is out: recorded, the job's exit code kept

A process whose launcher is gone gets SIGTERM, so it takes the same path. torchrun starts each
rank in a session of its own: a kill -9 of the agent's process group (a killed notebook kernel,
`timeout -s KILL`, a scheduler) left the ranks training, unseen, for the rest of the job. On Linux
the kernel sends the signal (`prctl(PR_SET_PDEATHSIG)`) the moment the parent exits; elsewhere a
thread polls the parent's pid. A rank is always watched: torchrun's agent supervises it. A single
process (`python train_ddp.py`) is watched unless it was started to outlive its parent: under
`nohup` (SIGHUP ignored) or as the leader of a session of its own (`setsid`, a daemon).

This module imports only the standard library: the script installs it before the heavy imports.

    signals.while_loading()        # the script's first line: SIGTERM as Ctrl-C, the launcher watched
    stops = StopSignals(); stops.install()   # Job.start: from here a signal pauses training
    stops.finished(code)           # Job.finish: a late signal no longer changes the exit code
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

POLL_S = 1.0  # where the kernel cannot signal a parent's death: how often the parent's pid is read

_watched: dict = {}  # "parent": the launcher's pid, "how": "prctl" or "poll"; empty when not watched


class Interrupted(KeyboardInterrupt):
    """SIGTERM outside training: unwinds like Ctrl-C, so `finally` blocks tear down, then exit 128 + N."""

    def __init__(self, signum: int):
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        gone = launcher_gone_words()
        self.by = f" by {self.name}" + (f" ({gone})" if gone else "")  # "interrupted{by} while loading …"
        super().__init__(self.name)


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def while_loading() -> None:
    """SIGTERM raises `Interrupted` from now on, as Ctrl-C raises KeyboardInterrupt; watch the launcher.

    Call it first in the script, before the libraries load. A no-op outside the main thread (a
    notebook's worker thread cannot set handlers), where SIGTERM keeps its default.
    """
    try:
        signal.signal(signal.SIGTERM, _raise_interrupted)
    except ValueError:  # not the main thread
        return
    watch_launcher()


# -- the launcher -----------------------------------------------------------------------------------
def _started_to_outlive_parent() -> bool:
    """`nohup` (SIGHUP ignored) or a session of its own (`setsid`): a single process meant to go on."""
    hangup = getattr(signal, "SIGHUP", None)  # none on Windows
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_IGN:
        return True
    try:
        return os.getsid(0) == os.getpid()
    except (AttributeError, OSError):  # no sessions (Windows)
        return False


def watch_launcher() -> str | None:
    """Arrange a SIGTERM to this process when its parent (torchrun's agent, or the shell or kernel
    that ran a single process) exits. Returns how ("prctl", "poll"), or None when not watched."""
    from kit.errors import under_torchrun

    if _watched:
        return _watched["how"]
    parent = os.getppid()
    if parent <= 1 or (not under_torchrun() and _started_to_outlive_parent()):
        return None  # no parent to lose (pid 1 adopted it, or it is a container's first process)
    how = "prctl" if _set_pdeathsig(signal.SIGTERM) else "poll"
    _watched.update(parent=parent, how=how)
    if how == "poll":
        threading.Thread(target=_poll_parent, args=(parent,), name="kit-launcher-watch", daemon=True).start()
    elif os.getppid() != parent:  # it exited between getppid() and prctl(): no signal will come
        signal.raise_signal(signal.SIGTERM)
    return how


def _set_pdeathsig(signum: int) -> bool:
    """Linux: the kernel sends `signum` to this process when its parent exits. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, signum, 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl in this libc: the polling thread instead
        return False


def _poll_parent(parent: int) -> None:
    import time

    while os.getppid() == parent:
        time.sleep(POLL_S)
    signal.raise_signal(signal.SIGTERM)  # handled in the main thread, as the kernel's would be


def launcher_gone_words() -> str:
    """"torchrun's agent (pid N) is gone" once the watched parent has exited, else ""."""
    parent = _watched.get("parent")
    if parent is None or os.getppid() == parent:
        return ""
    from kit.errors import under_torchrun

    who = "torchrun's agent" if under_torchrun() else "the parent process"
    return f"{who} (pid {parent}) is gone"


def _keep_output_writable() -> None:
    """With the launcher gone, the reader of stdout/stderr may be gone too (a killed kernel's pipe or
    pty): a write would then raise and end the pause before its push. Such a stream goes to devnull."""
    import select

    if not hasattr(select, "poll"):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # replaced by a non-file (a notebook, a test)
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in poller.poll(0)):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


# -- training and after ------------------------------------------------------------------------------
class StopSignals:
    """The first SIGTERM/SIGINT asks for a clean stop (save, push, exit 0); a second one acts at once.

    `reason` says why ("signal SIGTERM", or "torchrun's agent (pid N) is gone" when the launcher's
    death sent it). After `finished(code)`, a signal is only recorded (`late`): the outcome is said,
    and the exit code stays the job's; a second late one ends the process at once with that code.
    """

    def __init__(self):
        self.received: str | None = None
        self.reason: str | None = None
        self.late: list[str] = []
        self._previous = {}
        self._code = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (a notebook's worker): keep the defaults
                return

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        gone = launcher_gone_words()
        if gone:
            _keep_output_writable()
        self.reason = gone or f"signal {self.received}"
        for sig, prev in self._previous.items():  # the next one acts at once
            signal.signal(sig, signal.SIG_DFL if prev is _raise_interrupted else prev)

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def finished(self, code: int) -> None:
        """The job's outcome is decided (and said next): from now on a signal cannot change `code`."""
        self._code = code
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._late)
        except ValueError:  # not the main thread
            return
        # The interpreter drops Python handlers as it shuts down: from the first exit step on, ignore.
        atexit.register(self._ignore_from_here)

    def _late(self, signum, frame):
        self.late.append(signal.Signals(signum).name)
        if launcher_gone_words():
            _keep_output_writable()
        if len(self.late) > 1:  # asked twice: end now, with the job's own exit code
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # its reader is gone, or it is closed: nothing more to say
                    continue
            os._exit(self._code)

    @staticmethod
    def _ignore_from_here() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
