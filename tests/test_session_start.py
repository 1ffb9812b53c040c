"""A session's record starts at its launch, so the goodput ledger's setup counts the imports (#16).

Importing torch, transformers, peft and trl takes seconds of a held GPU before kit's code runs;
`kit.train.deadline.process_started` reads the process's start from /proc (under torchrun: the
launcher's, the rank's parent). Real processes; the delay before kit is imported stands in for
the imports.
"""

import os
import subprocess
import sys
import time

import pytest

from kit.train import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = "import time; time.sleep(1.0); from kit.train.deadline import process_started; print(time.time() - process_started())"

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    return dict(env, PYTHONPATH=ROOT, **extra)


def test_the_start_is_the_launch_not_the_first_kit_import():
    out = subprocess.run([sys.executable, "-c", CHILD], env=_env(), capture_output=True, text=True, timeout=60)
    assert 1.0 <= float(out.stdout) < 10, out.stderr


def test_under_torchrun_the_start_is_the_launchers():
    launcher = ("import subprocess, sys, time; time.sleep(1.0); "
                f"subprocess.run([sys.executable, '-c', {CHILD!r}], check=True)")
    out = subprocess.run([sys.executable, "-c", launcher], env=_env(TORCHELASTIC_RUN_ID="bench"),
                         capture_output=True, text=True, timeout=60)
    assert 2.0 <= float(out.stdout) < 12, out.stderr  # the launcher's second and the rank's own


def test_this_process_started_before_now():
    assert time.time() - 3600 * 24 < deadline.process_started() <= time.time()
