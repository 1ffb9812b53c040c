"""A job cut and run again, end to end: the real train_ddp.py under torchrun (2 gloo ranks), the real
huggingface_hub client over HTTP against tests/hubserver.py: kill -9 of the whole job at random
moments, a time budget, a local copy lost, another world size. The helpers here serve the other
end-to-end files too (tests/test_store_faults.py, test_signals.py, the GRPO and preference scripts)."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, hub_env, kill_job, losses, torchrun_cmd, train, train_here

STEPS = ["max_steps=24", "save_steps=3", "keep_checkpoints=2", *FAST]
# For runs cut by a time budget: long enough (~12 s of steps on 2 idle cores) that a 4.2 s budget always cuts it.
LONG = ["max_steps=120", "save_steps=10", "keep_checkpoints=2", *FAST]
BUDGET = "time_budget_minutes=0.07"  # 4.2 s, less a 0.4 s safety margin and one step + save


def assert_continuous(ckpt: Path, max_steps: int) -> None:
    """Every step logged exactly once across the sessions: none repeated, none skipped."""
    assert [s for s, _ in losses(ckpt)] == list(range(1, max_steps + 1))


@pytest.fixture
def server():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as s:
        yield s


def adapter(ckpt: Path) -> dict:
    from safetensors.torch import load_file  # imports torch: only where a test reads an adapter

    return load_file(Path(ckpt) / "adapter_model.safetensors")


def assert_same_training(a: Path, b: Path) -> None:
    la, lb = losses(a), losses(b)
    assert [s for s, _ in lb] == [s for s, _ in la]
    assert lb == la, "logged loss differs from the uninterrupted run"
    wa, wb = adapter(a), adapter(b)
    assert wa.keys() == wb.keys()
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst <= 1e-6, f"final adapter differs by {worst}"


def uninterrupted(tmp_path_factory, args: list[str], steps: int) -> Path:
    """The final checkpoint of an uninterrupted run (2 ranks) with the same seed and no store."""
    out = tmp_path_factory.mktemp("reference") / "run"
    r = train([f"output_dir={out}", *args])
    assert r.returncode == 0, r.stderr[-3000:]
    return out / f"checkpoint-{steps}"


def start_job(args, env, log: Path | None = None) -> subprocess.Popen:
    # Its own process group, so one killpg takes down torchrun (kill_job finds the ranks).
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(torchrun_cmd() + list(args), cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_steps(proc, log: Path, steps: int, timeout: float = 120) -> bool:
    """Wait until the run has logged `steps` more losses; False if it ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if log.read_text(errors="replace").count("'loss':") >= steps:
            return True
        time.sleep(0.05)
    return False


