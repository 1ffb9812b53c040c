"""kit_manifest.json: built from real files, written atomically, and every way it can fail to verify."""

import json
import os

import pytest

from kit.checkpoints.manifest import MANIFEST_NAME, build_manifest, read_manifest, verify, write_manifest


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
    assert verify(ckpt) == (False, "optimizer.pt sha256 differs from the manifest")
    opt.write_bytes(good[:-1])
    assert verify(ckpt) == (False, "optimizer.pt has 8999 bytes, manifest says 9000")
    opt.unlink()
    assert verify(ckpt) == (False, "optimizer.pt is missing")


def test_missing_or_broken_manifest(ckpt):
    assert verify(ckpt) == (False, f"no {MANIFEST_NAME}")
    assert read_manifest(ckpt) is None
    (ckpt / MANIFEST_NAME).write_text("{not json")
    assert verify(ckpt)[0] is False and "not valid JSON" in verify(ckpt)[1]
    (ckpt / MANIFEST_NAME).write_text(json.dumps({"files": {}}))  # no step
    assert read_manifest(ckpt) is None
