"""`kit schedule` end to end: papermill runs notebooks/resume.ipynb in a real kernel, the real
train_ddp.py trains under torchrun (2 gloo ranks) into a Hub store on tests/hubserver.py:
paused by a time budget, resumed to completion on a "new machine", then already complete.
Then `kit status` against that store, and every way a schedule is refused before it runs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.errors import UsageError
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, cpu_env, kit_cli

if importlib.util.find_spec("papermill") is None:  # looked up, not imported (half a second of imports)
    pytest.skip("papermill is not installed (pip install -e \".[notebooks]\")", allow_module_level=True)

LONG = ["max_steps=200", "save_steps=10", "keep_checkpoints=2", *FAST]
BUDGET = ["--time-budget", "0.07"]  # 4.2 s: a 200-step CPU run is always cut


def hub_env(server_url: str, token: str = WRITE_TOKEN, **extra) -> dict:
    return cpu_env(HF_ENDPOINT=server_url, HF_TOKEN=token, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
                   **extra)


def kit(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m kit ARGS`, in this process (kit_cli): the runs it starts are real processes."""
    return kit_cli(args, env=env)


def schedule_args(runs: Path, out: Path, store: str, *extra: str, nproc: int = 2) -> list[str]:
    return ["schedule", "--config", "configs/default.yaml", "--runs-dir", str(runs), "--store", store,
            "--nproc", str(nproc), *extra, *LONG, f"output_dir={out}"]


def outcome_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("run ")]


def outcome_of(stdout: str) -> str:
    """The outcome of run 1: what follows `run 1: outcome: `."""
    line = outcome_lines(stdout)[0]
    assert line.startswith("run 1: outcome: "), line
    return line.removeprefix("run 1: outcome: ")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
    """Three scheduled runs against one Hub store; the second starts on a machine with no local files."""
    tmp = tmp_path_factory.mktemp("schedule")
    runs, out = tmp / "runs", tmp / "out"
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        env = hub_env(server.url)
        args = schedule_args(runs, out, "hf://me/sched", *BUDGET)
        first = kit(args, env)
        shutil.rmtree(out)  # a new session: only the Hub remembers
        # The first run goes through torchrun (2 gloo ranks), the others through plain python: both
        # launch paths of the resume notebook, and a world-size change the job handles.
        second = kit(schedule_args(runs, out, "hf://me/sched", nproc=1), env)
        third = kit(schedule_args(runs, out, "hf://me/sched", "--loop", "--every", "0.01", "--max-runs", "3",
                                  nproc=1), env)
        status = kit(["status", "--config", "configs/default.yaml", *LONG, f"output_dir={out}",
                      "store=hf://me/sched", "--json", "--plot", str(tmp / "progress.png")], env)
        text = kit(["status", "--config", "configs/default.yaml", *LONG, f"output_dir={out}",
                    "store=hf://me/sched"], env)
        yield {"runs": runs, "out": out, "tmp": tmp, "results": [first, second, third], "status": status,
               "text": text, "files": server.files("me/sched")}


@pytest.mark.slow
def test_first_run_pauses_second_completes_third_is_already_complete(sequence):
    first, second, third = sequence["results"]
    for r in (first, second, third):
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert len(outcome_lines(first.stdout)) == 1
    assert outcome_of(first.stdout).startswith("paused at step ")
    assert outcome_of(second.stdout).startswith("complete: ") and "step 200 of 200" in outcome_of(second.stdout)
    # --loop stops at once: the job is complete
    assert len(outcome_lines(third.stdout)) == 1
    assert outcome_of(third.stdout).split("  (")[0].split(": ") == ["already complete", "step 200 of 200"]
    kept = sorted(sequence["runs"].glob("*.ipynb"))
    assert len(kept) == 3 and all(p.name.endswith(("-1.ipynb", "-2.ipynb")) for p in kept)
    assert not (sequence["runs"] / ".kit-schedule.lock").exists()
    assert "*/30 * * * *" in first.stdout and "OnUnitActiveSec=30min" in first.stdout


