"""kit.train.deadline: when a session ends, from the platform's limit or a budget."""

from __future__ import annotations

import os

import pytest

from kit.train import deadline


def fake_proc(tmp_path, btime: int, starttime_ticks: int, comm: str = "tini (init) x") -> str:
    (tmp_path / "1").mkdir()
    (tmp_path / "stat").write_text(f"cpu  1 2 3\nbtime {btime}\nprocesses 9\n")
    fields = ["S"] + ["0"] * 18 + [str(starttime_ticks)] + ["0"] * 10
    (tmp_path / "1" / "stat").write_text(f"1 ({comm}) " + " ".join(fields) + "\n")
    return str(tmp_path)


def test_container_start_reads_pid_1_even_with_spaces_in_its_name(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    proc = fake_proc(tmp_path, btime=1_000_000, starttime_ticks=30 * hz)
    assert deadline.container_start(proc) == pytest.approx(1_000_030)


def test_container_start_unreadable_is_none(tmp_path):
    assert deadline.container_start(str(tmp_path / "missing")) is None
    (tmp_path / "stat").write_text("no btime here\n")
    assert deadline.container_start(str(tmp_path)) is None


def test_this_machine_has_a_container_start():
    # Linux always has /proc/stat and /proc/1/stat (CI and every notebook platform are Linux).
    start = deadline.container_start()
    assert start is not None, "could not read the container start from /proc"
    import time
    assert 1e9 < start <= time.time()


def test_kaggle_counts_12_hours_from_the_session_start(monkeypatch):
    monkeypatch.setattr(deadline, "container_start", lambda: 1000.0)
    d = deadline.session_deadline(None, platform="kaggle", now=5000.0)
    assert d.at == 1000.0 + 12 * 3600 and "12 h session limit" in d.source and "session start" in d.source
    assert d.safety_s == 60.0


def test_a_budget_on_a_local_machine_counts_from_this_run(monkeypatch):
    monkeypatch.setattr(deadline, "container_start", lambda: 1000.0)
    d = deadline.session_deadline(30, platform="local", now=5000.0)
    assert d.at == 5000.0 + 1800 and "from this run's start" in d.source


def test_no_limit_locally():
    d = deadline.session_deadline(None, platform="local", now=0.0)
    assert d.at is None and not d.near(10**9, now=10**12)


def test_near_leaves_room_for_a_step_a_save_and_a_margin():
    d = deadline.Deadline(at=1000.0, source="test", safety_s=60.0)
    assert not d.near(needed_s=30, now=1000 - 91)
    assert d.near(needed_s=30, now=1000 - 90)


def test_short_budgets_get_a_short_margin():
    d = deadline.session_deadline(0.5, platform="local", now=0.0)
    assert d.safety_s == pytest.approx(3.0)
