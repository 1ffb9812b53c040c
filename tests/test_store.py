"""The checkpoint store suite, run over both backends: a directory in tmp_path, and a Hub repo on
tests/hubserver.py reached by the real huggingface_hub client over real HTTP."""

import json
import logging
import os
import time
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from kit.errors import StoreError, UsageError
from kit.checkpoints.manifest import MANIFEST_NAME, write_manifest
from kit.checkpoints.store import DirStore, TransientStoreError, open_store
from kit.checkpoints.store.hub import NO_TOKEN, HubStore
from tests.hubserver import READ_TOKEN, WRITE_TOKEN, hub  # noqa: F401  (fixture)

REPO = "me/ckpts"


def make_ckpt(root: Path, step: int, size: int = 4096, manifest: bool = True, vanilla_name: str | None = None) -> Path:
    """A small HF Trainer-shaped checkpoint with random weights, plus its kit manifest."""
    d = Path(root) / (vanilla_name or f"checkpoint-{step}")
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(size))
    (d / "optimizer.pt").write_bytes(os.urandom(size * 2))
    (d / "scheduler.pt").write_bytes(b"sched")
    (d / "rng_state_0.pth").write_bytes(os.urandom(64))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if manifest:
        write_manifest(d, step, world_size=1, fingerprint={"model": "tiny"})
    return d


def tree_bytes(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}


@pytest.fixture(params=["dir", "hub", "hub-lfs"])
def backend(request, tmp_path, monkeypatch):
    """(store, kind, server-or-None). "hub-lfs": files over 1 kB go through the LFS batch + PUT
    path (Xet disabled, as it cannot be served here); "hub": everything as regular base64 files."""
    if request.param == "dir":
        return DirStore(tmp_path / "store"), "dir", None
    server = request.getfixturevalue("hub")
    if request.param == "hub-lfs":
        server.lfs_threshold = 1024
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    return HubStore(REPO, token=WRITE_TOKEN, endpoint=server.url), "hub", server


@pytest.mark.slow
def test_publish_list_latest_fetch_round_trip(backend, tmp_path):
    store, _, _ = backend
    src = {s: make_ckpt(tmp_path / "local", s) for s in (1, 2, 3)}
    assert store.list_steps() == [] and store.latest_valid() is None
    for s in (1, 2, 3):
        store.publish(src[s], s, keep=2)
    assert store.list_steps() == [2, 3]
    assert store.latest_valid() == 3
    dest = tmp_path / "restore" / "checkpoint-3"
    assert store.fetch(3, dest) == dest
    assert tree_bytes(dest) == tree_bytes(src[3])
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")], "temp fetch folder left behind"


def test_fetch_replaces_an_existing_dest(backend, tmp_path):
    store, _, _ = backend
    store.publish(make_ckpt(tmp_path / "l", 5), 5, keep=3)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "stale.txt").write_text("old")
    store.fetch(5, dest)
    assert not (dest / "stale.txt").exists() and (dest / MANIFEST_NAME).exists()


def test_fetch_of_absent_step_raises(backend, tmp_path):
    store, _, _ = backend
    with pytest.raises(StoreError, match="no checkpoint for step 9"):
        store.fetch(9, tmp_path / "x")


def test_keep_deletes_in_the_same_commit(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (10, 20, 30):
        store.publish(make_ckpt(tmp_path, s), s, keep=2)
    log = hub.commit_log(REPO)
    ckpt_commits = [c for c in log if c.title.startswith("kit: checkpoint")]
    assert len(ckpt_commits) == 3, "one commit per publish"
    last = ckpt_commits[-1]
    assert last.deleted == ["checkpoints/checkpoint-10/"]
    assert any(p.startswith("checkpoints/checkpoint-30/") for p in last.added)
    assert f"checkpoints/checkpoint-30/{MANIFEST_NAME}" in last.added
    assert hub.repos[REPO].private, "the repo kit creates is private"


def test_corrupt_dir_checkpoint_is_skipped_and_fetch_refuses(tmp_path, caplog):
    store = DirStore(tmp_path / "store")
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path / "l", s), s, keep=5)
    f = tmp_path / "store/checkpoints/checkpoint-2/optimizer.pt"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() == 1
    assert "step 2" in caplog.text and "optimizer.pt sha256" in caplog.text
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("untouched")
    with pytest.raises(StoreError, match="corrupt: optimizer.pt"):
        store.fetch(2, dest)
    assert tree_bytes(dest) == {"keep.txt": b"untouched"}
    assert store.fetch_latest(tmp_path / "dest2") == 1