@pytest.mark.slow
def test_each_run_notebook_keeps_the_training_output_and_one_outcome(sequence):
    import nbformat

    outcomes = []
    for path in sorted(sequence["runs"].glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
        said = [line for line in text.splitlines() if line.startswith("outcome: ")]
        assert len(said) == 1, path
        outcomes.append(said[0].split(":")[1].strip().split()[0])
        assert "[kit] plan:" in text and "$ " in text
    assert sorted(outcomes) == ["already", "complete", "paused"]


@pytest.mark.slow
def test_status_json_after_the_sequence(sequence):
    r = sequence["status"]
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["store"] == "hf://me/sched" and s["complete"] is True
    assert s["latest_step"] == 200 and s["max_steps"] == 200 and s["checkpoints"] == [190, 200]
    # Every run is a session, the one that found the job complete too.
    assert [x["outcome"] for x in s["sessions"]] == ["paused", "complete", "already complete"]
    assert s["sessions"][1]["start_step"] == s["sessions"][0]["end_step"] > 0
    assert s["lease"]["released"] is True and s["lease"]["holder"]
    png = Path(s["plot"]).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1024


@pytest.mark.slow
def test_status_text_is_short_and_aligned(sequence):
    r = sequence["text"]
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["store", "hf://me/sched"]
    assert any(line.split()[:7] == ["progress", "step", "200", "of", "200", "(100", "%)"] and "— complete" in line
               for line in lines)
    assert any(line.startswith("lease        released: ") for line in lines)
    assert len(lines) <= 12


@pytest.mark.slow
def test_the_scheduled_store_holds_the_records(sequence):
    files = sequence["files"]
    assert "checkpoints/checkpoint-200/kit_manifest.json" in files
    assert len(files["kit/sessions.jsonl"].decode().splitlines()) == 3
    assert json.loads(files["kit/lease.json"])["released"] is True


# -- refused before anything runs ----------------------------------------------------------------
@pytest.fixture
def runs_with_a_notebook(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    old = runs / "20260101T000000Z-1.ipynb"
    old.write_text("an earlier run")
    return runs, old


def _refused(r, code: int, *words: str) -> None:
    assert r.returncode == code, (r.stdout + r.stderr)[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    for w in words:
        assert w in err[0]


def test_unreachable_hub_store_is_one_line_exit_4(runs_with_a_notebook, tmp_path):
    runs, old = runs_with_a_notebook
    env = hub_env(f"http://127.0.0.1:{closed_port()}")
    r = kit(schedule_args(runs, tmp_path / "out", "hf://me/nowhere"), env, timeout=60)
    _refused(r, 4, "hf://me/nowhere")
    assert sorted(p.name for p in runs.iterdir()) == [old.name] and old.read_text() == "an earlier run"


def test_unwritable_directory_store_is_one_line_exit_4(runs_with_a_notebook, tmp_path):
    runs, old = runs_with_a_notebook
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = kit(schedule_args(runs, tmp_path / "out", str(blocker / "store")), cpu_env(), timeout=60)
    _refused(r, 4, "not writable")
    assert sorted(p.name for p in runs.iterdir()) == [old.name]


@pytest.mark.parametrize("content, words", [
    ("# just markdown\n", "not valid JSON"),
    ('{"cells": 3}', "not a valid Jupyter notebook"),
    (json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}), "tagged `parameters`"),
])
def test_notebook_that_is_not_a_resume_notebook(tmp_path, content, words):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(content)
    r = kit(schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), "--notebook", str(bad)),
            cpu_env(), timeout=60)
    _refused(r, 2, words)
    assert not list((tmp_path / "runs").glob("*.ipynb"))


def test_missing_notebook(tmp_path):
    r = kit(schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), "--notebook",
                          str(tmp_path / "nope.ipynb")), cpu_env(), timeout=60)
    _refused(r, 2, "no such file")


@pytest.mark.parametrize("override", ["HF_TOKEN=hf_" + "FAKEtokenFORtestsONLY0123456789abcd",
                                      "hub_token=abc", "data.path=hf_" + "FAKEtokenFORtestsONLY0123456789abcd"])
