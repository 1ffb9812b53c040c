"""The plan made once: the script's launch-time settling uses the planner's own rules, as a pure
function of plain facts about this rank (`settle.for_rank`), and `--config FILE` plans again instead
of inheriting."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from kit.errors import CannotTrain, UsageError
from kit.machine.command import launch_command
from kit.planning import config, precision, settle
from kit.planning.plan import Plan, make_plan
from kit.planning.settle import RankFacts
from kit.script import arguments
from tests.test_plan import COLAB_T4, CPU_ONLY, H200, KAGGLE_T4X2, MI300X, QWEN8_QLORA, cfg, codes, reason

T4 = RankFacts("cuda", vendor="nvidia", capability="7.5", name="Tesla T4")
H200_RANK = RankFacts("cuda", vendor="nvidia", capability="9.0", name="NVIDIA H200")
CPU = RankFacts("cpu")


def test_a_bf16_plan_launched_on_a_t4_trains_in_fp16_and_says_so():
    planned = make_plan(H200, cfg(*QWEN8_QLORA))
    plan, notes = settle.for_rank(planned, cfg(*QWEN8_QLORA), T4)
    assert planned.precision == "bf16" and plan.precision == "fp16"
    assert reason(notes, "precision_settled").figures == {"precision": "fp16", "planned": "bf16"}


def test_a_warmup_longer_than_the_job_is_said_at_launch_not_refused():
    """A 2-step trial of a config with warmup_steps=5 trains (and is not an error), but says so."""
    short = cfg("max_steps=2", "warmup_steps=5")
    _, notes = settle.for_rank(make_plan(H200, short), short, H200_RANK)
    said = reason(notes, "warmup_over_max_steps")
    assert (said["warmup_steps"], said["max_steps"]) == (5, 2)
    fine = cfg("max_steps=20", "warmup_steps=5")
    assert "warmup_over_max_steps" not in codes(settle.for_rank(make_plan(H200, fine), fine, H200_RANK)[1])


@pytest.mark.parametrize("arch, expected", [("gfx90a:sramecc+:xnack-", "bf16"), ("gfx942", "bf16"),
                                            ("gfx1100", "bf16"), ("gfx1030", "fp16"), ("gfx906", "fp16")])
def test_rocm_at_launch_follows_the_per_arch_bf16_list_not_every_rocm_gpu(arch, expected):
    # The old launch rule said every ROCm GPU has bf16; RDNA2 (gfx1030) and MI50 (gfx906) do not.
    rank = RankFacts("cuda", vendor="amd", capability=arch, name="AMD GPU")
    planned = make_plan(MI300X, cfg("model=Qwen/Qwen3-0.6B"))
    assert settle.for_rank(planned, cfg("model=Qwen/Qwen3-0.6B"), rank)[0].precision == expected


def test_planner_and_launch_refuse_bf16_on_a_t4_with_the_same_words():
    with pytest.raises(CannotTrain) as planned:
        make_plan(COLAB_T4, cfg("precision=bf16"))
    with pytest.raises(CannotTrain) as launched:
        settle.for_rank(make_plan(H200, cfg()), cfg("precision=bf16"), T4)
    assert str(planned.value) == str(launched.value)
    assert "Tesla T4 (sm_75)" in str(launched.value) and "no native bf16" in str(launched.value)


@pytest.mark.parametrize("asked", ["bf16", "fp16"])
def test_half_precision_on_the_cpu_is_refused_by_planner_and_launch_alike(asked):
    from tests.test_plan import CPU_ONLY

    with pytest.raises(CannotTrain, match="runs on the CPU; use precision=fp32"):
        make_plan(CPU_ONLY, cfg(f"precision={asked}"))
    with pytest.raises(CannotTrain, match="runs on the CPU; use precision=fp32"):
        settle.for_rank(Plan(strategy="single"), cfg(f"precision={asked}"), CPU)


def test_the_global_batch_is_kept_whatever_the_world_size():
    planned = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA))
    two, _ = settle.for_rank(planned, cfg(*QWEN8_QLORA), RankFacts("cuda", world_size=2, vendor="nvidia",
                                                                     capability="7.5"))
    one, _ = settle.for_rank(planned, cfg(*QWEN8_QLORA), T4)
    assert two.global_batch == one.global_batch == planned.global_batch
    assert one.grad_accum == 2 * two.grad_accum and two.strategy == "ddp"


def test_unsloth_planned_but_missing_falls_back_with_a_note_and_asked_for_refuses():
    planned = replace(make_plan(H200, cfg(*QWEN8_QLORA)), backend="unsloth")
    plan, notes = settle.for_rank(planned, cfg(*QWEN8_QLORA), H200_RANK)
    assert plan.backend == "transformers" and reason(notes, "unsloth_unavailable")["because"] == "not_installed"
    with_it = RankFacts("cuda", vendor="nvidia", capability="9.0", installed=frozenset({"unsloth"}))
    assert settle.for_rank(planned, cfg(*QWEN8_QLORA), with_it)[0].backend == "unsloth"
    with pytest.raises(CannotTrain, match="backend=unsloth was asked for"):
        settle.for_rank(planned, cfg(*QWEN8_QLORA, "backend=unsloth"), H200_RANK)
    # On the CPU the launch refuses it as the planner does, in the same words.
    with pytest.raises(CannotTrain) as launched:
        settle.for_rank(planned, cfg("backend=unsloth"), CPU)
    with pytest.raises(CannotTrain) as planned_on_cpu:
        make_plan(CPU_ONLY, cfg("backend=unsloth"))
    assert str(launched.value) == str(planned_on_cpu.value) and "needs a CUDA GPU" in str(launched.value)


def test_model_parallel_under_torchrun_is_refused():
    with pytest.raises(UsageError, match="rank 1 of 2.*not torchrun"):
        settle.for_rank(Plan(global_batch=2, strategy="model_parallel"), cfg(),
                        RankFacts("cuda", rank=1, world_size=2, vendor="nvidia", capability="7.5"))


def test_precision_rule_is_the_one_the_planner_prints():
    chosen, why = precision.choose("auto", "cuda", "nvidia", "7.5", "Tesla T4")
    plan = make_plan(COLAB_T4, cfg())
    assert chosen == plan.precision == "fp16" and why in plan.reasons


def test_one_launch_command_builder():
    assert launch_command(2).split() == ["torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]
    assert launch_command(1) == "python train_ddp.py"
    assert launch_command(1, torchrun=True).split() == ["torchrun", "--standalone", "--nproc_per_node=1", "train_ddp.py"]
    assert launch_command(1, visible=[1], vendor="amd").split() == ["HIP_VISIBLE_DEVICES=1", "python", "train_ddp.py"]
    assert make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA)).launch == launch_command(2)


def _args(config_file=None, *overrides):
    return argparse.Namespace(config=config_file, overrides=list(overrides))


def test_config_at_launch_plans_again_instead_of_keeping_the_embedded_plan(tmp_path, monkeypatch):
    """The embedded PLAN of an 8B render must not reach a `--config` run of another config."""
    from kit.machine import probe
    from tests.test_plan import CPU_ONLY

    monkeypatch.setattr(probe, "gather", lambda cwd=None: CPU_ONLY)  # this test's machine: no GPU, as CI
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    embedded_plan = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA)).to_dict()  # 8B: checkpointing on, micro-batch of 8B
    other = tmp_path / "other.yaml"
    other.write_text("model: models/tiny-qwen3\nmethod: lora\nper_device_batch: 4\nglobal_batch: 8\n")
    cfg_, planned, notes = arguments.settings(cfg(*QWEN8_QLORA).__dict__, embedded_plan, _args(str(other)))
    assert planned.device == "cpu" and planned.per_device_batch == 4
    assert planned.gradient_checkpointing is False and embedded_plan["gradient_checkpointing"] is True
    plan, _ = settle.for_rank(planned, cfg_, CPU)
    assert plan.per_device_batch == 4 and plan.grad_accum == 2
    assert (notes[0].code, notes[0]["source"], notes[0]["device"]) == ("replanned", str(other), "cpu")


def test_without_config_the_embedded_plan_is_used_with_the_overrides():
    embedded_plan = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA)).to_dict()
    from dataclasses import asdict

    cfg_, planned, notes = arguments.settings(asdict(cfg(*QWEN8_QLORA)), embedded_plan, _args(None, "max_steps=7"))
    assert planned == Plan.from_dict(embedded_plan) and cfg_.max_steps == 7 and notes == []


# ---- one Plan: frozen, written whole into the script, read back equal ---------------------------
@pytest.mark.parametrize("facts,overrides,kw", [
    (KAGGLE_T4X2, QWEN8_QLORA, {}),
    (H200, (*QWEN8_QLORA, "trainer=dpo"), {}),
    (CPU_ONLY, (), {"nproc": 2}),
    (H200, QWEN8_QLORA, {"nodes": 2, "rdzv_endpoint": "10.0.0.1:29500"}),
])
def test_the_plan_round_trips_through_its_dict_and_is_frozen(facts, overrides, kw):
    import dataclasses
    import json

    plan = make_plan(facts, cfg(*overrides), **kw)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan  # `kit plan --json` too
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.per_device_batch = 99


def test_the_rendered_script_holds_the_whole_plan(tmp_path, monkeypatch, capsys):
    import ast

    from kit.cli import main
    from tests.scripts import ROOT

    monkeypatch.chdir(ROOT)
    out = tmp_path / "t.py"
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", "-o", str(out)]) == 0
    capsys.readouterr()
    literal = next(ast.literal_eval(n.value) for n in ast.parse(out.read_text()).body
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PLAN")
    planned = make_plan(machine_2xt4(), config.load("configs/default.yaml"))
    assert Plan.from_dict(literal) == planned and set(literal) == set(planned.to_dict())


def machine_2xt4():
    from kit.machine import gpu_table

    return gpu_table.synthesize("2xT4")


def test_a_plan_with_a_key_kit_does_not_know_is_one_line():
    with pytest.raises(UsageError, match="unknown key.*'batch_size'"):
        arguments.settings(config.to_dict(cfg()), {"batch_size": 4}, _args(None))


def test_a_plan_rendered_before_every_field_was_written_still_settles():
    """A script from an older kit carries a subset of the keys: the others take the plan's defaults."""
    old = {"precision": "fp32", "strategy": "single", "device": "cpu", "nproc": 1, "per_device_batch": 8,
           "grad_accum": 1, "global_batch": 8, "gradient_checkpointing": False, "backend": "transformers",
           "optimizer": "adamw_torch"}
    _, plan, _ = arguments.settings(config.to_dict(cfg()), old, _args(None))
    settled, notes = settle.for_rank(plan, cfg(), CPU)
    assert (settled.batching, settled.kernels, settled.quantization, settled.per_device_batch) == \
        ("padded", "none", None, 8) and notes == []


