"""The plan made once: the script's launch-time settling uses the planner's own rules, as a pure
function of plain facts about this rank, and `--config FILE` plans again instead of inheriting."""

from __future__ import annotations

import argparse

import pytest

from kit.errors import CannotTrain, UsageError
from kit.machine.command import launch_command
from kit.planning import adapt, precision
from kit.planning.adapt import RankFacts
from kit.planning.plan import make_plan
from kit.script import arguments
from tests.test_plan import COLAB_T4, H200, KAGGLE_T4X2, MI300X, QWEN8_QLORA, cfg

T4 = RankFacts("cuda", vendor="nvidia", capability="7.5", name="Tesla T4")
H200_RANK = RankFacts("cuda", vendor="nvidia", capability="9.0", name="NVIDIA H200")
CPU = RankFacts("cpu")


def test_a_bf16_plan_launched_on_a_t4_trains_in_fp16_and_says_so():
    planned = make_plan(H200, cfg(*QWEN8_QLORA)).to_dict()
    plan = adapt.adapt(planned, cfg(*QWEN8_QLORA), T4)
    assert planned["precision"] == "bf16" and plan.precision == "fp16"
    assert any(n.startswith("precision fp16 on this") and "plan said bf16" in n for n in plan.notes)


def test_a_warmup_longer_than_the_job_is_said_at_launch_not_refused():
    """A 2-step trial of a config with warmup_steps=5 trains (and is not an error), but says so."""
    short = cfg("max_steps=2", "warmup_steps=5")
    notes = adapt.adapt(make_plan(H200, short).to_dict(), short, H200_RANK).notes
    assert any(n.startswith("warning: warmup_steps=5 ") and "max_steps=2: " in n and "never reaches" in n
               for n in notes)
    fine = cfg("max_steps=20", "warmup_steps=5")
    assert not any("warmup" in n for n in adapt.adapt(make_plan(H200, fine).to_dict(), fine, H200_RANK).notes)


@pytest.mark.parametrize("arch, expected", [("gfx90a:sramecc+:xnack-", "bf16"), ("gfx942", "bf16"),
                                            ("gfx1100", "bf16"), ("gfx1030", "fp16"), ("gfx906", "fp16")])
def test_rocm_at_launch_follows_the_per_arch_bf16_list_not_every_rocm_gpu(arch, expected):
    # The old launch rule said every ROCm GPU has bf16; RDNA2 (gfx1030) and MI50 (gfx906) do not.
    rank = RankFacts("cuda", vendor="amd", capability=arch, name="AMD GPU")
    planned = make_plan(MI300X, cfg("model=Qwen/Qwen3-0.6B")).to_dict()
    assert adapt.adapt(planned, cfg("model=Qwen/Qwen3-0.6B"), rank).precision == expected


def test_planner_and_launch_refuse_bf16_on_a_t4_with_the_same_words():
    with pytest.raises(CannotTrain) as planned:
        make_plan(COLAB_T4, cfg("precision=bf16"))
    with pytest.raises(CannotTrain) as launched:
        adapt.adapt(make_plan(H200, cfg()).to_dict(), cfg("precision=bf16"), T4)
    assert str(planned.value) == str(launched.value)
    assert "Tesla T4 (sm_75)" in str(launched.value) and "no native bf16" in str(launched.value)


@pytest.mark.parametrize("asked", ["bf16", "fp16"])
def test_half_precision_on_the_cpu_is_refused_by_planner_and_launch_alike(asked):
    from tests.test_plan import CPU_ONLY

    with pytest.raises(CannotTrain, match="runs on the CPU; use precision=fp32"):
        make_plan(CPU_ONLY, cfg(f"precision={asked}"))
    with pytest.raises(CannotTrain, match="runs on the CPU; use precision=fp32"):
        adapt.adapt({"per_device_batch": 1, "global_batch": 1}, cfg(f"precision={asked}"), CPU)


def test_the_global_batch_is_kept_whatever_the_world_size():
    planned = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA)).to_dict()
    two = adapt.adapt(planned, cfg(*QWEN8_QLORA), RankFacts("cuda", world_size=2, vendor="nvidia", capability="7.5"))
    one = adapt.adapt(planned, cfg(*QWEN8_QLORA), T4)
    assert two.global_batch == one.global_batch == planned["global_batch"]
    assert one.grad_accum == 2 * two.grad_accum and two.strategy == "ddp"


def test_unsloth_planned_but_missing_falls_back_with_a_note_and_asked_for_refuses():
    planned = {**make_plan(H200, cfg(*QWEN8_QLORA)).to_dict(), "backend": "unsloth"}
    assert adapt.adapt(planned, cfg(*QWEN8_QLORA), H200_RANK).backend == "transformers"
    with_it = RankFacts("cuda", vendor="nvidia", capability="9.0", installed=frozenset({"unsloth"}))
    assert adapt.adapt(planned, cfg(*QWEN8_QLORA), with_it).backend == "unsloth"
    with pytest.raises(CannotTrain, match="backend=unsloth was asked for"):
        adapt.adapt(planned, cfg(*QWEN8_QLORA, "backend=unsloth"), H200_RANK)


def test_model_parallel_under_torchrun_is_refused():
    with pytest.raises(UsageError, match="rank 1 of 2.*not torchrun"):
        adapt.adapt({"per_device_batch": 1, "global_batch": 2, "strategy": "model_parallel"}, cfg(),
                    RankFacts("cuda", rank=1, world_size=2, vendor="nvidia", capability="7.5"))


def test_precision_rule_is_the_one_the_planner_prints():
    chosen, why = precision.choose("auto", "cuda", "nvidia", "7.5", "Tesla T4")
    plan = make_plan(COLAB_T4, cfg())
    assert chosen == plan.precision == "fp16" and why + "." in plan.reasons


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
    cfg_, planned = arguments.settings(cfg(*QWEN8_QLORA).__dict__, embedded_plan, _args(str(other)))
    assert planned is not embedded_plan and planned["device"] == "cpu" and planned["per_device_batch"] == 4
    assert planned["gradient_checkpointing"] is False and embedded_plan["gradient_checkpointing"] is True
    plan = adapt.adapt(planned, cfg_, CPU)
    assert plan.per_device_batch == 4 and plan.grad_accum == 2
    assert plan.notes[0].startswith(f"--config {other}: planned") and "machine (the CPU)" in plan.notes[0]


def test_without_config_the_embedded_plan_is_used_with_the_overrides():
    embedded_plan = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA)).to_dict()
    from dataclasses import asdict

    cfg_, planned = arguments.settings(asdict(cfg(*QWEN8_QLORA)), embedded_plan, _args(None, "max_steps=7"))
    assert planned is embedded_plan and cfg_.max_steps == 7
