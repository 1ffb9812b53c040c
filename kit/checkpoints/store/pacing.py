"""The Hub's commit budget: about 128 commits per hour per repo (and 1000 API requests per
5 minutes). A store counts its own commits in a sliding hour; the checkpoint uploader asks it how
long to wait (`wait_s`) before its next commit, and meanwhile newer checkpoints supersede the
queued one. The lease heartbeat never waits (a late heartbeat lets another session take over);
it is paced by its interval instead, and counted here like any commit, so checkpoints get what
the heartbeats leave.

The hour is the repo's, not the process's: a session that starts minutes after another was cut
inherits that one's commits, which each lease heartbeat carries (`recent`, then `seed` in the
next session; kit.checkpoints.lease). Times are wall-clock, as they cross machines. Every store
has a pacer (`Store.pacer`); a store without a commit limit (a directory) has `NO_LIMIT`.

Example:
    >>> pacer = CommitPacer(per_hour=128)
    >>> pacer.note(); pacer.wait_s()
    0.0
"""

from __future__ import annotations

import threading
import time

HUB_COMMITS_PER_HOUR = 128
RESERVE = 8  # kept for heartbeats and session records, so a checkpoint never takes the last commits
WINDOW_S = 3600.0


class CommitPacer:
    def __init__(self, per_hour: float | None = HUB_COMMITS_PER_HOUR, clock=time.time):
        self.per_hour, self.clock = per_hour, clock
        self._own: list[float] = []  # this process's commits
        self._inherited: set[float] = set()  # another session's, as its lease record told them (to the ms)
        self._lock = threading.Lock()

    def note(self) -> None:
        """Count one commit that just landed."""
        with self._lock:
            self._own.append(self.clock())

    def seed(self, times) -> None:
        """Count commits another session made (their wall-clock times, told once or many times over)."""
        with self._lock:
            self._inherited.update(round(float(t), 3) for t in times if isinstance(t, (int, float)))

    def recent(self) -> list[float]:
        """The times of the commits in the last hour, oldest first."""
        with self._lock:
            return self._in_window(self.clock())

    def _in_window(self, now: float) -> list[float]:
        self._own = [t for t in self._own if now - t < WINDOW_S]
        self._inherited = {t for t in self._inherited if now - t < WINDOW_S}
        return sorted([round(t, 3) for t in self._own] + list(self._inherited))

    def wait_s(self) -> float:
        """Seconds until a deferrable commit (a checkpoint) fits in the hour's budget; 0 when it does now."""
        with self._lock:
            now = self.clock()
            times = self._in_window(now)
            allowed = max(1, int(self.per_hour) - RESERVE)
            if len(times) < allowed:
                return 0.0
            return max(0.0, times[len(times) - allowed] + WINDOW_S - now)


class _NoLimit(CommitPacer):
    """The pacer of a store that takes any number of commits: never waits, remembers nothing."""

    def __init__(self):
        super().__init__(per_hour=None)

    def note(self) -> None:
        pass

    def seed(self, times) -> None:
        pass

    def wait_s(self) -> float:
        return 0.0


NO_LIMIT = _NoLimit()


def checkpoint_rate_warning(save_steps: int, step_s: float, heartbeat_s: float,
                            per_hour: float = HUB_COMMITS_PER_HOUR) -> str | None:
    """A warning when saving every `save_steps` at `step_s` would commit more often than the Hub allows.

    The uploader then skips checkpoints (the queued one is superseded) rather than being refused;
    the warning says which save_steps would fit.
    """
    if not step_s or step_s <= 0 or not save_steps:
        return None
    heartbeats = 3600 / heartbeat_s if heartbeat_s else 0.0
    left = max(1.0, per_hour - RESERVE - heartbeats)
    saves = 3600 / (save_steps * step_s)
    if saves <= left:
        return None
    fits = int(-(-3600 // (left * step_s)))  # ceil
    return (f"save_steps={save_steps} at {step_s:.3g} s/step is {saves:,.0f} checkpoints/h, but the Hub takes about "
            f"{per_hour:g} commits/h per repo ({heartbeats:.0f} of them lease heartbeats): kit uploads at most "
            f"~{left:.0f}/h and skips the ones in between; save_steps={fits} or more would upload every checkpoint")
