"""Run the generated train_ddp.py for real: under `python` or `torchrun` (gloo, CPU)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.machine.command import launch_argv

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "train_ddp.py"


def cpu_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", KIT_PLATFORM="local")
    env.update({k: str(v) for k, v in extra.items()})
    return env


@contextlib.contextmanager
def environment(env: dict):
    """os.environ is exactly `env` for the block (as a subprocess started with env=env would see it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cells_until_one_fails(cells: list[str], cwd: Path, env: dict):
    """(the notebook, the CellExecutionError): `cells` run in a real Jupyter kernel as "Run all" runs them, in `cwd`,
    the kernel inheriting os.environ with `env` over it, until a cell fails (the test fails if none does)."""
    import nbclient
    import nbformat
    import pytest

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(cwd)}})
    with environment({**os.environ, **env}):  # the kernel inherits this process's environment
        with pytest.raises(nbclient.exceptions.CellExecutionError) as failed:
            client.execute()
    return nb, failed.value


def kit_cli(args: list[str], *, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
    """`python -m kit ARGS` in this process, through kit.cli: its exit code, stdout and stderr.

    The same command line, environment (cpu_env() unless given) and working directory as the
    subprocess a user's shell starts, without paying ~8 s of imports per call. Tests whose point
    is a separate process (locks held by another pid, kill -9, import-time behaviour) keep `run`.
    """
    from kit.cli import run as kit_run

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    with environment(env or cpu_env()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd)
        try:
            code = kit_run([str(a) for a in args]).code
        except SystemExit as e:  # argparse's --help / usage errors exit like the real command
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            os.chdir(here)
    return subprocess.CompletedProcess(["kit", *map(str, args)], code, out.getvalue(), err.getvalue())


def elsewhere_env(**extra) -> dict:
    """cpu_env for a script rendered into a temp folder: kit imported from this checkout."""
    return cpu_env(PYTHONPATH=str(ROOT), **extra)


def hub_env(server, token: str | None = None) -> dict:
    """elsewhere_env talking to the test Hub `server` with `token` (its write token by default)."""
    from tests.hubserver import WRITE_TOKEN

    return elsewhere_env(HF_ENDPOINT=server.url, HF_TOKEN=token or WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")


def two_ranks(script: Path, args: list[str], environ: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=2 script args` from the checkout, to the end."""
    return subprocess.run(torchrun_cmd(script, 2) + args, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def torchrun_cmd(script=SCRIPT, nproc: int = 2) -> list[str]:
    return launch_argv(nproc, torchrun=True, script=str(script))  # kit's one launch-command builder


def run(cmd: list[str], *, timeout: float = 300, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env or cpu_env(), capture_output=True, text=True, timeout=timeout)


def train(args: list[str], *, nproc: int = 2, timeout: float = 300, env: dict | None = None,
          script=SCRIPT) -> subprocess.CompletedProcess:
    """`torchrun … train_ddp.py ARGS` (nproc > 1) or `python train_ddp.py ARGS`."""
    cmd = torchrun_cmd(script, nproc) if nproc > 1 else [sys.executable, str(script)]
    return run(cmd + list(args), timeout=timeout, env=env)


def train_here(args: list[str], *, env: dict | None = None, script=SCRIPT, cwd=ROOT) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` in this process: the script's own __main__ block through runpy, with that
    command line, environment (cpu_env() unless given) and working directory; its exit code, stdout and
    stderr (an exception that escapes is printed there as Python prints it, exit code 1). For runs
    whose separate process is not the point (no torchrun, no signal, no kill): ~8 s of imports fewer each."""
    import runpy
    import traceback

    # huggingface_hub reads HF_HUB_OFFLINE once, at its import: imported here, under this process's
    # environment (tests/conftest.py clears it), a run with cpu_env()'s HF_HUB_OFFLINE=1 that happens to
    # import it first cannot turn the test Hub off for every later run in this process.
    import huggingface_hub.constants  # noqa: F401

    out, err, here, argv = io.StringIO(), io.StringIO(), os.getcwd(), sys.argv
    with environment(env or cpu_env()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd)
        sys.argv = [str(script), *map(str, args)]
        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except Exception:  # what `python SCRIPT` would print before exiting with 1
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = argv
            os.chdir(here)
    return subprocess.CompletedProcess([sys.executable, str(script), *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def kill_job(proc: subprocess.Popen, marker: str, sig: int = signal.SIGKILL) -> None:
    """Kill a whole torchrun job like a platform cutting the session: torchrun and every rank.

    torchrun starts its workers in process sessions of their own, so killing its process group
    leaves them running as orphans: they are found by `marker` (e.g. the run's unique output_dir)
    in their command line.
    """
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry.name), sig)
            except ProcessLookupError:
                continue
            killed.append(int(entry.name))
    proc.wait()
    if sig == signal.SIGKILL:  # as a platform's cut: every rank gone (or a zombie) before the test goes on
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def losses(ckpt: Path) -> list[tuple[int, float]]:
    history = json.loads((Path(ckpt) / "trainer_state.json").read_text())["log_history"]
    return [(h["step"], h["loss"]) for h in history if "loss" in h]


# Fast settings for the tiny default: no periodic eval, a log line every step.
FAST = ["eval_steps=null", "logging_steps=1"]
