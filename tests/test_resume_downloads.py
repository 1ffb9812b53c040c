"""A resume from the Hub downloads each file of the checkpoint once (#16: a Kaggle session's setup).

The check before the fetch reads the manifest and hashes the small regular files; the fetch, at
the same commit, reuses those bytes instead of downloading them again, and still verifies every
file against the manifest. Real huggingface_hub client, real HTTP, tests/hubserver.py.
"""

import collections
import json
import logging

from kit.checkpoints.store.hub import HubStore
from tests.hubserver import WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.test_store import REPO, make_ckpt, tree_bytes


def _file_gets(hub, since: int) -> collections.Counter:
    return collections.Counter(path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path, _ in hub.requests[since:]
                               if method == "GET" and "/resolve/" in path)


def test_fetch_latest_downloads_each_checkpoint_file_once(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    src = make_ckpt(tmp_path / "l", 4)
    store.publish(src, 4, keep=3)
    n = len(hub.requests)
    assert store.fetch_latest(tmp_path / "dest") == 4
    gets = _file_gets(hub, n)
    assert set(gets) == {f"checkpoints/checkpoint-4/{p.name}" for p in src.iterdir()}
    assert max(gets.values()) == 1, f"downloaded more than once: {[p for p, c in gets.items() if c > 1]}"
    assert tree_bytes(tmp_path / "dest") == tree_bytes(src)
    assert store._reuse._state is None, "the kept copies are dropped with their folder"


def test_a_corrupt_small_file_is_still_caught_before_the_fetch(hub, tmp_path, caplog):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    for s in (1, 2):
        store.publish(make_ckpt(tmp_path / "l", s), s, keep=5)
    hub.corrupt_stored(REPO, "checkpoints/checkpoint-2/optimizer.pt", mode="flip")
    with caplog.at_level(logging.WARNING, "kit.checkpoints.store"):
        assert store.fetch_latest(tmp_path / "dest") == 1
    assert "skipping checkpoints/" in caplog.text and "checkpoint-2 (step 2): " in caplog.text
    assert "optimizer.pt sha256" in caplog.text
    assert json.loads((tmp_path / "dest" / "trainer_state.json").read_text())["global_step"] == 1


def test_kept_copies_are_never_served_for_another_commit(hub, tmp_path):
    store = HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url)
    store.publish(make_ckpt(tmp_path / "a", 4), 4, keep=3)
    assert store.fetch_latest(tmp_path / "d1") == 4
    newer = make_ckpt(tmp_path / "b", 4)  # the same step written again: other bytes, a new commit
    store.publish(newer, 4, keep=3)
    assert store.fetch_latest(tmp_path / "d2") == 4
    assert tree_bytes(tmp_path / "d2") == tree_bytes(newer)
