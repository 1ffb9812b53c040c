"""Two runs into one output_dir without a store (so without a lease): the second is refused in one
line, exit 2, before it writes anything; once the first is killed (kill -9) the folder is free at
once, with no stale lock to wait out."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, kill_job, train


@pytest.mark.slow
def test_a_second_run_into_a_busy_output_dir_is_refused_and_a_killed_one_frees_it(tmp_path):
    out = tmp_path / "busy-out"
    first = subprocess.Popen([sys.executable, str(SCRIPT), f"output_dir={out}", "max_steps=100000", "save_steps=5",
                              "keep_checkpoints=100000",
                              *FAST], cwd=ROOT, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        for line in first.stdout:
            if "run id:" in line or time.monotonic() > deadline:
                break
        while not list(out.glob("checkpoint-*")) and time.monotonic() < deadline:
            time.sleep(0.2)  # training, with checkpoints being written
        assert list(out.glob("checkpoint-*")), "the first run never saved"
        before, record = sorted(p.name for p in out.iterdir()), (out / "kit_run.json").read_text()
        second = train([f"output_dir={out}", "max_steps=3", *FAST], nproc=1)
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "is in use by another kit run on this machine" in errors[0], second.stderr[-2000:]
        assert "trainable parameters" not in second.stdout  # refused before the model was loaded
        assert set(before) <= {p.name for p in out.iterdir()}  # nothing of the first run's was touched
        assert (out / "kit_run.json").read_text() == record
    finally:
        kill_job(first, str(out), signal.SIGKILL)
    # A fresh process takes the folder at once (a resume here would go on to the first run's 100000 steps).
    free = subprocess.run([sys.executable, "-c", "import sys; from kit.train.output_dir import lock; "
                           "print(lock(sys.argv[1]) is not None)", str(out)], cwd=ROOT, env=cpu_env(),
                          capture_output=True, text=True, timeout=60)
    assert free.returncode == 0 and free.stdout.strip() == "True", free.stderr[-2000:]


def test_a_filesystem_without_flock_trains_unlocked_instead_of_crashing(tmp_path, monkeypatch):
    """Colab's Drive (FUSE) and some network mounts answer flock with ENOLCK/EINVAL: such a folder is
    used without the lock, not refused and not a traceback. Mocked: no such mount exists here."""
    import errno
    import fcntl

    from kit.train.output_dir import lock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert lock(str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []  # nothing left behind
