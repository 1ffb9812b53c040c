"""The store when it holds junk, answers 500 or never answers (issue #11: items 19, 20, 29, 30, 33).

Both backends: a directory in tmp_path, and a Hub repo on tests/hubserver.py reached by the real
huggingface_hub client over real HTTP. The silent endpoint is a real TCP server that accepts the
connection and never sends a byte.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from kit import cli
from kit.planning import config
from kit.checkpoints import status

from kit.checkpoints.manifest import MANIFEST_NAME
from kit.checkpoints.store import DirStore, TransientStoreError, base
from kit.checkpoints.store.hub import HubStore
from tests.hubserver import WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.scripts import ROOT, SCRIPT, cpu_env, kit_cli
from tests.test_store import REPO, make_ckpt, tree_bytes


@pytest.fixture(autouse=True)
def _online(monkeypatch):
    """Whatever the caller exported: huggingface_hub reads HF_HUB_OFFLINE once, at import."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(params=["dir", "hub"])
def backend(request, tmp_path):
    if request.param == "dir":
        return DirStore(tmp_path / "store"), None
    server = request.getfixturevalue("hub")
    return HubStore(REPO, token=WRITE_TOKEN, endpoint=server.url), server


def add_junk(store, server, tmp_path: Path, step: int, kind: str) -> None:
    """A `checkpoint-N` that does not verify: no manifest, or one file with a flipped byte."""
    src = make_ckpt(tmp_path / "junk", step, manifest=(kind == "corrupt"))
    if kind == "corrupt":  # published whole, then the stored optimizer.pt rots (same size)
        store.publish(src, step, keep=99)
    rel = f"checkpoints/checkpoint-{step}"
    if server is None:
        dest = Path(store.root) / rel
        if kind == "no-manifest":
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.rename(dest)
        else:
            f = dest / "optimizer.pt"
            data = bytearray(f.read_bytes())
            data[10] ^= 0xFF
            f.write_bytes(bytes(data))
    elif kind == "no-manifest":
        server.put_files(REPO, {f"{rel}/{p.name}": p.read_bytes() for p in src.iterdir()})
    else:
        server.corrupt_stored(REPO, f"{rel}/optimizer.pt")


# ---- 29: pruning counts verified checkpoints only ---------------------------------------------
@pytest.mark.slow
def test_junk_folders_never_push_valid_checkpoints_out(backend, tmp_path):
    store, server = backend
    src = {s: make_ckpt(tmp_path / "local", s) for s in (20, 21, 25)}
    store.publish(src[20], 20, keep=3)
    store.publish(src[21], 21, keep=3)
    add_junk(store, server, tmp_path, 22, "no-manifest")
    add_junk(store, server, tmp_path, 23, "corrupt")
    store.publish(src[25], 25, keep=3)
    verdicts = {v.step: v.ok for v in store.inspect()}
    assert verdicts == {25: True, 23: False, 22: False, 21: True, 20: True}, verdicts
    assert store.latest_valid() == 25
    restored = tmp_path / "restore-20"
    store.fetch(20, restored)  # the oldest valid one is still whole
    assert tree_bytes(restored) == tree_bytes(src[20])


@pytest.mark.slow
def test_valid_ones_beyond_keep_and_junk_older_than_them_are_removed(backend, tmp_path):
    store, server = backend
    add_junk(store, server, tmp_path, 5, "no-manifest")
    store.publish(make_ckpt(tmp_path / "local", 10), 10, keep=2)
    store.publish(make_ckpt(tmp_path / "local", 20), 20, keep=2)
    add_junk(store, server, tmp_path, 25, "no-manifest")
    store.publish(make_ckpt(tmp_path / "local", 30), 30, keep=2)
    # 10 is beyond keep=2 of the verified ones; junk 5 is older than every kept one; junk 25 is
    # not counted (20 stays) and, newer than a kept one, is left for someone to look at.
    assert store.list_steps() == [20, 25, 30]
    assert [v.step for v in store.inspect() if v.ok] == [30, 20]


