"""Issue 11 as a new user meets it: the README's path, progress and exit codes that must not
mislead, next steps that name the right script, and data that is odd but usable.

Bad input (one line, the right code, nothing lost, no token) is in tests/test_bad_input.py; these
are the behaviours around it, one or more per item of the issue.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit.planning import config
from kit.train import data
from kit.checkpoints import resume, status
from kit import cli
from kit.cli import main
from tests.code_asserts import words_in
from tests.scripts import FAST, ROOT, cpu_env, train, train_here

README = (ROOT / "README.md").read_text()
MACHINES = ROOT / "tests" / "fixtures" / "machines"


# ---- items 2, 3, 5: the README -----------------------------------------------------------------
def test_readme_notebook_cd_is_a_line_of_its_own():
    cells = re.findall(r"```python\n(.*?)```", README, re.S)
    lines = [line for cell in cells for line in cell.splitlines()]
    assert "%cd kit" in lines  # IPython's magic, not a shell command that exits at once
    assert not [line for line in lines if line.startswith("!") and "%cd" in line]


def test_readme_keeps_its_two_commands_and_names_the_cpu_index():
    assert words_in(README, "pip", "install", "torch", "&&", "pip", "install", "-e", '".[train]"', "&&",
                    "torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py")
    assert words_in(README, "pip", "install", "-e", '".[train,notebooks,test]"', "&&", "python", "-m", "pytest", "-q")
    # CI runs README's test command as it is: the line in .ci/run is one of README's lines.
    ci_line = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_line.startswith("pip install -e") and ci_line in README.splitlines()
    assert words_in(README, "pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu")


def test_parameter_counts_agree_between_readme_and_run():
    from kit.train import modeling
    from kit.planning.plan import Plan

    cfg = config.load("configs/default.yaml")
    plan = Plan(strategy="single", device="cpu", per_device_batch=8, grad_accum=2, global_batch=16)
    ctx = SimpleNamespace(device=__import__("torch").device("cpu"), local_rank=0, rank=0, world_size=1, is_main=True)
    model, _ = modeling.load(cfg, plan, ctx)
    from peft import LoraConfig

    lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, target_modules=modeling.target_modules(cfg, model),
                      task_type="CAUSAL_LM")  # as train_ddp.py builds it
    line = modeling.trainable_summary(modeling.add_lora(model, cfg, plan, lora))
    assert line.startswith("trainable parameters: ") and re.findall(r"[\d,]{5,}", line)[:4] == [
        "32,768", "139,648", "106,880", "32,768"]  # trainable of total; frozen + trainable
    assert "107k-parameter Qwen3" in README and "32,768 of 139,648" in README and "106,880" in README


# ---- item 4: peak memory on the CPU --------------------------------------------------------------
def test_cpu_runs_report_peak_host_ram():
    import torch

    from kit.train.callbacks import Meter, meter_words

    meter = Meter(torch.device("cpu"), tokens_per_step=100.0)
    state = SimpleNamespace(global_step=0)
    meter.on_train_begin(None, state, None)
    for _ in range(4):
        meter.on_step_end(None, state, None)
    summary = meter.summary()
    assert summary["peak_rss_bytes"] > 2**20
    assert "peak host RAM of rank 0:" in meter_words(summary)
    assert "peak RAM" in status.session_line(1, {"peak_rss_bytes": 2**30, "world_size": 1})


# ---- item 6: one target ----------------------------------------------------------------------------
@pytest.mark.parametrize("configured,step,recorded,target", [
    (60, None, None, 60), (60, 40, 60, 60), (60, 100, 100, 100), (60, 80, 100, 100), (60, 60, 60, 60),
    (None, 10, 60, 60), (200, 100, 100, 200)])
def test_current_target(configured, step, recorded, target):
    assert resume.current_target(configured, step, recorded) == target


@pytest.mark.parametrize("configured,step,recorded,target", [(90, 80, 100, 90), (80, 80, 100, 80), (120, 80, 100, 120)])
def test_a_target_given_on_the_command_line_is_the_target(configured, step, recorded, target):
    assert resume.current_target(configured, step, recorded, given=False) == (100 if configured <= step else target)
    assert resume.current_target(configured, step, recorded, given=True) == target


@pytest.mark.slow
def test_an_extended_job_reports_one_target_everywhere(tmp_path):
    """Train a 2-step config, extend it with max_steps=4 on the command line: the checkpoint, the
    script and `kit status` (which `kit schedule`'s notebook reads) all say 4, never "4 of 2"."""
    c = tmp_path / "c.yaml"
    c.write_text((ROOT / "configs/default.yaml").read_text().replace("max_steps: 60", "max_steps: 2")
                 .replace("save_steps: 20", "save_steps: 2").replace("outputs/default", str(tmp_path / "run")))
    assert train_here(["--config", str(c), *FAST]).returncode == 0
    r = train_here(["--config", str(c), "max_steps=4", *FAST])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "complete: step 4 of 4" in r.stdout
    assert json.loads((tmp_path / "run/checkpoint-4/trainer_state.json").read_text())["max_steps"] == 4
    again = train_here(["--config", str(c)])  # the config still says 2
    assert "already complete: " in again.stdout and "step 4 of 4" in again.stdout, again.stdout[-2000:]
    s = status.gather(config.load(str(c)))
    assert (s["latest_step"], s["max_steps"], s["complete"]) == (4, 4, True)
    assert "step 4 of 4 (100 %)" in status.format_text(s) and "— complete" in status.format_text(s)


@pytest.mark.slow
def test_a_job_cut_in_its_wrap_up_finishes_it_and_an_explicit_target_ends_an_extended_job(tmp_path):
    """A session cut after its last checkpoint but before final/ did not finish the job: the same
    command runs the wrap-up and trains no step more (Trainer resumed mid-epoch at max_steps trained
    one). max_steps=N on the command line is the target even below the one the job was extended to;
    below the checkpoint's own step it is refused, and nothing is touched."""
    c = tmp_path / "c.yaml"
    run = tmp_path / "run"
    c.write_text((ROOT / "configs/default.yaml").read_text().replace("max_steps: 60", "max_steps: 2")
                 .replace("save_steps: 20", "save_steps: 2").replace("outputs/default", str(run)))
    assert train_here(["--config", str(c), "max_steps=6", *FAST]).returncode == 0
    # The session that ran to 6 is cut after its checkpoint-4: 6 and final/ never happened.
    shutil.rmtree(run / "checkpoint-6")
    shutil.rmtree(run / "final")
    assert status.gather(config.load(str(c)))["max_steps"] == 6  # the plain command would go on to 6

    below = train_here(["--config", str(c), "max_steps=3", *FAST])
    assert below.returncode == 2 and "error: max_steps=3 " in below.stderr and "checkpoint-4" in below.stderr
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    s = status.gather(config.load(str(c), ["max_steps=4"]), steps_given=True)
    assert (s["latest_step"], s["max_steps"], s["complete"]) == (4, 4, False)
    assert s["complete"] is False and "did not finish" in status.format_text(s)

    ended = train_here(["--config", str(c), "max_steps=4", *FAST])
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert "checkpoint-4 is the" in ended.stdout and "wrap-up" in ended.stdout
    assert "complete: step 4 of 4" in ended.stdout
    assert not (run / "checkpoint-5").exists()  # no step trained past the target
    assert json.loads((run / "final/eval_results.json").read_text())["step"] == 4
    s = status.gather(config.load(str(c), ["max_steps=4"]), steps_given=True)
    assert s["complete"] and s["final_step"] == 4


# ---- item 7: bootstrap on a CPU machine -------------------------------------------------------------
def test_bootstrap_with_config_on_cpu_exits_0_with_one_next_line(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    code = main(["bootstrap", "--facts", str(MACHINES / "cpu_only.json"), "--config", "configs/default.yaml",
                 "-o", str(out)])
    printed = capsys.readouterr()
    assert code == 0 and out.exists() and printed.err == ""
    # One line says what to do next, and nothing else does: the verdict's "use a machine with a
    # GPU" advice is not repeated under a plan that trains here.
    lines = printed.out.splitlines()
    nexts = [line for line in lines if re.search(r"(?i)\b(next|do this)\b", line)]
    assert nexts == [lines[-1]] and lines[-2] == f"Wrote {out}"
    assert nexts[0].startswith(f"Next: python {out}  (") and "CPU: slow" in nexts[0]


def test_bootstrap_without_config_on_cpu_says_config_gives_a_script(tmp_path, monkeypatch, capsys):
    outcome = cli.run(["bootstrap", "--facts", str(MACHINES / "cpu_only.json")])
    printed = capsys.readouterr()
    # exit 0: the default job trains here, and the one next line is the command that writes its script
    assert outcome.code == 0 and outcome.result.cpu_only and printed.err == ""
    [command] = outcome.result.next
    assert command.split("#")[0].split() == ["kit", "bootstrap", "--config", "configs/default.yaml"]
    assert "train_ddp.py" in command.split("#")[1] and "CPU: slow" in command
    # Outside the checkout the command says where the default config is.
    monkeypatch.chdir(tmp_path)
    outcome = cli.run(["bootstrap", "--facts", str(MACHINES / "cpu_only.json")])
    assert outcome.result.next[0].split("#")[0].split() == ["cd", str(ROOT), "&&", "kit", "bootstrap", "--config",
                                                            "configs/default.yaml"]


def test_bootstrap_keeps_numbered_backups_and_prev_is_ignored(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    for i, machine in enumerate(("kaggle_t4x2", "h200", "mi300x")):
        out.write_text(f"# my edit {i}\n")
        assert main(["bootstrap", "--facts", str(MACHINES / f"{machine}.json"), "--config", "configs/default.yaml",
                     "-o", str(out)]) == 0
    assert (tmp_path / "train_ddp.py.prev").read_text() == "# my edit 0\n"
    assert (tmp_path / "train_ddp.py.prev.2").read_text() == "# my edit 1\n"
    assert (tmp_path / "train_ddp.py.prev.3").read_text() == "# my edit 2\n"
    # A dangling symlink already named .prev.4 is a name taken, not a file to replace.
    (tmp_path / "train_ddp.py.prev.4").symlink_to(tmp_path / "nowhere")
    out.write_text("# my edit 3\n")
    assert main(["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "--config", "configs/default.yaml",
                 "-o", str(out)]) == 0
    assert (tmp_path / "train_ddp.py.prev.4").is_symlink()
    assert (tmp_path / "train_ddp.py.prev.5").read_text() == "# my edit 3\n"
    ignored = subprocess.run(["git", "check-ignore", "train_ddp.py.prev", "train_ddp.py.prev.2"], cwd=ROOT,
                             capture_output=True, text=True)
    assert ignored.stdout.split() == ["train_ddp.py.prev", "train_ddp.py.prev.2"]


# ---- item 8: plan names the script that matches ------------------------------------------------------
def test_plan_says_to_render_first_when_the_script_is_another(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("configs", "models", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    assert main(["plan", "--config", "configs/default.yaml", "--gpus", "2xT4", "lora.r=8"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.split("  (")[0].split() == ["next:", "python", "-m", "kit", "render", "--config", "configs/default.yaml",
                                           "--gpus", "2xT4", "lora.r=8", "-o", "train_ddp.py", "--force"]
    assert "(./train_ddp.py does not" in last and last.split("), then: ")[1].startswith("torchrun")
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", "lora.r=8"]) == 0
    capsys.readouterr()
    assert main(["plan", "--config", "configs/default.yaml", "--gpus", "2xT4", "lora.r=8"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["next:", "torchrun", "--standalone",
                                                               "--nproc_per_node=2", "train_ddp.py"]
    assert main(["plan", "--config", "configs/default.yaml", "--gpus", "2xT4"]) == 0  # r=16: another script
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("next: ") and "render" in last and "another config's" in last


# ---- item 9: the re-render hint reproduces the file ----------------------------------------------------
@pytest.mark.parametrize("machine", [["--gpus", "1xA100"], ["--facts", str(MACHINES / "mi300x.json")], []])
def test_the_rerender_hint_reproduces_the_file(tmp_path, monkeypatch, capsys, machine):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "mine.py"
    assert main(["render", "--config", "configs/default.yaml", *machine, "lora.r=8", "seq_len=128", "-o", str(out)]) == 0
    first = out.read_bytes()
    out.write_text("# edited since\n")  # the hint has --force: it must put the same bytes back
    assert main(_hint_of(first)) == 0
    assert out.read_bytes() == first


def _hint_of(text: bytes) -> list[str]:
    """The re-render command at the top of a script, as `kit` arguments."""
    line = next(ln.strip() for ln in text.decode().splitlines() if ln.strip().startswith("python -m kit render"))
    return shlex.split(line)[3:]  # after `python -m kit`


def test_the_repo_script_hint_is_the_command_that_wrote_it():
    assert _hint_of((ROOT / "train_ddp.py").read_bytes()) == ["render", "--config", "configs/default.yaml", "--gpus", "2xT4",
                                            "-o", "train_ddp.py", "--force"]


# ---- item 10: a refusal once, naming the torch it judged -------------------------------------------------
def test_plan_refusal_is_printed_once_and_names_the_assumed_torch(capsys):
    assert main(["plan", "--gpus", "1xP100"]) == 3
    out, err = capsys.readouterr()
    assert "sm_60" not in out and err.count("is not in the arch list") == 1
    assert "torch 2.10.0+cu128 (" in err and "(assumed" in err and "--gpus" in err
    assert "this torch build" not in err


# ---- item 11: exit codes under torchrun ------------------------------------------------------------------
@pytest.mark.slow
def test_under_torchrun_the_error_line_names_kits_exit_code(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "train_ddp.py"), "max_steps=0"], cwd=ROOT, env=cpu_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1  # torchrun's own code for any failed rank
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "[kit exit 2; torchrun" in errors[0] and errors[0].endswith("ChildFailedError]")
    # torchrun's report follows the rank's line; kit says it again after it, so the last line is kit's.
    assert "ChildFailedError" in done.stderr.split(errors[0])[1]
    assert errors[1:] == [done.stderr.strip().splitlines()[-1]] and errors[1].startswith("error: config key")
    assert "'max_steps'" in errors[1] and "> 0, got 0 [kit exit 2;" in errors[1]
    assert "torchrun's" in README and "ChildFailedError" in README and "SignalException" in README


@pytest.mark.slow
def test_ctrl_c_under_torchrun_ends_with_kits_outcome_line(tmp_path):
    """Ctrl-C in a terminal signals torchrun's process group; torchrun starts each rank in a session
    of its own and forwards SIGINT to it. The ranks pause cleanly, then torchrun prints its
    SignalException traceback and exits 1: kit's outcome must still be the last line."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "train_ddp.py"), f"output_dir={out}", "max_steps=2000", "save_steps=5", *FAST]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while not list(out.glob("checkpoint-*")):  # the first save: training is under way
            assert time.monotonic() < deadline and proc.poll() is None, "the run never saved"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches torchrun (the ranks have own sessions)
        log, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1 and "SignalException" in log  # torchrun's, for the signal it got
    step = int(log.split("[kit] paused at step ")[1].split()[0])
    assert (out / f"checkpoint-{step}" / "kit_manifest.json").is_file()
    last = log.strip().splitlines()[-1]
    assert last.startswith("[kit] ") and f"paused at step {step} of 2000" in last and "SIGINT" in last
    assert "same command" in last and "[kit exit 0; the" in last and "SignalException" in last


# ---- item 12: smoke cleans up after itself ---------------------------------------------------------------
@pytest.mark.slow
def test_smoke_removes_its_temporary_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = train(["--smoke"], nproc=1, env=cpu_env(TMPDIR=str(tmp)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "smoke: one optimizer" in r.stdout and str(tmp) in r.stdout
    assert not list(tmp.glob("kit-smoke-*"))


# ---- items 15, 17: data that is odd but usable -------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / "models/tiny-qwen3"))


ROWS = [json.loads(line) for line in (ROOT / "data/ha_commands.jsonl").read_text().splitlines()[:20]]
SPEAKER = {"user": "human", "assistant": "gpt", "system": "system"}


@pytest.mark.parametrize("column", ["conversations", "messages"])
def test_sharegpt_rows_train_like_their_messages(tmp_path, tok, column):
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("".join(json.dumps({column: [{"from": SPEAKER[m["role"]], "value": m["content"]}
                                                 for m in r["messages"]]}) + "\n" for r in ROWS))
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    got = data.prepare(config.load("configs/default.yaml", [f"data.path={path}", "data.format=auto"]), tok)
    want = data.prepare(config.load("configs/default.yaml", [f"data.path={plain}", "data.format=auto"]), tok)
    assert got.format == "messages"
    assert got.train["input_ids"] == want.train["input_ids"]
    assert got.train["completion_mask"] == want.train["completion_mask"]


def test_a_dataset_smaller_than_one_global_batch_is_named(capsys):
    import torch

    from kit.train.job import Job
    from kit.planning.plan import Plan

    cfg = config.load("configs/default.yaml", ["max_steps=null", "epochs=1"])
    ctx = SimpleNamespace(device=torch.device("cpu"), rank=0, world_size=2, is_main=True)
    job = Job(cfg, ctx, Plan(strategy="ddp", device="cpu", nproc=2, per_device_batch=8, global_batch=16))
    assert job.max_steps(3) == 1
    out = capsys.readouterr().out
    [warned] = [ln for ln in out.splitlines() if "warning: 3 training" in ln]
    assert "global batch of 16 (" in warned and "8 per device" in warned and "2 process(es)" in warned
    capsys.readouterr()
    job.max_steps(400)
    assert "warning" not in capsys.readouterr().out


# ---- item 18: output_dir is checked before anything loads --------------------------------------------------
def test_output_dir_check(tmp_path):
    from kit.errors import UsageError
    from kit.train.output_dir import check_output_dir

    (tmp_path / "file").write_text("x")
    for bad, words in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "run", "which is a file"),
                       (Path("/proc/kit-no/run"), "is not writable")):
        with pytest.raises(UsageError, match=words):
            check_output_dir(str(bad))
    check_output_dir(str(tmp_path / "new" / "run"))
    assert (tmp_path / "new" / "run").is_dir() and not list((tmp_path / "new" / "run").iterdir())


def test_a_torn_session_record_is_named_by_line(tmp_path, caplog):
    """Item 16, for kit's own JSONL: a cut write is skipped, and the warning says which line."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "kit_sessions.jsonl").write_text('{"started": 1, "end_step": 2, "max_steps": 2}\n{"started": 2, "end\n')
    with caplog.at_level("WARNING", logger="kit.checkpoints.status"):
        s = status.gather(config.load("configs/default.yaml", [f"output_dir={out}"]))
    assert len(s["sessions"]) == 1
    assert f"{out / 'kit_sessions.jsonl'} line 2 " in caplog.text and "not valid JSON" in caplog.text


# ---- overrides anywhere among the flags (`train_ddp.py lora.r=8 --force output_dir=X`) ---------------------
@pytest.mark.slow
def test_the_script_takes_overrides_before_between_and_after_its_flags(tmp_path):
    from kit.script import arguments

    args = arguments.parse(["lora.r=8", "--force", f"output_dir={tmp_path}", "--smoke", "max_steps=3"], "c.yaml")
    assert (args.force, args.smoke, args.overrides) == (True, True, ["lora.r=8", f"output_dir={tmp_path}",
                                                                      "max_steps=3"])
    cfg, _, _ = arguments.settings(config.to_dict(config.load("configs/default.yaml")), {}, args)
    assert (cfg.lora.r, cfg.output_dir, cfg.max_steps) == (8, str(tmp_path), 3)
    # The real script: the override after --force is read (and refused for its value, not as an argument).
    r = train_here(["lora.r=8", "--force", f"output_dir={tmp_path}", "max_steps=0"])  # `python train_ddp.py …`
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: config key") and "'max_steps'" in r.stderr
    assert r.stderr.strip().endswith("> 0, got 0")


def test_kit_commands_take_overrides_among_their_flags(capsys):
    def lora_bytes(*argv):
        assert main(["plan", *argv]) == 0
        return json.loads(capsys.readouterr().out)["memory"]["terms"]["lora_params_fp32"]

    flags_first = lora_bytes("--gpus", "2xT4", "--config", "configs/default.yaml", "--json", "lora.r=8")
    assert lora_bytes("lora.r=8", "--gpus", "2xT4", "--json", "--config", "configs/default.yaml") == flags_first
    assert lora_bytes("--gpus", "2xT4", "--json", "--config", "configs/default.yaml") == 2 * flags_first  # r=16
    assert main(["plan", "lora.r=8", "--jsn", "--gpus", "2xT4"]) == 2  # an unknown flag is still refused, in one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: kit: ") and "--jsn" in err and "`kit --help`" in err


# ---- commands without --config: the README's main job, from one default --------------------------------
@pytest.mark.parametrize("command", ["plan", "render", "status", "export", "schedule"])
def test_every_config_command_defaults_to_the_readme_job_config(command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.build_parser(command).parse_args([command]).config == config.DEFAULT_CONFIG == "configs/default.yaml"
    monkeypatch.chdir(tmp_path)  # no configs/default.yaml here: the built-in defaults, into the same output_dir
    assert cli.build_parser(command).parse_args([command]).config is None
    assert config.RunConfig().output_dir == config.load(str(ROOT / config.DEFAULT_CONFIG)).output_dir


def test_bare_status_and_export_look_where_the_readme_job_writes(tmp_path, monkeypatch, capsys):
    for name in ("configs", "models", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    # What the README's main job leaves (train_ddp.py is configs/default.yaml's script): its sessions log.
    (tmp_path / "outputs" / "default").mkdir(parents=True)
    (tmp_path / "outputs/default/kit_sessions.jsonl").write_text(json.dumps(
        {"session": 1, "outcome": "paused", "start_step": 0, "end_step": 20, "max_steps": 60}) + "\n")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "local outputs/default" in out and "of 60 steps" in out and "0 of ? steps" not in out
    assert main(["export"]) == 2
    err = capsys.readouterr().err
    assert "outputs/default/final (" in err and "configs/default.yaml" in err and "does not exist" in err
    assert "--adapter outputs" not in err  # no flag the user did not give


# ---- the project's own name: `kit --version`, and install hints that name this checkout -------------------
def test_version_names_the_distribution_from_its_metadata(capsys):
    import configparser
    from importlib import metadata

    meta = configparser.ConfigParser()
    meta.read(ROOT / "setup.cfg")
    name = meta["metadata"]["name"]
    assert name == "kit-finetune"
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:  # a checkout that was never pip-installed
        assert out.startswith(f"kit {meta['metadata']['version']} (")
    else:
        assert out.startswith(f"{name} {version} (")


def test_no_install_hint_names_pypis_other_kit(capsys):
    """On PyPI `kit` is an unrelated project; this one installs from its checkout (`pip install -e ".[x]"`)."""
    hint = re.compile(r"pip install[^\n`]*?['\"]?\bkit\[")
    found = []
    for path in [ROOT / "README.md", *(ROOT / "kit").rglob("*.py"), *(ROOT / "kit").rglob("*.tmpl"),
                 *(ROOT / "docs").rglob("*.md"), *(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "tests").glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in hint.finditer(text)
                  if path.name != "test_new_user_path.py"]
    assert not found, found
    with pytest.raises(SystemExit):  # `kit schedule --help`, the text the report quoted
        cli.build_parser("schedule").parse_args(["schedule", "--help"])
    assert words_in(capsys.readouterr().out, "`pip", "install", "-e", '".[kaggle]"`', "in", "the", "kit", "checkout")


# ---- the README's closing lines are what its main job prints -------------------------------------------------
@pytest.mark.slow
def test_the_readme_closing_lines_are_what_the_main_job_prints(tmp_path):
    """The README's main job as it is (the shipped script, two processes), output_dir moved aside; its
    eval line must give the README's figures. Float sums differ in the last digit between CPUs and
    builds (196.3 on one machine, 196.4 on another), so figures agree to 0.5 %; the rest word for word."""
    out = tmp_path / "default"
    done = train([f"output_dir={out}"], nproc=2, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = re.search(r"    (\[kit\] eval loss .*)\n", README).group(1)
    printed = next(line for line in done.stdout.splitlines() if line.startswith("[kit] eval loss"))
    number = r"\d+(?:\.\d+)?"
    assert re.sub(number, "N", printed) == re.sub(number, "N", shown), (printed, shown)
    for got, want in zip(map(float, re.findall(number, printed)), map(float, re.findall(number, shown))):
        assert got == pytest.approx(want, rel=0.005, abs=0.05), (printed, shown)
    tail = done.stdout.replace(str(out), "outputs/default").splitlines()
    for line in re.findall(r"    (\[kit\] (?:final|export): .*)\n", README):
        assert any(t.startswith(line) for t in tail), line