def kill_9_after_steps_and_rerun(script: Path, args: list[str], environ: dict, log: Path, marker: str,
                                 steps: int = 7) -> subprocess.CompletedProcess:
    """Two gloo ranks of `script`: kill -9 of the whole job (its ranks found by `marker`, e.g. the
    output_dir) after `steps` logged losses, then the same command again, to its end. The rerun's
    result; the first run's output is in `log`."""
    with open(log, "w") as f:
        proc = subprocess.Popen(torchrun_cmd(script, 2) + args, cwd=ROOT, env=environ, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
        assert wait_for_steps(proc, log, steps, timeout=300), log.read_text()[-3000:]
        kill_job(proc, marker)
    return subprocess.run(torchrun_cmd(script, 2) + args, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=400)


# Each kind of moment a platform's cut can land on, once: (when, then the local copy is removed). A kill
# mid-training lands on a step, a save or an upload (saves and uploads every ~0.5 s, the Hub throttled); a
# kill during start-up lands on loading, resuming or downloading; a removed output_dir is a new session
# on a fresh machine, so the next attempt resumes from the Hub.
MOMENTS = [("training", False), ("training", True), ("start-up", False), ("training", False), ("start-up", True)]
# The job they cut: five kills at most ~12 logged steps apart leave most of its 60 steps to the last rerun.
CUT = ["max_steps=60", "save_steps=4", "keep_checkpoints=2", *FAST]


@pytest.mark.slow
def test_kill_9_at_random_moments_then_rerun_until_done(server, tmp_path_factory, tmp_path):
    reference = uninterrupted(tmp_path_factory, CUT, 60)
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/ha-tiny", *CUT]
    env = hub_env(server)
    server.throttle_bps = 2e6  # a 0.5 MB checkpoint takes ~0.25 s to upload: kills land mid-upload too
    rng = random.Random(1234)
    kills = 0
    for attempt, (when, new_machine) in enumerate(MOMENTS):
        log = tmp_path / f"attempt{attempt}.log"
        proc = start_job(args, env, log)
        if when == "start-up":
            time.sleep(rng.uniform(1.0, 3.0))
        elif not wait_for_steps(proc, log, rng.randint(1, 12)):
            break  # it finished before the kill
        if proc.poll() is not None:
            break
        kill_job(proc, str(out))
        kills += 1
        if new_machine:
            shutil.rmtree(out, ignore_errors=True)
    assert kills == len(MOMENTS)
    final = train(args, env=env)
    log = final.stdout + final.stderr
    assert final.returncode == 0, log[-3000:]
    assert "resuming from step" in log and "(store:" in log  # the last kill took the local copy along
    assert_same_training(reference, out / "checkpoint-60")
    # The Hub holds the final checkpoint; a fresh machine would see the job as complete (one process
    # suffices to see that: it runs in this one).
    shutil.rmtree(out)
    again = train_here(args, env=env)
    assert again.returncode == 0 and "already complete: " in again.stdout and "step 60 of 60" in again.stdout


@pytest.mark.slow
def test_time_budget_pauses_with_exit_0_and_the_rerun_finishes(server, tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/budget", *LONG]
    env = hub_env(server)
    first = train([*args, BUDGET], env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "paused at step" in first.stdout and "same command" in first.stdout
    paused_step = int(first.stdout.split("paused at step ")[1].split()[0])
    assert 0 < paused_step < 120
    pushed = {p.split("/")[1] for p in server.files("me/budget") if p.startswith("checkpoints/")}
    assert f"checkpoint-{paused_step}" in pushed  # the paused step is on the Hub, not only local
    shutil.rmtree(out)
    second = train(args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {paused_step} (" in second.stdout
    assert "complete: step 120" in second.stdout and "step 120 of 120" in second.stdout
    assert_continuous(out / "checkpoint-120", 120)


@pytest.mark.slow
def test_directory_store_resumes_after_the_local_copy_is_lost(tmp_path):
    """One process, in this one: the point is the store folder, not the processes."""
    out, store = tmp_path / "run", tmp_path / "drive"
    args = [f"output_dir={out}", f"store={store}", *LONG]
    first = train_here([*args, BUDGET])
    assert first.returncode == 0 and "paused at step" in first.stdout, first.stderr[-2000:]
    shutil.rmtree(out)
    second = train_here(args)
    assert second.returncode == 0 and "(store:" in second.stdout, second.stderr[-2000:]
    assert_continuous(out / "checkpoint-120", 120)


@pytest.mark.slow
def test_a_different_world_size_resumes_with_a_warning(tmp_path):
    out = tmp_path / "run"
    assert train([f"output_dir={out}", "max_steps=6", "save_steps=3", *FAST]).returncode == 0
    r = train_here([f"output_dir={out}", "max_steps=9", "save_steps=3", *FAST])  # one process: this one
    assert r.returncode == 0, r.stderr[-2000:]
    assert "written by 2 processes" in r.stdout and "this run has 1" in r.stdout
    assert "complete: step 9 of 9" in r.stdout
    # One process packs 8 × 2 into 4 × 1 micro-batches: kit says so before transformers' bare
    # "per_device_train_batch_size: 4 (from args) != 8 (from trainer_state.json)" warning.
    [said] = [ln for ln in r.stdout.splitlines() if ln.startswith("[kit] micro-batch 4 × ")]
    assert "accumulation 1 per" in said and "now, 8 when the" in said, r.stdout
    assert "global batch is kept" in said and "per_device_train_batch_size" in said and "is expected" in said
