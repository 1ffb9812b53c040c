"""One writer per store: a lease with a heartbeat, so two sessions never train into one store.

Hub: ``kit/lease.json`` is committed with ``parent_commit`` = the head we read it at; of two
racers only one commit lands, the other gets 412, re-reads and sees the winner. Directory: an
``O_CREAT|O_EXCL`` lock file ``kit/lease.lock`` holding the same record. Each store implements
that compare-and-swap itself (``store.swap_lease``, kit/checkpoints/store/leasing.py); this module
only decides what to write.

The holder heartbeats every ``heartbeat_s`` (60 s); a lease that missed ``missed`` heartbeats in a
row (3: no heartbeat for 180 s) is stale and taken over with a warning — the holder's session was
cut. Each record says its own cadence (``ttl_s`` = heartbeat_s × missed), and a newcomer judges it
by that, so a holder on a slower cadence is never taken over early. A live holder that could not
heartbeat that long (a Hub outage) finds at its next heartbeat that the compare-and-swap lost, and
stops writing (``lost``). The heartbeat is paced for the Hub's ~128 commits/hour per repo: 60 of
them, the rest for checkpoints. Timestamps are wall-clock UTC, so machines with clocks skewed by
minutes can misjudge staleness.

A record also carries the holder's ``progress`` (its step, and when its training began), so the
session that takes over from a cut one can say how far that one got (``took_over``), and the
times of the store's commits in the last hour, so that session's commit pacer counts them: the
Hub's limit is the repo's, and a new session on another host would otherwise start a fresh hour.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from kit.errors import StoreError
from kit.files import parse_json
from kit.retry import retry
from kit.checkpoints.store.base import Store, TransientStoreError
from kit.checkpoints.store.leasing import LEASE_NAME, LOCK_NAME  # noqa: F401  (the records' names)

log = logging.getLogger("kit.checkpoints.lease")
HEARTBEAT_S = 60.0  # 60 commits/h of the Hub's ~128 per repo
MISSED_HEARTBEATS = 3  # a cut session is taken over 3 × 60 = 180 s after its last heartbeat
ACQUIRE_BACKOFF_S = (1, 2, 4, 8, None)  # None: the last attempt


def default_holder() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def _dead_here(holder: str) -> bool:
    """True when `holder` (as `default_holder` writes it) names a process of this host that is gone.

    A run killed with kill -9 cannot release its lease; rerunning on the same machine must not
    wait for the lease to go stale.
    """
    host, _, pid = holder.rpartition(" pid ")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    # A killed rank whose torchrun died with it waits as a zombie until something reaps it (in a
    # container without an init, never): it exists, but it runs no more and heartbeats no more.
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    """True when /proc says `pid` has exited and is waiting to be reaped (state Z or X)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS), or the process was reaped meanwhile: judged by kill() alone
        return False
    return stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"])


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(t))