# ---- 33: status reports the newest VERIFIED checkpoint and why the others are not -------------
@pytest.mark.slow
def test_status_reports_the_newest_verified_checkpoint_and_why_others_are_not(backend, tmp_path, monkeypatch):
    store, server = backend
    for s in (10, 20):
        store.publish(make_ckpt(tmp_path / "local", s), s, keep=5)
    add_junk(store, server, tmp_path, 22, "no-manifest")
    add_junk(store, server, tmp_path, 21, "corrupt")
    spec = f"hf://{REPO}" if server else str(store.root)
    if server:
        monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    s = status.gather(config.load(None, [f"store={spec}", f"output_dir={tmp_path / 'out'}", "max_steps=40"]))
    assert s["latest_step"] == 20 and s["checkpoints"] == [10, 20, 21, 22]
    by_step = {c["step"]: c for c in s["verified"]}
    assert by_step[20]["state"] == by_step[10]["state"] == "verified"
    assert by_step[22]["state"] == "invalid" and MANIFEST_NAME in by_step[22]["why"]
    assert by_step[21]["state"] == "invalid" and "optimizer.pt sha256" in by_step[21]["why"]
    text = status.format_text(s)
    assert "20 (newest verified)" in text and "verified: 10; 2 that" in text
    [bad] = [ln for ln in text.splitlines() if "checkpoints/checkpoint-21: " in ln]
    assert bad.split("does not verify — ")[1].startswith("optimizer.pt sha256") and "differs" in bad
    assert "step 20 of 40 (50 %)" in text


def test_status_of_a_local_output_dir_lists_what_does_not_verify(tmp_path):
    out = tmp_path / "out"
    make_ckpt(out, 4)
    make_ckpt(out, 8, manifest=False)
    s = status.gather(config.load(None, [f"output_dir={out}", "max_steps=8"]))
    assert s["latest_step"] == 4 and [(c["step"], c["state"]) for c in s["verified"]] == [(8, "invalid"), (4, "verified")]
    [bad] = [ln for ln in status.format_text(s).splitlines() if "checkpoint-8: " in ln]
    assert "does not verify — " in bad and "no kit_manifest.json" in bad


# ---- 30: a 500 on a checkpoint download is retried, then an older checkpoint is used ----------
@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(base, "FETCH_BACKOFF_S", (0.01, 0.01, 0.01))


@pytest.mark.slow
def test_one_http_500_on_a_download_is_retried(hub, tmp_path, quick_backoff):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    src = make_ckpt(tmp_path / "l", 6)
    store.publish(make_ckpt(tmp_path / "l", 3), 3, keep=5)
    store.publish(src, 6, keep=5)
    fault = hub.inject("status", status=500, times=1, method="GET", path="checkpoint-6/adapter_model")
    assert store.fetch_latest(tmp_path / "dest") == 6
    assert fault.hits == 1 and tree_bytes(tmp_path / "dest") == tree_bytes(src)


@pytest.mark.slow
def test_a_download_that_keeps_failing_falls_back_to_the_next_older_checkpoint(hub, tmp_path, quick_backoff):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (3, 6):
        store.publish(make_ckpt(tmp_path / "l", s), s, keep=5)
    fault = hub.inject("status", status=500, times=100, method="GET", path="checkpoint-6/")
    skipped: list[str] = []
    assert store.fetch_latest(tmp_path / "dest", skipped=skipped) == 3
    assert fault.hits == 4, "the first try and one retry per pause"
    assert skipped and "checkpoint-6" in skipped[0] and "HTTP 500" in skipped[0]
    assert json.loads((tmp_path / "dest" / "trainer_state.json").read_text())["global_step"] == 3


