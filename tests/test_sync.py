"""BackgroundSync against the real Hub client and tests/hubserver.py: retries, supersede, staging,
refusals that must not stop training. Real threads, real HTTP, real files."""

import logging
import shutil
import threading
import time

import pytest

from kit.errors import StoreError
from kit.checkpoints.store import DirStore
from kit.checkpoints.store.hub import HubStore
from kit.checkpoints.sync import STAGING, BackgroundSync
from tests.hubserver import READ_TOKEN, WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.test_store import REPO, make_ckpt, tree_bytes

FAST = (0.05, 0.1)


def hub_store(server, token=WRITE_TOKEN, timeout_s=2.0):
    return HubStore(REPO, token=token, endpoint=server.url, timeout_s=timeout_s)


@pytest.mark.parametrize("fault", [dict(kind="status", status=503, times=2), dict(kind="status", status=429),
                                   dict(kind="status", status=500, times=3), dict(kind="drop_upload", times=2),
                                   dict(kind="hang", seconds=4)])
@pytest.mark.slow
def test_transient_failures_are_retried_until_the_checkpoint_lands(hub, tmp_path, fault):
    store = hub_store(hub)
    events = []
    hub.inject(method="POST", path="/commit/", **fault)
    sync = BackgroundSync(store, keep=2, backoff=FAST, on_event=events.append)
    src = make_ckpt(tmp_path, 1, size=100_000)
    sync.submit(src, 1)
    assert sync.wait(timeout=30) is True
    assert sync.published == [1] and sync.errors == []
    retries = [e for e in events if e["event"] == "retrying"]
    assert len(retries) == fault.get("times", 1)
    assert store.latest_valid() == 1
    store.fetch(1, tmp_path / "back")
    assert tree_bytes(tmp_path / "back") == tree_bytes(src)
    sync.close(5)


@pytest.mark.slow
def test_dropped_upload_never_yields_a_corrupt_latest(hub, tmp_path):
    store = hub_store(hub)
    store.publish(make_ckpt(tmp_path / "a", 1), 1, keep=3)
    hub.inject("drop_upload", times=3, method="POST", path="/commit/")
    seen = []
    sync = BackgroundSync(store, keep=3, backoff=(0.2,), on_event=lambda e: seen.append(store.latest_valid())
                          if e["event"] == "retrying" else None)
    sync.submit(make_ckpt(tmp_path / "b", 2, size=500_000), 2)
    assert sync.wait(30)
    assert seen == [1, 1, 1], "while uploads were being cut, latest stayed at the old complete checkpoint"
    assert store.latest_valid() == 2


def test_retries_exhausted_is_an_error_not_a_crash(hub, tmp_path):
    hub.inject("status", status=503, times=100, method="POST", path="/commit/")
    sync = BackgroundSync(hub_store(hub), keep=1, retries=2, backoff=(0.01,))
    sync.submit(make_ckpt(tmp_path, 1), 1)
    with pytest.raises(StoreError, match="not published after 3 attempts"):
        sync.wait(30)
    assert sync.wait(1) is True, "an error is raised once, then wait() is clean"
    assert sync.close(1) is False


def test_refusal_is_recorded_and_training_goes_on(hub, tmp_path, caplog):
    HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).publish(make_ckpt(tmp_path / "w", 1), 1, keep=1)
    sync = BackgroundSync(hub_store(hub, token=READ_TOKEN), keep=1, backoff=FAST)
    with caplog.at_level(logging.ERROR, "kit.checkpoints.sync"):
        sync.submit(make_ckpt(tmp_path, 2), 2)  # does not raise
        steps_done = sum(1 for _ in range(1000))  # the "training loop" keeps going
        with pytest.raises(StoreError, match="no write access .* \\(403\\)"):
            sync.wait(30)
    assert steps_done == 1000 and len(sync.errors) == 1
    assert "checkpoint 2 was not" in caplog.text and "published" in caplog.text
    assert len([r for r in hub.requests if r[2] == 403]) == 1, "a 403 is not retried"
    sync.submit(make_ckpt(tmp_path, 3), 3)  # still accepts work after a failure
    with pytest.raises(StoreError):
        sync.wait(30)


@pytest.mark.slow
def test_newer_submission_supersedes_a_queued_one_and_says_so(hub, tmp_path, caplog):
    store = hub_store(hub, timeout_s=30)
    hub.throttle_bps = 2_000_000  # ~1.3 MB of base64 per upload: ~0.7 s each
    events = []
    started = threading.Event()
    sync = BackgroundSync(store, keep=5, backoff=FAST,
                          on_event=lambda e: (events.append(e), e["event"] == "started" and started.set()))
    with caplog.at_level(logging.WARNING, "kit.checkpoints.sync"):
        sync.submit(make_ckpt(tmp_path, 1, size=300_000), 1)
        assert started.wait(10)
        sync.submit(make_ckpt(tmp_path, 2, size=300_000), 2)
        sync.submit(make_ckpt(tmp_path, 3, size=300_000), 3)
        assert sync.busy
        assert sync.wait(60)
    assert sync.published == [1, 3] and sync.superseded == [2]
    assert "checkpoint 2 was still" in caplog.text and "step 3 supersedes it" in caplog.text
    kinds = [(e["event"], e["step"]) for e in events]
    assert ("superseded", 2) in kinds and ("published", 1) in kinds and ("published", 3) in kinds
    assert store.list_steps() == [1, 3]
    assert not list((tmp_path / STAGING).iterdir()), "staging folders are cleaned up"
    sync.close(5)


