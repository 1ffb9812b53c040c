"""The goodput ledger: pure sums over session records, then a real kill -9 whose cut session is
recorded by the session that takes its lease over (real train_ddp.py, a Hub store on
tests/hubserver.py), and `kit status` showing it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from kit.checkpoints import goodput, status
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, kill_job

T0 = 1_800_000_000.0


def rec(started, span, start_step, end_step, *, setup=10.0, outcome="paused", world=2, stored=None):
    return {"started": T0 + started, "ended": T0 + started + span, "start_step": start_step, "end_step": end_step,
            "setup_s": setup, "outcome": outcome, "world_size": world, "gpu_count": world,
            "stored_step": end_step if stored is None else stored, "max_steps": 300}


def test_sums_agree_with_the_sessions_and_a_cut_costs_the_steps_the_next_session_redid():
    sessions = [rec(0, 110, 0, 100, outcome="cut", stored=80),  # cut at 100; only 80 reached the store
                rec(200, 230, 80, 300, outcome="complete")]
    led = goodput.ledger(sessions, max_steps=300, latest_step=300)
    first, second = led["sessions"]
    assert (first["steps_done"], first["steps_lost"], second["steps_lost"]) == (100, 20, 0)
    assert (first["start_step"], first["end_step"], second["start_step"]) == (0, 100, 80)
    assert first["step_s"] == pytest.approx(1.0) and first["time_lost_s"] == pytest.approx(20.0)
    assert led["steps_recomputed"] == 20
    # GPU time: (110 + 230) s × 2 GPUs; useful: (100 - 20) + 220 s of training, × 2.
    assert led["gpu_hours"] == pytest.approx(340 * 2 / 3600)
    assert led["useful_gpu_hours"] == pytest.approx(300 * 2 / 3600)
    assert led["goodput"] == pytest.approx(300 / 340)
    assert led["setup_s"] == 20 and led["hours_left"] == 0 and led["sessions_needed"] == 0
    assert first["goodput"] == pytest.approx(80 / 110)


def test_hours_left_and_sessions_needed_at_the_latest_speed():
    led = goodput.ledger([rec(0, 3610, 0, 1200, setup=10)], max_steps=30000, latest_step=1200, session_hours=12)
    assert led["sessions"][0]["step_s"] == pytest.approx(3.0)
    assert led["hours_left"] == pytest.approx(28800 * 3.0 / 3600)  # 24 h
    assert led["sessions_needed"] == 3  # 12 h sessions, less their setup
    words = goodput.words(led)
    assert words.startswith("99.7 % goodput: ") and "2.00 of 2.01 GPU h" in words
    assert "(3 more sessions of" in words and "12 h)" in words


def test_a_cpu_run_counts_process_hours_and_one_process_is_singular():
    cpu = {**rec(0, 3600, 0, 100, world=1), "gpu_count": 0, "gpu_name": "cpu"}
    words = goodput.words(goodput.ledger([cpu], max_steps=100, latest_step=100))
    assert "of 1.00 process h" in words and "GPU h" not in words and "0 steps recomputed" in words
    assert "GPU h" in goodput.words(goodput.ledger([rec(0, 3600, 0, 100)], max_steps=100, latest_step=100))
    line = status.session_line(1, cpu)
    assert "1 process," in line and "1 processes" not in line
    assert "2 processes" in status.session_line(1, rec(0, 60, 0, 10))


def test_already_complete_runs_and_missing_facts_do_not_count_or_crash():
    sessions = [rec(0, 100, 0, 90, setup=None), {"outcome": "already complete", "started": T0 + 500,
                                                  "ended": T0 + 501, "start_step": 90, "end_step": 90},
                {"started": T0 + 900, "start_step": 90}]  # a torn record: no end
    led = goodput.ledger(sessions, max_steps=None, latest_step=90)
    assert len(led["sessions"]) == 2 and led["sessions"][0]["setup_s"] is None
    assert led["goodput"] == pytest.approx(1.0) and led["hours_left"] is None
    assert goodput.ledger([], max_steps=10, latest_step=None)["goodput"] is None
    assert goodput.words(goodput.ledger([], max_steps=10, latest_step=None)) is None


def test_fields_of_the_wrong_type_count_as_missing_not_as_a_crash():
    """kit status skips such records (kit.checkpoints.session_records); the ledger stays total for other callers."""
    bad = {**rec(0, 100, 0, 90), "gpu_count": "x", "world_size": None, "setup_s": float("nan"),
           "stored_step": "80", "step_s": 10**400}
    row = goodput.ledger([bad, {**rec(200, 100, 90, 100), "start_step": "90"}], max_steps=100,
                         latest_step=100)["sessions"][0]
    assert row["weight"] == 1 and row["setup_s"] is None and row["steps_lost"] == 0 and row["steps_done"] == 90


JOB = ["max_steps=150", "save_steps=10", "keep_checkpoints=2", "lease_heartbeat_seconds=0.3", *FAST]


@pytest.mark.slow
def test_a_kill_9_is_recorded_by_the_next_session_with_the_steps_it_lost(tmp_path):
    """kill -9 mid-run; the next session (a new machine: no local files) takes the lease over at once
    (that process is gone from this host), records the cut session from its last heartbeat, and the
    ledger counts the steps it redid."""
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
        env = cpu_env(HF_ENDPOINT=hub.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        store = "hf://me/goodput"
        first = tmp_path / "first"
        log = tmp_path / "first.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, str(SCRIPT), f"output_dir={first}", f"store={store}", *JOB],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.time() + 240
            while log.read_text().count(" published: ") < 3:
                assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            time.sleep(0.4)
            kill_job(proc, str(first))
            proc.wait()
        reached = max(int(m) for m in re.findall(r"(\d+)/150 \[", log.read_text()))
        second = subprocess.run([sys.executable, str(SCRIPT), f"output_dir={tmp_path / 'second'}", f"store={store}",
                                 *JOB], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
        shown = subprocess.run([sys.executable, "-m", "kit", "status", "--config", "configs/default.yaml",
                                f"store={store}", *JOB, "--json"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        facts = json.loads(shown.stdout)
    cut, done = facts["sessions"]
    assert cut["outcome"] == "cut" and cut["from"] == "its last lease heartbeat"
    assert done["outcome"] == "complete"
    # The record may miss a checkpoint published in the instant before the kill (not yet heartbeated).
    assert cut["stored_step"] <= done["start_step"] <= max(cut["end_step"], cut["stored_step"] + 10)
    # The cut record is as of the last heartbeat: at most one heartbeat (0.3 s) behind the kill.
    assert cut["end_step"] - 2 <= reached <= cut["end_step"] + 40, (cut, reached)  # tqdm's line lags a step
    assert cut["setup_s"] > 0 and cut["started"] < cut["ended"]
    led = facts["goodput"]
    assert led["sessions"][0]["steps_lost"] == max(0, cut["end_step"] - done["start_step"])
    assert led["steps_recomputed"] == led["sessions"][0]["steps_lost"]
    assert led["gpu_hours"] == pytest.approx(sum(s["ended"] - s["started"] for s in facts["sessions"]) / 3600)
    text = status.format_text(facts)
    lost = led["sessions"][0]["steps_lost"]
    assert "% goodput: " in text and ((f"{lost} steps lost" in text) == (lost > 0))