@pytest.mark.parametrize("damage", [
    lambda m: {**m, "step": "abc"}, lambda m: {**m, "step": True}, lambda m: {**m, "step": -2},
    lambda m: {**m, "files": {**m["files"], "optimizer.pt": {"size": "9000", "sha256": "x"}}},
    lambda m: {**m, "files": {"optimizer.pt": None}}, lambda m: "[" * 100_000 + "]" * 100_000,
], ids=["step-text", "step-bool", "step-negative", "size-text", "file-null", "nested-100k"])
def test_a_manifest_of_the_wrong_shape_is_a_checkpoint_that_does_not_verify(tmp_path, caplog, damage):
    """A hand-edited or corrupt manifest in the newest checkpoint: the next older one is resumed from,
    it never stops the resume (a text step raised ValueError in every resume and in `kit status`)."""
    store = DirStore(tmp_path / "store")
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path / "l", s), s, keep=5)
    f = tmp_path / "store/checkpoints/checkpoint-2" / MANIFEST_NAME
    bad = damage(json.loads(f.read_text()))
    f.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() == 1
    assert "not a valid kit manifest" in caplog.text


def test_truncated_hub_file_is_skipped(hub, tmp_path, caplog):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path, s), s, keep=5)
    hub.corrupt_stored(REPO, "checkpoints/checkpoint-2/adapter_model.safetensors", mode="truncate")
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() == 1
    assert "step 2" in caplog.text and "adapter_model.safetensors" in caplog.text and "has 2048 bytes" in caplog.text


@pytest.mark.slow
def test_flipped_hub_byte_fails_fetch_and_falls_back(hub, tmp_path, caplog):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path, s), s, keep=5)
    hub.corrupt_stored(REPO, "checkpoints/checkpoint-2/optimizer.pt", mode="flip")
    dest = tmp_path / "dest"
    with pytest.raises(StoreError, match="sha256 differs"):
        store.fetch(2, dest)
    assert not dest.exists()
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.fetch_latest(dest) == 1
    # Small regular files are hashed by the check itself, so 2 is skipped before any weights move.
    assert "skipping checkpoints/" in caplog.text and "checkpoint-2 (step 2): " in caplog.text
    assert "optimizer.pt sha256" in caplog.text
    assert json.loads((dest / "trainer_state.json").read_text())["global_step"] == 1


def test_lfs_sha256_from_the_tree_catches_an_overwrite_without_downloading(hub, tmp_path, monkeypatch, caplog):
    hub.lfs_threshold = 1024
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path, s), s, keep=5)
    assert any(path.startswith("/lfs-upload/") for _, path, _ in hub.requests)
    # another writer replaces a file of checkpoint-2 with same-sized other bytes
    hub.put_files(REPO, {"checkpoints/checkpoint-2/optimizer.pt": os.urandom(8192)})
    n = len(hub.requests)
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() == 1
    assert "optimizer.pt sha256" in caplog.text and "differs" in caplog.text
    assert not [r for r in hub.requests[n:] if "optimizer.pt" in r[1]], "judged from the tree listing"