def test_a_prequantized_base_under_fsdp_loads_the_same_from_the_script_and_from_config(tmp_path, monkeypatch,
                                                                                           capsys):
    """The script's PLAN carried no `quantization`, so a bnb-4bit base rendered for FSDP loaded as a 16-bit
    one (on the CPU, one rank reading) from the script, and as 4-bit on each GPU from `--config`."""
    import ast

    import yaml

    from kit.cli import main
    from kit.machine import probe
    from kit.train import sharding
    from tests.scripts import ROOT

    monkeypatch.chdir(ROOT)
    settings = {"model": "unsloth/Qwen3-8B-bnb-4bit", "method": "lora", "strategy": "fsdp", "seq_len": 512}
    config_file = tmp_path / "pre4bit.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    out = tmp_path / "t.py"
    assert main(["render", "--config", str(config_file), "--gpus", "2xT4", "-o", str(out)]) == 0
    capsys.readouterr()
    literals = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(out.read_text()).body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") in ("SETTINGS", "PLAN")}
    monkeypatch.setattr(probe, "gather", lambda cwd=None: machine_2xt4())  # the machine rendered for
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rank = RankFacts("cuda", rank=0, world_size=2, vendor="nvidia", capability="7.5", name="Tesla T4",
                     under_torchrun=True)
    settled = {}
    for how, config_arg in (("script", None), ("--config", str(config_file))):
        c, plan, _ = arguments.settings(literals["SETTINGS"], literals["PLAN"], _args(config_arg))
        settled[how] = settle.for_rank(plan, c, rank)[0]
    script, replanned = settled["script"], settled["--config"]
    assert (script.strategy, script.quantization) == (replanned.strategy, replanned.quantization) == ("fsdp", "nf4")
    assert sharding.loads_on_cpu(script) is sharding.loads_on_cpu(replanned) is False
    assert script == replanned


