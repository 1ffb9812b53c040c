"""kit.planning.plan: a pure function of (facts, config), tested with the facts of real machines; `kit plan`'s
exit codes and error lines through a real subprocess."""

import copy
import json
import os
import re

import pytest

from kit.planning import config
from kit.machine import gpu_table
from kit.errors import CannotTrain, UsageError
from kit.planning.plan import batch_for_world, make_plan
from tests.scripts import kit_cli

GIB = 2**30
TORCHRUN2 = ["torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]
CU128 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def machine(gpu_name, capability, total, count=1, vendor="nvidia", arch=CU128, platform="kaggle",
            torch_version="2.10.0+cu128", packages=None):
    """Facts as `kit probe --json` prints them on that machine."""
    return {
        "schema": 1, "platform": platform, "platform_detected_by": "test", "python": "3.11.13",
        "torch": {"installed": True, "version": torch_version, "cuda": None if vendor == "amd" else "12.8",
                  "hip": "7.0" if vendor == "amd" else None, "arch_list": arch},
        "driver": "560.35.03", "gpu_count": count, "gpu_source": "nvml",
        "gpus": [{"index": i, "name": gpu_name, "vendor": vendor, "capability": capability,
                  "memory_total_bytes": total, "memory_free_bytes": total - 300 * 2**20} for i in range(count)],
        "cpu_count": 4, "ram_bytes": 32 * GIB, "disk_free_bytes": 60 * GIB,
        "packages": packages or {"transformers": "5.17.0", "peft": "0.18.0", "bitsandbytes": "0.49.0",
                                 "unsloth": None, "trl": "1.15.0"},
        "hf_token_available": False, "unknown": {},
    }


KAGGLE_P100 = machine("Tesla P100-PCIE-16GB", "6.0", 17_071_734_784)
KAGGLE_T4X2 = machine("Tesla T4", "7.5", 15_637_086_208, count=2)
COLAB_T4 = machine("Tesla T4", "7.5", 15_637_086_208, platform="colab")
A100 = machine("NVIDIA A100-SXM4-80GB", "8.0", 85_899_345_920, platform="local")
H200 = machine("NVIDIA H200", "9.0", 150_754_820_096, platform="local", torch_version="2.11.0+cu130",
               arch=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
MI300X = machine("AMD Instinct MI300X", "gfx942", 206_141_652_992, vendor="amd", platform="local",
                 arch=["gfx90a", "gfx942", "gfx1100"], torch_version="2.10.0+rocm7.0")
CPU_ONLY = {**machine("x", "7.5", 0, count=0, platform="local"), "gpu_source": None, "driver": None}


def reason(plan_or_reasons, code: str):
    """The one Reason of `code` among a plan's reasons (or a list of notes)."""
    reasons = getattr(plan_or_reasons, "reasons", plan_or_reasons)
    found = [r for r in reasons if r.code == code]
    assert len(found) == 1, [r.code for r in reasons]
    return found[0]


def codes(plan_or_reasons) -> list[str]:
    return [r.code for r in getattr(plan_or_reasons, "reasons", plan_or_reasons)]


def cfg(*overrides):
    return config.load(None, list(overrides))


QWEN8_QLORA = ("model=Qwen/Qwen3-8B", "method=qlora")


def test_p100_is_refused_with_the_kaggle_fix():
    with pytest.raises(CannotTrain, match=r"P100.*sm_60.*sm_70…sm_120.*T4×2") as e:
        make_plan(KAGGLE_P100, cfg(*QWEN8_QLORA))
    assert e.value.plan.strategy == "none"


def test_t4x2_qwen3_8b_qlora_is_ddp_fp16_on_both_gpus():
    p = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA, "seq_len=1024"))
    assert (p.strategy, p.precision, p.nproc, p.device, p.quantization) == ("ddp", "fp16", 2, "cuda", "nf4")
    assert p.gradient_checkpointing and p.per_device_batch >= 1
    assert p.memory["per_gpu_bytes"] <= p.memory["budget_bytes"] == 15_637_086_208
    assert sum(p.memory["terms"].values()) == p.memory["per_gpu_bytes"]
    # What max_memory_allocated would count: everything but the CUDA context and the allocator's slack.
    t = p.memory["terms"]
    assert abs(p.memory["allocated_bytes"] - (p.memory["per_gpu_bytes"] - t["cuda_context"] - t["allocator_slack"])) <= len(t)
    assert p.launch.split() == TORCHRUN2
    assert reason(p, "precision_no_bf16")["gpu"] == "Tesla T4" and reason(p, "strategy")["strategy"] == "ddp"
    assert p.to_dict()["memory"]["terms"]["weights_4bit"] > 0