def test_token_as_a_parameter_is_refused_without_echoing_it(tmp_path, override):
    r = kit(schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), override),
            cpu_env(), timeout=60)
    _refused(r, 2, "refusing to pass a token")
    assert "FAKEtoken" not in r.stdout + r.stderr and "=abc" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_second_scheduler_on_the_same_runs_dir_refuses(tmp_path):
    import os

    from kit.notebooks.schedule.runs_lock import RunsLock

    runs = tmp_path / "runs"
    runs.mkdir()
    with RunsLock(runs):  # a live scheduler: this test's own process; the second one is another process
        args = schedule_args(runs, tmp_path / "out", str(tmp_path / "store"))
        r = subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, env=cpu_env(), capture_output=True,
                           text=True, timeout=60)
    _refused(r, 2, "another `kit schedule`", f"pid {os.getpid()}")
    # What a process killed with -9 leaves (the OS dropped its lock) does not block the next one.
    (runs / ".kit-schedule.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 12345}))
    with RunsLock(runs) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (runs / ".kit-schedule.lock").exists()


def test_print_cron_only_prints(tmp_path):
    r = kit(["schedule", "--config", "configs/default.yaml", "--runs-dir", str(tmp_path / "runs"), "--every", "120",
             "--time-budget", "1234.5678", "--print-cron", "max_steps=20"], cpu_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "\n0 */2 * * * cd " in r.stdout and "OnUnitActiveSec=120min" in r.stdout and "EnvironmentFile=" in r.stdout
    assert "--loop" not in r.stdout and "max_steps=20" in r.stdout and "--time-budget 1234.5678 " in r.stdout
    assert not (tmp_path / "runs").exists()


def in_process(args: list[str], capsys) -> tuple[int, str, str]:
    from kit import cli

    code = cli.main(["schedule", "--config", "configs/default.yaml", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], err


@pytest.mark.parametrize("flag", ["--every", "--max-runs", "--time-budget", "--run-timeout", "--nproc",
                                  "--max-gpu-hours", "--poll"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "1e400", "abc", "99999999"])
def test_bad_numbers_are_refused(flag, value, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    code, out, err = in_process(["--runs-dir", str(tmp_path / "runs"), flag, value, "--print-cron"], capsys)
    _one_line(code, err, f"argument {flag}:", repr(value))
    assert out == "" and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("every, when", [(1, "*/1 * * * *"), (5, "*/5 * * * *"), (30, "*/30 * * * *"),
                                         (60, "0 */1 * * *"), (120, "0 */2 * * *"), (480, "0 */8 * * *"),
                                         (1440, "0 0 * * *"), (90, None), (45, None), (0.5, None), (2880, None)])
def test_a_cron_line_means_exactly_the_interval(every, when):
    from kit.notebooks.schedule import unattended

    assert unattended.cron_when(every) == when
    units = unattended.unattended(["kit"], Path("/w"), every, Path("/w/runs"))
    assert (f"\n{when} cd /w " in units) if when else ("no crontab line" in units and " cd /w " not in units)


@pytest.mark.parametrize("every, near", [("90", "--every 60 or --every 120"), ("45", "--every 30 or --every 60"),
                                         ("7", "--every 6 or --every 10"), ("0.5", "--every 1"),
                                         ("2000", "--every 1440")])
def test_print_cron_refuses_an_interval_cron_cannot_keep(every, near, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = in_process(["--every", every, "--print-cron"], capsys)
    _one_line(code, err, f"cron cannot run a job every {every} min", near)
    assert out == ""


def _runs_dir_problem(tmp_path, kind: str) -> tuple[Path, str]:
    if kind == "a file":
        (tmp_path / "runsfile").write_text("mine")
        return tmp_path / "runsfile", "is a file, not a folder"
    if kind == "inside a file":
        (tmp_path / "runsfile").write_text("mine")
        return tmp_path / "runsfile" / "runs", "runsfile is a file, not a folder"
    runs = tmp_path / "runs"
    (runs / (".kit-schedule.lock" + (".flock" if kind == "flock is a folder" else ""))).mkdir(parents=True)
    return runs, "is a directory, not a file"


@pytest.mark.parametrize("kind", ["a file", "inside a file", "flock is a folder", "lock record is a folder"])
def test_a_runs_dir_kit_cannot_use_is_refused(tmp_path, kind, capsys, monkeypatch):
    from kit.notebooks.schedule.runs_lock import RunsLock

    monkeypatch.chdir(ROOT)
    runs, words = _runs_dir_problem(tmp_path, kind)
    before = sorted(map(str, tmp_path.rglob("*")))
    code, _, err = in_process(schedule_args(runs, tmp_path / "out", str(tmp_path / "store"))[3:], capsys)
    _one_line(code, err, "--runs-dir", words)
    with pytest.raises(UsageError, match=words):  # the lock itself refuses too (the Kaggle path takes it directly)
        RunsLock(runs).__enter__()
    assert sorted(map(str, tmp_path.rglob("*"))) == before


def test_no_training_script_is_one_line_exit_2_before_any_run(tmp_path):
    """A new user schedules before bootstrap: said at once, not as a failed papermill run minutes later."""
    nb = tmp_path / "resume.ipynb"
    nb.write_text((ROOT / "notebooks" / "resume.ipynb").read_text())
    args = schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), "--notebook", str(nb))
    args[args.index("configs/default.yaml")] = str(ROOT / "configs" / "default.yaml")
    r = kit_cli(args, cwd=tmp_path)
    _refused(r, 2, "no train_ddp.py in", "kit bootstrap --config")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("extra", [[], ["--print-cron"]])
def test_a_training_script_for_another_trainer_is_one_line_exit_2_before_any_run(tmp_path, extra):
    """A GRPO config scheduled where ./train_ddp.py is the SFT one (a fresh clone's): every run would start a kernel
    only for the script to refuse the config; said at once, naming both trainers and the command that fixes it."""
    nb = tmp_path / "resume.ipynb"
    nb.write_text((ROOT / "notebooks" / "resume.ipynb").read_text())
    shutil.copy(ROOT / "train_ddp.py", tmp_path / "train_ddp.py")  # rendered for trainer sft
    args = schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), "--notebook", str(nb), *extra)
    args[args.index("configs/default.yaml")] = str(ROOT / "configs" / "grpo-tiny.yaml")
    r = kit_cli(args, cwd=tmp_path)
    _refused(r, 2, "rendered for trainer=sft", "asks for trainer=grpo", "kit bootstrap --config")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_notebook_that_is_a_directory(tmp_path):
    (tmp_path / "dir.ipynb").mkdir()
    r = kit(schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), "--notebook",
                          str(tmp_path / "dir.ipynb")), cpu_env(), timeout=60)
    _refused(r, 2, "is a directory, not a file")


