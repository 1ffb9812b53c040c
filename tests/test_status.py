"""`kit status` and `kit.report.plots` on hand-made job records (fast; the end-to-end run against a Hub
store is in test_schedule.py): sessions, lease states, text layout, PNGs, every error branch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.planning import config
from kit.report import plots
from kit.checkpoints import status
from kit.errors import UsageError
from tests.scripts import ROOT, cpu_env, kit_cli

PNG = b"\x89PNG\r\n\x1a\n"
T0 = 1_796_000_000.0


def sessions(*spans) -> list[dict]:
    """(start_step, end_step, outcome) → records one hour apart, 20 minutes each."""
    return [{"host": "kaggle-abc", "started": T0 + 3600 * i, "ended": T0 + 3600 * i + 1200, "start_step": a,
             "end_step": b, "max_steps": 200, "world_size": 2, "outcome": o} for i, (a, b, o) in enumerate(spans)]


def kit(args, env=None) -> subprocess.CompletedProcess:
    return kit_cli(args, env=env)  # `python -m kit ARGS`, in this process


def test_nothing_yet(tmp_path):
    s = status.gather(config.load(None, [f"output_dir={tmp_path / 'none'}", "max_steps=50"]))
    assert (s["latest_step"], s["max_steps"], s["complete"], s["checkpoints"], s["sessions"], s["lease"]) == \
        (None, 50, False, [], [], None)
    text = status.format_text(s)
    assert "not started (0 of 50" in text and "none recorded" in text


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
    assert text[4].startswith(" " * 13 + "#1  2026-")
    assert text[4].split("  ")[-3:] == ["0 → 40 of 200", "paused", "(20 min, 2 processes)"]
    assert text[5].split("  ")[-3:-1] == ["40 → 90 of 200", "paused"]
    assert text[5].split("  ")[-1].strip("()").split(", ") == ["20 min", "2 processes", "~7,087 tokens/s",
                                                               "peak 10.1 GiB"]
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
    png.parent.mkdir()  # --plot creates no folder (a typo'd path is refused, not made)
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
    assert r.returncode == 2 and r.stderr.startswith("error: no sessions") and "recorded yet" in r.stderr


def test_invalid_hub_store_is_exit_2():
    r = kit(["status", "store=hf://not a repo"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "invalid Hugging Face" in r.stderr
    assert "repo id" in r.stderr


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


# -- bad input: one `error:` line, exit 2, nothing written or lost -------------------------------------
def in_process(args, capsys) -> tuple[int, str, str]:
    from kit import cli

    code = cli.main(["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], err


def _plot_target(tmp_path, kind):
    """Where --plot points, for each way it can be wrong; returns (path, words in the error)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    if kind == "directory":
        (tmp_path / "pics").mkdir()
        return tmp_path / "pics", "is a directory"
    if kind == "missing folder":
        return tmp_path / "nonexist" / "p.png", "does not exist"
    if kind == "folder is a file":
        return notes / "p.png", "is not a directory"
    if kind == "not a .png name":
        return notes, "ending in .png"
    if kind == "a .png that is not a PNG":
        fake = tmp_path / "mine.png"
        fake.write_text("not an image")
        return fake, "not a PNG"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["directory", "missing folder", "folder is a file", "not a .png name",
                                  "a .png that is not a PNG"])