def test_one_t4_bf16_lora_8b_suggests_qlora():
    with pytest.raises(CannotTrain, match=r"does not fit on 1× Tesla T4: cheapest change that fits: method=qlora") as e:
        make_plan(COLAB_T4, cfg("model=Qwen/Qwen3-8B", "method=lora"))
    assert e.value.plan.strategy == "none" and e.value.exit_code == 3


def test_memory_held_by_another_process_shrinks_the_budget():
    busy = copy.deepcopy(COLAB_T4)
    busy["gpus"][0]["memory_free_bytes"] = 4 * GIB  # a kernel still holds a model
    with pytest.raises(CannotTrain) as e:
        make_plan(busy, cfg(*QWEN8_QLORA))
    assert e.value.plan.memory["budget_bytes"] == 4 * GIB
    held = reason(e.value.plan, "gpu_memory_held")
    assert held["budget_gib"] == 4 and held["used_gib"] == pytest.approx(COLAB_T4["gpus"][0]["memory_total_bytes"] / GIB - 4)
    assert e.value.plan.memory["per_gpu_bytes"] > 4 * GIB and "weights_4bit" in e.value.plan.memory["terms"]


def test_two_t4_bf16_lora_8b_fits_only_sharded():
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-8B", "method=lora"))
    assert p.strategy == "fsdp" and p.nproc == 2 and p.launch.startswith("torchrun")
    assert p.memory["terms"]["weights"] < 9 * GIB


def test_model_parallel_is_the_last_resort_and_never_torchrun(monkeypatch):
    # Where FSDP's gathered layers tip it over but a layer split fits: one process, python launch.
    from kit.planning import memory, plan as planner

    real = memory.estimate

    def no_room_for_fsdp(*a, **kw):
        e = real(*a, **kw)
        if kw.get("sharding") == "fsdp":
            e.total_bytes = 10**12
        return e

    monkeypatch.setattr(planner.memory, "estimate", no_room_for_fsdp)
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-32B", "method=qlora", "seq_len=256"))
    assert (p.strategy, p.nproc, p.launch) == ("model_parallel", 1, "python train_ddp.py")
    said = reason(p, "strategy")
    assert (said["strategy"], said["n"], said["configured"]) == ("model_parallel", 2, "auto")


def test_qlora_that_needs_sharding_says_what_fsdp_needs():
    # 14B QLoRA at seq 4096: a replica does not fit a T4, sharded it does (tests/test_plan_sharded.py has more).
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-14B", "method=qlora", "seq_len=4096"))
    assert p.strategy == "fsdp" and reason(p, "fsdp_qlora")["precision"] == "fp16"


def test_a100_h200_and_mi300x_train_in_bf16():
    for facts in (A100, H200, MI300X):
        p = make_plan(facts, cfg("model=Qwen/Qwen3-8B", "method=lora"))
        assert (p.precision, p.strategy, p.launch) == ("bf16", "single", "python train_ddp.py")
    assert "precision_bf16_rocm" in codes(make_plan(MI300X, cfg()))


def test_cpu_only_tiny_default_plans_and_big_models_are_refused():
    p = make_plan(CPU_ONLY, cfg())
    assert (p.device, p.precision, p.strategy, p.launch) == ("cpu", "fp32", "single", "python train_ddp.py")
    assert codes(p)[:2] == ["model", "cpu_only"]
    p2 = make_plan(CPU_ONLY, cfg(), nproc=2)
    assert p2.strategy == "ddp" and p2.launch.split() == TORCHRUN2
    for refused, match in (("model=Qwen/Qwen3-1.7B", "too big to train on a CPU"),
                           ("method=qlora", "needs a CUDA GPU")):
        with pytest.raises(CannotTrain, match=match) as e:
            make_plan(CPU_ONLY, cfg(refused))
        assert "cpu_only" not in codes(e.value.plan)  # no "fine for the tiny default" above the refusal
    with pytest.raises(CannotTrain, match="GiB of RAM"):
        make_plan({**CPU_ONLY, "ram_bytes": 2**20}, cfg())


# 8B QLoRA at seq 512 takes ~10 GiB at micro-batch 8 (TRL's tiled loss, measured on the H200), so a
# T4 runs batch 8; four T4s split 16 as 4 each.
@pytest.mark.parametrize("gpus,per_device,accum", [("1xT4", 8, 2), ("2xT4", 8, 1), ("4xT4", 4, 1)])
def test_global_batch_is_kept_across_world_sizes(gpus, per_device, accum):
    p = make_plan(gpu_table.synthesize(gpus), cfg(*QWEN8_QLORA, "global_batch=16"))
    assert (p.per_device_batch, p.grad_accum, p.global_batch) == (per_device, accum, 16)
    assert p.per_device_batch * p.grad_accum * p.nproc == 16


