"""`kit status` and `kit.report.plots` on hand-made job records (fast; the end-to-end run against a Hub
store is in test_schedule.py): sessions, lease states, text layout, PNGs, every error branch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from kit.planning import config
from kit.report import plots
from kit.checkpoints import status
from kit.errors import UsageError
from tests.scripts import ROOT, cpu_env

PNG = b"\x89PNG\r\n\x1a\n"
T0 = 1_796_000_000.0


def sessions(*spans) -> list[dict]:
    """(start_step, end_step, outcome) → records one hour apart, 20 minutes each."""
    return [{"host": "kaggle-abc", "started": T0 + 3600 * i, "ended": T0 + 3600 * i + 1200, "start_step": a,
             "end_step": b, "max_steps": 200, "world_size": 2, "outcome": o} for i, (a, b, o) in enumerate(spans)]


def kit(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, env=env or cpu_env(),
                          capture_output=True, text=True, timeout=120)


def test_nothing_yet(tmp_path):
    s = status.gather(config.load(None, [f"output_dir={tmp_path / 'none'}", "max_steps=50"]))
    assert (s["latest_step"], s["max_steps"], s["complete"], s["checkpoints"], s["sessions"], s["lease"]) == \
        (None, 50, False, [], [], None)
    text = status.format_text(s)
    assert "not started (0 of 50 steps)" in text and "none recorded" in text


def test_local_sessions_with_a_torn_last_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    recs = sessions((0, 40, "paused"), (40, 90, "paused"))
    recs[1].update(tokens_per_s=7086.8, peak_allocated_bytes=10.11 * 2**30)  # what the script measured
    torn = '{"host": "x", "sta'
    (out / "kit_sessions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(recs)) + torn)
    s = status.gather(config.load(None, [f"output_dir={out}", "max_steps=200"]))
    assert [r["end_step"] for r in s["sessions"]] == [40, 90]  # oldest first, torn line skipped
    text = status.format_text(s).splitlines()
    assert text[3] == "sessions     2"
    assert text[4].startswith("             #1  2026-") and "0 → 40 of 200  paused  (20 min, 2 processes)" in text[4]
    assert text[5].endswith("40 → 90 of 200  paused  (20 min, 2 processes, ~7,087 tokens/s, peak 10.1 GiB)")
    assert all(len(line.split()[0]) <= 12 for line in text if line[:1] != " ")


def test_directory_store_lease_held_then_free(tmp_path):
    store = tmp_path / "store"
    (store / "kit").mkdir(parents=True)
    (store / "kit" / "sessions.jsonl").write_text(json.dumps(sessions((0, 40, "paused"))[0]) + "\n")
    now = time.time()
    (store / "kit" / "lease.lock").write_text(json.dumps({"holder": f"{socket.gethostname()} pid 1", "id": "x",
                                                          "since": now - 600, "heartbeat": now - 30}))
    cfg = config.load(None, [f"store={store}", f"output_dir={tmp_path / 'out'}", "max_steps=200"])
    s = status.gather(cfg, now=now)
    assert s["store"] == f"directory {store}" and s["latest_step"] is None and len(s["sessions"]) == 1
    assert s["lease"]["released"] is False and s["lease"]["heartbeat_age_s"] == 30.0
    assert "HELD: " in status.format_text(s) and "last heartbeat 30 s ago" in status.format_text(s)
    (store / "kit" / "lease.lock").unlink()
    s = status.gather(cfg)
    assert s["lease"]["released"] is True and s["lease"]["holder"] is None
    assert "lease        free" in status.format_text(s)


def test_cli_json_and_plot(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in sessions((0, 40, "paused"), (40, 40, "killed"), (40, 130, "paused"),
                                               (130, 200, "complete"))))
    png = tmp_path / "plots" / "progress.png"
    r = kit(["status", f"output_dir={out}", "max_steps=200", "--json", "--plot", str(png)])
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert {"latest_step", "max_steps", "complete", "checkpoints", "sessions", "lease", "store"} <= set(s)
    assert s["plot"] == str(png) and len(s["sessions"]) == 4
    data = png.read_bytes()
    assert data.startswith(PNG) and len(data) > 1024
    assert not [p for p in png.parent.iterdir() if p.name != "progress.png"]  # no temp file left


def test_loss_curve_from_a_trainer_state(tmp_path):
    ckpt = tmp_path / "checkpoint-30"
    ckpt.mkdir()
    history = [{"step": s, "loss": 6 - s / 10} for s in range(1, 31)] + [{"step": 15, "eval_loss": 5.0},
                                                                          {"step": 30, "eval_loss": 4.0}]
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 30, "log_history": history}))
    for source in (ckpt, ckpt / "trainer_state.json"):
        out = plots.loss_curve(source, tmp_path / f"loss-{source.name}.png")
        assert out.read_bytes().startswith(PNG) and out.stat().st_size > 1024


@pytest.mark.parametrize("content, words", [
    (None, "cannot read the training log"),
    ("not json", "cannot read the training log"),
    ('{"global_step": 3}', "has no log_history"),
    ('{"log_history": [{"step": 1, "learning_rate": 0.1}]}', "holds no loss yet"),
])
def test_loss_curve_errors(tmp_path, content, words):
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    if content is not None:
        (ckpt / "trainer_state.json").write_text(content)
    with pytest.raises(UsageError, match=words):
        plots.loss_curve(ckpt, tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def test_progress_plot_needs_a_session(tmp_path):
    with pytest.raises(UsageError, match="no sessions recorded yet"):
        plots.progress([], tmp_path / "p.png")
    r = kit(["status", f"output_dir={tmp_path / 'out'}", "--plot", str(tmp_path / "p.png")])
    assert r.returncode == 2 and r.stderr.startswith("error: no sessions recorded yet")


def test_invalid_hub_store_is_exit_2():
    r = kit(["status", "store=hf://not a repo"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "invalid Hugging Face repo id" in r.stderr


def test_unreachable_hub_store_is_exit_4():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = cpu_env(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN="hf_x", HF_HUB_OFFLINE="0")
    r = kit(["status", "store=hf://me/x"], env)
    assert r.returncode == 4, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "hf://me/x" in err[0]


def test_status_sees_the_store_checkpoints(tmp_path):
    """A directory store with one complete and one partial checkpoint (no manifest)."""
    from kit.checkpoints.manifest import write_manifest

    store = tmp_path / "store" / "checkpoints"
    for step in (10, 20):
        ckpt = store / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 20,
                                                             "log_history": []}))
        (ckpt / "adapter_model.safetensors").write_bytes(b"w" * 10)
        (ckpt / "optimizer.pt").write_bytes(b"o" * 10)
    write_manifest(store / "checkpoint-10", step=10, world_size=1, fingerprint={})
    cfg = config.load(None, [f"store={store.parent}", f"output_dir={tmp_path / 'out'}", "max_steps=null"])
    s = status.gather(cfg)
    assert s["checkpoints"] == [10, 20] and s["latest_step"] == 10 and s["max_steps"] == 20
    assert s["complete"] is False and s["progress"] == 0.5