def test_plot_target_refused_before_anything_is_written(tmp_path, kind, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_text(json.dumps(sessions((0, 40, "paused"))[0]) + "\n")
    target, words = _plot_target(tmp_path, kind)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, _, err = in_process([f"output_dir={out}", "--plot", str(target)], capsys)
    assert code == 2
    _one_error_line(err, "--plot", words)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing lost or added
    assert not (tmp_path / "nonexist").exists()


def test_plot_replaces_only_an_earlier_png(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_text(json.dumps(sessions((0, 40, "paused"))[0]) + "\n")
    png = tmp_path / "p.png"
    png.write_bytes(PNG + b"an earlier plot")
    code, _, err = in_process([f"output_dir={out}", "--plot", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes().startswith(PNG) and png.stat().st_size > 1024


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_plot_into_a_folder_that_takes_no_files_is_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_text(json.dumps(sessions((0, 40, "paused"))[0]) + "\n")
    code, _, err = in_process([f"output_dir={out}", "--plot", "/proc/kit-plot.png"], capsys)
    assert code == 2
    _one_error_line(err, "/proc")


BAD_RECORDS = [
    (b"\xff\xfe not text", "is not UTF-8 text"),
    (b'{"started": "abc", "ended": 5}', 'started="abc"'),
    (b'{"ended": "x", "started": 5}', 'ended="x"'),
    (b'{"started": 1796000000, "ended": 1796000100, "gpu_count": "x"}', 'gpu_count="x"'),
    (b'{"started": NaN, "ended": 5}', "started=NaN"),
    (b'{"started": 1e300, "ended": 1e301}', "started=1e+300"),
    (b'{"started": 5, "end_step": 1' + b"0" * 400 + b"}", "end_step="),
    (b'{"started": 5, "max_steps": 2.5}', "max_steps=2.5"),
    (b'{"started": 5, "outcome": ["paused"]}', "outcome="),
    (b'[1, 2]', "is not a JSON object"),
    (b'{"host": "x", "sta', "is not valid JSON"),
]


def _jsonl_with_bad_lines() -> bytes:
    good = [json.dumps(r).encode() for r in sessions((0, 40, "paused"), (40, 90, "paused"))]
    return b"\n".join([good[1], *(line for line, _ in BAD_RECORDS), good[0]]) + b"\n"


@pytest.mark.parametrize("where", ["local", "store"])
def test_bad_session_records_are_skipped_with_one_warning_each(tmp_path, where, capsys, caplog):
    out, store = tmp_path / "out", tmp_path / "store"
    if where == "local":
        out.mkdir()
        (out / "kit_sessions.jsonl").write_bytes(_jsonl_with_bad_lines())
        args = [f"output_dir={out}", "max_steps=200"]
    else:
        (store / "kit").mkdir(parents=True)
        (store / "kit" / "sessions.jsonl").write_bytes(_jsonl_with_bad_lines())
        (store / "kit" / "run.json").write_bytes(b'{"run_id": "\xff"}')
        args = [f"store={store}", f"output_dir={out}", "max_steps=200"]
    code, text, err = in_process(args, capsys)
    assert code == 0, err
    assert "sessions     2" in text and "40 → 90 of 200  paused" in text
    for n, (_, words) in enumerate(BAD_RECORDS, 2):
        assert any(f"line {n} " in w and words in w and w.endswith("ignoring it") for w in caplog.messages), words
    code, text, err = in_process([*args, "--json", "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0, err
    facts = json.loads(text)
    assert [s["end_step"] for s in facts["sessions"]] == [40, 90] and facts["goodput"]["gpu_hours"] > 0


def test_bad_session_records_warn_in_one_line_each_on_the_terminal(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_bytes(_jsonl_with_bad_lines())
    # A process of its own: what its terminal shows is the point (in this process pytest takes the log).
    r = subprocess.run([sys.executable, "-m", "kit", "status", f"output_dir={out}", "max_steps=200"], cwd=ROOT,
                       env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    warnings = r.stderr.strip().splitlines()
    assert len(warnings) == len(BAD_RECORDS) and all(w.endswith("; ignoring it") for w in warnings), r.stderr


def test_session_records_are_judged_once_for_every_reader():
    from kit.checkpoints import session_records

    said = []
    recs = session_records.parse(_jsonl_with_bad_lines(), "f", warn=lambda *a: said.append(a[0] % a[1:]))
    assert [r["end_step"] for r in recs] == [90, 40] and len(said) == len(BAD_RECORDS)
    assert session_records.problem({"started": None, "host": None, "world_size": 2}) is None
    problem = session_records.problem({"world_size": True})
    assert problem.startswith("has world_size=true") and problem.endswith("not an integer")


def test_a_checkpoints_trainer_state_with_other_types_is_left_out():
    facts = status._trainer_state({"max_steps": "x", "log_history": [
        {"step": 1, "loss": 2.0}, {"step": "2", "loss": 1.0}, {"step": 3, "loss": "low"}, "text", {"step": 4,
                                                                                                  "loss": float("nan")}]},
        "checkpoint-4/trainer_state.json")
    assert facts["state_max_steps"] is None
    assert [h["step"] for h in facts["log_history"]] == [1, 4]  # a NaN loss stays: a diverged run shows
    assert status._trainer_state({"log_history": "abc", "max_steps": 20}, "x") == {"state_max_steps": 20,
                                                                                     "log_history": []}


def test_a_grpo_jobs_rewards_are_read_from_its_log_and_other_logs_give_none(tmp_path):
    # What TRL's GRPOTrainer logs each step (trainer_state.json's log_history), with values a store may hold.
    grpo = [{"step": i, "loss": 0.0, "reward": 0.5 + i / 100, "reward_std": 0.1, "rewards/fmt/mean": i / 10,
             "rewards/fmt/std": 0.2, "rewards/short/mean": 0.5} for i in range(1, 9)]
    grpo[2]["rewards/short/mean"] = "high"  # not a number: left out of that step
    grpo.insert(4, {"step": 4.5, "loss": 0.0, "reward": float("nan")})  # not a finite reward: no entry
    rewards = status.reward_history(grpo)
    assert [r["step"] for r in rewards] == list(range(1, 9))
    assert rewards[0] == {"step": 1, "reward": 0.51, "rewards": {"fmt": 0.1, "short": 0.5}}
    assert rewards[2]["rewards"] == {"fmt": 0.3}
    # DPO's and KTO's `rewards/chosen`, `rewards/margins` are not reward functions' means; SFT logs none.
    assert status.reward_history([{"step": 1, "loss": 0.6, "rewards/chosen": 0.1, "rewards/margins": 0.3}]) == []
    # The first and last quarter of the logged steps (2 of 8), each function named.
    words = status.reward_words(rewards)
    assert words.startswith("0.515 over steps 1-2 → 0.575 over steps 7-8 (fmt 0.15 → 0.75")
    assert words.endswith("short 0.5 → 0.5; TRL's mean reward of each step's completions)"), words
    assert status.reward_words(rewards[:1]).startswith("0.51 at step 1 (fmt 0.1, short 0.5;")
    # `kit status` words them on a row of their own, for a GRPO job only.
    facts = status.gather(config.load(None, [f"output_dir={tmp_path / 'none'}", "max_steps=8"]))
    assert facts["rewards"] == [] and "reward " not in status.format_text(facts)
    rows = status.format_text({**facts, "rewards": rewards}).splitlines()
    assert [ln for ln in rows if ln.startswith("reward ")] == [f"reward       {words}"]


def test_output_dir_that_is_a_file_is_exit_2(tmp_path, capsys):
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0")
    code, _, err = in_process([f"output_dir={afile}"], capsys)
    assert code == 2
    _one_error_line(err, f"output_dir {afile} is a file, not a folder")


def test_a_folder_where_a_session_file_goes_is_refused_by_name(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "kit_sessions.jsonl").mkdir(parents=True)
    code, _, err = in_process([f"output_dir={out}"], capsys)
    assert code == 2
    _one_error_line(err, "kit_sessions.jsonl", "is a directory")
