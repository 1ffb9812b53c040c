"""Local checkpoint rotation (kit.checkpoints.rotation): only `checkpoint-<step>` folders count and
go, oldest step first; a user's `checkpoint-best` folder and junk names are never touched, and a real
training run keeps exactly keep_checkpoints of its own."""

from __future__ import annotations

import os
import time

import pytest

from kit.checkpoints import rotation
from tests.scripts import FAST, train_here


def _folder(root, name, age_s=0.0):
    path = root / name
    path.mkdir(parents=True)
    (path / "f.bin").write_bytes(b"x")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_only_checkpoint_step_folders_are_rotated_oldest_step_first(tmp_path):
    best = _folder(tmp_path, "checkpoint-best", age_s=10**7)  # old: Trainer's mtime sort removed it first
    junk = _folder(tmp_path, "checkpoint-abc")                 # new: Trainer's sort kept it over a real one
    steps = [_folder(tmp_path, f"checkpoint-{s}") for s in (2, 10, 4, 8)]
    (tmp_path / "checkpoint-6").write_text("a file, not a checkpoint")
    removed = rotation.rotate(tmp_path, 2, steps[1])
    assert sorted(p.name for p in removed) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-6", "checkpoint-8",
                                                          "checkpoint-abc", "checkpoint-best"]
    assert (best / "f.bin").exists() and (junk / "f.bin").exists()


def test_the_checkpoint_just_written_stays_even_when_older_by_step(tmp_path):
    current = _folder(tmp_path, "checkpoint-3")  # resumed from 2 beside a stale 9: 3 was just written
    _folder(tmp_path, "checkpoint-9")
    assert rotation.rotate(tmp_path, 1, current) == []


@pytest.mark.slow
def test_a_training_run_keeps_its_newest_checkpoints_and_the_users_folder(tmp_path):
    out = tmp_path / "out"
    mine = _folder(out, "checkpoint-best", age_s=10**7)
    (mine / "NOTES.txt").write_text("my notes")
    (out / "README.md").write_text("# my notes on this run\n")  # TRL's card overwrote it at each save
    r = train_here([f"output_dir={out}", "max_steps=8", "save_steps=2", "keep_checkpoints=2", *FAST])
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8", "checkpoint-best"]
    assert (mine / "NOTES.txt").read_text() == "my notes"
    assert (out / "README.md").read_text() == "# my notes on this run\n"
    assert (out / "final" / "README.md").is_file()  # kit's card