@pytest.mark.slow
def test_staged_snapshot_survives_rotation_of_the_source(hub, tmp_path):
    store = hub_store(hub, timeout_s=30)
    hub.throttle_bps = 1_000_000
    sync = BackgroundSync(store, keep=2)
    src = make_ckpt(tmp_path, 1, size=200_000)
    expected = tree_bytes(src)
    sync.submit(src, 1)
    shutil.rmtree(src)  # what save_total_limit rotation does under an upload
    assert sync.wait(60)
    store.fetch(1, tmp_path / "back")
    assert tree_bytes(tmp_path / "back") == expected
    st = sync.stats()
    assert st["last_upload_bytes"] == sum(len(v) for v in expected.values())
    assert st["last_upload_s"] > 0.1 and st["bytes_per_s"] > 0
    sync.close(5)


def test_close_publishes_the_final_checkpoint_and_refuses_more(tmp_path):
    sync = BackgroundSync(DirStore(tmp_path / "store"), keep=2)
    for s in (1, 2, 3):
        sync.submit(make_ckpt(tmp_path / "out", s), s)
    assert sync.close(timeout=30) is True
    assert sync.published[-1] == 3 and DirStore(tmp_path / "store").latest_valid() == 3
    assert set(sync.published) | set(sync.superseded) == {1, 2, 3}, "nothing silently dropped"
    with pytest.raises(StoreError, match="closed"):
        sync.submit(make_ckpt(tmp_path / "out", 4), 4)


def test_close_times_out_on_a_stuck_upload(hub, tmp_path):
    hub.throttle_bps = 50_000
    sync = BackgroundSync(hub_store(hub, timeout_s=30), keep=1)
    sync.submit(make_ckpt(tmp_path, 1, size=200_000), 1)
    t0 = time.monotonic()
    assert sync.close(timeout=0.5) is False
    assert time.monotonic() - t0 < 3
    hub.throttle_bps = None


def test_missing_folder_and_broken_callback_do_not_stop_anything(tmp_path, caplog):
    def boom(event):
        raise RuntimeError("callback bug")

    sync = BackgroundSync(DirStore(tmp_path / "store"), keep=1, on_event=boom)
    with caplog.at_level(logging.ERROR, "kit.checkpoints.sync"):
        sync.submit(tmp_path / "never-saved", 5)
        sync.submit(make_ckpt(tmp_path, 6), 6)
        with pytest.raises(StoreError, match="could not snapshot"):
            sync.wait(10)
    assert sync.published == [6]
    assert "on_event callback raised" in caplog.text


def test_manifestless_checkpoint_is_a_recorded_error(tmp_path):
    sync = BackgroundSync(DirStore(tmp_path / "store"), keep=1)
    sync.submit(make_ckpt(tmp_path, 1, manifest=False), 1)
    with pytest.raises(StoreError, match="write_manifest"):
        sync.wait(10)
    assert sync.close(1) is False


def test_manifest_can_be_built_in_the_worker(tmp_path):
    store = DirStore(tmp_path / "store")
    sync = BackgroundSync(store, keep=1)
    src = make_ckpt(tmp_path, 4, manifest=False)
    sync.submit(src, 4, world_size=2, fingerprint={"model": "tiny"})
    assert sync.close(30) is True
    assert store.latest_valid() == 4
    store.fetch(4, tmp_path / "back")
    from kit.checkpoints.manifest import read_manifest
    m = read_manifest(tmp_path / "back")
    assert m["world_size"] == 2 and m["fingerprint"] == {"model": "tiny"}
    assert not (src / "kit_manifest.json").exists(), "the training folder itself is not touched"


def test_a_store_bug_is_recorded_not_lost(tmp_path, caplog):
    class BuggyStore(DirStore):
        def publish(self, local_ckpt_dir, step, keep):
            raise KeyError("oops")

    sync = BackgroundSync(BuggyStore(tmp_path / "s"), keep=1)
    with caplog.at_level(logging.ERROR, "kit.checkpoints.sync"):
        sync.submit(make_ckpt(tmp_path, 1), 1)
        with pytest.raises(StoreError, match="unexpected KeyError"):
            sync.wait(10)
    assert "unexpected error" in caplog.text and "publishing step 1" in caplog.text
    sync.submit(make_ckpt(tmp_path, 2), 2)  # the worker thread is still alive
    with pytest.raises(StoreError):
        sync.wait(10)


def test_events_print_as_one_line(tmp_path):
    lines = []
    sync = BackgroundSync(DirStore(tmp_path / "s"), keep=1, on_event=lambda e: lines.append(f"[kit] {e}"))
    sync.submit(make_ckpt(tmp_path, 1), 1)
    sync.close(10)
    assert [ln.split()[:5] for ln in (lines[0], lines[-1])] == [["[kit]", "sync:", "step", "1", "submitted"],
                                                                ["[kit]", "sync:", "step", "1", "published"]]