def test_batch_for_world_at_runtime():
    c = cfg("global_batch=16")
    assert batch_for_world(c, 4, 1) == (4, 4, 16)
    assert batch_for_world(c, 8, 4) == (4, 1, 16)  # a planner-picked micro-batch shrinks to divide
    assert batch_for_world(cfg(), 4, 2) == (4, 1, 8)
    with pytest.raises(UsageError, match="global_batch 16 is not a multiple of per_device_batch 8 × 4"):
        batch_for_world(cfg("global_batch=16", "per_device_batch=8"), 8, 4)
    with pytest.raises(UsageError, match="global_batch 6 is not a multiple of the 4"):
        batch_for_world(cfg("global_batch=6"), 1, 4)


def test_indivisible_global_batch_is_a_usage_error():
    with pytest.raises(UsageError, match="global_batch 3"):
        make_plan(KAGGLE_T4X2, cfg("global_batch=3"))


def test_explicit_bf16_on_t4_is_refused_naming_the_gpu():
    with pytest.raises(CannotTrain, match=r"bf16.*Tesla T4 \(sm_75\)"):
        make_plan(COLAB_T4, cfg("precision=bf16"))


def test_mixed_gpus_are_refused():
    with pytest.raises(CannotTrain, match="mixed GPU models"):
        make_plan(gpu_table.synthesize("T4+L4"), cfg())


def test_gradient_checkpointing_auto():
    assert make_plan(COLAB_T4, cfg()).gradient_checkpointing is False  # tiny
    assert make_plan(A100, cfg("model=Qwen/Qwen3-1.7B")).gradient_checkpointing is True  # ≥ 1B
    assert make_plan(A100, cfg("model=Qwen/Qwen3-1.7B", "gradient_checkpointing=off")).gradient_checkpointing is False
    # 0.6B at 4k tokens on a T4 only fits when it recomputes
    assert make_plan(COLAB_T4, cfg("model=Qwen/Qwen3-0.6B", "seq_len=4096")).gradient_checkpointing is True


def test_batch_is_the_configs_or_the_largest_power_of_two_that_fits():
    assert make_plan(H200, cfg("model=Qwen/Qwen3-8B")).per_device_batch == 8
    assert make_plan(H200, cfg("model=Qwen/Qwen3-8B", "per_device_batch=3")).per_device_batch == 3
    # 8B QLoRA, seq 2048 × 4 with checkpointing: 10.1 GiB allocated on the H200, ~11.8 GiB planned
    # with context and slack, of the T4's 14.6; 8 would not fit.
    assert make_plan(COLAB_T4, cfg(*QWEN8_QLORA, "seq_len=2048")).per_device_batch == 4


def test_backend_unsloth_only_on_one_nvidia_gpu():
    with_unsloth = copy.deepcopy(KAGGLE_T4X2)
    with_unsloth["packages"]["unsloth"] = "2026.1.1"
    two = make_plan(with_unsloth, cfg(*QWEN8_QLORA))
    one = make_plan(with_unsloth, cfg(*QWEN8_QLORA), nproc=1)
    assert two.backend == "transformers" and "backend_plain_multi_gpu" in codes(two)
    assert one.backend == "unsloth" and one.launch.split() == ["CUDA_VISIBLE_DEVICES=0", "python", "train_ddp.py"]
    assert make_plan(with_unsloth, cfg(*QWEN8_QLORA, "backend=transformers"), nproc=1).backend == "transformers"


def test_prequantized_checkpoint_is_qlora_and_not_full():
    p = make_plan(COLAB_T4, cfg("model=unsloth/Qwen3-8B-unsloth-bnb-4bit", "method=lora"))
    assert p.quantization == "nf4" and reason(p, "qlora_prequantized")["model"] == "unsloth/Qwen3-8B-unsloth-bnb-4bit"
    with pytest.raises(UsageError, match="4-bit checkpoint"):
        make_plan(COLAB_T4, cfg("model=unsloth/Qwen3-8B-bnb-4bit", "method=full"))


def test_nproc_beyond_usable_gpus_is_a_usage_error():
    with pytest.raises(UsageError, match="2 usable GPU"):
        make_plan(KAGGLE_T4X2, cfg(), nproc=3)


def test_bad_facts_dict_is_a_usage_error():
    with pytest.raises(UsageError, match="probe format"):
        make_plan({"schema": 1}, cfg())


# ---- `kit plan` as users run it ---------------------------------------------------------------