def test_a_runs_record_is_read_from_usable_lines_only(tmp_path, caplog):
    from kit.notebooks.schedule.papermill_run import session_since

    path = tmp_path / "kit_sessions.jsonl"
    path.write_bytes(b'{"started": 10, "outcome": "paused", "end_step": 4}\n\xff\n{"started": "abc"}\n'
                     b'{"started": 20, "end_step": "x"}\n{"started": NaN}\n{"to')
    assert session_since(path, 5)["end_step"] == 4
    assert session_since(path, 15) is None
    assert len(caplog.messages) == 2 * 5


@pytest.mark.slow
def test_run_timeout_interrupts_training_which_pauses_cleanly(tmp_path):
    """A hung or overlong run is cut by --run-timeout: SIGTERM to the training, which saves and pauses."""
    runs, out, store = tmp_path / "runs", tmp_path / "out", tmp_path / "store"
    # 20000 steps cannot finish within the 45 s timeout, however fast the machine; 45 s leaves a loaded
    # machine (2 test workers on 2 cores) time to import the libraries and start training first. One
    # process trains (--nproc 1): the point is the timeout's signal and the pause; torchrun passing a
    # SIGTERM on to its ranks is tests/test_signals.py's, and two ranks would spend 45 s of both cores.
    r = kit(schedule_args(runs, out, str(store), "--run-timeout", "0.75", nproc=1) + ["max_steps=20000"], cpu_env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    line = outcome_lines(r.stdout)[0]
    assert line.startswith("run 1: outcome: ") and "paused at step " in line, r.stdout[-2000:]
    step = int(line.split("paused at step ")[1].split()[0])
    assert (store / "checkpoints" / f"checkpoint-{step}" / "kit_manifest.json").is_file()
    assert "--run-timeout 0.75" in r.stdout  # the cron/systemd command keeps it


def test_the_local_loop_stops_when_a_run_made_no_progress(tmp_path, monkeypatch):
    """The stop rule shared with --kaggle. A real run that pauses twice at the same step cannot be
    made to order, so papermill's part (`execute`, tested above) is replaced by its outcomes."""
    from kit.notebooks.schedule import loop as schedule

    outcomes = iter(["paused at step 40 of 200", "paused at step 40 of 200", "complete: step 200 of 200"])
    monkeypatch.setattr(schedule, "execute", lambda plan, n, verbose=False: (next(outcomes), tmp_path / f"{n}.ipynb"))
    said = []
    plan = schedule.Plan(notebook=tmp_path / "nb.ipynb", runs_dir=tmp_path / "runs", parameters={})
    code = schedule.loop(plan, repeat=True, every_minutes=0.01, max_runs=None, say=lambda *a, **k: said.append(a[0]),
                         sleep=lambda s: None)
    assert code == 1
    assert said[-1].startswith("stopped: the session") and "no progress (" in said[-1]
    assert "stayed at step 40): " in said[-1] and said[-1].endswith("paused at step 40 of 200")



def test_a_failed_or_stopped_loop_ends_with_one_error_line_on_stderr(tmp_path, monkeypatch, capsys):
    """The failure was only in stdout's "run 1: outcome: …" line: exit 2 with an empty stderr."""
    from kit.notebooks.schedule import loop as schedule

    outcome = "failed (exit code 2): error: data file d/rows.jsonl line 11: a row is null, not an object"
    monkeypatch.setattr(schedule, "execute", lambda plan, n, verbose=False: (outcome, tmp_path / "1.ipynb"))
    plan = schedule.Plan(notebook=tmp_path / "nb.ipynb", runs_dir=tmp_path / "runs", parameters={})
    assert schedule.loop(plan, repeat=True, every_minutes=0.01, max_runs=None, sleep=lambda s: None) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run 1 failed: ") and "d/rows.jsonl line 11: " in err[0]
    assert "row is null" in err[0] and err[0].endswith(f"(its notebook: {tmp_path / '1.ipynb'})")


def _notebook(path, source: str):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_a_runs_outcome_is_its_session_record_not_printed_text(tmp_path):
    """Real papermill and kernel: the outcome comes from the record the session appended."""
    from kit.notebooks.schedule.papermill_run import Plan, execute

    sessions = tmp_path / "out" / "kit_sessions.jsonl"
    sessions.parent.mkdir()
    # An older session's record (and a torn line) must not count for this run.
    sessions.write_text(json.dumps({"started": 1.0, "outcome": "complete", "end_step": 9, "max_steps": 9}) + "\n{\"to")
    nb = _notebook(tmp_path / "writes.ipynb", (
        "import json, time\n"
        f"with open({str(sessions)!r}, 'a') as f:\n"
        "    f.write('\\n' + json.dumps({'started': time.time(), 'outcome': 'paused', 'end_step': 40, 'max_steps': 200}) + '\\n')\n"
        "print('outcome: complete: step 200 of 200')  # printed words are not what counts\n"))
    plan = Plan(notebook=nb, runs_dir=tmp_path / "runs", parameters={}, cwd=tmp_path, sessions=sessions)
    assert execute(plan, 1)[0] == "paused at step 40 of 200"
    # A session that died in its first cell left no record: a failure, saying so, with the notebook's words.
    plan.notebook = _notebook(tmp_path / "dies.ipynb", "print('outcome: failed (exit code 1): missing HF_TOKEN')")
    outcome = execute(plan, 2)[0]
    assert outcome.startswith("failed: the session left") and f"no record in {sessions}" in outcome
    assert "missing HF_TOKEN" in outcome


def test_asyncio_reports_after_a_run_go_to_its_kernel_log_not_the_terminal(tmp_path, capfd):
    """Real papermill and kernel. A Ctrl-C mid-cell leaves the notebook client's cell task to fail when the
    kernel is shut down; asyncio reports that task ("Task exception was never retrieved" and a DeadKernelError
    traceback) only when it is garbage-collected, which was after "interrupted" and landed on the terminal
    under it. That moment cannot be made to order, so the report is logged here, after the runs, the way
    asyncio logs it."""
    import logging

    from kit.notebooks.schedule.papermill_run import Plan, execute

    plan = Plan(notebook=_notebook(tmp_path / "nb.ipynb", "print('outcome: complete: step 1 of 1')"),
                runs_dir=tmp_path / "runs", parameters={}, cwd=tmp_path, sessions=None)
    logger = logging.getLogger("asyncio")
    try:
        for n in (1, 2):  # the second run's log takes over from the first's
            assert execute(plan, n)[0] == "complete: step 1 of 1"
        capfd.readouterr()
        logger.error("Task exception was never retrieved")
        logs = sorted((tmp_path / "runs").glob("*.kernel.log"), key=lambda p: p.stat().st_mtime)
        assert len(logs) == 2 and "Task exception was never retrieved" in logs[1].read_text()
        assert "Task exception" not in logs[0].read_text()
        assert "Task exception" not in capfd.readouterr().err
    finally:  # this process goes on: asyncio's logger as it was
        for h in [h for h in logger.handlers if getattr(h, "kit_run_log", False)]:
            logger.removeHandler(h)
            h.close()
        logger.propagate = True


def test_the_executed_notebook_kit_keeps_never_holds_the_token(tmp_path, monkeypatch):
    """Real papermill and kernel: a cell that prints the token (the user's own, or a library's debug
    line) and one that fails with it in the error; the runs/ notebook kit wrote shows *** instead."""
    from kit.notebooks.schedule.papermill_run import Plan, execute

    token = "hf_" + "printedBYaCELL" + "0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", token)
    nb = _notebook(tmp_path / "leak.ipynb", "import os\nprint('boom', os.environ['HF_TOKEN'])\n"
                                            "raise ValueError(os.environ['HF_TOKEN'])\n")
    plan = Plan(notebook=nb, runs_dir=tmp_path / "runs", parameters={}, cwd=tmp_path, sessions=None)
    outcome, out = execute(plan, 1)
    assert outcome.startswith("failed") and token not in outcome
    text = out.read_text()
    assert token not in text and "boom ***" in text
    json.loads(text)  # still a notebook