@pytest.mark.parametrize("kind", ["flip_download", "drop_download"])
@pytest.mark.slow
def test_bad_download_raises_and_leaves_dest(hub, tmp_path, kind):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.publish(make_ckpt(tmp_path, 4, size=300_000), 4, keep=5)
    hub.inject(kind, times=50, method="GET", path="optimizer.pt")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine").write_text("x")
    with pytest.raises(StoreError):
        store.fetch(4, dest)
    assert tree_bytes(dest) == {"mine": b"x"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == []


def test_one_dropped_download_is_resumed_by_the_client(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    src = make_ckpt(tmp_path, 4, size=300_000)
    store.publish(src, 4, keep=5)
    hub.inject("drop_download", times=1, method="GET", path="optimizer.pt")
    store.fetch(4, tmp_path / "dest")
    assert tree_bytes(tmp_path / "dest") == tree_bytes(src)


def test_partial_dir_checkpoints_are_ignored(tmp_path, caplog):
    store = DirStore(tmp_path / "store")
    store.publish(make_ckpt(tmp_path / "l", 3), 3, keep=5)
    tmpdir = tmp_path / "store/checkpoints/.tmp-checkpoint-9-deadbeef"
    tmpdir.mkdir()
    (tmpdir / "optimizer.pt").write_bytes(b"half")
    make_ckpt(tmp_path / "store/checkpoints", 6, manifest=False)  # copied by hand, no manifest
    assert store.list_steps() == [3, 6]
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() == 3
    assert "step 6" in caplog.text and "no kit_manifest.json" in caplog.text


def test_failed_publish_changes_nothing(backend, tmp_path):
    store, kind, server = backend
    store.publish(make_ckpt(tmp_path / "a", 1), 1, keep=1)
    before = store.list_steps()
    bad = make_ckpt(tmp_path / "b", 2)
    (bad / "optimizer.pt").write_bytes(os.urandom(8192))  # same size, other bytes than the manifest says
    with pytest.raises(StoreError, match="changed since its manifest"):
        store.publish(bad, 2, keep=1)
    assert store.list_steps() == before and store.latest_valid() == 1


def test_publish_needs_a_matching_manifest(backend, tmp_path):
    store, _, _ = backend
    with pytest.raises(StoreError, match="call kit.checkpoints.manifest.write_manifest"):
        store.publish(make_ckpt(tmp_path, 1, manifest=False), 1, keep=1)
    with pytest.raises(StoreError, match="says step 2, not 3"):
        store.publish(make_ckpt(tmp_path, 2), 3, keep=1)
    with pytest.raises(StoreError, match="does not exist"):
        store.publish(tmp_path / "nope", 1, keep=1)
    short = make_ckpt(tmp_path, 4)
    (short / "scheduler.pt").unlink()
    with pytest.raises(StoreError, match="scheduler.pt is missing"):
        store.publish(short, 4, keep=1)
    with pytest.raises(UsageError, match="at least 1"):
        store.publish(make_ckpt(tmp_path, 5), 5, keep=0)


def test_records_round_trip(backend):
    store, _, _ = backend
    assert store.read_text("job.json") is None
    store.write_text("kit/job.json", '{"a": 1}')
    store.write_text("sessions.jsonl", "line1\n")
    assert store.read_text("job.json") == '{"a": 1}'
    assert store.read_text("kit/sessions.jsonl") == "line1\n"
    with pytest.raises(UsageError):
        store.write_text("../escape", "x")


@pytest.mark.parametrize("layout", ["hub", "dir"])
@pytest.mark.slow
def test_vanilla_last_checkpoint_is_a_candidate(layout, tmp_path, request, caplog):
    if layout == "hub":
        server = request.getfixturevalue("hub")
        store = HubStore(REPO, token=WRITE_TOKEN, endpoint=server.url)
        van = make_ckpt(tmp_path, 7, manifest=False, vanilla_name="last-checkpoint")
        server.put_files(REPO, {f"last-checkpoint/{k}": v for k, v in tree_bytes(van).items()})
    else:
        store = DirStore(tmp_path / "store")
        make_ckpt(tmp_path / "store", 7, manifest=False, vanilla_name="last-checkpoint")
    assert store.latest_valid() == 7 and store.list_steps() == []
    dest = tmp_path / "got"
    store.fetch(7, dest)
    assert json.loads((dest / "trainer_state.json").read_text())["global_step"] == 7
    store.publish(make_ckpt(tmp_path / "k", 5), 5, keep=2)
    assert store.latest_valid() == 7, "vanilla step 7 is newer than kit's 5"
    store.publish(make_ckpt(tmp_path / "k", 8), 8, keep=2)
    assert store.latest_valid() == 8


def test_vanilla_without_optimizer_is_skipped(tmp_path, caplog):
    store = DirStore(tmp_path / "store")
    van = make_ckpt(tmp_path / "store", 7, manifest=False, vanilla_name="last-checkpoint")
    (van / "optimizer.pt").unlink()
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() is None
    assert "lacks optimizer.pt" in caplog.text
    (van / "trainer_state.json").write_text("{}")
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.latest_valid() is None
    assert "no readable global_step" in caplog.text


def test_read_only_token_gets_403_and_nothing_is_deleted(hub, tmp_path):
    HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).publish(make_ckpt(tmp_path, 1), 1, keep=1)
    before = hub.files(REPO)
    ro = HubStore(REPO, token=READ_TOKEN, endpoint=hub.url)
    assert ro.latest_valid() == 1, "a read token can still read"
    with pytest.raises(StoreError) as err:
        ro.publish(make_ckpt(tmp_path, 2), 2, keep=1)
    assert str(err.value).startswith("token has no write") and f"access to {REPO} (403)" in str(err.value)
    assert err.value.exit_code == 4
    assert hub.files(REPO) == before


def test_missing_and_invalid_tokens(hub, tmp_path):
    HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).publish(make_ckpt(tmp_path, 1), 1, keep=1)
    anon = HubStore(REPO, endpoint=hub.url)
    with pytest.raises(StoreError, match=NO_TOKEN):
        anon.publish(make_ckpt(tmp_path, 2), 2, keep=1)
    with pytest.raises(StoreError, match=NO_TOKEN):
        anon.check_writable()  # what `kit schedule` asks before it starts a run
    HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).check_writable()
    with pytest.raises(StoreError, match="no token was given \\(401\\)"):
        anon.latest_valid()  # the repo is private
    with pytest.raises(StoreError, match="token rejected .* \\(401\\)"):
        HubStore(REPO, token="hf_fakeNOTvalid", endpoint=hub.url).latest_valid()


