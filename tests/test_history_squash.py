"""History squashing (issue #11 item 32): `keep_checkpoints` removes checkpoints from the Hub repo's
current files, not its history; `squash_history_every=N` squashes it (huggingface_hub's
`super_squash_history`, the real client over HTTP against tests/hubserver.py) from the upload
thread, between two publishes."""

from __future__ import annotations

import pytest
from huggingface_hub import constants as hf_constants

from kit.planning import config
from kit.checkpoints.store import DirStore
from kit.checkpoints.store.hub import HubStore
from kit.checkpoints.sync import BackgroundSync
from tests.hubserver import WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.test_store import REPO, make_ckpt, tree_bytes


@pytest.fixture(autouse=True)
def _online(monkeypatch):
    """Whatever the caller exported: huggingface_hub reads HF_HUB_OFFLINE once, at import."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


def publish_all(store, tmp_path, steps, squash_every: int, keep: int = 2) -> tuple[BackgroundSync, list]:
    events = []
    sync = BackgroundSync(store, keep=keep, squash_every=squash_every, on_event=events.append)
    for s in steps:
        sync.submit(make_ckpt(tmp_path / "out", s, size=50_000), s)
        assert sync.wait(timeout=60)  # one at a time, so none is superseded
    assert sync.close(timeout=60)
    return sync, events


@pytest.mark.slow
def test_by_default_pruned_checkpoints_stay_in_the_history(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    publish_all(store, tmp_path, [1, 2, 3, 4], squash_every=0)
    assert store.list_steps() == [3, 4]
    assert hub.stored_bytes() > 4 * 150_000, "all four checkpoints still use storage"


@pytest.mark.slow
def test_squashing_frees_the_storage_of_pruned_checkpoints(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    sync, events = publish_all(store, tmp_path, [1, 2, 3, 4], squash_every=2)
    assert [e["step"] for e in events if e["event"] == "squashed"] == [2, 4]
    assert store.list_steps() == [3, 4] and store.latest_valid() == 4
    assert len(hub.commit_log(REPO)) == 1
    assert hub.stored_bytes() < 2.2 * 150_000, "only the two kept checkpoints are stored"
    store.fetch(4, tmp_path / "restored")
    assert tree_bytes(tmp_path / "restored") == tree_bytes(tmp_path / "out" / "checkpoint-4")
    assert sync.published == [1, 2, 3, 4] and not sync.errors


def test_a_failed_squash_is_a_warning_and_the_checkpoint_is_published(hub, tmp_path, caplog):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    hub.inject("status", status=500, times=10, method="POST", path="/super-squash/")
    sync, events = publish_all(store, tmp_path, [1], squash_every=1)
    assert sync.published == [1] and not sync.errors and store.latest_valid() == 1
    assert [e["event"] for e in events][-1] == "squash failed"
    assert "squashing the history" in caplog.text and "unaffected" in caplog.text


def test_a_directory_store_has_no_history_to_squash(tmp_path):
    sync, events = publish_all(DirStore(tmp_path / "store"), tmp_path, [1, 2], squash_every=1)
    assert not [e for e in events if "squash" in e["event"]] and sync.published == [1, 2]


def test_the_setting_is_validated():
    assert config.load(None, ["squash_history_every=5"]).squash_history_every == 5
    from kit.errors import UsageError

    with pytest.raises(UsageError, match="squash_history_every"):
        config.load(None, ["squash_history_every=-1"])