@pytest.mark.slow
def test_a_store_that_only_fails_transiently_is_an_error_not_a_fresh_start(hub, tmp_path, quick_backoff):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (3, 6):
        store.publish(make_ckpt(tmp_path / "l", s), s, keep=5)
    hub.inject("status", status=503, times=1000, method="GET", path="/resolve/")
    with pytest.raises(TransientStoreError, match="run again when it answers"):
        store.fetch_latest(tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_resume_retries_the_download_through_choose(hub, tmp_path, quick_backoff):
    from kit.checkpoints import resume

    from kit.checkpoints import fingerprint
    from kit.checkpoints.manifest import write_manifest

    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    cfg = config.load(None, [f"output_dir={tmp_path / 'out'}", "store=hf://me/ckpts", "max_steps=12"])
    src = make_ckpt(tmp_path / "l", 6, manifest=False)
    (src / "trainer_state.json").write_text(json.dumps({"global_step": 6, "max_steps": 12}))
    write_manifest(src, 6, 1, fingerprint.of_job(cfg))
    store.publish(src, 6, keep=5)
    hub.inject("status", status=500, times=1, method="GET", path="checkpoint-6/")
    d = resume.choose(cfg, store, world_size=1)
    assert d.source == "store" and d.step == 6 and Path(d.resume_from).name == "checkpoint-6"


# ---- 19: `kit status` shares the training script's one-line store checks ---------------------
def run_cli(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_status_with_a_file_as_store_is_one_line_exit_4(tmp_path, capsys):
    f = tmp_path / "store.txt"
    f.write_text("not a folder")
    code, _, err = run_cli(["status", f"store={f}", f"output_dir={tmp_path / 'o'}"], capsys)
    assert code == 4 and err.count("\n") == 1 and err.startswith("error: ") and "is a file, not a" in err
    assert f.read_text() == "not a folder"


@pytest.mark.slow
def test_training_script_says_the_same_about_a_file_store(tmp_path):
    f = tmp_path / "store.txt"
    f.write_text("x")
    r = subprocess.run([sys.executable, str(SCRIPT), f"store={f}", f"output_dir={tmp_path / 'o'}"], cwd=ROOT,
                       env=cpu_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: store ") and "is a file, not a" in r.stderr


def test_status_of_a_hub_store_offline_is_one_line_exit_4():
    r = kit_cli(["status", "store=hf://me/x"], env=cpu_env(HF_HUB_OFFLINE="1", HF_TOKEN=WRITE_TOKEN))
    assert r.returncode == 4, r.stderr
    assert r.stderr.count("\n") == 1 and "HF_HUB_OFFLINE is set" in r.stderr and "Traceback" not in r.stderr
    assert WRITE_TOKEN not in r.stderr + r.stdout


# ---- 20: a Hub endpoint that accepts and never answers --------------------------------------
@pytest.fixture
def silent():
    """A TCP server that accepts every connection and never sends a byte (nor closes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def in_thread(fn, limit_s: float):
    """Run ``fn`` in a thread and give up waiting after ``limit_s`` (so a hang fails, not blocks)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the test, which asserts on it
            box["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still waiting after {limit_s} s"
    return box


@pytest.mark.parametrize("call", ["head", "snapshot", "commit"])
def test_every_hub_api_call_is_bounded(silent, call):
    store = HubStore("me/x", token=WRITE_TOKEN, endpoint=silent, timeout_s=1.0)
    fn = {"head": store.head, "snapshot": store._snapshot,
          "commit": lambda: store.write_text("kit/x.json", "{}", parent="0" * 40)}[call]
    t0 = time.monotonic()
    box = in_thread(fn, 30)
    assert isinstance(box.get("error"), TransientStoreError), box
    assert time.monotonic() - t0 < 20
    assert silent in str(box["error"]) and "did not answer" in str(box["error"]) and "within 1 s" in str(box["error"])


@pytest.mark.slow
def test_status_against_a_silent_endpoint_exits_4_naming_it(silent):
    env = cpu_env(HF_ENDPOINT=silent, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", KIT_NETWORK_TIMEOUT_S="2")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kit", "status", "store=hf://me/x"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and silent in lines[0], lines
    assert took < 30, f"took {took:.0f} s"
    assert WRITE_TOKEN not in r.stderr + r.stdout


@pytest.mark.slow
def test_training_script_against_a_silent_endpoint_exits_4_naming_it(silent, tmp_path):
    env = cpu_env(HF_ENDPOINT=silent, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", KIT_NETWORK_TIMEOUT_S="2")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(SCRIPT), "store=hf://me/x", f"output_dir={tmp_path / 'o'}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=150)
    took = time.monotonic() - t0
    assert r.returncode == 4, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and silent in r.stderr
    assert "Traceback" not in r.stderr and took < 90, took
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("value", ["soon", "1e300", "0", "inf"])  # 1e300 overflowed the socket timeout: "a bug in kit"
def test_a_bad_timeout_setting_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", value)
    from kit.errors import UsageError

    with pytest.raises(UsageError, match=f"KIT_NETWORK_TIMEOUT_S='{value}' must be a number of seconds above 0"):
        HubStore("me/x", token=WRITE_TOKEN, endpoint="http://127.0.0.1:9")

