"""Verdicts on the probe facts of real machines (tests/fixtures/machines/), and the rules behind them."""

import copy
import json
from pathlib import Path

import pytest

from kit.report import text as report
from kit.machine.probe import Facts, load_facts
from kit.machine.verdicts import arch_supported, bf16_native, judge

MACHINES = Path(__file__).parent / "fixtures" / "machines"
CU128 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def machine(name: str) -> Facts:
    return load_facts(str(MACHINES / f"{name}.json"))


def with_gpus(name: str, gpus: list, arch_list=None) -> Facts:
    """A fixture machine with other GPUs (and optionally another arch list)."""
    facts = copy.deepcopy(machine(name))
    facts.gpus = [{"index": i, "vendor": "nvidia", "memory_free_bytes": None, **g} for i, g in enumerate(gpus)]
    facts.gpu_count = len(gpus)
    if arch_list is not None:
        facts.torch["arch_list"] = arch_list
    return facts


def test_kaggle_p100_is_refused_naming_both_archs():
    facts = machine("kaggle_p100")
    assert facts.torch["arch_list"] == CU128
    v = judge(facts)
    assert not v.ok and v.usable_gpus == []
    assert v.gpus[0]["arch_supported"] is False and v.gpus[0]["arch"] == "sm_60"
    assert "Tesla P100-PCIE-16GB" in v.summary and "(sm_60) is not in" in v.summary
    assert "arch list sm_70…sm_120" in v.summary
    assert "T4×2" in v.action and "install a torch" in v.action and "for sm_60" in v.action