def test_a_percent_sign_in_a_path_is_escaped_for_cron_and_systemd(tmp_path):
    """cron ends a command at a bare % (the rest is stdin) and systemd reads %d as a specifier."""
    from kit.notebooks.schedule.unattended import unattended

    cwd = tmp_path / "p%d 100%"
    text = unattended(["python", "-m", "kit", "schedule", "--config", str(cwd / "c.yaml")], cwd, 60, cwd / "runs")
    cron = [line for line in text.splitlines() if line.startswith("0 */1 * * *")][0]
    assert "%" not in cron.replace("\\%", "")
    assert f"WorkingDirectory={str(cwd).replace('%', '%%')}" in text
    exec_start = [line for line in text.splitlines() if line.startswith("ExecStart=")][0]
    assert "%" not in exec_start.replace("%%", "")


@pytest.mark.parametrize("outcome, code", [
    ("failed: the session left no record in O/kit_sessions.jsonl (it ended before training began): failed (exit "
     "code 2): error: data file /nonexistent.jsonl does not exist (data.path)", 2),  # what a real run printed
    ("failed (exit code 4): error: store hf://me/x: no write access", 4),
    ("failed (exit code 1): Traceback", 1),
    ("failed: the kernel stopped: Kernel died", 1),
])
def test_a_failed_run_passes_on_kits_exit_code(tmp_path, monkeypatch, outcome, code):
    """`kit schedule` exits as the training did (2 bad input, 3 cannot train, 4 store), so a cron job's
    mail says which; anything else is 1. papermill's part is replaced by the outcome, as above."""
    from kit.notebooks.schedule import loop as schedule

    monkeypatch.setattr(schedule, "execute", lambda plan, n, verbose=False: (outcome, tmp_path / f"{n}.ipynb"))
    plan = schedule.Plan(notebook=tmp_path / "nb.ipynb", runs_dir=tmp_path / "runs", parameters={})
    assert schedule.loop(plan, repeat=True, every_minutes=0.01, max_runs=None, say=lambda *a, **k: None,
                         sleep=lambda s: None) == code


