"""`kit bootstrap`: verdicts, exit codes, output forms and bad input, through the real CLI."""

import json
import re
import shutil
import os
from pathlib import Path

import pytest

from kit import cli
from kit.cli import main
from kit.commands import bootstrap
from kit.errors import UsageError
from tests.scripts import kit_cli

ROOT = Path(__file__).resolve().parent.parent
MACHINES = ROOT / "tests" / "fixtures" / "machines"


def kit(*args, tmp_path):
    """`python -m kit ARGS` as a user runs it, in this process."""
    return kit_cli(args, env={**os.environ, "KIT_CACHE_DIR": str(tmp_path / "cache")})


def machine(name: str) -> str:
    return str(MACHINES / f"{name}.json")


def test_t4x2_exits_0_and_suggests_torchrun(capsys):
    assert main(["bootstrap", "--facts", machine("kaggle_t4x2")]) == 0
    out = capsys.readouterr().out
    assert "2× Tesla T4 (sm_75)" in out and "can train" in out
    assert [ln.split() for ln in out.splitlines() if ln.startswith("next ")] == [
        ["next", "torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]]


def test_json_holds_facts_verdicts_and_next(capsys):
    assert main(["bootstrap", "--json", "--facts", machine("h200")]) == 0
    d = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert d["gpu_count"] == 1 and d["torch"]["arch_list"][0] == "sm_75"
    gpu = d["verdicts"]["gpus"][0]
    assert d["verdicts"]["ok"] is True and {k: v for k, v in gpu.items() if k != "reason"} == {
        "index": 0, "name": "NVIDIA H200", "arch": "sm_90", "arch_supported": True, "bf16": True}
    assert gpu["reason"].startswith("NVIDIA H200 (sm_90) ") and " is in " in gpu["reason"] and "arch list" in gpu["reason"]
    assert d["next"] == ["python train_ddp.py"]


def test_p100_exits_3_with_one_error_line(capsys):
    assert main(["bootstrap", "--facts", machine("kaggle_p100")]) == 3
    captured = capsys.readouterr()
    assert "Tesla P100-PCIE-16GB" in captured.out and "(sm_60) is not in" in captured.out and "is not in this torch" in captured.out
    assert "arch list sm_70…sm_120" in captured.out
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ")


def test_p100_json_error_names_the_fix(capsys):
    assert main(["bootstrap", "--json", "--facts", machine("kaggle_p100")]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdicts"]["ok"] is False
    assert "sm_60" in captured.err and "T4×2" in captured.err and captured.err.count("\n") == 1


def test_cpu_only_without_config_exits_0_with_one_next_line_naming_the_default_config(capsys):
    # A newcomer's first command: no GPU is no failure when the default job trains here; one line says
    # what to do next (the verdict's "use a machine with a GPU" advice would say otherwise), exit 0.
    assert main(["bootstrap", "--facts", machine("cpu_only")]) == 0
    out, err = capsys.readouterr()
    assert "CPU-slow" in out and err == ""
    assert [line.split()[0] for line in out.splitlines() if re.match(r"(?i)(next|do this)\b", line)] == ["next"]
    [nxt] = [ln for ln in out.splitlines() if ln.startswith("next ")]
    assert nxt.split("#")[0].split() == ["next", "kit", "bootstrap", "--config", "configs/default.yaml"]
    assert "writes train_ddp.py" in nxt.split("#")[1]


@pytest.mark.parametrize("name,code", [("mi300x", 0), ("radeon_8060s", 0), ("h200", 0), ("kaggle_t4x2", 0),
                                       ("kaggle_p100", 3), ("cpu_only", 0)])
def test_exit_code_of_every_machine(name, code, capsys):
    assert main(["bootstrap", "--facts", machine(name)]) == code


def test_config_plans_writes_the_script_and_keeps_the_result(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    out.write_text("# my own edits\n")
    args = ["bootstrap", "--facts", machine("kaggle_t4x2"), "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml",
            "lora.r=8", "-o", str(out)]
    outcome = cli.run(args)
    result = outcome.result
    assert outcome.code == 0 and isinstance(result, bootstrap.Result)
    assert result.facts.gpu_count == 2 and result.verdicts.ok
    plan = result.plan
    assert (plan.strategy, plan.nproc, plan.precision) == ("ddp", 2, "fp16")
    assert result.wrote.startswith(f"wrote {out} (") and result.wrote.endswith("now train_ddp.py.prev)")
    assert [n.split() for n in result.next] == [["torchrun", "--standalone", "--nproc_per_node=2", str(out)]]
    script = out.read_text()
    assert "'r': 8" in script and "ddp_find_unused_parameters=False" in script
    assert (tmp_path / "train_ddp.py.prev").read_text() == "# my own edits\n"  # nothing lost
    printed = capsys.readouterr().out
    assert "plan for Qwen/Qwen3-8B" in printed
    wrote, nxt = printed.splitlines()[-2:]
    assert wrote == "W" + result.wrote[1:]  # the same line, capitalised
    assert nxt.split() == ["Next:", "torchrun", "--standalone", "--nproc_per_node=2", str(out)]
    failed = cli.run(["bootstrap", "--facts", "/nonexistent.json"])
    assert failed.code == 2 and failed.result is None  # a failed run leaves no stale facts for the notebook


def test_config_on_a_machine_that_cannot_train_writes_nothing(tmp_path):
    out = tmp_path / "train_ddp.py"
    code = main(["bootstrap", "--facts", machine("kaggle_p100"), "--config", "configs/default.yaml", "-o", str(out)])
    assert code == 3 and not out.exists()


def test_real_bootstrap_of_this_machine(tmp_path):
    done = kit("bootstrap", "--json", tmp_path=tmp_path)
    d = json.loads(done.stdout)
    assert done.returncode == (0 if d["verdicts"]["ok"] or not d["gpus"] else 3)
    if not d["gpus"]:
        assert "CPU-slow" in d["verdicts"]["summary"]
        assert d["next"][0].split()[:4] == ["kit", "bootstrap", "--config", "configs/default.yaml"]


@pytest.mark.parametrize("args,message", [
    (["bootstrap", "--bogus"], "unrecognized arguments: --bogus"),
    (["bootstrap", "--facts"], "expected one argument"),
    (["bootstrap", "--facts", "/nonexistent/facts.json"], "does not exist"),
    (["probe", "--facts", "x.json"], "unrecognized arguments"),
])
def test_bad_usage_exits_2_with_one_line(tmp_path, args, message):
    done = kit(*args, tmp_path=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("content,message", [
    ("{oops", "is not valid JSON"),
    ('{"platform": "kaggle"}', "lacks python, torch, gpus, gpu_count"),
])
def test_bad_facts_file_exits_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "facts.json"
    path.write_text(content)
    done = kit("bootstrap", "--facts", str(path), tmp_path=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_probe_prints_facts_only(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    assert main(["probe", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "verdicts" not in d and d["schema"] == 1


# ---- a failed bootstrap for one job leaves no other job's script ready to launch ---------------------------
@pytest.mark.parametrize("machine_name,argv,code", [
    ("kaggle_p100", ["--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml"], 3),  # the machine cannot
    ("cpu_only", ["--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml"], 3),  # no GPU for an 8B job
    ("kaggle_t4x2", ["--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "lora.r=many"], 2),  # a bad value
])
def test_a_failed_bootstrap_stops_the_script_at_o_from_training_another_job(tmp_path, capsys, machine_name,
                                                                             argv, code):
    from kit.script import failed_bootstrap

    out = tmp_path / "train_ddp.py"
    shutil.copy(ROOT / "train_ddp.py", out)  # a fresh clone's: the tiny default
    assert main(["bootstrap", "--facts", machine(machine_name), *argv, "-o", str(out)]) == code
    assert out.read_bytes() == (ROOT / "train_ddp.py").read_bytes()  # nothing replaced
    printed = capsys.readouterr().out
    assert "train_ddp.py.bootstrap-failed" in printed and "beside it says why" in printed
    with pytest.raises(UsageError, match=r"is not the job last asked for: `kit bootstrap --config "
                                         r"configs/qwen3-8b-qlora-kaggle-t4x2.yaml` failed \(exit " + str(code)):
        failed_bootstrap.check(out)
    # The next script kit writes there is the one asked for: the note goes.
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", "-o", str(out)]) == 0
    assert not (tmp_path / "train_ddp.py.bootstrap-failed").exists()
    failed_bootstrap.check(out)


def test_a_failed_bootstrap_of_the_scripts_own_job_leaves_it_runnable(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    shutil.copy(ROOT / "train_ddp.py", out)  # configs/default.yaml's script: the job asked for
    assert main(["bootstrap", "--facts", machine("kaggle_p100"), "--config", "configs/default.yaml",
                 "-o", str(out)]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_ddp.py"]
