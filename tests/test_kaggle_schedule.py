"""`kit schedule --kaggle` end to end: the real `kaggle` client (the official package) talks to
tests/kaggleserver.py, whose kernels run the pushed notebook with papermill on the CPU, training
the tiny default into a Hub store on tests/hubserver.py. A whole job runs over two sessions, the first
cut with kill -9 at a seeded random moment; then the ways a schedule stops, and every bad input.

The Kaggle endpoint cannot be configured in the client (it is https://api.kaggle.com, or
http://localhost with KAGGLE_API_ENVIRONMENT=LOCALHOST): the test server is reached as an HTTP
proxy for that localhost URL (see tests/kaggleserver.py). Nothing else is emulated on the way.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.code_asserts import words_in
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.kaggleserver import QUOTA_MESSAGE, KaggleServer
from tests.scripts import FAST, ROOT, cpu_env, kit_cli, train_here
from tests.test_resume import assert_same_training

if importlib.util.find_spec("papermill") is None:  # looked up, not imported (half a second of imports)
    pytest.skip("papermill is not installed (pip install -e \".[notebooks]\")", allow_module_level=True)
if importlib.util.find_spec("kaggle") is None:  # not imported here: importing it authenticates, noisily
    pytest.skip("the kaggle package is not installed (pip install -e \".[kaggle]\")", allow_module_level=True)

# A heartbeat every 0.5 s: a session cut with kill -9 is recorded (by the next one) to within 0.5 s.
STEPS = 200  # a session cut 0.3-2.5 s after its first checkpoint (step 20) has steps left to do
JOB = [f"max_steps={STEPS}", "save_steps=20", "keep_checkpoints=2", "lease_heartbeat_seconds=0.5", *FAST]
USER, KEY = "me", "kaggle-key-1"
REF = f"{USER}/kit-resume"


def kaggle_env(tmp: Path, hub_url: str, kaggle: KaggleServer | None, **extra) -> dict:
    """The scheduler's machine: Kaggle credentials of its own (never the user's real ~/.kaggle)."""
    env = cpu_env(HF_ENDPOINT=hub_url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
                  KAGGLE_CONFIG_DIR=str(tmp / "kaggle-config"), KAGGLE_USERNAME=USER, KAGGLE_KEY=KEY,
                  **(kaggle.client_env() if kaggle else {}))
    env.pop("KAGGLE_API_TOKEN", None)
    env.update(extra)
    return env


def session_env(hub_url: str, token: str | None = WRITE_TOKEN) -> dict:
    """A Kaggle session's environment: the attached secret HF_TOKEN (or none), no Kaggle credentials."""
    env = cpu_env(HF_ENDPOINT=hub_url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
    for name in ("HF_TOKEN", "KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "HTTP_PROXY", "http_proxy"):
        env.pop(name, None)
    if token:
        env["HF_TOKEN"] = token
    return env


def schedule(tmp: Path, env: dict, *extra: str, ref: str = REF, store: str = "hf://me/kaggle-job",
             timeout: float = 900) -> subprocess.CompletedProcess:
    args = ["schedule", "--kaggle", ref, "--config", "configs/default.yaml", "--kit-repo", str(ROOT),
            "--runs-dir", str(tmp / "runs"), "--poll", "0.5", "--nproc", "1", *extra, *JOB,
            f"store={store}", f"output_dir={tmp / 'local-out'}"]
    if "--loop" not in extra:  # one session's push or refusal: in this process
        return kit_cli(args, env=env)
    # A loop of sessions: a subprocess, so that its timeout ends a loop that would not stop.
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def whole_job(tmp_path_factory):
    """A session cut with kill -9 at a seeded random moment after its first checkpoint, then one that completes.

    One cut proves what more would: each session is a fresh Kaggle machine that resumes from the Hub alone
    (the next session after a cut reads the store and the cut session's record, whatever came before)."""
    tmp = tmp_path_factory.mktemp("kaggle-job")
    rng = random.Random(16)
    cuts = {1: round(rng.uniform(0.3, 2.5), 2)}
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub, \
            KaggleServer(tmp / "kaggle", users={USER: KEY}, kernel_env=session_env(hub.url), cut_after_s=cuts) as k:
        env = kaggle_env(tmp, hub.url, k)
        done = schedule(tmp, env, "--loop")
        shown = kit_cli(["status", "--config", "configs/default.yaml", *JOB, "store=hf://me/kaggle-job", "--json",
                         "--plot", str(tmp / "progress.png")], env=env)
        assert shown.returncode == 0, shown.stderr
        yield {"run": done, "server": k, "tmp": tmp, "cuts": cuts, "status": json.loads(shown.stdout)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same job uninterrupted, with the script a session renders for this machine (as the kernel does)."""
    tmp = tmp_path_factory.mktemp("kaggle-reference")
    script, out = tmp / "train_ddp.py", tmp / "run"
    rendered = kit_cli(["render", "--config", "configs/default.yaml", "-o", str(script)])
    assert rendered.returncode == 0, rendered.stderr
    r = train_here([f"output_dir={out}", *JOB], script=script)  # in this process: its own process is not the point
    assert r.returncode == 0, r.stderr[-3000:]
    return out / f"checkpoint-{STEPS}"


@pytest.mark.slow
def test_a_job_cut_with_kill_9_runs_to_completion_on_kaggle(whole_job, reference):
    r, k = whole_job["run"], whole_job["server"]
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert [v.cut for v in k.versions] == [True, False], r.stdout
    assert [v.state for v in k.versions] == ["ERROR", "COMPLETE"]
    lines = [line for line in r.stdout.splitlines() if ": outcome: " in line]
    assert len(lines) == 2 and ": outcome: complete: " in lines[-1] and \
        lines[-1].split("  (")[0].endswith(f"step {STEPS} of {STEPS}"), \
        r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("done: complete"), r.stdout
    # The same training as one uninterrupted run: nothing skipped or repeated, the same adapter.
    assert_same_training(reference, k.versions[-1].work / "out" / f"checkpoint-{STEPS}")


@pytest.mark.slow
def test_every_push_is_private_on_two_t4_with_internet_and_carries_no_token(whole_job):
    k = whole_job["server"]
    assert len(k.pushes) == 2
    for body in k.pushes:
        assert body["slug"] == REF and body["kernelType"] == "notebook" and body["language"] == "python"
        assert body["isPrivate"] is True and body["enableInternet"] is True and body["enableGpu"] is True
        assert body["machineShape"] == "NvidiaTeslaT4"
        assert WRITE_TOKEN not in json.dumps(body)
    runs = whole_job["tmp"] / "runs"
    assert all(WRITE_TOKEN not in p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file())


@pytest.mark.slow
def test_each_sessions_output_and_hours_are_kept(whole_job):
    runs = whole_job["tmp"] / "runs"
    outputs = sorted(p for p in runs.iterdir() if p.is_dir() and p.name != "kaggle-push")
    assert len(outputs) == 2
    outcome = json.loads((outputs[-1] / "kit-outcome.json").read_text())["outcome"]
    assert outcome.startswith("complete: ") and outcome.endswith(f"step {STEPS} of {STEPS}")
    hours = [json.loads(line) for line in (runs / "kaggle-sessions.jsonl").read_text().splitlines()]
    assert [h["state"] for h in hours] == ["error", "complete"]
    assert all(0 < h["hours"] < 0.5 for h in hours)


@pytest.mark.slow
def test_the_ledger_accounts_for_every_session_and_the_steps_each_cut_lost(whole_job):
    facts, k = whole_job["status"], whole_job["server"]
    sessions = facts["sessions"]
    assert [s["outcome"] for s in sessions] == ["cut", "complete"], sessions
    led = facts["goodput"]
    for cut, after, version in zip(sessions, sessions[1:], k.versions):
        # Each cut session is recorded as of its last heartbeat; its log says how far it really got.
        reached = max(int(m) for m in re.findall(rf"(\d+)/{STEPS} \[", version.log))
        assert cut["end_step"] - 2 <= reached <= cut["end_step"] + 40, (cut, reached)  # tqdm's line lags a step
        # The record may miss a checkpoint published in the instant before the kill (not yet heartbeated).
        assert cut["stored_step"] <= after["start_step"] <= max(cut["end_step"], cut["stored_step"] + 20)
    rows = led["sessions"]
    assert [r["steps_lost"] for r in rows[:-1]] == [max(0, c["end_step"] - n["start_step"])
                                                   for c, n in zip(sessions, sessions[1:])]
    assert led["steps_recomputed"] == sum(r["steps_lost"] for r in rows)
    assert led["gpu_hours"] == pytest.approx(sum(s["ended"] - s["started"] for s in sessions) / 3600)
    # Steps that stayed: all of them, less at most one checkpoint per cut whose record missed it (see above).
    assert STEPS - len(whole_job["cuts"]) * 20 <= sum(r["steps_done"] for r in rows) - led["steps_recomputed"] <= STEPS
    assert 0 < led["goodput"] < 1 and led["hours_left"] == 0 and led["sessions_needed"] == 0
    assert (whole_job["tmp"] / "progress.png").stat().st_size > 10_000


# -- the stop rules -------------------------------------------------------------------------
@pytest.fixture
def hub():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        yield server


@pytest.mark.slow
def test_a_session_without_the_token_stops_the_schedule_at_once(tmp_path, hub):
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url, token=None)) as k:
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k), "--loop")
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(k.versions) == 1  # no second push burning quota
    assert "stopped: " in r.stdout and "no Hugging Face token" in r.stdout and "secret named HF_TOKEN" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_kernel_error_before_any_progress_stops_with_its_reason(tmp_path, hub):
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url)) as k:
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k), "--loop", "--kit-repo", str(tmp_path / "no-kit"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(k.versions) == 1
    assert "stopped: the session" in r.stdout and "made no progress" in r.stdout
    assert "(the store stayed at" in r.stdout and "failed: kernel error" in r.stdout
    assert "its log ends:" in r.stdout


def test_the_weekly_quota_counted_by_the_schedule_stops_it_before_a_push(tmp_path, hub):
    runs = tmp_path / "runs"
    runs.mkdir()
    import time

    (runs / "kaggle-sessions.jsonl").write_text(json.dumps({"ended": time.time() - 3600, "hours": 11.9}) + "\n")
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url)) as k:
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k), "--loop", "--max-gpu-hours", "20")
    assert r.returncode == 1, r.stdout + r.stderr
    assert k.pushes == []
    assert "stopped: the GPU quota" in r.stdout and "11.90 h used of" in r.stdout and "--max-gpu-hours 20" in r.stdout


@pytest.mark.slow
def test_kaggles_own_quota_refusal_is_one_line_exit_4(tmp_path, hub):
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url), quota_s=0) as k:
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k), "--loop")
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: Kaggle API") and "rejected" in r.stderr
    assert r.stderr.strip().endswith(f"push: {QUOTA_MESSAGE}")
    assert k.versions == []


# -- bad input: one line, exit 2 or 4, no push loop -----------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("ref", ["kit-resume", "me/kit/resume", "me/Kit_Resume", "me/abc", "/x"])
def test_a_slug_that_is_not_user_slug_is_refused(tmp_path, ref):
    r = schedule(tmp_path, kaggle_env(tmp_path, "http://127.0.0.1:9", None), ref=ref)
    assert r.returncode == 2 and r.stderr.startswith(f"error: --kaggle {ref!r} "), r.stderr
    assert "is not USER/SLUG" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_no_kaggle_credentials_is_a_usage_error(tmp_path):
    env = kaggle_env(tmp_path, "http://127.0.0.1:9", None)
    del env["KAGGLE_USERNAME"], env["KAGGLE_KEY"]
    r = schedule(tmp_path, env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: no Kaggle") and "credentials" in r.stderr and "an API token" in r.stderr


def test_refused_credentials_are_one_line_exit_4(tmp_path, hub):
    with KaggleServer(tmp_path / "k", users={USER: "another-key"}, kernel_env=session_env(hub.url)) as k:
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k))
    assert r.returncode == 4, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: Kaggle API") and "refused" in r.stderr
    assert "(HTTP 401: " in r.stderr and "Unauthenticated)" in r.stderr and "during status" in r.stderr
    assert r.stderr.strip().endswith("or kaggle.json") and "check KAGGLE_API_TOKEN" in r.stderr
    assert KEY not in r.stdout + r.stderr and k.versions == []


@pytest.mark.slow
def test_an_access_token_is_accepted_through_introspection(tmp_path, hub):
    with KaggleServer(tmp_path / "k", tokens={"KGAT_0123456789abcdef": USER}, kernel_env=session_env(hub.url, None)) as k:
        env = kaggle_env(tmp_path, hub.url, k, KAGGLE_API_TOKEN="KGAT_0123456789abcdef")
        del env["KAGGLE_USERNAME"], env["KAGGLE_KEY"]
        r = schedule(tmp_path, env)
    assert len(k.versions) == 1, r.stdout + r.stderr  # pushed with the token (then stopped: no HF token there)
    assert "KGAT_0123456789abcdef" not in r.stdout + r.stderr


@pytest.mark.slow
def test_a_rejected_push_shows_kaggles_message(tmp_path, hub):
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url)) as k:
        k.reject_next = (400, "Notebook title must be at least 5 characters")
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k), "--loop")
    assert r.returncode == 4, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: Kaggle API") and "rejected" in r.stderr
    assert "push: HTTP 400: " in r.stderr and "at least 5 characters" in r.stderr
    assert len(k.pushes) == 1 and k.versions == []


def test_an_unreachable_kaggle_api_is_one_line_exit_4(tmp_path, hub):
    port = closed_port()
    env = kaggle_env(tmp_path, hub.url, None, KAGGLE_API_ENVIRONMENT="LOCALHOST",
                     HTTP_PROXY=f"http://127.0.0.1:{port}", http_proxy=f"http://127.0.0.1:{port}",
                     NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    r = schedule(tmp_path, env, "--loop")
    assert r.returncode == 4, r.stderr
    assert r.stderr.startswith("error: Kaggle API") and "unreachable during" in r.stderr and "status: " in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_directory_store_is_refused_for_kaggle(tmp_path):
    r = schedule(tmp_path, kaggle_env(tmp_path, "http://127.0.0.1:9", None), store=str(tmp_path / "store"))
    assert r.returncode == 2
    assert "--kaggle needs a Hub" in r.stderr and "(store=hf://USER/NAME)" in r.stderr


@pytest.mark.slow
def test_a_session_already_running_is_waited_for_never_pushed_over(tmp_path, hub):
    """Started elsewhere (the web UI, another machine): the schedule waits for it and pushes nothing."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(2)")])
    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url)) as k:
        k.start({"text": nbformat.writes(nb)})
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k))
    assert k.pushes == [] and len(k.versions) == 1, r.stdout + r.stderr
    assert f"{REF} is already running;" in r.stdout and "waiting for that session" in r.stdout
    assert "made no progress" in r.stdout and r.returncode == 1  # it was not a kit session