@pytest.mark.slow
def test_ctrl_c_of_a_scheduled_run_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C while the kernel trains: `interrupted`, exit 130, and nothing else on stderr (the kernel's
    ZMQ traceback from its interrupted reply goes to the run's .kernel.log)."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    args = ["schedule", "--config", "configs/default.yaml", "--runs-dir", str(runs), "--nproc", "1",
            "max_steps=3000", "save_steps=50", *FAST, f"output_dir={out}"]
    # Ctrl-C reaches a foreground command: its SIGINT is not ignored, however pytest itself was started (a shell's
    # background job ignores SIGINT, and its children inherit that: kit would never see the Ctrl-C).
    proc = subprocess.Popen([sys.executable, "-m", "kit", *args], cwd=ROOT, env=cpu_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out / "kit_run.json").exists() and time.monotonic() < deadline:  # training has begun
            time.sleep(0.5)
        assert (out / "kit_run.json").exists(), "training never began"
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert stderr.strip() == "interrupted", stderr[-3000:]
    assert list(runs.glob("*.kernel.log"))


@pytest.mark.parametrize("args, code, words", [
    (["--notebook", "nowhere/resume.ipynb"], 2, ["--notebook nowhere/resume.ipynb: no such file"]),
    (["--store", "/dev/null"], 4, ["store /dev/null is a file"]),
])
def test_print_cron_checks_what_its_line_names(args, code, words, capsys, monkeypatch, tmp_path):
    """--print-cron printed (exit 0) a line naming a missing notebook or a file as the store: a line
    that fails at every run, found only in cron's mail."""
    monkeypatch.chdir(ROOT)
    got, out, err = in_process(["--runs-dir", str(tmp_path / "runs"), *args, "--print-cron"], capsys)
    lines = err.strip().splitlines()
    assert got == code and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(w in lines[0] for w in words), err
