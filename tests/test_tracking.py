"""Experiment tracking (report_to): the setting and its checks at plan, render and launch, the rank-0
only switch with kit's run id, the trackers' keys (found, scrubbed, refused as settings and as
papermill parameters).

A tracker kit must see as missing is made missing for real: `sys.modules[name] = None` makes
`importlib.util.find_spec` (what transformers and kit ask) answer None. wandb is not in the test
extra, so a test that needs it present puts an empty `wandb` package on sys.path (said there).
Kaggle's and Colab's secret stores are faked as in test_auth.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from kit import auth
from kit.cli import main
from kit.errors import UsageError
from kit.notebooks.schedule import loop as schedule
from kit.planning import config, tracking
from kit.redaction import holds_token, redact
from kit.train import tracking as launch
from kit.train.dist import Context
from tests.code_asserts import squeeze
from tests.test_auth import clean_env, fake_colab, fake_kaggle  # noqa: F401  (fixture, fakes)
from tests.test_bad_input import MACHINES, TOKEN, check_contract, run_script_in_process, sandbox, snapshot  # noqa: F401

WANDB_KEY = "fakeWANDBkey" + "0123456789abcdef0123456789"  # as WANDB_API_KEY: must never come back
TRACKER_VARS = ("WANDB_API_KEY", "TRACKIO_WRITE_TOKEN", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR", "WANDB_MODE",
                "TENSORBOARD_LOGGING_DIR", "NETRC")


@pytest.fixture(autouse=True)
def no_tracker_env(monkeypatch, tmp_path):
    for var in TRACKER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc of the caller's
    monkeypatch.setattr(launch, "_ours", {})


def missing(monkeypatch, *names):
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def fake_wandb_installed(monkeypatch, tmp_path):
    """An empty `wandb` package: wandb is not in the test extra, and only its presence is checked here."""
    pkg = tmp_path / "site" / "wandb"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)


# ---- the setting ---------------------------------------------------------------------------------
def test_report_to_is_a_setting_with_its_choices():
    assert config.RunConfig().report_to == "none"
    assert "trackio" in dict((k, h) for k, h, _ in config.describe())["report_to"]
    for value in tracking.CHOICES:
        assert config.load(None, [f"report_to={value}"]).report_to == value


@pytest.mark.parametrize("argv, want", [
    (["plan", "report_to=wandbb"], "'report_to' in command line is 'wandbb'; expected one of "
                                   "none|auto|trackio|wandb|tensorboard \\(did you mean 'wandb'\\?\\)"),
    (["plan", "report_to=[wandb, tensorboard]"], "'report_to' in command line must be a string"),
    (["plan", "tracker=wandb"], "did you mean 'report_to'"),
    (["plan", f"report_to={WANDB_KEY}"], "'report_to'.*token or a tracker's key"),
])
def test_bad_report_to_is_one_line_exit_2(sandbox, capsys, monkeypatch, argv, want):
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    before = snapshot(sandbox)
    got = main(argv)
    out, err = capsys.readouterr()
    check_contract(sandbox, before, got, out, err, 2, want)
    assert WANDB_KEY not in out + err


# ---- the decision --------------------------------------------------------------------------------
def test_auto_picks_trackio_only_where_it_is_installed():
    assert tracking.choose("auto", {"trackio": True, "wandb": True, "tensorboard": True})[0] == "trackio"
    # Kaggle's and Colab's images carry wandb and tensorboard: auto does not take them as a wish.
    tracker, why = tracking.choose("auto", {"trackio": False, "wandb": True, "tensorboard": True})
    assert (tracker, why.code) == ("none", "tracker_auto_none")  # it says `pip install trackio`
    assert tracking.choose("auto", {})[0] == "none"  # not known (an assumed machine): settled at launch
    assert tracking.choose("none", {"trackio": True}) == ("none", None)


@pytest.mark.parametrize("tracker", tracking.TRACKERS)
def test_a_named_tracker_not_installed_is_refused_with_its_pip_package(tracker):
    with pytest.raises(UsageError) as e:
        tracking.choose(tracker, {tracker: False})
    assert e.value.exit_code == 2 and f"`pip install {tracking.PIP[tracker]}`" in str(e.value)
    assert tracking.choose(tracker, {tracker: True})[0] == tracker
    assert tracking.choose(tracker, {})[1]["known"] is False


def test_installed_here_asks_the_import_system(monkeypatch):
    missing(monkeypatch, "trackio", "wandb", "tensorboard", "tensorboardX")
    assert tracking.installed_here() == {"trackio": False, "wandb": False, "tensorboard": False}


# ---- plan and render -----------------------------------------------------------------------------
def facts_file(sandbox, **packages) -> str:
    facts = json.loads((MACHINES / "kaggle_t4x2.json").read_text())
    facts["packages"] = {**facts["packages"], **packages}
    (sandbox / "f.json").write_text(json.dumps(facts))
    return "f.json"


@pytest.mark.parametrize("command", ["plan", "render"])
def test_plan_and_render_refuse_a_tracker_the_machine_lacks(sandbox, capsys, command):
    f = facts_file(sandbox, wandb=None, trackio="0.43.0")
    argv = [command, "--config", "configs/default.yaml", "--facts", f, "report_to=wandb"]
    before = snapshot(sandbox)
    got = main(argv + (["-o", "t.py"] if command == "render" else []))
    out, err = capsys.readouterr()
    check_contract(sandbox, before, got, out, err, 2, "report_to=wandb, but wandb is not installed on the machine "
                                                      "planned for: `pip install wandb`")
    assert main(["plan", "--config", "configs/default.yaml", "--facts", f, "report_to=auto", "--json"]) == 0
    reasons = json.loads(capsys.readouterr().out)["reasons"]
    assert "tracker_auto_trackio" in [r["code"] for r in reasons], reasons


def test_the_script_shows_the_tracker_on_its_report_to_line(sandbox, capsys):
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", "-o", "t.py",
                 "report_to=tensorboard"]) == 0
    text = (sandbox / "t.py").read_text()
    assert "'report_to':'tensorboard'" in squeeze(text)
    line = next(i for i, s in enumerate(text.splitlines()) if s.strip().startswith("report_to="))
    lines = text.splitlines()
    assert "report_to: tensorboard" in lines[line - 2] and "rank 0" in lines[line - 2]
    code, comment = lines[line].strip().split("  # ")
    assert squeeze(code) == 'report_to=tracking.report_to(cfg,ctx,job.run.get("run_id")),'
    assert comment.startswith("None: a smoke") and "untracked" in comment
    assert lines[line + 1].strip() == 'run_name=job.run.get("run_id"),'


# ---- the script at launch --------------------------------------------------------------------------
def test_the_script_refuses_a_missing_tracker_before_any_model_loads(sandbox, capsys, monkeypatch):
    missing(monkeypatch, "wandb")
    before = snapshot(sandbox)
    code = run_script_in_process(sandbox, ["report_to=wandb", "output_dir=out"])
    out, err = capsys.readouterr()
    check_contract(sandbox, before, code, out, err, 2, "report_to=wandb, but wandb is not installed here: "
                                                       "`pip install wandb`")
    assert not (sandbox / "out").exists(), "refused before output_dir was made"


def test_wandb_without_a_key_is_refused_at_launch(sandbox, capsys, monkeypatch, tmp_path):
    fake_wandb_installed(monkeypatch, tmp_path)
    before = snapshot(sandbox)
    code = run_script_in_process(sandbox, ["report_to=wandb", "output_dir=out"])
    out, err = capsys.readouterr()
    check_contract(sandbox, before, code, out, err, 2, "report_to=wandb, but no W&B key: set WANDB_API_KEY")
    cfg = config.load(None, ["report_to=wandb"])
    monkeypatch.setenv("WANDB_MODE", "offline")  # offline runs need no key
    assert launch.settle(cfg) == "wandb"
    monkeypatch.delenv("WANDB_MODE")
    assert launch.settle(cfg, rank=1) == "wandb"  # only rank 0 looks for the key: it alone logs
    netrc = tmp_path / "home" / ".netrc"
    netrc.parent.mkdir()
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + WANDB_KEY + "\n")
    assert launch.settle(cfg) == "wandb"  # `wandb login` wrote it


def test_a_wandb_key_from_a_kaggle_secret_reaches_wandb_and_is_scrubbed(monkeypatch, tmp_path):
    fake_wandb_installed(monkeypatch, tmp_path)
    fake_kaggle_named(monkeypatch, {"WANDB_API_KEY": WANDB_KEY})
    assert launch.settle(config.load(None, ["report_to=wandb"])) == "wandb"
    assert os.environ["WANDB_API_KEY"] == WANDB_KEY  # this process's environment, where wandb reads it
    assert redact(f"key {WANDB_KEY} in a line") == "key *** in a line"


# ---- rank 0 only, named by the run id --------------------------------------------------------------
def ctx(rank: int) -> Context:
    import torch

    return Context(rank=rank, local_rank=rank, world_size=2, device=torch.device("cpu"), backend="gloo")


def test_only_rank_0_reports_and_tensorboard_logs_under_output_dir(tmp_path):
    cfg = config.load(None, ["report_to=tensorboard", f"output_dir={tmp_path / 'out'}"])
    assert launch.report_to(cfg, ctx(1), "20261206-0000-abcdef") == "none"
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ, "rank 1 set nothing up"
    assert launch.report_to(cfg, ctx(0), None) == "none", "a smoke run (no run id) is never tracked"
    assert launch.report_to(cfg, ctx(0), "20261206-0000-abcdef") == ["tensorboard"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "out" / "runs" / "20261206-0000-abcdef")
    # A second job in the same process (a notebook) gets its own folder; a folder the user chose is kept.
    assert launch.report_to(cfg, ctx(0), "20261206-0001-123456") == ["tensorboard"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"].endswith("20261206-0001-123456")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(tmp_path / "mine")
    launch.report_to(cfg, ctx(0), "20261206-0002-aaaaaa")
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "mine")


def test_wandb_resumes_the_run_named_by_kits_run_id(monkeypatch, tmp_path):
    fake_wandb_installed(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    cfg = config.load(None, ["report_to=wandb", f"output_dir={tmp_path / 'out'}"])
    assert launch.report_to(cfg, ctx(0), "20261206-0000-abcdef") == ["wandb"]
    assert (os.environ["WANDB_RUN_ID"], os.environ["WANDB_RESUME"]) == ("20261206-0000-abcdef", "allow")
    assert os.environ["WANDB_DIR"] == str(tmp_path / "out"), "wandb's files in output_dir, not the current folder"


# ---- keys: found like HF_TOKEN, never shown, never a setting or a parameter --------------------------
def fake_kaggle_named(monkeypatch, secrets: dict):
    fake_kaggle(monkeypatch)
    import kaggle_secrets

    class Client(kaggle_secrets.UserSecretsClient):
        def get_secret(self, label):
            if label not in secrets:
                raise kaggle_secrets.BackendError("no such secret")
            return secrets[label]

    monkeypatch.setattr(kaggle_secrets, "UserSecretsClient", Client)


def test_find_secret_reads_the_environment_then_kaggle_then_colab(monkeypatch):
    assert auth.find_secret("WANDB_API_KEY") == (None, None)
    fake_kaggle_named(monkeypatch, {"WANDB_API_KEY": " kaggle-key-value "})
    assert auth.find_secret("WANDB_API_KEY") == ("kaggle-key-value", "Kaggle secret")
    assert auth.find_secret("OTHER") == (None, None)
    monkeypatch.setenv("WANDB_API_KEY", "env-key-value")
    assert auth.find_secret("WANDB_API_KEY") == ("env-key-value", "WANDB_API_KEY env")
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    fake_colab(monkeypatch, value="colab-key-value")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab")
    assert auth.find_secret("WANDB_API_KEY") == ("colab-key-value", "Colab secret")


@pytest.mark.parametrize("var", ["WANDB_API_KEY", "TRACKIO_WRITE_TOKEN"])
def test_tracker_keys_in_the_environment_are_scrubbed_and_refused_as_settings(monkeypatch, var):
    monkeypatch.setenv(var, WANDB_KEY)
    assert redact(f"wandb: key={WANDB_KEY}") == "wandb: key=***"
    assert holds_token(f"x{WANDB_KEY}x")
    with pytest.raises(UsageError) as e:
        config.load(None, [f"data.path={WANDB_KEY}.jsonl"])
    assert e.value.exit_code == 2 and WANDB_KEY not in str(e.value)


def test_no_tracker_key_travels_as_a_papermill_parameter(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    for values in ([f"store=/data/{WANDB_KEY}"], ["wandb_api_key=abc"], ["WANDB_API_KEY=abc"],
                   [f"config={WANDB_KEY}.yaml"]):
        with pytest.raises(UsageError) as e:
            schedule.refuse_tokens(values)
        assert "refusing to pass a token" in str(e.value) and WANDB_KEY not in str(e.value)
    schedule.refuse_tokens(["store=/data/store", "report_to=wandb", "config=configs/default.yaml"])


# ---- real runs: torchrun, 2 gloo ranks (one process where said), the tiny default --------------------
def _written(root) -> dict:
    from pathlib import Path

    return {p: p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}


def _no_secret_in(*roots) -> None:
    for root in roots:
        for path, data in _written(root).items():
            assert WANDB_KEY.encode() not in data and TOKEN.encode() not in data, path


def _two_sessions(tmp_path, tracker: str, nproc: int = 2, **env):
    """Train to step 4, then extend the same job to 6 (a resume), with fake keys in the environment."""
    from tests.scripts import FAST, ROOT, cpu_env, train

    out, store = tmp_path / "out", tmp_path / "store"
    given = {"WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": TOKEN, **env}
    env = {k: v for k, v in cpu_env(**given).items() if k in given or k not in TRACKER_VARS}  # no caller's
    logs = []
    for steps in (4, 6):
        r = train([f"output_dir={out}", f"store={store}", f"max_steps={steps}", "save_steps=2", *FAST,
                   f"report_to={tracker}"], env=env, nproc=nproc)
        logs.append(r.stdout + r.stderr)
        assert r.returncode == 0, logs[-1][-3000:]
    assert "resuming from step 4" in logs[1]
    run_id = json.loads((out / "kit_run.json").read_text())["run_id"]
    assert f"run id: {run_id}" in logs[0] and f"run id: {run_id}" in logs[1]
    for name in ("runs", "wandb", "trackio"):
        assert not (ROOT / name).exists(), f"a tracker wrote {name}/ into the kit checkout (the current folder)"
    for folder in [*out.glob("checkpoint-*"), store]:  # checkpoints and the store hold no tracker files
        assert not [p for p in folder.rglob("*") if "tfevents" in p.name or p.suffix == ".db"], folder
    return out, store, run_id, logs


@pytest.mark.slow
def test_tensorboard_on_rank_0_one_run_continued_by_the_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, store, run_id, _ = _two_sessions(tmp_path, "tensorboard")
    events = sorted(p for p in tmp_path.rglob("*") if "tfevents" in p.name)
    # One event file per session, both in the run's folder: rank 1 wrote none.
    assert [p.parent for p in events] == [out / "runs" / run_id] * 2, events
    acc = EventAccumulator(str(out / "runs" / run_id))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert all(e.value > 0 for e in acc.Scalars("train/loss"))
    # The arguments logged are rank 0's: each rank trains with seed + rank (42 is rank 0's).
    args = [json.loads(t.tensor_proto.string_val[0]) for t in acc.Tensors("args/text_summary")]
    assert [a["seed"] for a in args] == [42, 42] and {a["run_name"] for a in args} == {run_id}
    _no_secret_in(tmp_path)


@pytest.mark.slow
def test_trackio_local_one_run_continued_by_the_resume(tmp_path):
    pytest.importorskip("trackio")
    import sqlite3

    home = tmp_path / "trackio"
    # One process: the tracker on rank 0 alone is one switch for every tracker (kit.train.tracking.report_to),
    # asserted under two ranks by the tensorboard test above; the point here is trackio's run continued.
    out, store, run_id, logs = _two_sessions(tmp_path, "trackio", nproc=1, TRACKIO_DIR=home)
    assert "Resumed existing run" in logs[1] or run_id in logs[1]
    dbs = sorted(home.glob("*.db"))
    assert [p.name for p in dbs] == ["huggingface.db"], dbs  # trackio's default project, in its own home
    rows = sqlite3.connect(dbs[0]).execute("select run_name, metrics from metrics").fetchall()
    assert {name for name, _ in rows} == {run_id}, "one tracked run: kit's run id, continued by the resume"
    steps = [json.loads(m)["train/global_step"] for _, m in rows if "train/loss" in json.loads(m)]
    assert steps == [1, 2, 3, 4, 5, 6]
    _no_secret_in(tmp_path)


@pytest.mark.slow
def test_wandb_offline_on_rank_0_keeps_the_run_id_across_the_resume(tmp_path):
    """wandb is not in the test extra (Kaggle's and Colab's images carry it): skipped where it is absent."""
    pytest.importorskip("wandb")
    out, store, run_id, logs = _two_sessions(tmp_path, "wandb", WANDB_MODE="offline", HOME=tmp_path / "home")
    runs = sorted((out / "wandb").glob("offline-run-*"))
    # One run folder per session, both rank 0's and under kit's run id (`wandb sync` joins them: resume=allow).
    assert [p.name.rsplit("-", 3)[1:] for p in runs] == [run_id.split("-")] * 2, runs
    assert all((p / f"run-{run_id}.wandb").is_file() for p in runs)
    _no_secret_in(tmp_path)
