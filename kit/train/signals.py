"""What a stop signal does at each stage of a training process, and a gone launcher as one.

    stage                       SIGTERM, SIGHUP (and SIGINT, Ctrl-C)
    loading, setup, wrap-up     raises `Interrupted` (Ctrl-C: KeyboardInterrupt): one line, exit 128 + N
    training (`StopSignals`)    the first asks for a clean pause (save, push, exit 0); a second acts at once
    finished (`finished`)       the outcome line is out: recorded, the job's exit code kept

A signal the process was started ignoring keeps being ignored (`nohup` ignores SIGHUP). torchrun's
agent forwards SIGHUP (a closed terminal, a notebook's pty going away) to the ranks as it does
SIGTERM: it used to end them at once, without a checkpoint.

A process whose launcher is gone gets one SIGTERM, so it takes the same path. torchrun starts each
rank in a session of its own: a kill -9 of the agent's process group (a killed notebook kernel,
`timeout -s KILL`, a scheduler) left the ranks training, unseen, for the rest of the job. On Linux
the kernel signals the moment the parent exits (`prctl(PR_SET_PDEATHSIG)`); elsewhere a thread
polls the parent's pid. The kernel's signal is SIGUSR2, not SIGTERM: it comes each time a thread of
the parent ends (the agent has several, and a child passes from one to the next as they die), and
a second SIGTERM would end the pause at once; each one only makes this process check its parent.
A rank is always watched: torchrun's agent supervises it. A single process (`python train_ddp.py`)
is watched unless it was started to outlive its parent: under `nohup` (SIGHUP ignored) or as the
leader of a session of its own (`setsid`, a daemon). A `nohup`-less `cmd &` that its shell leaves
behind pauses: its parent, the shell, is gone.

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
OUTPUT_POLL_S = 0.05  # with the launcher gone: how often stdout/stderr are checked for a reader
# The signals that stop the process cleanly; SIGHUP does not exist on Windows.
STOPS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))

_watched: dict = {}  # "parent": the launcher's pid, "how": "prctl" or "poll"; empty when not watched


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP outside training: unwinds like Ctrl-C (`finally` blocks tear down), exit 128 + N."""

    def __init__(self, signum: int):
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        gone = launcher_gone_words()
        self.by = f" by {self.name}" + (f" ({gone})" if gone else "")  # "interrupted{by} while loading …"
        super().__init__(self.name)


def _raise_interrupted(signum, frame):
    keep_output_writable()  # the one line this prints must not fail for want of a reader (a hung-up pty)
    raise Interrupted(signum)


def _not_ignored() -> list[int]:
    return [sig for sig in STOPS if signal.getsignal(sig) is not signal.SIG_IGN]


def while_loading() -> None:
    """SIGTERM and SIGHUP raise `Interrupted` from now on, as Ctrl-C raises KeyboardInterrupt; watch
    the launcher.

    Call it first in the script, before the libraries load. A no-op outside the main thread (a
    notebook's worker thread cannot set handlers), where the signals keep their defaults, and in a
    notebook kernel's own process (`%run train_ddp.py`): its signals and its parent are the kernel's.
    """
    if "ipykernel" in sys.modules:
        return
    try:
        for sig in _not_ignored():
            if sig != signal.SIGINT:  # Ctrl-C raises KeyboardInterrupt already
                signal.signal(sig, _raise_interrupted)
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

    if "how" in _watched:
        return _watched["how"]
    parent = os.getppid()
    if parent <= 1:  # no parent to lose: init adopted it already, or it is a container's first process
        return None
    if not under_torchrun() and _started_to_outlive_parent():
        return None
    _watched["parent"] = parent
    _watched["how"] = "prctl" if _set_pdeathsig() else "poll"
    if _watched["how"] == "poll":
        threading.Thread(target=_poll_parent, name="kit-launcher-watch", daemon=True).start()
    else:
        _check_parent()  # it may have exited between getppid() and prctl(): then no signal comes
    return _watched["how"]


