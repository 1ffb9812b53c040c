"""`kit plan` for every machine of kit's GPU table (`--gpus`): host RAM known only where it is a platform
fact, each node's command and a SkyPilot task with SkyPilot's GPU name over several nodes, and plan text
that reads right on one GPU, several, several nodes, the CPU, and a GPU the assumed torch cannot run."""

from __future__ import annotations

import json
import re

import pytest

from kit.cli import main
from kit.errors import CannotTrain
from kit.machine import gpu_table
from kit.planning import config
from kit.planning.plan import make_plan
from tests.scripts import ROOT
from tests.test_plan import codes, machine, reason

GIB = 2**30
MACHINES = ROOT / "tests" / "fixtures" / "machines"
QWEN8_QLORA = ("model=Qwen/Qwen3-8B", "method=qlora")
EVERY_GPU = sorted(gpu_table.GPUS)
RUNNABLE = [k for k in EVERY_GPU if k != "P100"]  # the assumed torch (Kaggle's) has no sm_60


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)


def cfg(*overrides):
    return config.load(None, list(overrides))


def heading(out: str) -> tuple[str, str]:
    """The plan's first line, `plan for MODEL on MACHINE`, as (MODEL, MACHINE)."""
    first = out.splitlines()[0]
    assert first.startswith("plan for "), first
    model, machine = first.removeprefix("plan for ").split(" on ", 1)
    return model, machine


def row(out: str, name: str) -> str:
    """The value of the plan text's `  NAME   VALUE` row."""
    [found] = [ln.split(None, 1)[1] for ln in out.splitlines() if ln.startswith("  ") and ln.split()[:1] == [name]]
    return found


def kit_plan(capsys, *args) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---- host RAM: a platform fact, or unknown and not checked ---------------------------------------
@pytest.mark.parametrize("key", EVERY_GPU)
@pytest.mark.parametrize("count", [1, 2, 8])
def test_a_named_machine_has_host_ram_only_where_the_platform_fixes_it(key, count):
    facts = gpu_table.synthesize(f"{count}x{key}")
    platform_machine = gpu_table.PLATFORM_MACHINES.get((key,) * count)
    if platform_machine is None:
        assert facts["ram_bytes"] is None and "ram_bytes" in facts["unknown"]
        assert facts["platform"] == "other"
    else:
        assert facts["ram_bytes"] == platform_machine[1] and facts["platform"] == platform_machine[0]


def test_the_platform_machines_ram_is_what_their_probes_read():
    kaggle = json.loads((MACHINES / "kaggle_t4x2.json").read_text())
    p100 = json.loads((MACHINES / "kaggle_p100.json").read_text())
    colab = json.loads((MACHINES / "cpu_only.json").read_text())  # Colab's runtime, accelerator off
    assert gpu_table.synthesize("2xT4")["ram_bytes"] == kaggle["ram_bytes"]
    assert gpu_table.synthesize("1xP100")["ram_bytes"] == p100["ram_bytes"]
    assert gpu_table.synthesize("1xT4")["ram_bytes"] == colab["ram_bytes"]


@pytest.mark.parametrize("key", RUNNABLE)
def test_an_8b_qlora_on_eight_of_any_gpu_is_ddp_never_vetoed_by_assumed_ram(key):
    p = make_plan(gpu_table.synthesize(f"8x{key}"), cfg(*QWEN8_QLORA))
    assert (p.strategy, p.nproc) == ("ddp", 8), p.reasons
    assert not [c for c in codes(p) if c.startswith("passed_over")]
    host = reason(p, "host_ram")
    assert host["ram_gib"] is None and round(host["load_gib"], 1) == 36.0  # not known: not checked
    # Over two nodes too (the README's example): one DDP world of 16 ranks.
    p = make_plan(gpu_table.synthesize(f"8x{key}"), cfg(*QWEN8_QLORA), nodes=2, rdzv_endpoint="10.0.0.1:29500")
    assert (p.strategy, p.nproc, p.nodes) == ("ddp", 8, 2)


