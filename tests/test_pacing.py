"""The Hub's commit budget: the pacer's sliding hour, the uploader holding checkpoints back (newer
ones supersede the held one) against tests/hubserver.py, and the save_steps warning."""

from __future__ import annotations

import time

import pytest

from kit.checkpoints.store.hub import HubStore
from kit.checkpoints.store.pacing import RESERVE, CommitPacer, checkpoint_rate_warning
from kit.checkpoints.sync import BackgroundSync
from tests.hubserver import WRITE_TOKEN, HubServer, hub  # noqa: F401  (fixture)
from tests.test_store import REPO
from tests.test_sync import make_ckpt


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_pacer_lets_a_checkpoint_through_until_the_hours_budget_less_a_reserve_is_spent():
    clock = Clock()
    pacer = CommitPacer(per_hour=20, clock=clock)
    for _ in range(20 - RESERVE):
        assert pacer.wait_s() == 0.0
        pacer.note()
        clock.t += 10
    # 12 commits in the last 120 s: the next waits until the oldest is an hour old.
    assert pacer.wait_s() == 3600 - 120
    clock.t += 3600 - 120
    assert pacer.wait_s() == 0.0


@pytest.mark.slow
def test_the_uploader_holds_checkpoints_back_and_publishes_the_newest_at_close(tmp_path):
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
        store = HubStore("hf://me/paced", token=WRITE_TOKEN, endpoint=hub.url)
        store.pacer.per_hour = RESERVE + 2  # two commits an hour for checkpoints
        events = []
        sync = BackgroundSync(store, keep=10, on_event=events.append)
        for step in (1, 2):
            sync.submit(make_ckpt(tmp_path / f"c{step}", step), step)
            assert sync.wait(60)
        for step in (3, 4, 5):
            sync.submit(make_ckpt(tmp_path / f"c{step}", step), step)
            time.sleep(0.3)
        assert sync.published == [1, 2] and sync.superseded == [3, 4]  # held, then replaced by newer ones
        assert any(e["event"] == "paced" for e in events)
        assert sync.close(60)  # the last checkpoint of a session is never held back
        assert sync.published == [1, 2, 5] and store.list_steps() == [1, 2, 5]


def test_the_warning_names_a_save_steps_that_fits():
    words = checkpoint_rate_warning(save_steps=10, step_s=1.0, heartbeat_s=60)
    assert words.startswith("save_steps=10 at ") and "1 s/step" in words and "360 checkpoints/h" in words
    assert "the Hub takes about 128" in words and "(60 of them lease" in words and "save_steps=60 or more" in words
    assert checkpoint_rate_warning(save_steps=60, step_s=1.0, heartbeat_s=60) is None
    assert checkpoint_rate_warning(save_steps=10, step_s=0, heartbeat_s=60) is None


def test_commits_another_session_made_count_against_the_hour_old_ones_do_not():
    clock = Clock()
    clock.t = 10_000.0
    pacer = CommitPacer(per_hour=12, clock=clock)  # 12 - RESERVE = 4 checkpoint commits an hour
    pacer.seed([clock.t - 4000, clock.t - 3000, clock.t - 20, clock.t - 10, "junk"])
    assert pacer.recent() == [clock.t - 3000, clock.t - 20, clock.t - 10]  # over an hour old: dropped
    pacer.seed([clock.t - 10])  # the same commit, told twice (every heartbeat carries it)
    assert len(pacer.recent()) == 3 and pacer.wait_s() == 0.0
    own = CommitPacer(clock=clock)
    own.note()
    own.note()  # two commits in the same millisecond are two commits
    assert own.recent() == [clock.t, clock.t]
    pacer.note()
    assert pacer.wait_s() == 600.0  # four in the hour: wait until the one 3,000 s old is an hour old


def test_a_session_taking_over_a_cut_one_inherits_its_hour_of_hub_commits(hub):
    """The Hub's ~128 commits an hour are the repo's: a session cut at minute 50 and the next one
    started at minute 52 share one hour. The cut session's last heartbeat carries its commit times;
    the session that takes over (it is stale, or it released) counts them before its first checkpoint."""
    from kit.checkpoints.lease import Lease

    first = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    lease = Lease(first, "cut-host pid 1", ttl_s=0.3).acquire()
    for i in range(3):
        first.write_text(f"note-{i}", "x")
    lease.heartbeat()  # its last heartbeat: the lease's and 3 records' commit times, and its own time
    carried = len(first.pacer.recent())
    assert carried == 5
    time.sleep(0.5)  # then it is cut: no release, the lease goes stale

    fresh = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    assert fresh.pacer.recent() == [] and fresh.pacer.wait_s() == 0.0  # a new process knows nothing
    nxt = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    nxt.pacer.per_hour = RESERVE + carried  # so the inherited commits alone fill the checkpoint budget
    taken = Lease(nxt, "next-host pid 2").acquire()
    assert taken.took_over is not None
    assert len(nxt.pacer.recent()) == carried + 1  # the cut session's, and this takeover's commit
    assert nxt.pacer.wait_s() > 3500  # the next checkpoint waits for the hour to move on
    taken.release()
    # A released lease carries the hour too: the session after this one inherits both sessions' commits
    # (the cut one's 5, the takeover and the release), then makes its own two (acquire, release).
    after = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    Lease(after, "third-host pid 3").acquire().release()
    assert len(after.pacer.recent()) == carried + 2 + 2
