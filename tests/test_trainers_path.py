"""The path of a user who has done SFT and now wants DPO, KTO or GRPO: the shipped Kaggle 2×T4 configs,
what `kit plan` and `kit bootstrap` tell about the trainer, and a wrong reward file refused at bootstrap
(one line, exit 2) rather than in a script that stops at launch."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.cli import main
from kit.machine import gpu_table
from kit.planning import config
from kit.planning.plan import make_plan
from tests.scripts import ROOT, cells_until_one_fails

DPO = "configs/qwen3-8b-dpo-kaggle-t4x2.yaml"
KTO = "configs/qwen3-8b-kto-kaggle-t4x2.yaml"
GRPO = "configs/qwen3-4b-grpo-kaggle-t4x2.yaml"
T4X2 = str(ROOT / "tests" / "fixtures" / "machines" / "kaggle_t4x2.json")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def plan_of(path: str, gpus: str = "2xT4", *overrides):
    return make_plan(gpu_table.synthesize(gpus), config.load(str(ROOT / path), list(overrides)))


def codes(plan) -> dict:
    return {r.code: r.figures for r in plan.reasons}


# ---- the shipped configs ------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", ["T4", "2xT4", "L4", "A100-40", "H100"])
def test_the_dpo_kto_and_grpo_configs_plan_on_the_gpus_users_have(gpus):
    dpo, kto, grpo = plan_of(DPO, gpus), plan_of(KTO, gpus), plan_of(GRPO, gpus)
    assert (dpo.trainer, kto.trainer, grpo.trainer) == ("dpo", "kto", "grpo")
    for plan in (dpo, kto):
        assert plan.quantization == "nf4" and plan.reference == "adapter_disabled" and plan.global_batch == 16
    assert grpo.global_batch == 16
    # GRPO: whole groups of 8 completions per rank's share; no reference pass at beta 0.
    assert grpo.per_device_batch * grpo.grad_accum % 8 == 0 and "reference_none_grpo" in codes(grpo)
    for plan in (dpo, kto, grpo):
        assert plan.memory["per_gpu_bytes"] <= plan.memory["budget_bytes"]
    if gpus == "2xT4":
        assert (dpo.strategy, kto.strategy, grpo.strategy, dpo.precision) == ("ddp", "ddp", "ddp", "fp16")


def test_the_grpo_plan_says_generation_dominates_the_step_and_why_no_vllm(capsys):
    plan = plan_of(GRPO)
    gen = codes(plan)["grpo_generation"]
    assert gen["generation_s"] / gen["step_s"] > 0.5 and gen["step_time_vs_trl"] < 1
    assert "kv_cache" in plan.memory["terms"] or any("KV cache" in n for n in plan.memory["notes"])
    assert main(["plan", "--config", GRPO, "--gpus", "2xT4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"trainer\s+grpo \(TRL's GRPOTrainer\)", out)
    line = next(ln for ln in out.splitlines() if "grpo generation:" in ln)
    assert "most of each step" in line and "vLLM is not used" in line and "faster" in line


def test_the_sft_plan_has_no_trainer_row_and_dpo_names_its_trainer(capsys):
    assert main(["plan", "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4"]) == 0
    assert not re.search(r"^\s+trainer\s", capsys.readouterr().out, re.M)
    assert main(["plan", "--config", DPO, "--gpus", "2xT4"]) == 0
    assert re.search(r"trainer\s+dpo \(TRL's DPOTrainer\)", capsys.readouterr().out)


def test_the_data_to_change_is_named_in_each_config():
    for path in (DPO, KTO, GRPO):
        text = (ROOT / path).read_text()
        assert "YOUR DATA" in text and re.search(r"^\s+path: \S+\s+# CHANGE ME", text, re.M), path


def _gsm8k_rewards():
    spec = importlib.util.spec_from_file_location("gsm8k_rewards_under_test", ROOT / "configs" / "gsm8k_rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gsm8k_rewards_score_answers_as_trl_calls_them():
    r = _gsm8k_rewards()
    rows = [json.loads(line) for line in (ROOT / "data" / "gsm8k_shaped.jsonl").read_text().splitlines()[:3]]
    answers = [row["answer"] for row in rows]
    gold = [a.split("####")[-1].strip() for a in answers]
    completions = [[{"role": "assistant", "content": f"5 + 5 = 10, so\n#### {gold[0]}"}],  # right, formatted
                   [{"role": "assistant", "content": f"The answer is {gold[1]}."}],  # right, unformatted
                   [{"role": "assistant", "content": "#### 1234567"}]]  # formatted, wrong
    # TRL passes its own keywords and every other column by name: **kwargs takes them.
    extra = {"prompts": [row["question"] for row in rows], "completion_ids": [[1]] * 3, "trainer_state": None,
             "question": [row["question"] for row in rows]}
    assert r.correct(completions, answer=answers, **extra) == [2.0, 2.0, 0.0]
    assert r.format(completions, answer=answers, **extra) == [0.5, 0.0, 0.5]
    assert r.correct(["1,234 apples\n#### 1,234"], answer=["#### 1234"]) == [2.0]  # thousands separators
    assert r.correct(["no number here"], answer=["#### 3"]) == [0.0]


# ---- a wrong reward file: refused when the script is written, not at launch ----------------------
GOOD = "def ok(completions, **kwargs):\n    return [1.0] * len(completions)\n"
STATIC_CASES = [
    ("missing-file", {}, "nope.py:ok", r"rewards: .*nope\.py not found"),
    ("missing-name", {"r.py": GOOD}, "r.py:ok,format", r"r\.py has no function 'format' \(it defines: ok\)"),
    ("no-kwargs", {"r.py": "def ok(completions):\n    return [1.0]\n"}, "r.py:ok", r"takes no \*\*kwargs"),
    ("syntax-error", {"r.py": "def ok(completions, **kwargs):\n    return [1.0] +\n"}, "r.py:ok",
     r"r\.py cannot be read as Python \(line 2\): SyntaxError"),
]


def job_folder(tmp_path, files, spec) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "job.yaml").write_text((ROOT / GRPO).read_text().replace("gsm8k_rewards.py:correct,format", spec)
                                     .replace("data/gsm8k_shaped.jsonl", str(ROOT / "data" / "gsm8k_shaped.jsonl")))
    return folder / "job.yaml"


@pytest.mark.parametrize("files,spec,want", [c[1:] for c in STATIC_CASES], ids=[c[0] for c in STATIC_CASES])
def test_a_wrong_reward_file_is_one_line_at_plan_render_and_bootstrap(tmp_path, capsys, monkeypatch, files, spec,
                                                                      want):
    cfg = job_folder(tmp_path, files, spec)
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--config", str(cfg), "--gpus", "2xT4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and [ln for ln in err.splitlines() if ln.strip()] == [err.strip()], (out, err)  # no plan first
    assert re.search(want, err), err
    assert main(["render", "--config", str(cfg), "--gpus", "2xT4", "-o", "train_ddp.py"]) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and re.search(want, errors[0]), err
    assert not (tmp_path / "train_ddp.py").exists()
    # bootstrap over another job's script: exit 2, the script kept and fenced off by the failed-bootstrap note.
    (tmp_path / "train_ddp.py").write_text("print('another job')\n")
    assert main(["bootstrap", "--config", str(cfg), "--facts", T4X2]) == 2
    err = capsys.readouterr().err
    assert re.search(want, [ln for ln in err.splitlines() if ln.startswith("error:")][-1]), err
    assert (tmp_path / "train_ddp.py").read_text() == "print('another job')\n"
    assert (tmp_path / "train_ddp.py.bootstrap-failed").exists()


def test_a_reward_file_bound_in_other_ways_still_renders(tmp_path, capsys, monkeypatch):
    """Names the launch can resolve (an import, an assignment, a def under `if`) are not refused by reading."""
    text = ("import math\nfrom os.path import basename as base\nscale = lambda completions, **kw: [1.0]\n"
            "if True:\n    def late(completions, **kwargs):\n        return [math.pi]\n")
    cfg = job_folder(tmp_path, {"r.py": text}, "r.py:scale,late,base")
    monkeypatch.chdir(tmp_path)
    assert main(["render", "--config", str(cfg), "--gpus", "2xT4", "-o", "train_ddp.py"]) == 0, capsys.readouterr()


# ---- the notebook: one kernel, the DPO and GRPO bootstraps, then a failed one -------------------
@pytest.mark.slow
def test_dpo_and_grpo_bootstraps_in_a_kernel_and_a_bad_reward_file_stops_the_notebook(tmp_path):
    pytest.importorskip("nbclient")
    for folder in ("configs", "data"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy(ROOT / "train_ddp.py", tmp_path / "train_ddp.py")  # a fresh clone's tiny default
    shutil.copy(ROOT / "kit.py", tmp_path / "kit.py")  # what `%run kit …` runs, as in the README's cells
    (tmp_path / "configs" / "bad.yaml").write_text(
        (ROOT / GRPO).read_text().replace("gsm8k_rewards.py:correct,format", "gsm8k_rewards.py:correct,formatting"))
    cells = [f"%run kit bootstrap --config {DPO} --facts {T4X2}",
             f"%run kit bootstrap --config {GRPO} --facts {T4X2}",
             f"%run kit bootstrap --config configs/bad.yaml --facts {T4X2}",
             "print('THE NEXT CELL RAN')"]
    env = {"KIT_CACHE_DIR": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": "", "KIT_PLATFORM": "local",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    nb, failed = cells_until_one_fails(cells, tmp_path, env)

    def text(cell):
        return "".join(o.get("text", "") + json.dumps(o.get("data", {})) for o in cell.outputs)

    dpo, grpo, bad = (text(c) for c in nb.cells[:3])
    assert "dpo (TRL's DPOTrainer)" in dpo and "adapter disabled" in dpo and "torchrun --standalone" in dpo
    assert "grpo (TRL's GRPOTrainer)" in grpo and "KV cache" in grpo and "most of each step" in grpo
    assert "Next: torchrun --standalone --nproc_per_node=2 train_ddp.py" in grpo
    assert "exit code 2" in str(failed) and "has no function 'formatting'" in bad
    assert nb.cells[3].outputs == []  # "Run all" stopped at the failed bootstrap
    # The next cell would train the script left there (the GRPO one bootstrap wrote): it refuses instead.
    done = subprocess.run([sys.executable, "train_ddp.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is not the job last asked for: `kit bootstrap --config configs/bad.yaml` failed" in done.stderr
    assert "[kit] step" not in done.stdout


def test_bootstrap_takes_gpus_as_plan_does(tmp_path, capsys, monkeypatch):
    """`kit plan --gpus 2xT4` showed the plan; `kit bootstrap --gpus 2xT4` (a laptop preparing a Kaggle run)
    was "unrecognized arguments". It judges the assumed machine and writes its script."""
    for folder in ("configs", "data"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    assert main(["bootstrap", "--config", DPO, "--gpus", "2xT4"]) == 0
    out = capsys.readouterr().out
    assert "Next: torchrun --standalone --nproc_per_node=2 train_ddp.py" in out and "dpo (TRL's DPOTrainer)" in out
    assert f"python -m kit render --config {DPO} --gpus 2xT4 -o train_ddp.py" in (tmp_path / "train_ddp.py").read_text()
    assert main(["bootstrap", "--gpus", "3xNOPE"]) == 2
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert "unknown GPU 'NOPE'" in err