def test_the_readmes_8xh100_plans_ddp_on_one_node_and_on_two(capsys):
    code, out, err = kit_plan(capsys, "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "8xH100")
    assert (code, err) == (0, "")
    assert re.search(r"^  strategy +ddp ", out, re.M) and "model_parallel" not in out
    assert "× 8 processes = 16" in out and "not checked" in out
    code, out, err = kit_plan(capsys, "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "8xH100",
                              "--nodes", "2", "--rdzv-endpoint", "10.0.0.1:29500")
    assert (code, err) == (0, "")
    assert re.search(r"^  strategy +ddp ", out, re.M)


def test_known_ram_still_decides_and_a_ram_refusal_names_the_ram_fix():
    # 8×T4 with 16 GiB of RAM over two nodes: the GPUs hold an 8B QLoRA replica each, but 8 ranks
    # loading at once need ~36 GiB; model parallel does not span nodes. The fix is fewer processes,
    # not a bigger GPU.
    small = machine("Tesla T4", "7.5", 15_637_086_208, count=8)
    small["ram_bytes"] = 16 * GIB
    with pytest.raises(CannotTrain) as e:
        make_plan(small, cfg(*QWEN8_QLORA), nodes=2)
    msg = str(e.value)
    assert e.value.exit_code == 3 and "host RAM while loading" in msg
    assert "cheapest change" in msg and "fits: --nproc 3" in msg and "GPU with more memory" not in msg
    plan = make_plan(small, cfg(*QWEN8_QLORA), nproc=3, nodes=2)
    assert (plan.strategy, plan.nproc) == ("ddp", 3)
    # And the layer split it falls back to on one node says why, not "neither fits".
    p = make_plan(small, cfg(*QWEN8_QLORA))
    split = reason(p, "strategy")
    assert p.strategy == "model_parallel" and split["ddp_passed"]
    assert [r["strategy"] for r in p.reasons if r.code == "passed_over_host_ram"] == ["ddp", "fsdp"]


# ---- several nodes: every node's command, SLURM and SkyPilot in the text ---------------------------
def test_multi_node_text_shows_each_nodes_command_and_the_whole_world(capsys):
    code, out, err = kit_plan(capsys, "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "4xH100",
                              "--nodes", "2", "--rdzv-endpoint", "10.0.0.1:29500")
    assert (code, err) == (0, "")
    assert heading(out)[1].startswith("2 nodes × 4× NVIDIA H100") and heading(out)[1].endswith(" 80GB HBM3")
    batch = next(ln for ln in out.splitlines() if ln.lstrip().startswith("batch "))
    assert "× 8 processes (" in batch and "(2 nodes × 4) = 16" in batch and "process(es)" not in batch
    for rank in (0, 1):
        assert any(ln.split()[:6] == ["node", f"{rank}:", "torchrun", "--nnodes=2", "--nproc_per_node=4",
                                      f"--node_rank={rank}"] for ln in out.splitlines())
    sbatch = [ln.split() for ln in out.splitlines() if ln.strip().startswith("#SBATCH")]
    assert ["#SBATCH", "--nodes=2"] in sbatch and ["#SBATCH", "--gpus-per-node=4"] in sbatch
    assert "    accelerators: H100:4" in out and "HBM3:" not in out
    last = out.splitlines()[-1]
    assert last.startswith("next: ") and "--node_rank=0" not in last and "each node's command" in last


@pytest.mark.parametrize("key", RUNNABLE)
def test_the_skypilot_task_names_every_table_gpu_as_skypilot_does(key):
    p = make_plan(gpu_table.synthesize(f"2x{key}"), cfg(), nodes=2)
    assert f"  accelerators: {gpu_table.SKYPILOT[key]}:2" in p.snippets["skypilot"].splitlines()


def test_skypilot_names_other_boards_of_a_model_and_marks_a_gpu_it_does_not_know():
    assert set(gpu_table.SKYPILOT) == set(gpu_table.GPUS)
    assert gpu_table.skypilot_name("NVIDIA H100 PCIe", 80 * GIB) == "H100"
    assert gpu_table.skypilot_name("NVIDIA A100-PCIE-40GB", 40 * GIB) == "A100"
    assert gpu_table.skypilot_name("NVIDIA A100 80GB PCIe", 80 * GIB) == "A100-80GB"
    assert gpu_table.skypilot_name("Tesla V100-PCIE-32GB", 32 * GIB) == "V100-32GB"
    unknown = machine("NVIDIA RTX PRO 6000 Blackwell", "12.0", 96 * GIB, count=2, platform="local")
    task = make_plan(unknown, cfg(), nodes=2).snippets["skypilot"]
    [acc] = [ln for ln in task.splitlines() if "accelerators:" in ln]
    assert acc.split("#")[0].split() == ["accelerators:", "GPU:2"] and "SkyPilot's name" in acc
    assert "Blackwell" not in task


# ---- the plan's words on every built-in machine ---------------------------------------------------
BAD_WORDS = ["(es)", "(s)", "1 processes", "1 accumulation steps", "1 GPUs", " on cuda", "× cpu", "2 process ",
             "2 accumulation step,", "2 accumulation step ", "None"]


@pytest.mark.parametrize("spec", ["cpu"] + [f"{n}x{k}" for k in EVERY_GPU for n in (1, 2)])
@pytest.mark.parametrize("job", [(), ("--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml")])
def test_plan_text_reads_right_on_every_built_in_machine(capsys, spec, job):
    code, out, err = kit_plan(capsys, *job, "--gpus", spec)
    assert code in (0, 3), err
    text = out + err
    for bad in BAD_WORDS:
        assert bad not in text, (bad, text)
    header = out.splitlines()[0]
    facts = gpu_table.synthesize(spec)
    if spec == "cpu":
        assert header.endswith(" on the CPU") and "GPU" not in out.split("reasons")[0]
    else:
        assert header.endswith(f" on {facts['gpu_count']}× {facts['gpus'][0]['name']}")
    if facts["platform"] != "kaggle":  # Kaggle's own fix (its accelerator menu) only for Kaggle's machines
        assert "T4×2 accelerator" not in text and "Settings → Accelerator" not in text
    if code == 3:
        assert row(out, "strategy").startswith("none (no plan")
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_a_p100_refusal_names_the_machine_and_says_where_kaggles_fix_applies(capsys):
    code, out, err = kit_plan(capsys, "--gpus", "1xP100")
    assert code == 3 and heading(out) == ("models/tiny-qwen3", "1× Tesla P100-PCIE-16GB")
    assert "on Kaggle, pick the T4×2" in err and "elsewhere, install a" in err and "sm_60" in err
    code, out, err = kit_plan(capsys, "--gpus", "2xP100")  # not a Kaggle machine: no Kaggle advice
    assert code == 3 and heading(out) == ("models/tiny-qwen3", "2× Tesla P100-PCIE-16GB")
    assert err.rstrip().endswith("built for sm_60") and ": install a torch" in err and "Kaggle" not in err


def test_one_gpu_and_the_cpu_read_in_the_singular(capsys):
    code, out, _ = kit_plan(capsys, "--gpus", "1xL4", "global_batch=16", "per_device_batch=8")
    assert code == 0 and row(out, "strategy").startswith("single (one GPU") and "one process)" in out
    assert row(out, "batch").split(" × ") == ["8 per GPU", "2 accumulation steps", "1 process = 16"]
    assert "(1 process of ~2.5 GiB:" in out
    code, out, _ = kit_plan(capsys, "--gpus", "cpu", "global_batch=8", "per_device_batch=8")
    assert code == 0 and heading(out) == ("models/tiny-qwen3", "the CPU")
    per, steps, world = row(out, "batch").split(" × ")
    assert per.endswith(" per process") and steps == "1 accumulation step" and world.startswith("1 process = ")
    assert "memory per process" in out
    # The CPU's RAM is not known for --gpus cpu: the budget is an assumption, said so.
    assert "RAM is not known" in out


def test_render_says_what_it_wrote_in_words(tmp_path, capsys):
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", str(tmp_path / "t.py")]) == 0
    wrote = capsys.readouterr().out.splitlines()[0]
    assert wrote.endswith("(one process), fp32") and ": single on the CPU (" in wrote and "× cpu" not in wrote



@pytest.mark.parametrize("spec,words", [("cpu", "# the plan: single process on the CPU, fp32"),
                                        ("1xT4", "# the plan: single GPU (Tesla T4), fp16")])
def test_the_scripts_header_names_its_plan_in_words(capsys, spec, words):
    assert main(["render", "--config", "configs/default.yaml", "--gpus", spec, "-o", "-"]) == 0
    assert words in capsys.readouterr().out


def test_a_script_given_a_config_on_one_of_two_nodes_plans_the_whole_world(monkeypatch):
    # Rank 0 of node 0 of 2 nodes × 8 GPUs: torchrun sets WORLD_SIZE=16 and LOCAL_WORLD_SIZE=8.
    # The 8-GPU machine cannot exist here: its facts are the GPU table's (what the probe reads there).
    from kit.machine import probe
    from kit.script import arguments

    monkeypatch.setattr(probe, "gather", lambda: probe.Facts.from_dict(gpu_table.synthesize("8xH100")))
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    planned, note = arguments.replan(cfg(*QWEN8_QLORA, "global_batch=32"), "big.yaml")
    assert (planned.strategy, planned.nodes, planned.nproc) == ("ddp", 2, 8)
    assert planned.global_batch == planned.per_device_batch * planned.grad_accum * 16 == 32
    assert (note.code, note["nodes"], note["nproc"], note["source"]) == ("replanned", 2, 8, "big.yaml")


@pytest.mark.parametrize("spec,nodes,words", [
    ("1xT4", "1", "global_batch 12 is not a multiple of per_device_batch 8 × 1 process = 8"),
    ("2xT4", "2", "global_batch 12 is not a multiple of per_device_batch 8 × 4 processes = 32")])
def test_a_batch_that_does_not_divide_counts_the_whole_worlds_processes(capsys, spec, nodes, words):
    code, _, err = kit_plan(capsys, "--gpus", spec, "--nodes", nodes, "global_batch=12", "per_device_batch=8")
    assert code == 2 and words in err and "(s)" not in err


def test_a_refused_mix_of_gpus_is_named_as_the_mix(capsys):
    code, out, err = kit_plan(capsys, "--gpus", "2xT4+L4")
    assert code == 3 and heading(out)[1].split(" + ") == ["2× Tesla T4", "1× NVIDIA L4"]
    assert "mixed GPU models" in err
