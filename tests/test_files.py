"""kit.files: the one atomic writer every kit file write goes through."""

import os
import stat

import pytest

from kit.errors import UsageError
from kit.files import atomic_path, read_text, write_atomic


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    write_atomic(target, "new", fsync=True)
    assert target.read_text() == "new"
    write_atomic(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path):
    target = tmp_path / "plot.png"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["plot.png"]


def test_mode_and_mkdir(tmp_path):
    target = tmp_path / "new" / "train_ddp.py"
    write_atomic(target, "print(1)\n", mode=0o644, mkdir=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_read_text_errors_are_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="not UTF-8 text"):
        read_text(bad, "config")
    with pytest.raises(UsageError, match="cannot read config"):
        read_text(tmp_path / "missing.yaml", "config")


def test_only_regular_files_are_read_and_each_other_kind_is_named(tmp_path):
    from kit.files import check_output, regular_file, same_content

    fifo = tmp_path / "train_ddp.py"
    os.mkfifo(fifo)  # reading it would block for ever
    for call in (lambda: read_text(fifo, "config"), lambda: same_content(fifo, "x", "-o"),
                 lambda: check_output(fifo, "-o", "t.py")):
        with pytest.raises(UsageError, match="not a regular file"):
            call()
    with pytest.raises(UsageError, match="cannot read config .*: is a directory"):
        read_text(tmp_path, "config")
    with pytest.raises(UsageError, match="no such file"):
        read_text(tmp_path / "none.yaml", "config")
    assert regular_file(tmp_path / "none.yaml", "config") is None
    assert same_content(tmp_path / "none.py", "x", "-o") is None
    (tmp_path / "b.py").write_bytes(b"\xff\xfe")
    assert same_content(tmp_path / "b.py", "x", "-o") is False  # not UTF-8: simply different


def test_inputs_are_capped_except_training_data(tmp_path):
    big = tmp_path / "big.jsonl"
    big.write_bytes(b'{"text": "a"}\n' * 5_000_000)  # 70 MB: over the 64 MiB a config or facts file may be
    with pytest.raises(UsageError, match="is over 64 MiB"):
        read_text(big, "config")
    assert read_text(big, "data file", max_bytes=None).count("\n") == 5_000_000