def test_kaggle_t4x2_trains_on_both_in_fp16():
    facts = machine("kaggle_t4x2")
    assert [g["memory_total_bytes"] for g in facts.gpus] == [15637086208, 15637086208]
    v = judge(facts)
    assert v.ok and v.usable_gpus == [0, 1] and not v.mixed
    assert [g["bf16"] for g in v.gpus] == [False, False] and v.bf16 is False
    assert v.action.split() == ["torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]
    assert "fp16" in v.summary


def test_h200_real_probe_is_ok_with_bf16():
    facts = machine("h200")
    assert facts.gpus[0]["memory_total_bytes"] == 150754820096 == 143771 * 2**20
    assert facts.torch["version"] == "2.11.0+cu130"
    assert facts.torch["arch_list"] == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    v = judge(facts)
    assert v.ok and v.bf16 and v.gpus[0]["arch_supported"] is True
    assert v.action == "python train_ddp.py"


def test_mi300x_rocm_is_ok_with_bf16():
    facts = machine("mi300x")
    assert facts.torch["hip"] and facts.torch["cuda"] is None
    assert facts.gpus[0]["capability"] == "gfx942" and facts.gpus[0]["vendor"] == "amd"
    assert facts.gpus[0]["memory_total_bytes"] > 190 * 10**9
    v = judge(facts)
    assert v.ok and v.bf16


def test_radeon_8060s_gfx1151_has_bf16():
    v = judge(machine("radeon_8060s"))
    assert v.ok and v.gpus[0]["arch"] == "gfx1151" and v.gpus[0]["bf16"] is True


def test_cpu_only_cannot_train_and_says_cpu_slow():
    v = judge(machine("cpu_only"))
    assert not v.ok and v.gpus == []
    assert "CPU-slow" in v.summary
    assert "Change runtime type" in v.action  # the fixture is a Colab CPU runtime


def test_ptx_counts_as_support():
    t4 = [{"name": "Tesla T4", "capability": "7.5", "memory_total_bytes": 15637086208}]
    v = judge(with_gpus("kaggle_t4x2", t4, arch_list=["sm_70", "compute_70"]))
    assert v.ok and v.gpus[0]["arch_supported"] is True
    ok, why = arch_supported("7.5", ["compute_70"], "nvidia")
    assert ok is True and why.startswith("runs through PTX: ") and "compute_70 is JIT" in why
    assert arch_supported("7.5", ["sm_80", "compute_80"], "nvidia")[0] is False  # PTX runs forward only
    assert arch_supported("9.0", ["sm_80", "compute_80"], "nvidia")[0] is True   # ... across majors too


def test_same_major_cubins_and_arch_specific_suffix():
    assert arch_supported("8.6", ["sm_80"], "nvidia")[0] is True
    assert arch_supported("8.0", ["sm_86"], "nvidia")[0] is False
    assert arch_supported("9.0", ["sm_90a"], "nvidia")[0] is True
    assert arch_supported("10.3", ["sm_100a"], "nvidia")[0] is False  # "a" kernels run on exactly 10.0


def test_mixed_models_are_flagged():
    gpus = [{"name": "NVIDIA A100-SXM4-80GB", "capability": "8.0", "memory_total_bytes": 80 * 2**30},
            {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_total_bytes": 80 * 2**30}]
    v = judge(with_gpus("h200", gpus))
    assert v.ok and v.mixed and v.usable_gpus == [0, 1]
    assert any("mixed GPU models" in w for w in v.warnings)


def test_unsupported_gpu_among_supported_ones_is_hidden_from_the_launch():
    gpus = [{"name": "Tesla T4", "capability": "7.5", "memory_total_bytes": 15637086208},
            {"name": "Tesla P100-PCIE-16GB", "capability": "6.0", "memory_total_bytes": 16 * 2**30}]
    v = judge(with_gpus("kaggle_t4x2", gpus))
    assert v.ok and v.usable_gpus == [0] and not v.mixed
    assert v.action.split() == ["CUDA_VISIBLE_DEVICES=0", "python", "train_ddp.py"]
    assert any("sm_60" in w for w in v.warnings)


@pytest.mark.parametrize("vendor,capability,native", [
    ("nvidia", "6.0", False), ("nvidia", "7.5", False), ("nvidia", "8.0", True), ("nvidia", "8.9", True),
    ("nvidia", "9.0", True), ("nvidia", "12.0", True), ("amd", "gfx906", False), ("amd", "gfx908", False),
    ("amd", "gfx90a", True), ("amd", "gfx942", True), ("amd", "gfx950", True), ("amd", "gfx1030", False),
    ("amd", "gfx1100", True), ("amd", "gfx1151", True), ("amd", "gfx1201", True),
    ("amd", "gfx90a:sramecc+:xnack-", True)])
def test_bf16_native_from_architecture(vendor, capability, native):
    assert bf16_native(vendor, capability) is native


def test_wrong_vendor_and_cpu_builds_are_refused():
    ok, why = arch_supported("7.5", ["gfx942", "gfx90a"], "nvidia")
    assert not ok and "AMD (ROCm)" in why
    ok, why = arch_supported("gfx942", CU128, "amd")
    assert not ok and "NVIDIA (CUDA)" in why
    ok, why = arch_supported("7.5", [], "nvidia")
    assert ok is False and why.startswith("cannot run on this") and "no GPU kernels" in why
    assert arch_supported("gfx1151", ["gfx942"], "amd")[0] is False


def test_torch_not_installed_cannot_train():
    facts = copy.deepcopy(machine("kaggle_t4x2"))
    facts.torch = {"installed": False, "version": None, "cuda": None, "hip": None, "arch_list": None}
    facts.unknown["torch"] = "no module named torch for /usr/bin/python3"
    v = judge(facts)
    assert not v.ok and v.usable_gpus == []
    assert v.summary.startswith("torch is not installed") and "(no module named torch" in v.summary
    assert "pytorch.org" in v.action


def test_unreadable_arch_list_is_unchecked_not_refused():
    facts = copy.deepcopy(machine("kaggle_t4x2"))
    facts.torch["arch_list"] = None
    v = judge(facts)
    assert v.ok and [g["arch_supported"] for g in v.gpus] == [None, None]
    assert any("could not be read" in w for w in v.warnings)


def test_reports_render_all_three_forms():
    facts = machine("kaggle_p100")
    v = judge(facts)
    text = report.to_text(facts, v)
    assert "Tesla P100-PCIE-16GB" in text and "sm_60 (6.0)" in text and "verdict" in text
    header = next(line for line in text.splitlines() if line.startswith("GPU"))
    row = next(line for line in text.splitlines() if line.startswith("0 "))
    assert header.index("arch") == row.index("sm_60")  # columns line up
    html = report.to_html(facts, v)
    assert html.count("<table>") == 2 and "sm_60" in html and "T4×2" in html
    d = json.loads(report.to_json(facts, v, ["python train_ddp.py"]))
    assert d["verdicts"]["ok"] is False and d["next"] == ["python train_ddp.py"] and d["gpu_count"] == 1


def test_html_escapes_names():
    facts = with_gpus("h200", [{"name": "<script>x</script>", "capability": "9.0", "memory_total_bytes": 1}])
    assert "<script>" not in report.to_html(facts, judge(facts))


def test_an_unread_capability_is_assumed_to_run_and_planned_in_fp16():
    """nvidia-smi without compute_cap writes capability null: the GPU is assumed to run (with a
    warning), bf16 is not assumed, and the plan trains in fp16 (it crashed with 'a bug in kit')."""
    from kit.planning import config
    from kit.planning.plan import make_plan

    facts = with_gpus("kaggle_t4x2", [{**g, "capability": None} for g in machine("kaggle_t4x2").gpus])
    v = judge(facts)
    assert v.ok and not v.bf16 and "compute capability" in v.warnings[0] and "not be read" in v.warnings[0]
    assert bf16_native("nvidia", None) is False
    assert make_plan(facts, config.load(None, [])).precision == "fp16"
