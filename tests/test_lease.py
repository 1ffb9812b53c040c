"""One writer per store: refusal names the holder, stale leases are taken over, and two racers on
the Hub cannot both win (parent_commit compare-and-swap on tests/hubserver.py)."""

import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import pytest

from kit.errors import StoreError
from kit.checkpoints.lease import LOCK_NAME, Lease, default_holder
from kit.checkpoints.store import DirStore
from kit.checkpoints.store.hub import HubStore
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
    assert "leased by host-x pid 123" in msg and "since 20" in msg
    # The heartbeat's age is whole seconds since acquire(): 0 or 1 on a loaded machine, never more.
    assert int(re.search(r"heartbeat (\d+) s ago", msg).group(1)) <= 2
    assert "take over after 180 s" in msg and err.value.exit_code == 4
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


def test_a_killed_holder_not_yet_reaped_is_taken_over_at_once(tmp_path, caplog):
    """kill -9 of a job whose torchrun died with it leaves its ranks as zombies until something reaps
    them (never, in a container without an init): a rerun on the same host must not wait 180 s."""
    import signal
    import socket
    import subprocess

    holder = subprocess.Popen(["sleep", "60"])
    try:
        Lease(DirStore(tmp_path / "store"), f"{socket.gethostname()} pid {holder.pid}").acquire()
        with pytest.raises(StoreError, match="is leased by"):  # alive: it blocks
            Lease(DirStore(tmp_path / "store"), "rerun").acquire()
        os.kill(holder.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{holder.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed process did not become a zombie"
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING, "kit.checkpoints.lease"):
            rerun = Lease(DirStore(tmp_path / "store"), "rerun").acquire()  # not reaped: still taken over
        assert rerun.took_over["holder"].endswith(f"pid {holder.pid}") and "no longer runs" in caplog.text
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_stale_lease_is_taken_over_with_a_warning(store_factory, caplog):
    old = Lease(store_factory(), "cut-session", ttl_s=0.3).acquire()
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING, "kit.checkpoints.lease"):
        new = Lease(store_factory(), "new-session").acquire()  # judged by the cut holder's own 0.3 s
    assert "taking over the stale" in caplog.text and "lease of cut-session" in caplog.text
    assert new.took_over["holder"] == "cut-session" and new.took_over["ttl_s"] == pytest.approx(0.3)
    with pytest.raises(StoreError, match="lost to new-session"):
        old.heartbeat()
    assert not old.held
    old.release()  # not ours any more: must not remove the new holder's lease
    with pytest.raises(StoreError, match="leased by new-session"):
        Lease(store_factory(), "third", ttl_s=600).acquire()
    new.release()


def test_a_lease_is_judged_by_its_holders_cadence_not_the_newcomers(store_factory):
    slow = Lease(store_factory(), "slow-holder", heartbeat_s=2, missed=3).acquire()  # stale after 6 s
    time.sleep(0.5)
    with pytest.raises(StoreError, match="leased by slow-holder.*take over after 6 s without a heartbeat"):
        Lease(store_factory(), "impatient", heartbeat_s=0.05, missed=3).acquire()
    slow.release()


def test_the_default_takes_over_after_three_missed_heartbeats_of_a_minute(store_factory):
    lease = Lease(store_factory(), "me")
    assert (lease.heartbeat_s, lease.missed, lease.ttl_s) == (60, 3, 180)
    lease.acquire()
    record = json.loads(lease.store.read_text("lease.json") if not isinstance(lease.store, DirStore)
                        else (lease.store.root / "kit" / "lease.lock").read_text())
    assert record["ttl_s"] == 180 and record["heartbeat_s"] == 60
    lease.release()


def test_heartbeat_before_acquire_is_an_error(store_factory):
    with pytest.raises(StoreError, match="before acquire"):
        Lease(store_factory(), "x").heartbeat()


def test_context_manager_and_default_holder(store_factory):
    with Lease(store_factory()) as lease:
        assert default_holder() == lease.holder and lease.held
    assert not lease.held


def test_two_racers_on_the_hub_exactly_one_wins(hub):
    hub.commit_gate = threading.Barrier(2)  # both read the same head before either commit lands
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
    with caplog.at_level(logging.WARNING, "kit.checkpoints.lease"):
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


@pytest.mark.slow
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
    with caplog.at_level(logging.ERROR, "kit.checkpoints.lease"):
        lease.keep_alive(interval_s=0.05)
        time.sleep(0.4)
    assert lease.lost is not None and "lost to b" in str(lease.lost)
    assert "heartbeat on" in caplog.text
    lease.release()
    assert json.loads((tmp_path / "s/kit" / LOCK_NAME).read_text())["holder"] == "b", "not ours: left alone"


@pytest.mark.slow
def test_hub_lease_gives_up_when_the_repo_keeps_moving(hub, monkeypatch):
    import kit.checkpoints.lease

    monkeypatch.setattr(kit.checkpoints.lease, "ACQUIRE_BACKOFF_S", (0.01, None))
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.ensure_repo()
    hub.inject("status", status=412, times=100, method="POST", path="/commit/")
    with pytest.raises(StoreError, match="kept changing"):
        Lease(store, "x").acquire()