def test_a_second_schedule_of_the_same_runs_folder_refuses(tmp_path, hub):
    from kit.notebooks.schedule.runs_lock import RunsLock

    with KaggleServer(tmp_path / "k", users={USER: KEY}, kernel_env=session_env(hub.url)) as k, \
            RunsLock(tmp_path / "runs"):
        r = schedule(tmp_path, kaggle_env(tmp_path, hub.url, k))
    assert r.returncode == 2 and "another `kit schedule`" in r.stderr and k.pushes == []


def test_print_cron_for_kaggle_only_prints_a_tick_that_schedules_one_session(tmp_path):
    r = schedule(tmp_path, kaggle_env(tmp_path, "http://127.0.0.1:9", None), "--print-cron", "--max-gpu-hours", "20")
    assert r.returncode == 0, r.stderr
    assert words_in(r.stdout, "--kaggle", REF, "--max-gpu-hours", "20") and "--loop" not in r.stdout
    assert not (tmp_path / "runs" / "kaggle-push").exists()


@pytest.mark.slow
def test_a_refused_access_token_is_one_line_without_the_packages_help_page(tmp_path, hub):
    with KaggleServer(tmp_path / "k", tokens={"KGAT_good": USER}, kernel_env=session_env(hub.url)) as k:
        env = kaggle_env(tmp_path, hub.url, k, KAGGLE_API_TOKEN="KGAT_expired")
        del env["KAGGLE_USERNAME"], env["KAGGLE_KEY"]
        r = schedule(tmp_path, env)
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: Kaggle API") and "refused" in r.stderr
    assert "during status (" in r.stderr and "(KAGGLE_API_TOKEN):" in r.stderr and r.stderr.strip().endswith("or kaggle.json")
    assert "Authentication required" not in r.stdout and "KGAT_expired" not in r.stdout + r.stderr
    assert k.pushes == []