class Lease:
    """``Lease(store, holder).acquire()``, then ``keep_alive()`` (a heartbeat every ``heartbeat_s``),
    and ``release()`` at the end. Without heartbeats the lease goes stale after ``missed`` of them
    (``ttl_s``) and another session may take the store over. ``ttl_s`` alone means a heartbeat
    every ttl_s / 3."""

    def __init__(self, store: Store, holder: str | None = None, ttl_s: float | None = None,
                 heartbeat_s: float = HEARTBEAT_S, missed: int = MISSED_HEARTBEATS):
        if ttl_s is not None:
            heartbeat_s, missed = ttl_s / 3, 3
        self.store, self.heartbeat_s, self.missed = store, heartbeat_s, missed
        self.ttl_s = heartbeat_s * missed
        self.holder = holder or default_holder()
        self.progress: dict = {}  # the job's step etc., carried by each heartbeat
        self.took_over: dict | None = None  # the record of a cut holder this lease replaced
        self.id = uuid.uuid4().hex
        self.since: float | None = None
        self.held = False
        self.lost: StoreError | None = None  # set by the keep-alive thread when the lease was taken
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_beat = 0.0
        self._keeper: threading.Thread | None = None

    def _record(self) -> dict:
        now = time.time()
        # The store's commits of the last hour (the Hub's limit is the repo's), for the next session;
        # the commit of this record itself is its "heartbeat".
        return {"holder": self.holder, "id": self.id, "since": self.since or now, "heartbeat": now,
                "ttl_s": self.ttl_s, "heartbeat_s": self.heartbeat_s, "progress": dict(self.progress),
                "commits": self.store.pacer.recent()}

    def _judge(self, other: dict | None) -> bool:
        """True when ``other`` does not block us (absent, ours, released or stale); raises when it does."""
        if other and other.get("id") != self.id and isinstance(other.get("commits"), list):
            # The hour's budget another session spent here: its commits, and the record's own.
            self.store.pacer.seed([*other["commits"], other.get("heartbeat")])
        if not other or other.get("released") or other.get("id") == self.id:
            return True
        age = time.time() - float(other.get("heartbeat", 0))
        ttl = _number(other.get("ttl_s")) or self.ttl_s  # the holder's own cadence
        if _dead_here(other.get("holder", "")):
            log.warning("%s: taking over the lease of %s: that process no longer runs on this host",
                        self.store.describe(), other.get("holder"))
            self.took_over = other
            return True
        if age > ttl:
            log.warning("%s: taking over the stale lease of %s (last heartbeat %.0f s ago; stale after %.0f s)",
                        self.store.describe(), other.get("holder"), age, ttl)
            self.took_over = other
            return True
        raise StoreError(
            f"store {self.store.describe()} is leased by {other.get('holder')} since "
            f"{_iso(float(other.get('since', 0)))} (heartbeat {age:.0f} s ago); wait or take over after "
            f"{ttl:.0f} s without a heartbeat (in {ttl - age:.0f} s)")

    def acquire(self) -> "Lease":
        """Take the lease, or raise StoreError naming who holds it."""
        self.since = time.time()
        # A Hub hiccup (5xx, 429, a timeout) as a session starts must not cost the session.
        retry(lambda: self._swap(lambda current: self._record() if self._judge(current) else None),
              pauses=[w for w in ACQUIRE_BACKOFF_S if w is not None], transient=(TransientStoreError,),
              what=f"{self.store.describe()}: taking the lease", log=log)
        self.held = True
        log.info("%s: lease acquired by %s", self.store.describe(), self.holder)
        return self

    def heartbeat(self) -> None:
        """Refresh the lease; raises StoreError if someone else took it over meanwhile."""
        if not self.held:
            raise StoreError("heartbeat() before acquire()")
        self._swap(lambda current: self._check_ours(current) and self._record())
        self._last_beat = time.time()

    def keep_alive(self, interval_s: float | None = None) -> None:
        """Heartbeat from a daemon thread every ``interval_s`` (default ``heartbeat_s``) until ``release()``.

        Failures are logged; a lease taken over by another session is kept in ``self.lost``.
        """
        if self._keeper is not None:
            return
        interval = interval_s or self.heartbeat_s
        self._stop.clear()
        self._wake.clear()

        def beat() -> None:
            while self.held:
                self._wake.wait(interval)
                self._wake.clear()
                if self._stop.is_set() or not self.held:
                    return
                try:
                    self.heartbeat()
                except StoreError as err:
                    log.error("lease heartbeat on %s failed: %s", self.store.describe(), err)
                    if not self.held:
                        self.lost = err
                        return

        self._keeper = threading.Thread(target=beat, name="kit-lease", daemon=True)
        self._keeper.start()

    def beat_soon(self, unless_within_s: float = 0.0) -> None:
        """Heartbeat now rather than at the next interval (when training begins, or a checkpoint
        reached the store, so the record carries it) — unless the last one is younger than
        ``unless_within_s``. The next timed heartbeat then counts from this one."""
        if time.time() - self._last_beat >= unless_within_s:
            self._wake.set()

    def release(self) -> None:
        """Give the lease up (only if it is still ours)."""
        self._stop.set()
        self._wake.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(5)
        self._keeper = None
        if not self.held:
            return
        self.held = False
        self._swap(lambda current: self._record() | {"released": True}
                   if (current or {}).get("id") == self.id else None)
        log.info("%s: lease released by %s", self.store.describe(), self.holder)

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _check_ours(self, current: dict | None) -> bool:
        if (current or {}).get("id") != self.id:
            self.held = False
            holder = (current or {}).get("holder", "nobody")
            raise StoreError(f"lease on {self.store.describe()} was lost to {holder}: another session "
                             "took over; stop writing to this store")
        return True

    def _swap(self, decide) -> None:
        """The store's compare-and-swap of the lease record (each backend's own: store/leasing.py)."""
        self.store.swap_lease(lambda text: decide(_parse(text)))


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _parse(text: str | bytes | None) -> dict | None:
    if not text:
        return None
    try:
        data = parse_json(text)
    except ValueError:
        log.warning("lease record is not valid JSON; treating the store as unleased")
        return None
    if not isinstance(data, dict):
        return None
    wrong = [k for k, kinds in _FIELDS.items() if data.get(k) is not None and not (
        isinstance(data[k], kinds) and not isinstance(data[k], bool) and (
            not isinstance(data[k], float) or math.isfinite(data[k])))]
    if wrong or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
                        for c in data.get("commits") or []):
        log.warning("lease record has %s of the wrong type; treating the store as unleased",
                    ", ".join(wrong) or "commits")
        return None
    return data


# The record's fields and their JSON types: a hand-edited or damaged record is read as no lease,
# never as a crash in the session that reads it.
_FIELDS = {"holder": str, "id": str, "since": (int, float), "heartbeat": (int, float), "ttl_s": (int, float),
           "heartbeat_s": (int, float), "commits": list, "progress": dict}
