"""What a stop signal does at each stage of the real script, and a launcher that is gone.

torchrun starts each rank in a session of its own: a kill -9 of torchrun's process group (a killed
notebook kernel, `timeout -s KILL`, a scheduler) left the ranks training for the rest of the job,
holding the GPUs and the output_dir. SIGTERM while the libraries load ended the process silently
with 143, and a signal just after a finished job's last line turned its exit 0 into 130 or 143.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, hub_env, kill_job, torchrun_cmd, train_here

GONE_WITHIN_S = 20.0


def pids_with(marker: str) -> list[int]:
    """Live processes (zombies left out) whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # it ended meanwhile
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_for_checkpoint(proc, out: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not list(out.glob("checkpoint-*")):  # the first save: training is under way
        assert time.monotonic() < deadline and proc.poll() is None, "the run never saved"
        time.sleep(0.1)


@pytest.mark.slow
def test_ranks_whose_torchrun_is_killed_pause_push_and_exit_and_the_rerun_resumes(tmp_path):
    out, store, log = tmp_path / "run", tmp_path / "drive", tmp_path / "log.txt"
    args = [f"output_dir={out}", f"store={store}", "max_steps=2000", "save_steps=5", *FAST]
    with open(log, "w") as sink:
        agent = subprocess.Popen(torchrun_cmd() + args, cwd=ROOT, env=cpu_env(), stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_checkpoint(agent, out)
        ranks = [p for p in pids_with(str(out)) if p != agent.pid]
        assert len(ranks) == 2, ranks
        os.killpg(agent.pid, signal.SIGKILL)  # torchrun and its group; the ranks are in sessions of their own
        agent.wait()
        killed = time.monotonic()
        while set(ranks) & set(pids_with(str(out))) and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.2)
        left = set(ranks) & set(pids_with(str(out)))
        took = time.monotonic() - killed
    finally:
        kill_job(agent, str(out))
    text = log.read_text()
    assert not left, f"ranks {sorted(left)} still running {GONE_WITHIN_S:.0f} s after torchrun was killed"
    assert f"(torchrun's agent, pid {agent.pid}, is gone) — run the same command to continue" in text, text[-3000:]
    step = int(text.split("[kit] paused at step ")[1].split()[0])
    assert 0 < step < 2000 and took < GONE_WITHIN_S
    assert (out / f"checkpoint-{step}" / "kit_manifest.json").is_file()
    assert (store / "checkpoints" / f"checkpoint-{step}" / "kit_manifest.json").is_file()  # pushed, too
    again = train_here([*args, f"max_steps={step + 3}"])  # the rerun's resume, in this process
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from step {step}" in again.stdout and f"complete: step {step + 3} of {step + 3}" in again.stdout


@pytest.mark.slow
def test_sighup_that_torchrun_forwards_pauses_the_ranks(tmp_path):
    """A closed terminal or a notebook's pty going away: torchrun's agent forwards SIGHUP to the ranks
    as it does SIGTERM. They died at once, without a checkpoint; now they pause like on SIGTERM."""
    out = tmp_path / "run"
    agent = subprocess.Popen(torchrun_cmd() + [f"output_dir={out}", "max_steps=2000", "save_steps=5", *FAST],
                             cwd=ROOT, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        wait_for_checkpoint(agent, out)
        os.kill(agent.pid, signal.SIGHUP)
        log, _ = agent.communicate(timeout=150)
    finally:
        kill_job(agent, str(out))
    assert "(signal SIGHUP) — run the same command to continue" in log, log[-3000:]
    step = int(log.split("[kit] paused at step ")[1].split()[0])
    assert (out / f"checkpoint-{step}" / "kit_manifest.json").is_file()


@pytest.fixture
def server():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as s:
        yield s


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
@pytest.mark.slow
def test_sigterm_saves_pushes_and_stops_cleanly(server, tmp_path, launcher):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/sigterm", "max_steps=2000", "save_steps=5", *FAST]
    cmd = (torchrun_cmd() if launcher == "torchrun" else [sys.executable, str(SCRIPT)]) + args
    proc = subprocess.Popen(cmd, cwd=ROOT, env=hub_env(server), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for_checkpoint(proc, out)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGTERM)  # what a platform sends to every process before it kills
        log, _ = proc.communicate(timeout=120)
    finally:
        kill_job(proc, str(out))
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
    # A fresh machine resumes from the Hub: one process, this one.
    again = train_here([*args, "max_steps=%d" % (step + 2)], env=hub_env(server))
    assert again.returncode == 0 and f"resuming from step {step} (" in again.stdout, again.stderr[-2000:]


# A parent that starts `python train_ddp.py` (as is, or through `nohup`) and waits: a notebook kernel. Its child
# gets SIGHUP's default action, as a kernel's does, whatever this test run inherited (pytest itself started under
# nohup passes an ignored SIGHUP on, which is what `nohup` asks for); `nohup` then ignores it again.
PARENT = """
import signal, subprocess, sys, time
subprocess.Popen(sys.argv[1:], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
time.sleep(3600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["as is", "nohup"])
def test_a_single_process_pauses_when_its_parent_dies_unless_started_with_nohup(tmp_path, how):
    out, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = ([] if how == "as is" else ["nohup"]) + [sys.executable, str(SCRIPT), f"output_dir={out}",
                                                    "max_steps=2000", "save_steps=5", *FAST]
    with open(log, "w") as sink:
        parent = subprocess.Popen([sys.executable, "-c", PARENT, *cmd], cwd=ROOT, env=cpu_env(), stdout=sink,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_checkpoint(parent, out)
        child = [p for p in pids_with(str(out)) if p != parent.pid]
        assert len(child) == 1, child
        parent.kill()  # the parent alone, as a kernel dies
        parent.wait()
        killed = time.monotonic()
        if how == "nohup":  # it trains on: ten more steps saved, still running
            first = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
            while not (out / f"checkpoint-{first + 10}").is_dir() and time.monotonic() - killed < 120:
                time.sleep(0.2)
            assert (out / f"checkpoint-{first + 10}").is_dir() and child[0] in pids_with(str(out))
            assert "paused" not in log.read_text()
            return
        while child[0] in pids_with(str(out)) and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.2)
        assert child[0] not in pids_with(str(out)), f"still running {GONE_WITHIN_S:.0f} s after its parent died"
    finally:
        kill_job(parent, str(out))
    text = log.read_text()
    assert f"(the parent process, pid {parent.pid}, is gone) — run the same command to continue" in text, text[-3000:]
    step = int(text.split("[kit] paused at step ")[1].split()[0])
    assert (out / f"checkpoint-{step}" / "kit_manifest.json").is_file()


def test_output_without_a_reader_goes_to_devnull_instead_of_failing(tmp_path):
    """A killed kernel takes the reader of a rank's pipe along: prints raised BrokenPipeError and ended
    the pause before its push. A real pipe whose read end is closed."""
    code = ("import sys; from kit.train import signals; moved = signals.keep_output_writable(); "
            "open(sys.argv[1], 'w').write(repr(moved)); print('x' * 200000, flush=True); "
            "print('y' * 200000, file=sys.stderr, flush=True)")
    read, write = os.pipe()
    os.close(read)  # nobody reads it any more
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "moved")], cwd=ROOT, env=cpu_env(),
                          stdout=write, stderr=write, timeout=60)
    os.close(write)
    assert done.returncode == 0
    assert (tmp_path / "moved").read_text() == "[1, 2]"
    # With a reader, nothing moves.
    kept = subprocess.run([sys.executable, "-c", code, str(tmp_path / "kept")], cwd=ROOT, env=cpu_env(),
                          capture_output=True, timeout=60)
    assert kept.returncode == 0 and (tmp_path / "kept").read_text() == "[]" and len(kept.stdout) > 200000


@pytest.mark.slow
def test_sigterm_while_the_script_loads_is_one_line_and_exit_143(tmp_path):
    """As Ctrl-C there (tests/test_bad_input.py): one line, its own exit code, no traceback, nothing written."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), f"output_dir={out}"], cwd=ROOT, env=cpu_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # torch, transformers and trl still importing
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stdout + stderr
    assert stderr.strip().splitlines() == ["interrupted by SIGTERM while loading the libraries: nothing was started"]
    assert not out.exists()


# The real script, run to the end in a child process; the signal is sent (a real one, to itself) at
# two moments after the job's outcome is decided: right after its outcome line is printed (`print`
# is wrapped only to find that moment), and from an exit handler registered first, so it runs
# last, after kit's own.
LATE = """
import atexit, builtins, os, runpy, signal, sys
sig, trigger = getattr(signal, sys.argv[1]), sys.argv[2]
atexit.register(lambda: os.kill(os.getpid(), sig))
_print = builtins.print
def print_then_signal(*args, **kwargs):
    _print(*args, **kwargs)
    if trigger and args and str(args[0]).startswith(trigger):
        os.kill(os.getpid(), sig)
builtins.print = print_then_signal
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_a_signal_after_the_outcome_line_keeps_a_finished_jobs_exit_0(tmp_path, sent):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "max_steps=2", "save_steps=2", "eval.final=false", "eval.baseline=false", *FAST]
    done = subprocess.run([sys.executable, "-c", LATE, sent, "[kit] complete:", str(SCRIPT), *args], cwd=ROOT,
                          env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "complete: step 2 of 2" in done.stdout
    assert "interrupted" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    # Found already complete: a signal as the process exits keeps its exit 0 too.
    again = subprocess.run([sys.executable, "-c", LATE, sent, "", str(SCRIPT), *args], cwd=ROOT, env=cpu_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete: step 2 of 2" in again.stdout
    assert "interrupted" not in again.stderr and "Traceback" not in again.stderr, again.stderr[-3000:]