def _set_pdeathsig() -> bool:
    """Linux: the kernel sends SIGUSR2 to this process as its parent's threads end. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # no prctl in this libc: the polling thread instead
        return False
    previous = signal.signal(signal.SIGUSR2, _on_parent_thread_exit)
    if prctl(1, int(signal.SIGUSR2), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        signal.signal(signal.SIGUSR2, previous)
        return False
    return True


def _on_parent_thread_exit(signum, frame):
    _check_parent()  # a thread of the parent ended; the parent itself may live on


def _check_parent() -> bool:
    """Whether the watched parent is gone; the first time it is, one SIGTERM to this process."""
    if os.getppid() == _watched["parent"]:
        return False
    if not _watched.get("told"):
        _watched["told"] = True
        signal.raise_signal(signal.SIGTERM)  # handled in the main thread, by this stage's handler
    return True


def _poll_parent() -> None:
    import time

    while not _check_parent():
        time.sleep(POLL_S)


def launcher_gone_words() -> str:
    """"torchrun's agent, pid N, is gone" once the watched parent has exited, else ""."""
    parent = _watched.get("parent")
    if parent is None or os.getppid() == parent:
        return ""
    from kit.errors import under_torchrun

    who = "torchrun's agent" if under_torchrun() else "the parent process"
    return f"{who}, pid {parent}, is gone"


def keep_output_writable() -> list[int]:
    """Point stdout or stderr at devnull when nobody reads it any more; returns the fds moved.

    With the launcher gone, the reader of a rank's output may be gone too (a killed kernel's pipe
    or pty): a print would raise and end the pause before its checkpoint is pushed. The words have
    nowhere to go; the session record says how the session ended.
    """
    import select

    if not hasattr(select, "poll"):  # Windows: no poll on pipes
        return []
    moved = []
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # no such stream (pythonw), or closed
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        # POLLERR: a pipe without a reader; POLLHUP: a terminal or pty hung up.
        if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
            moved.append(fd)
    return moved


def _watch_output() -> None:
    """From the launcher's death (or a hangup) on, for the rest of the process: `keep_output_writable`
    now and every 50 ms (the reader may go a moment after the launcher)."""
    import time

    if _watched.get("output"):
        return
    _watched["output"] = True

    def loop():
        while True:
            time.sleep(OUTPUT_POLL_S)
            keep_output_writable()

    keep_output_writable()
    threading.Thread(target=loop, name="kit-output-watch", daemon=True).start()


# -- training and after ------------------------------------------------------------------------------
class StopSignals:
    """The first SIGTERM/SIGINT/SIGHUP asks for a clean stop (save, push, exit 0); a second one acts at once.

    `reason` says why ("signal SIGTERM", or "torchrun's agent, pid N, is gone" when the launcher's
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
        for sig in _not_ignored():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (a notebook's worker): keep the defaults
                return

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        gone = launcher_gone_words()
        if gone or self.received == "SIGHUP":  # the reader of this output may be gone too
            _watch_output()
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
            for sig in _not_ignored():
                signal.signal(sig, self._late)
        except ValueError:  # not the main thread
            return
        # The interpreter drops Python handlers as it shuts down: from the first exit step on, ignore.
        atexit.register(self._ignore_from_here)

    def _late(self, signum, frame):
        self.late.append(signal.Signals(signum).name)
        if launcher_gone_words() or self.late[-1] == "SIGHUP":
            _watch_output()
        if len(self.late) > 1:  # asked twice: end now, with the job's own exit code
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # its reader is gone, or it is closed: nothing more to say
                    continue
            os._exit(self._code)

    @staticmethod
    def _ignore_from_here() -> None:
        for sig in STOPS + ((signal.SIGUSR2,) if _watched.get("how") == "prctl" else ()):
            signal.signal(sig, signal.SIG_IGN)
