"""The Hub's commit budget: about 128 commits per hour per repo (and 1000 API requests per
5 minutes). A store counts its own commits in a sliding hour; the checkpoint uploader asks it how
long to wait (`wait_s`) before its next commit, and meanwhile newer checkpoints supersede the
queued one. The lease heartbeat never waits (a late heartbeat lets another session take over);
it is paced by its interval instead, and counted here like any commit, so checkpoints get what
the heartbeats leave.

Example:
    >>> pacer = CommitPacer(per_hour=128)
    >>> pacer.note(); pacer.wait_s()
    0.0
"""

from __future__ import annotations

import collections
import threading
import time

HUB_COMMITS_PER_HOUR = 128
RESERVE = 8  # kept for heartbeats and session records, so a checkpoint never takes the last commits
WINDOW_S = 3600.0


class CommitPacer:
    def __init__(self, per_hour: float = HUB_COMMITS_PER_HOUR, clock=time.monotonic):
        self.per_hour, self.clock = per_hour, clock
        self._times: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def note(self) -> None:
        """Count one commit that just landed."""
        with self._lock:
            self._times.append(self.clock())

    def wait_s(self) -> float:
        """Seconds until a deferrable commit (a checkpoint) fits in the hour's budget; 0 when it does now."""
        with self._lock:
            now = self.clock()
            while self._times and now - self._times[0] >= WINDOW_S:
                self._times.popleft()
            allowed = max(1, int(self.per_hour) - RESERVE)
            if len(self._times) < allowed:
                return 0.0
            return max(0.0, self._times[len(self._times) - allowed] + WINDOW_S - now)


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