@pytest.mark.parametrize("status,transient", [(503, True), (429, True), (400, False), (None, True)])
def test_which_kaggle_failures_are_asked_again(tmp_path, monkeypatch, status, transient):
    """The real kaggle client and requests' own errors, in-process: no answer, no connection, 429
    and 5xx are KaggleUnavailable (status polls and the output download retry them); a refusal is not."""
    import requests

    from kit.notebooks.schedule import kaggle_api

    for key, value in kaggle_env(tmp_path, "http://127.0.0.1:9", None).items():
        if key.startswith("KAGGLE_"):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("KAGGLE_API_TOKEN", raising=False)

    def fails(api):
        if status is None:
            raise requests.ConnectionError("connection refused")
        response = requests.Response()
        response.status_code, response._content = status, b'{"message": "busy"}'
        raise requests.HTTPError(response=response)

    with pytest.raises(kaggle_api.KaggleError) as err:
        kaggle_api._call("status", fails, timeout_s=30)
    assert isinstance(err.value, kaggle_api.KaggleUnavailable) == transient, err.value


def test_the_weeks_hours_count_usable_lines_only(tmp_path, caplog):
    from kit.notebooks.schedule.kaggle_run import HOURS_FILE, hours_this_week

    now = 1_800_000_000.0
    (tmp_path / HOURS_FILE).write_bytes(
        b'{"ended": %d, "hours": 2.5}\n\xff\n{"ended": "x", "hours": 1}\n{"ended": %d, "hours": "9"}\n'
        b'{"ended": %d, "hours": NaN}\n[1]\n\n{"ended": %d, "hours": 1.0}\n{"ref": "me/x", "ended' % (now - 60, now, now, now - 8 * 86400))
    assert hours_this_week(tmp_path, now) == (2.5, 2.5)  # the 8-day-old session is out of the week
    assert len(caplog.messages) == 6 and all(m.endswith("ignoring it") for m in caplog.messages)
