"""The Hub's commit budget: the pacer's sliding hour, the uploader holding checkpoints back (newer
ones supersede the held one) against tests/hubserver.py, and the save_steps warning."""

from __future__ import annotations

import time

import pytest

from kit.checkpoints.store.hub import HubStore
from kit.checkpoints.store.pacing import RESERVE, CommitPacer, checkpoint_rate_warning
from kit.checkpoints.sync import BackgroundSync
from tests.hubserver import WRITE_TOKEN, HubServer
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
    assert words.startswith("save_steps=10 at 1 s/step is 360 checkpoints/h, but the Hub takes about 128")
    assert "(60 of them lease heartbeats)" in words and "save_steps=60 or more" in words
    assert checkpoint_rate_warning(save_steps=60, step_s=1.0, heartbeat_s=60) is None
    assert checkpoint_rate_warning(save_steps=10, step_s=0, heartbeat_s=60) is None