def kit_plan(*args, tmp_path=None):
    return kit_cli(["plan", *args], env={**os.environ, "HF_HUB_OFFLINE": "1"})  # in this process


def test_cli_plan_text_and_json():
    out = kit_plan("--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4")
    assert out.returncode == 0, out.stderr
    assert re.search(r"^  strategy +ddp ", out.stdout, re.M) and "weights_4bit" in out.stdout
    # ./train_ddp.py is the default config's script, not this one's: render first (issue 11, item 8).
    last = out.stdout.splitlines()[-1]
    render, torchrun = last.split("), then: ")
    assert render.split("  (")[0].split() == ["next:", "python", "-m", "kit", "render", "--config",
                                             "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4", "-o",
                                             "train_ddp.py", "--force"]
    assert "another config's" in render and torchrun.split() == TORCHRUN2
    out = kit_plan("--config", "configs/default.yaml", "--gpus", "2xT4")
    assert out.stdout.splitlines()[-1].split() == ["next:", *TORCHRUN2]
    out = kit_plan("--gpus", "2xT4", "model=Qwen/Qwen3-8B", "method=qlora", "--json")
    d = json.loads(out.stdout)
    for key in ("precision", "strategy", "nproc", "per_device_batch", "grad_accum", "global_batch",
                "gradient_checkpointing", "memory", "reasons", "launch"):
        assert key in d
    assert set(d["memory"]) >= {"per_gpu_bytes", "allocated_bytes", "budget_bytes", "terms"}


def test_cli_plan_with_facts_file(tmp_path):
    f = tmp_path / "facts.json"
    f.write_text(json.dumps(KAGGLE_T4X2))
    out = kit_plan("--facts", str(f), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["nproc"] == 2
    f.write_text(json.dumps(CPU_ONLY))  # facts with no GPU: the tiny default still plans, on the CPU
    assert json.loads(kit_plan("--facts", str(f), "--json").stdout)["device"] == "cpu"
    out = kit_plan("--facts", str(f), "model=Qwen/Qwen3-8B")
    assert out.returncode == 3 and out.stderr.startswith("error: Qwen/Qwen3-8B ") and "8.2B parameters" in out.stderr


def test_cli_does_not_fit_prints_plan_and_exits_3():
    out = kit_plan("--gpus", "T4", "model=Qwen/Qwen3-8B", "method=lora", "--json")
    assert out.returncode == 3 and json.loads(out.stdout)["strategy"] == "none"
    assert out.stderr.count("\n") == 1 and "method=qlora" in out.stderr
    out = kit_plan("--gpus", "2xP100")
    assert out.returncode == 3 and "sm_60" in out.stderr
    # The refused plan's header names the machine the error names.
    out = kit_plan("--gpus", "2xT4", "model=Qwen/Qwen3-32B", "method=lora")
    assert out.returncode == 3 and "does not fit on 2× Tesla" in out.stderr
    assert out.stdout.splitlines()[0].split(" on ") == ["plan for Qwen/Qwen3-32B", "2× Tesla T4"]
    # A seq_len past the model's positions is refused before any fit search (the script found it after loading).
    out = kit_plan("--gpus", "2xT4", "seq_len=2000000000")
    assert out.returncode == 2 and "longer than" in out.stderr and "max_position_embeddings=1024" in out.stderr


@pytest.mark.parametrize("setup,args,needle", [
    ("model: x\nlora:\n  r: 8\n   alpha: [1\n", [], r"malformed YAML in .* line \d"),
    ("lerning_rate: 0.1\n", [], "did you mean 'learning_rate'"),
    ("seq_len: long\n", [], "'seq_len' in .* must be an integer, got 'long'"),
    ("per_device_batch: -4\n", [], "'per_device_batch' in .* must be > 0, got -4"),
    ("model: someone/Unknown-13B\n", [], "'someone/Unknown-13B' is not in kit's table"),
    (None, ["--facts", "/no/such/facts.json"], "facts file '/no/such/facts.json' does not exist"),
    (None, ["--gpus", "3xGTX1080"], "unknown GPU"),
    (None, ["--gpus", "2xT4", "global_batch=5"], "global_batch 5"),
    (None, ["--gpus", "2xT4", "lora.rank=8"], "did you mean 'lora.r'"),
])
def test_cli_config_errors_exit_2_on_one_line(tmp_path, setup, args, needle):
    if setup is not None:
        c = tmp_path / "c.yaml"
        c.write_text(setup)
        args = ["--config", str(c), "--gpus", "T4", *args]
    out = kit_plan(*args)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert __import__("re").search(needle, out.stderr), out.stderr
