"""One writer per store: refusal names the holder, stale leases are taken over, and two racers on
the Hub cannot both win (parent_commit compare-and-swap on tests/hubserver.py)."""

import json
import logging
import threading
import time

import pytest

from kit.errors import StoreError
from kit.lease import LOCK_NAME, Lease, default_holder
from kit.store import DirStore
from kit.store.hub import HubStore
from tests.hubserver import READ_TOKEN, WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.test_store import REPO


@pytest.fixture(params=["dir", "hub"])
def store_factory(request, tmp_path):
    """A callable returning a fresh store object on the same storage (one per simulated session)."""
    if request.param == "dir":
        return lambda: DirStore(tmp_path / "store")
    server = request.getfixturevalue("hub")
    return lambda: HubStore(REPO, token=WRITE_TOKEN, endpoint=server.url)


def test_second_holder_is_refused_with_holder_and_age(store_factory):
    a = Lease(store_factory(), "host-x pid 123").acquire()
    with pytest.raises(StoreError) as err:
        Lease(store_factory(), "host-y pid 9").acquire()
    msg = str(err.value)
    assert "is leased by host-x pid 123 since 20" in msg and "heartbeat 0 s ago" in msg
    assert "take over after 10 min" in msg and err.value.exit_code == 4
    a.heartbeat()
    a.release()
    b = Lease(store_factory(), "host-y pid 9").acquire()
    assert b.held
    b.release()


def test_same_holder_object_can_reacquire(store_factory):
    lease = Lease(store_factory(), "me")
    lease.acquire()
    lease.acquire()  # our own lease does not block us
    assert lease.held
    with pytest.raises(StoreError, match="is leased by me"):
        Lease(store_factory(), "other").acquire()
    lease.release()
    lease.release()  # a second release is a no-op
    assert not lease.held
    other = Lease(store_factory(), "other").acquire()  # released: free at once
    assert other.held
    other.release()


def test_stale_lease_is_taken_over_with_a_warning(store_factory, caplog):
    old = Lease(store_factory(), "cut-session", ttl_s=0.3).acquire()
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING, "kit.lease"):
        new = Lease(store_factory(), "new-session", ttl_s=0.3).acquire()
    assert "taking over the stale lease of cut-session" in caplog.text
    with pytest.raises(StoreError, match="lost to new-session"):
        old.heartbeat()
    assert not old.held
    old.release()  # not ours any more: must not remove the new holder's lease
    with pytest.raises(StoreError, match="leased by new-session"):
        Lease(store_factory(), "third", ttl_s=600).acquire()
    new.release()


def test_heartbeat_before_acquire_is_an_error(store_factory):
    with pytest.raises(StoreError, match="before acquire"):
        Lease(store_factory(), "x").heartbeat()


def test_context_manager_and_default_holder(store_factory):
    with Lease(store_factory()) as lease:
        assert default_holder() == lease.holder and lease.held
    assert not lease.held


def test_two_racers_on_the_hub_exactly_one_wins(hub):
    hub.commit_delay_s = 0.3  # both read the same head before either commit lands
    results, barrier = {}, threading.Barrier(2)

    def race(name):
        lease = Lease(HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url), name)
        lease.store.ensure_repo()
        barrier.wait()
        try:
            lease.acquire()
            results[name] = "won"
        except StoreError as err:
            results[name] = str(err)

    hub.create(REPO)
    threads = [threading.Thread(target=race, args=(n,)) for n in ("racer-a", "racer-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(v == "won" for v in results.values()) == [False, True], results
    loser = next(v for v in results.values() if v != "won")
    winner = next(k for k, v in results.items() if v == "won")
    assert f"leased by {winner}" in loser
    assert any(status == 412 for _, path, status in hub.requests if "/commit/" in path), "CAS was exercised"
    lease_json = json.loads(hub.files(REPO)["kit/lease.json"])
    assert lease_json["holder"] == winner


def test_hub_lease_with_a_read_only_token_is_refused(hub):
    HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).ensure_repo()
    with pytest.raises(StoreError, match="no write access .* \\(403\\)"):
        Lease(HubStore(REPO, token=READ_TOKEN, endpoint=hub.url), "ro").acquire()


def test_dir_lock_file_is_exclusive_and_garbage_is_treated_as_free(tmp_path, caplog):
    store = DirStore(tmp_path / "store")
    (tmp_path / "store/kit").mkdir(parents=True)
    (tmp_path / "store/kit" / LOCK_NAME).write_text("not json")
    with caplog.at_level(logging.WARNING, "kit.lease"):
        lease = Lease(store, "me").acquire()
    assert "not valid JSON" in caplog.text
    assert json.loads((tmp_path / "store/kit" / LOCK_NAME).read_text())["holder"] == "me"
    lease.release()
    assert not (tmp_path / "store/kit" / LOCK_NAME).exists()


def test_dir_lease_on_unwritable_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="not writable"):
        Lease(DirStore(blocker / "s"), "me").acquire()


def test_keep_alive_holds_the_lease_past_its_ttl(store_factory, caplog):
    lease = Lease(store_factory(), "long-run", ttl_s=0.6)
    lease.acquire()
    lease.keep_alive(interval_s=0.1)
    time.sleep(1.0)
    with pytest.raises(StoreError, match="leased by long-run"):
        Lease(store_factory(), "intruder", ttl_s=0.6).acquire()
    lease.release()
    assert lease.lost is None
    Lease(store_factory(), "next").acquire().release()


def test_keep_alive_records_a_lost_lease(tmp_path, caplog):
    lease = Lease(DirStore(tmp_path / "s"), "a", ttl_s=60)
    lease.acquire()
    (tmp_path / "s/kit" / LOCK_NAME).write_text(json.dumps({"holder": "b", "id": "other", "heartbeat": time.time()}))
    with caplog.at_level(logging.ERROR, "kit.lease"):
        lease.keep_alive(interval_s=0.05)
        time.sleep(0.4)
    assert lease.lost is not None and "lost to b" in str(lease.lost)
    assert "heartbeat on" in caplog.text
    lease.release()
    assert json.loads((tmp_path / "s/kit" / LOCK_NAME).read_text())["holder"] == "b", "not ours: left alone"


def test_hub_lease_gives_up_when_the_repo_keeps_moving(hub, monkeypatch):
    import kit.lease

    monkeypatch.setattr(kit.lease, "ACQUIRE_BACKOFF_S", (0.01, None))
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.ensure_repo()
    hub.inject("status", status=412, times=100, method="POST", path="/commit/")
    with pytest.raises(StoreError, match="kept changing"):
        Lease(store, "x").acquire()
