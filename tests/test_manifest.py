"""kit_manifest.json: built from real files, written atomically, and every way it can fail to verify."""

import json
import os

import pytest

from kit.checkpoints.manifest import MANIFEST_NAME, build_manifest, read_manifest, verify, write_manifest
from tests.hubserver import hub  # noqa: F401  (fixture)


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "checkpoint-12"
    (d / "sub").mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(5000))
    (d / "optimizer.pt").write_bytes(os.urandom(9000))
    (d / "sub" / "extra.bin").write_bytes(b"abc")
    return d


def test_build_lists_files_with_size_and_sha256(ckpt):
    m = build_manifest(ckpt, 12, world_size=2, fingerprint={"model": "m", "lora.r": 16}, extra={"loss": 1.5})
    assert sorted(m["files"]) == ["adapter_model.safetensors", "optimizer.pt", "sub/extra.bin"]
    assert m["files"]["sub/extra.bin"] == {
        "size": 3, "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}
    assert m["step"] == 12 and m["world_size"] == 2 and m["fingerprint"]["lora.r"] == 16
    assert m["extra"] == {"loss": 1.5} and m["created_at"].endswith("Z")
    assert set(m["versions"]) == {"kit", "torch", "transformers", "peft", "trl"}
    assert m["versions"]["torch"] is not None and m["versions"]["kit"] is not None


def test_write_is_atomic_and_excludes_itself(ckpt):
    write_manifest(ckpt, 12, 1, {})
    assert [p.name for p in ckpt.iterdir() if p.name.startswith(".")] == []
    again = write_manifest(ckpt, 12, 1, {})  # rewriting must not list the manifest
    assert MANIFEST_NAME not in again["files"]
    assert read_manifest(ckpt)["files"] == again["files"]
    assert verify(ckpt) == (True, "ok: 3 files, 14003 bytes")


def test_verify_reports_each_kind_of_damage(ckpt):
    write_manifest(ckpt, 12, 1, {})
    opt = ckpt / "optimizer.pt"
    good = opt.read_bytes()
    flipped = bytearray(good)
    flipped[7] ^= 1
    opt.write_bytes(bytes(flipped))
    ok, why = verify(ckpt)
    assert ok is False and why.startswith("optimizer.pt sha256") and " differs" in why
    opt.write_bytes(good[:-1])
    ok, why = verify(ckpt)
    assert ok is False and why.startswith("optimizer.pt has 8999") and "8999 bytes" in why and why.endswith("says 9000")
    opt.unlink()
    assert verify(ckpt) == (False, "optimizer.pt is missing")


def test_missing_or_broken_manifest(ckpt):
    assert verify(ckpt) == (False, f"no {MANIFEST_NAME}")
    assert read_manifest(ckpt) is None
    (ckpt / MANIFEST_NAME).write_text("{not json")
    assert verify(ckpt)[0] is False and "not valid JSON" in verify(ckpt)[1]
    (ckpt / MANIFEST_NAME).write_text(json.dumps({"files": {}}))  # no step
    assert read_manifest(ckpt) is None


# ---- entries that leave their checkpoint folder (issue 33, item 12) -------------------------------
def _entry_for(data: bytes) -> dict:
    import hashlib

    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _tamper(ckpt, entries: dict | None = None, raw_tail: str | None = None) -> None:
    """Rewrite the manifest of `ckpt` with `entries` added (or `raw_tail` spliced into its files object)."""
    doc = json.loads((ckpt / MANIFEST_NAME).read_text())
    doc["files"].update(entries or {})
    text = json.dumps(doc)
    if raw_tail is not None:
        text = text.replace('"files": {', '"files": {' + raw_tail + ", ", 1)
    (ckpt / MANIFEST_NAME).write_text(text)


def _outside(ckpt) -> tuple:
    secret = ckpt.parent / "secret.txt"  # a file beside the checkpoint folder, as /etc/passwd would be
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    return secret, _entry_for(secret.read_bytes())


@pytest.mark.parametrize("how, words", [
    ("dotdot", "leaves its checkpoint folder"),
    ("absolute", "is an absolute path"),
    ("symlink", "through the symlink"),
    ("symlinked_folder", "through the symlink 'sub'"),
    ("nul", "NUL or control character"),
    ("backslash", "backslash"),
    ("dot_part", "an empty or '.' part"),
    ("duplicate", "not valid JSON or lacks files/step"),
])
def test_an_entry_outside_the_checkpoint_folder_never_verifies(ckpt, how, words):
    """A manifest listing ../secret.txt (or /etc/passwd, a link out of the folder, …) with the right size
    and sha256 was counted as verified, and the checkpoint resumed from."""
    write_manifest(ckpt, 12, 1, {})
    secret, entry = _outside(ckpt)
    if how == "dotdot":
        _tamper(ckpt, {"../secret.txt": entry})
    elif how == "absolute":
        _tamper(ckpt, {str(secret): entry})
    elif how == "symlink":
        (ckpt / "linked.bin").symlink_to(secret)
        write_manifest(ckpt, 12, 1, {})  # kit's own writer lists the link as a file
    elif how == "symlinked_folder":
        import shutil

        outside = ckpt.parent / "elsewhere"
        shutil.move(str(ckpt / "sub"), outside)
        (ckpt / "sub").symlink_to(outside)
    elif how == "nul":
        _tamper(ckpt, {"optimizer.pt\x00.txt": _entry_for((ckpt / "optimizer.pt").read_bytes())})
    elif how == "backslash":
        (ckpt / "sub\\x.bin").write_bytes(b"abc")  # one file with a backslash in its name (a folder on Windows)
        _tamper(ckpt, {"sub\\x.bin": _entry_for(b"abc")})
    elif how == "dot_part":
        _tamper(ckpt, {"./optimizer.pt": _entry_for((ckpt / "optimizer.pt").read_bytes())})
    elif how == "duplicate":  # the first of two entries for one file is wrong; JSON keeps the last, which verifies
        _tamper(ckpt, raw_tail='"optimizer.pt": {"size": 1, "sha256": "' + "0" * 64 + '"}')
    ok, why = verify(ckpt)
    assert ok is False and words in why, why


def test_entry_problem_accepts_what_kit_writes(ckpt):
    from kit.checkpoints.manifest import entry_problem

    assert [entry_problem(rel) for rel in write_manifest(ckpt, 12, 1, {})["files"]] == [None] * 3
    for rel in ("a/../b", "..", "/etc/passwd", "C:/x", "a\\b", "a\x00", "a\nb", "a//b", "a/", "./a", ""):
        assert entry_problem(rel), rel


def test_directory_store_checkpoint_with_a_link_outside_is_passed_over(tmp_path):
    """A store checkpoint whose file is a symlink to the same bytes elsewhere verified, and was resumed from."""
    from kit.checkpoints.store import DirStore
    from tests.test_store import make_ckpt

    store = DirStore(tmp_path / "store")
    for step in (1, 2):
        store.publish(make_ckpt(tmp_path / "local", step), step, keep=5)
    stored = tmp_path / "store/checkpoints/checkpoint-2/optimizer.pt"
    outside = tmp_path / "outside.pt"
    outside.write_bytes(stored.read_bytes())
    stored.unlink()
    stored.symlink_to(outside)
    assert store.latest_valid() == 1
    verdict = next(v for v in store.inspect() if v.cand.step == 2)
    assert "through the symlink" in verdict.reason


@pytest.mark.parametrize("name, words", [("sub\\x.bin", "backslash"), ("a\nb.bin", "control character")])
def test_hub_store_checkpoint_with_a_bad_entry_is_passed_over(hub, tmp_path, name, words):
    """On the Hub a file may be named with a backslash (a folder once downloaded on Windows) or a newline:
    such a checkpoint verified."""
    import hashlib

    from kit.checkpoints.store.hub import HubStore
    from tests.hubserver import WRITE_TOKEN

    data = os.urandom(100)
    files = {"optimizer.pt": data, name: b"abc", "trainer_state.json": b'{"global_step": 4}'}
    doc = {"schema": 1, "step": 4, "world_size": 1, "fingerprint": {}, "files": {
        rel: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for rel, b in files.items()}}
    hub.put_files("me/ckpts", {**{f"checkpoints/checkpoint-4/{rel}": b for rel, b in files.items()},
                               f"checkpoints/checkpoint-4/{MANIFEST_NAME}": json.dumps(doc).encode()})
    store = HubStore("me/ckpts", token=WRITE_TOKEN, endpoint=hub.url)
    assert store.latest_valid() is None
    assert words in store.inspect()[0].reason