def test_missing_repo_reads_as_empty(hub):
    store = HubStore("me/nothing-here", token=WRITE_TOKEN, endpoint=hub.url)
    assert store.list_steps() == [] and store.latest_valid() is None and store.read_text("job.json") is None


@pytest.mark.parametrize("fault", [dict(kind="status", status=500), dict(kind="status", status=429),
                                   dict(kind="drop_upload"), dict(kind="hang", seconds=3)])
@pytest.mark.slow
def test_transient_publish_failures_are_marked_retryable(hub, tmp_path, fault):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url, timeout_s=1.0)
    store.publish(make_ckpt(tmp_path, 1), 1, keep=1)
    hub.inject(method="POST", path="/commit/", **fault)
    with pytest.raises(TransientStoreError):
        store.publish(make_ckpt(tmp_path, 2, size=200_000), 2, keep=1)
    assert store.latest_valid() == 1 and store.list_steps() == [1], "a cut upload never becomes latest"


def test_open_store_specs(tmp_path, hub):
    assert open_store(None) is None and open_store("") is None and open_store("  ") is None
    assert isinstance(open_store(str(tmp_path)), DirStore)
    s = open_store("hf://me/ckpts", token=WRITE_TOKEN)
    assert isinstance(s, HubStore) and s.endpoint == hub.url, "endpoint defaults to HF_ENDPOINT"
    assert s.describe() == "hf://me/ckpts" and WRITE_TOKEN not in repr(s)
    for bad in ("hf://noslash", "hf://a/b/c", "hf://a/../b", "hf://-a/b", "hf://a b/c"):
        with pytest.raises(UsageError) as err:
            open_store(bad)
        assert err.value.exit_code == 2


def test_unwritable_store_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = DirStore(blocker / "store")
    with pytest.raises(StoreError, match="not writable") as err:
        store.publish(make_ckpt(tmp_path, 1), 1, keep=1)
    assert err.value.exit_code == 4
    with pytest.raises(StoreError, match="not writable"):
        store.write_text("job.json", "{}")
    with pytest.raises(StoreError, match="not writable"):
        store.check_writable()
    DirStore(tmp_path / "fine").check_writable()


def test_vanilla_without_trainer_state_is_ignored_with_a_warning(tmp_path, caplog):
    van = make_ckpt(tmp_path / "store", 3, manifest=False, vanilla_name="last-checkpoint")
    (van / "trainer_state.json").unlink()
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert DirStore(tmp_path / "store").latest_valid() is None
    assert "no trainer_state.json" in caplog.text


def test_leftover_temp_folders_are_cleaned_after_an_hour(tmp_path):
    store = DirStore(tmp_path / "store")
    store.publish(make_ckpt(tmp_path / "l", 1), 1, keep=3)
    ckpts = tmp_path / "store/checkpoints"
    old, fresh = ckpts / ".tmp-checkpoint-7-aaaa", ckpts / ".trash-checkpoint-0-bbbb"
    for d in (old, fresh):
        d.mkdir()
        (d / "optimizer.pt").write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    store.publish(make_ckpt(tmp_path / "l", 2), 2, keep=3)
    assert not old.exists() and fresh.exists(), "a fresh one may belong to a publish in progress"


def test_full_disk_during_publish_is_a_store_error(tmp_path, monkeypatch):
    """A full disk cannot be produced here, so the copy is made to fail with ENOSPC."""
    import errno

    import kit.checkpoints.store.directory as directory

    store = DirStore(tmp_path / "store")
    store.publish(make_ckpt(tmp_path / "l", 1), 1, keep=1)

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(directory, "_copy_fsync", no_space)
    with pytest.raises(StoreError, match="No space left"):
        store.publish(make_ckpt(tmp_path / "l", 2), 2, keep=1)
    assert store.list_steps() == [1] and store.latest_valid() == 1
    assert [p.name for p in (tmp_path / "store/checkpoints").iterdir()] == ["checkpoint-1"]