HOLDER = """
import sys, time
from kit.checkpoints.lease import Lease
from kit.checkpoints.store.hub import HubStore
lease = Lease(HubStore(sys.argv[3], token=sys.argv[2], endpoint=sys.argv[1]), "host-a pid 1",
              heartbeat_s=0.5, missed=3).acquire()
lease.keep_alive()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_after_a_kill_9_another_host_takes_over_after_three_missed_heartbeats(hub):
    """A real holder process heartbeats every 0.5 s and is killed with SIGKILL; a session on another
    host is refused while the heartbeats are fresh and gets the lease about 3 × 0.5 s after the last."""
    import os
    import signal
    import subprocess
    import sys

    from tests.scripts import ROOT

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, hub.url, WRITE_TOKEN, REPO], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(1.6)  # several heartbeats: still alive, so refused
        with pytest.raises(StoreError, match="leased by host-a pid 1"):
            Lease(HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url), "host-b pid 2").acquire()
        holder.send_signal(signal.SIGKILL)
        killed = time.time()
        holder.wait()
    finally:
        holder.kill()
    while True:
        try:
            lease = Lease(HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url), "host-b pid 2").acquire()
            break
        except StoreError:
            assert time.time() - killed < 10, "not taken over within 10 s of the kill"
            time.sleep(0.1)
    took = time.time() - killed
    since_beat = time.time() - lease.took_over["heartbeat"]
    assert 1.5 <= since_beat and took <= 1.5 + 2.0, (took, since_beat)  # 3 × 0.5 s, plus the Hub's latency
    lease.release()


@pytest.mark.slow
def test_a_job_whose_lease_was_taken_over_stops_and_writes_nothing_more(tmp_path):
    """Real train_ddp.py into a Hub store; mid-run another session's record replaces its lease (as a
    takeover after missed heartbeats would): at its next heartbeat the job stops, exit 4, and no
    checkpoint after that reaches the store."""
    import subprocess
    import sys

    from tests.hubserver import HubServer
    from tests.scripts import FAST, ROOT, SCRIPT, cpu_env

    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        env = cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        log = tmp_path / "log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, str(SCRIPT), f"output_dir={tmp_path / 'out'}", "store=hf://me/lost",
                                     "max_steps=5000", "save_steps=10", "lease_heartbeat_seconds=0.3", *FAST],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            deadline = time.time() + 240
            while " published: " not in log.read_text():
                assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            store = HubStore("hf://me/lost", token=WRITE_TOKEN, endpoint=server.url)
            store.write_text("lease.json", json.dumps({"holder": "other-host pid 7", "id": "theirs", "since": time.time(),
                                                       "heartbeat": time.time(), "ttl_s": 600}))
            taken = max(store.list_steps())
            assert proc.wait(120) == 4, log.read_text()[-3000:]
        text = log.read_text()
        assert "lease lost: " in text and "hf://me/lost was lost to" in text and "other-host pid 7" in text
        assert "writes nothing more" in text and "Traceback" not in text
        assert max(store.list_steps()) <= taken + 10  # at most the one upload already under way
        assert json.loads(store.read_text("lease.json"))["id"] == "theirs"  # never overwritten by the loser


def test_each_store_appends_session_records_and_reports_its_lease(store_factory):
    # The store owns its concurrency: the lease and the session records go through its own primitives.
    store = store_factory()
    store.append_text("sessions.jsonl", '{"n": 1}\n')
    store.append_text("kit/sessions.jsonl", '{"n": 2}\n')
    assert store.read_text("sessions.jsonl") == '{"n": 1}\n{"n": 2}\n'
    text, absent_is_free = store.read_lease()
    assert text is None
    lease = Lease(store, "me").acquire()
    assert json.loads(store.read_lease()[0])["holder"] == "me"
    lease.release()
    text, absent_is_free = store.read_lease()
    assert (text is None and absent_is_free) or json.loads(text)["released"] is True


@pytest.mark.parametrize("record", [
    {"holder": "otherhost pid 5", "heartbeat": "x", "id": "a"},
    {"holder": "otherhost pid 5", "heartbeat": [1], "id": "a"},
    {"holder": 5, "heartbeat": 1.0, "id": "a"},
    {"holder": "h", "heartbeat": 1.0, "since": 1e400, "id": "a"},
    {"holder": "h", "heartbeat": True, "id": "a"},
    {"holder": "h", "heartbeat": 1.0, "id": "a", "commits": ["x"]},
], ids=["text-beat", "list-beat", "number-holder", "infinite-since", "bool-beat", "text-commits"])
def test_a_lease_record_of_the_wrong_types_is_no_lease_not_a_crash(tmp_path, caplog, record):
    store = DirStore(tmp_path / "store")
    (tmp_path / "store/kit").mkdir(parents=True)
    (tmp_path / "store/kit" / LOCK_NAME).write_text(json.dumps(record).replace("Infinity", "1e400"))
    with caplog.at_level(logging.WARNING, "kit.checkpoints.lease"):
        lease = Lease(store, "me").acquire()
    assert "of the wrong type" in caplog.text and "as unleased" in caplog.text
    assert json.loads((tmp_path / "store/kit" / LOCK_NAME).read_text())["holder"] == "me"
    lease.release()
