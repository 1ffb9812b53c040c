"""Checkpoints that survive the cutoff, end to end: the real train_ddp.py under torchrun (2 gloo
ranks), the real huggingface_hub client over HTTP against tests/hubserver.py, kill -9 of the
whole job, a time budget, SIGTERM, a second writer, a failing server."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.checkpoints.store.hub import HubStore
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, kill_job, losses, torchrun_cmd, train

STEPS = ["max_steps=24", "save_steps=3", "keep_checkpoints=2", *FAST]
# For runs cut by a time budget: long enough (~20 s of steps) that a 4.2 s budget always cuts it.
LONG = ["max_steps=200", "save_steps=10", "keep_checkpoints=2", *FAST]
BUDGET = "time_budget_minutes=0.07"  # 4.2 s, less a 0.4 s safety margin and one step + save


def assert_continuous(ckpt: Path, max_steps: int) -> None:
    """Every step logged exactly once across the sessions: none repeated, none skipped."""
    assert [s for s, _ in losses(ckpt)] == list(range(1, max_steps + 1))


@pytest.fixture
def server():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as s:
        yield s


def hub_env(server, **extra):
    return cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0",
                   HF_HUB_DISABLE_TELEMETRY="1", **extra)


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
    """The final checkpoint of an uninterrupted run with the same seed and no store."""
    out = tmp_path_factory.mktemp("reference") / "run"
    r = train([f"output_dir={out}", *args])
    assert r.returncode == 0, r.stderr[-3000:]
    return out / f"checkpoint-{steps}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return uninterrupted(tmp_path_factory, STEPS, 24)


@pytest.fixture(scope="module")
def reference_long(tmp_path_factory):
    return uninterrupted(tmp_path_factory, LONG, 200)


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


@pytest.mark.slow
def test_kill_9_at_random_moments_then_rerun_until_done(server, reference_long, tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/ha-tiny", *LONG, "save_steps=4"]
    env = hub_env(server)
    server.throttle_bps = 2e6  # a 0.5 MB checkpoint takes ~0.25 s to upload: kills land mid-upload too
    rng = random.Random(1234)
    kills = 0
    for attempt in range(10):
        log = tmp_path / f"attempt{attempt}.log"
        proc = start_job(args, env, log)
        if attempt % 4 == 3:
            time.sleep(rng.uniform(1.0, 3.0))  # during start-up: loading, resuming, downloading
        elif not wait_for_steps(proc, log, rng.randint(1, 12)):  # mid-training: saves and uploads every ~0.4 s
            break  # it finished before the kill
        if proc.poll() is not None:
            break
        kill_job(proc, str(out))
        kills += 1
        if attempt % 3 == 1:
            shutil.rmtree(out, ignore_errors=True)  # a new session: resume must come from the Hub
    assert kills == 10
    final = train(args, env=env)
    log = final.stdout + final.stderr
    assert final.returncode == 0, log[-3000:]
    assert "resuming from step" in log or "already complete" in log
    assert_same_training(reference_long, out / "checkpoint-200")
    # The Hub holds the final checkpoint; a fresh machine would see the job as complete.
    shutil.rmtree(out)
    again = train(args, env=env)
    assert again.returncode == 0 and "already complete: " in again.stdout and "step 200 of 200" in again.stdout


@pytest.mark.slow
def test_time_budget_pauses_with_exit_0_and_the_rerun_finishes(server, tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/budget", *LONG]
    env = hub_env(server)
    first = train([*args, BUDGET], env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "paused at step" in first.stdout and "same command" in first.stdout
    paused_step = int(first.stdout.split("paused at step ")[1].split()[0])
    assert 0 < paused_step < 200
    pushed = {p.split("/")[1] for p in server.files("me/budget") if p.startswith("checkpoints/")}
    assert f"checkpoint-{paused_step}" in pushed  # the paused step is on the Hub, not only local
    shutil.rmtree(out)
    second = train(args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {paused_step} (" in second.stdout
    assert "complete: step 200" in second.stdout and "step 200 of 200" in second.stdout
    assert_continuous(out / "checkpoint-200", 200)


def _first_step_then(proc, out: Path, sig, timeout=120) -> str:
    deadline = time.monotonic() + timeout
    while not list(out.glob("checkpoint-*")):  # the first save: training is under way
        assert time.monotonic() < deadline and proc.poll() is None, "the run never saved"
        time.sleep(0.1)
    time.sleep(1)
    os.killpg(proc.pid, sig)  # what a platform sends to every process before it kills
    log, _ = proc.communicate(timeout=timeout)
    return log


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
@pytest.mark.slow
def test_sigterm_saves_pushes_and_stops_cleanly(server, tmp_path, launcher):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/sigterm", "max_steps=2000", "save_steps=5", *FAST]
    cmd = (torchrun_cmd() if launcher == "torchrun" else [sys.executable, str(SCRIPT)]) + args
    proc = subprocess.Popen(cmd, cwd=ROOT, env=hub_env(server), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = _first_step_then(proc, out, signal.SIGTERM)
    assert "paused at step" in log and "(signal SIGTERM)" in log, log[-3000:]
    step = int(log.split("paused at step ")[1].split()[0])
    assert f"checkpoints/checkpoint-{step}/kit_manifest.json" in server.files("me/sigterm")
    assert "destroy_process_group()" not in log  # torch's warning of a group left open
    if launcher == "python":
        assert proc.returncode == 0
    else:
        # The ranks exit 0 after the clean stop, but torchrun itself was signalled and always
        # exits 1 for that (its SignalException): nothing kit can change from inside the ranks.
        assert "exitcode: 1" not in log and "SignalException" in log
    shutil.rmtree(out)
    again = train([*args, "max_steps=%d" % (step + 2)], env=hub_env(server), nproc=1)
    assert again.returncode == 0 and f"resuming from step {step} (" in again.stdout, again.stderr[-2000:]


@pytest.mark.slow
def test_a_second_writer_is_refused_naming_the_holder(server, tmp_path):
    env = hub_env(server)
    first = start_job([f"output_dir={tmp_path / 'a'}", "store=hf://me/shared", "max_steps=400",
                       "save_steps=1000", *FAST], env)
    try:
        deadline = time.monotonic() + 60
        while "kit/lease.json" not in server.files("me/shared") if "me/shared" in server.repos else True:
            assert time.monotonic() < deadline, "first run never took the lease"
            time.sleep(0.2)
        second = train([f"output_dir={tmp_path / 'b'}", "store=hf://me/shared", "max_steps=4"], env=env, nproc=1)
        assert second.returncode == 4
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith("error: store ") and "hf://me/shared is" in line and "leased by " in line and " pid " in line
        assert "since" in line
        assert not (tmp_path / "b").exists() or not list((tmp_path / "b").glob("checkpoint-*"))
    finally:
        kill_job(first, str(tmp_path / "a"))


@pytest.mark.parametrize("fault", [
    dict(kind="status", status=503, times=3, method="POST", path="/commit/"),
    dict(kind="status", status=429, times=2, method="POST", path="/commit/"),
    dict(kind="hang", seconds=15, times=1, method="POST", path="/commit/"),
    dict(kind="drop_upload", times=2, method="POST", path="/commit/"),
])
@pytest.mark.slow
def test_a_failing_server_never_stops_training_nor_corrupts_resume(server, reference, tmp_path, fault):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/flaky", *STEPS]
    env = hub_env(server)
    server.inject(**fault)
    r = train(args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "complete: step 24 of 24" in r.stdout
    assert_same_training(reference, out / "checkpoint-24")
    # Whatever the server went through, a fresh machine resumes from a complete checkpoint.
    shutil.rmtree(out)
    again = train(args, env=env, nproc=1)
    assert again.returncode == 0 and "already complete: " in again.stdout and "step 24 of 24" in again.stdout


def published_steps(log: str) -> list[int]:
    return [int(line.split("store: step ")[1].split()[0]) for line in log.splitlines()
            if line.startswith("[kit] store: step ") and " published: " in line]


@pytest.mark.slow
def test_a_corrupt_download_falls_back_to_an_older_complete_checkpoint(server, reference, tmp_path):
    out = tmp_path / "run"
    env = hub_env(server)
    args = [f"output_dir={out}", "store=hf://me/corrupt", *STEPS]
    first = train(args, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    # The store keeps the newest two checkpoints that reached it. Which older one that is depends
    # on upload speed: a checkpoint still queued when a newer one is saved is superseded (on two
    # shared cores 18 and 21 both can be, leaving 15). The run's log says which were published.
    published = published_steps(first.stdout)
    assert published[-1] == 24 and len(published) >= 2, first.stdout[-3000:]
    steps = HubStore("me/corrupt", token=WRITE_TOKEN, endpoint=server.url).list_steps()
    assert steps == published[-2:], (steps, published)
    shutil.rmtree(out)
    # Every download of the newest checkpoint's adapter comes back with a flipped byte.
    server.inject("flip_download", times=100, path="checkpoint-24/adapter_model")
    r = train(args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from step {steps[0]} (" in r.stdout  # 24 did not verify: the next older one
    assert "already complete" not in r.stdout
    assert_same_training(reference, out / "checkpoint-24")


@pytest.mark.slow
def test_directory_store_resumes_after_the_local_copy_is_lost(tmp_path):
    out, store = tmp_path / "run", tmp_path / "drive"
    args = [f"output_dir={out}", f"store={store}", *LONG]
    first = train([*args, BUDGET])
    assert first.returncode == 0 and "paused at step" in first.stdout, first.stderr[-2000:]
    shutil.rmtree(out)
    second = train(args)
    assert second.returncode == 0 and "(store:" in second.stdout, second.stderr[-2000:]
    assert_continuous(out / "checkpoint-200", 200)


@pytest.mark.slow
def test_a_different_world_size_resumes_with_a_warning(tmp_path):
    out = tmp_path / "run"
    assert train([f"output_dir={out}", "max_steps=6", "save_steps=3", *FAST]).returncode == 0
    r = train([f"output_dir={out}", "max_steps=9", "save_steps=3", *FAST], nproc=1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "written by 2 processes" in r.stdout and "this run has 1" in r.stdout
    assert "complete: step 9 of 9" in r.stdout
    # One process packs 8 × 2 into 4 × 1 micro-batches: kit says so before transformers' bare
    # "per_device_train_batch_size: 4 (from args) != 8 (from trainer_state.json)" warning.
    [said] = [ln for ln in r.stdout.splitlines() if ln.startswith("[kit] micro-batch 4 × ")]
    assert "accumulation 1 per" in said and "now, 8 when the" in said, r.stdout
    assert "global batch is kept" in said and "per_device_train_batch_size" in said and "is expected" in said


@pytest.mark.slow
def test_a_store_that_stops_taking_checkpoints_ends_the_session_with_exit_4(tmp_path):
    """Uploads failing for the rest of a session (a full or unmounted drive, write access revoked)
    used to end "paused … run the same command to continue", exit 0: on a fresh machine that
    command resumed from the store's old step and the session's steps were lost, unannounced."""
    out, store = tmp_path / "run", tmp_path / "drive"
    log = tmp_path / "log.txt"
    cmd = [f"output_dir={out}", f"store={store}", "max_steps=400", "save_steps=5", "time_budget_minutes=0.15", *FAST]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *cmd], cwd=ROOT, env=cpu_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (store / "checkpoints" / "checkpoint-5").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(store / "checkpoints")
        (store / "checkpoints").write_text("not a folder any more")  # every later upload fails, root or not
        assert proc.wait(timeout=180) == 4, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_job(proc, str(out))
    text = log.read_text()
    paused = int(text.split("paused at step ")[1].split()[0])
    assert paused > 5 and (out / f"checkpoint-{paused}").is_dir()  # the work is kept locally
    error = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "is behind: " in error[0] and "checkpoint is step 5," in error[0]
    assert f"ended at step {paused}" in error[0] and f"Keep {out}" in error[0]