def test_record_write_failure_is_a_store_error(tmp_path):
    store = DirStore(tmp_path / "store")
    (tmp_path / "store/kit/job.json").mkdir(parents=True)  # a folder where the record should go
    with pytest.raises(StoreError, match="writing kit/job.json"):
        store.write_text("job.json", "{}")
    assert [p.name for p in (tmp_path / "store/kit").iterdir()] == ["job.json"], "no temp file left"


def test_file_vanishing_during_a_fetch(backend, tmp_path):
    store, kind, _ = backend
    store.publish(make_ckpt(tmp_path / "l", 1), 1, keep=1)
    snap = store._snapshot()
    with pytest.raises(StoreError, match="vanished|not found \\(404\\)"):
        store._download(["checkpoints/checkpoint-1/not-there.bin"], snap, tmp_path / "dl")


@pytest.mark.slow
def test_concurrent_writer_412_is_retried_then_given_up(hub, tmp_path, caplog):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.publish(make_ckpt(tmp_path, 1), 1, keep=2)
    hub.inject("status", status=412, times=1, method="POST", path="/commit/")
    with caplog.at_level(logging.INFO, "kit.checkpoints.store"):
        store.publish(make_ckpt(tmp_path, 2), 2, keep=2)
    assert "moved while publishing" in caplog.text and "step 2" in caplog.text and store.latest_valid() == 2
    hub.inject("status", status=412, times=10, method="POST", path="/commit/")
    with pytest.raises(TransientStoreError, match="kept changing"):
        store.publish(make_ckpt(tmp_path, 3), 3, keep=2)
    assert store.list_steps() == [1, 2]


def test_other_http_errors_are_one_line_store_errors(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.ensure_repo()
    hub.inject("status", status=400, method="POST", path="/commit/")
    with pytest.raises(StoreError, match="publishing step 1 on hf://me/ckpts failed: HTTP 400") as err:
        store.publish(make_ckpt(tmp_path, 1), 1, keep=1)
    assert not isinstance(err.value, TransientStoreError)


def test_a_client_factory_set_by_the_user_is_left_alone(hub):
    import httpx2
    from huggingface_hub.utils import _http as hf_http

    def mine():
        return httpx2.Client(timeout=7)

    hf_http.set_client_factory(mine)
    try:
        HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url, timeout_s=1)
        assert hf_http._GLOBAL_CLIENT_FACTORY is mine
    finally:
        hf_http.set_client_factory(hf_http.default_client_factory)


# ---- a final/ of an earlier target is kept (issue 33, item 16) ------------------------------------
def _final(root: Path, step: int, extra: str | None = None) -> Path:
    d = root / f"final-src-{step}-{extra or ''}"
    d.mkdir(parents=True)
    (d / "eval_results.json").write_text(json.dumps({"step": step}))
    (d / "adapter_model.safetensors").write_bytes(os.urandom(2048) + bytes([step]))
    (d / "README.md").write_text(f"card of step {step}\n")
    if extra:
        (d / extra).write_text("only in this one")
    return d


def _store_final(store, kind, server, tmp_path, name="final") -> dict:
    if kind == "dir":
        return tree_bytes(store.root / name) if (store.root / name).exists() else {}
    return {p[len(name) + 1:]: b for p, b in server.files(REPO).items() if p.startswith(f"{name}/")}


def test_a_final_of_another_step_is_kept_as_final_step_n_not_replaced(backend, tmp_path):
    """A re-targeted job (max_steps=3 after a step-4 final/) replaced the step-4 final/ in place."""
    store, kind, server = backend
    four, three = _final(tmp_path, 4, extra="notes.txt"), _final(tmp_path, 3)
    assert store.publish_final(four)[1] is None
    where, kept = store.publish_final(three)
    assert kept == "final-step-4" and where.endswith("final")
    assert store.final_step() == 3
    assert _store_final(store, kind, server, tmp_path) == tree_bytes(three), "final/ is exactly the new one"
    assert _store_final(store, kind, server, tmp_path, "final-step-4") == tree_bytes(four)
    again = _final(tmp_path, 3, extra="x")  # the same step again (a re-run wrap-up): replaced, nothing kept
    assert store.publish_final(again)[1] is None
    assert _store_final(store, kind, server, tmp_path) == tree_bytes(again)
    assert store.publish_final(_final(tmp_path, 4, extra="y"))[1] == "final-step-3"
    assert store.publish_final(_final(tmp_path, 3, extra="z"))[1] == "final-step-4-2", "an earlier kept one stays"
    assert _store_final(store, kind, server, tmp_path, "final-step-4") == tree_bytes(four)