# ---- the device rules, written once: the planner's for a CPU machine, the launch's on a CPU rank ------------
@pytest.mark.parametrize("overrides,planned,words", [
    (("method=qlora",), Plan(strategy="single", quantization="nf4"), "method=qlora needs a CUDA GPU"),
    # A bnb-4bit base with method=lora: main's launch did not refuse it, and the planner said to use method=lora.
    (("model=unsloth/Qwen3-0.6B-bnb-4bit", "method=lora"), Plan(strategy="single", prequantized=True),
     "is a 4-bit checkpoint, and 4-bit weights need a CUDA GPU"),
    (("backend=unsloth",), Plan(strategy="single", backend="unsloth"), "backend=unsloth needs a CUDA GPU"),
    (("strategy=model_parallel",), Plan(strategy="model_parallel"),
     "strategy model_parallel splits the layers over GPUs, and this machine has none"),
])
def test_the_planner_and_the_launch_refuse_the_same_on_a_cpu_in_the_same_words(overrides, planned, words):
    with pytest.raises(CannotTrain) as by_planner:
        make_plan(CPU_ONLY, cfg(*overrides))
    with pytest.raises(CannotTrain) as at_launch:
        settle.for_rank(planned, cfg(*overrides), CPU)
    assert str(by_planner.value) == str(at_launch.value) and words in str(at_launch.value)


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit", "adamw_torch_fused"])
def test_a_gpu_optimizer_runs_as_adamw_torch_on_a_cpu_planned_or_launched(optimizer):
    plan = make_plan(CPU_ONLY, cfg(f"optimizer={optimizer}"))
    settled, notes = settle.for_rank(Plan(strategy="single", optimizer=optimizer), cfg(f"optimizer={optimizer}"),
                                     CPU)
    assert plan.optimizer == settled.optimizer == "adamw_torch"
    said = [r for r in plan.reasons if r.code.startswith("optimizer_")]
    assert said and said[0] in notes  # the same Reason, planned or launched


def test_every_change_the_launch_makes_to_the_plan_is_a_note():
    """main changed the precision (fp16 → fp32 on a CPU) and the accumulation (for 1 process instead of 2)
    of the rendered plan without a word; now each field that differs is named, and a rank that runs the
    plan as rendered hears nothing."""
    c = config.load("configs/default.yaml")
    planned = make_plan(machine_2xt4(), c)
    settled, notes = settle.for_rank(planned, c, CPU)
    assert (settled.precision, settled.grad_accum) == ("fp32", 2)
    said = reason(notes, "plan_settled")
    assert said["changed"].split(",") == ["precision", "grad_accum"]
    assert (said["precision_was"], said["precision_now"], said["grad_accum_was"], said["grad_accum_now"]) == \
        ("fp16", "fp32", 1, 2)
    as_rendered = RankFacts("cuda", world_size=2, vendor="nvidia", capability="7.5", name="Tesla T4",
                            under_torchrun=True)
    assert settle.for_rank(planned, c, as_rendered) == (planned, [])
