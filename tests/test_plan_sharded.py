"""When a replica does not fit one GPU: FSDP, model parallel as the last resort, host RAM while
loading, the cheapest change, several nodes; and the bad input of each (exit 2 or 3, one line)."""

from __future__ import annotations

import copy
import subprocess

import pytest

from kit.planning import config
from kit.machine import gpu_table
from kit.errors import CannotTrain, UsageError
from kit.planning.plan import make_plan
from tests.scripts import FAST, ROOT, cpu_env, kit_cli, torchrun_cmd
from tests.test_plan import CPU_ONLY, KAGGLE_T4X2, machine, reason

GIB = 2**30


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def cfg(*overrides):
    return config.load(None, list(overrides))


def kit(*args, env=None):
    return kit_cli(args, env=env)  # `python -m kit ARGS`, in this process


def test_14b_qlora_at_4096_on_2xt4_is_fsdp_under_budget():
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-14B", "method=qlora", "seq_len=4096"))
    assert (p.strategy, p.nproc, p.precision, p.quantization) == ("fsdp", 2, "fp16", "nf4")
    assert p.memory["per_gpu_bytes"] <= p.memory["budget_bytes"]
    assert "fsdp_gathered_layers" in p.memory["terms"]
    assert p.launch.split() == ["torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]
    with pytest.raises(CannotTrain):  # and a replica alone would not fit
        make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-14B", "method=qlora", "seq_len=4096", "strategy=ddp"))


def test_32b_qlora_on_2xt4_goes_model_parallel_because_fsdp_loads_a_whole_4bit_base_per_gpu():
    # Sharded, 32B QLoRA would fit a T4 in training; but every rank quantizes the whole base on its
    # GPU before FSDP shards it (~20 GiB): that does not fit, so the layer split is the way.
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-32B", "method=qlora", "seq_len=256"))
    assert (p.strategy, p.nproc, p.gpus, p.launch) == ("model_parallel", 1, 2, "python train_ddp.py")
    fsdp = reason(p, "passed_over_fsdp_load")  # each rank quantizes the whole 4-bit base first
    assert fsdp["load_gib"] > fsdp["budget_gib"] == pytest.approx(15_637_086_208 / GIB)
    split = reason(p, "strategy")
    assert (split["strategy"], split["n"], split["layers"], split["fsdp_passed"]) == ("model_parallel", 2, 64, True)
    # With GPUs that hold the 4-bit base while loading, FSDP it is, with the quant storage named.
    p = make_plan(gpu_table.synthesize("2xL4"), cfg("model=Qwen/Qwen3-32B", "method=qlora", "seq_len=1024",
                                                    "activation_offloading=off"))
    assert p.strategy == "fsdp" and p.memory["per_gpu_bytes"] <= p.memory["budget_bytes"]
    assert reason(p, "fsdp_qlora")["precision"] == "bf16"  # the 4-bit weights stored as bf16 for FSDP2
    # Unless the layer inputs offloaded to the CPU (chosen for a replica per bf16 GPU) let a replica fit:
    # the search estimates each candidate with the speed choices made for it.
    p = make_plan(gpu_table.synthesize("2xL4"), cfg("model=Qwen/Qwen3-32B", "method=qlora", "seq_len=1024"))
    assert (p.strategy, p.activation_offloading) == ("ddp", True)
    assert "activations_checkpointed_in_flight" in p.memory["terms"]
    assert p.memory["per_gpu_bytes"] <= p.memory["budget_bytes"]


def test_70b_on_2xt4_does_not_fit_and_names_the_cheapest_bigger_machine():
    with pytest.raises(CannotTrain) as e:
        make_plan(KAGGLE_T4X2, cfg("model=meta-llama/Llama-3.1-70B", "method=qlora"))
    msg = str(e.value)
    assert e.value.exit_code == 3 and e.value.plan.strategy == "none"
    assert "does not fit on 2× Tesla" in msg and "cheapest change" in msg and "a machine with 2× " in msg


def test_host_ram_refuses_a_16bit_fsdp_load_that_would_oom_the_host_and_accepts_it_with_more_ram():
    # 8B bf16 LoRA fits 2×T4 only sharded, and the node's first rank reads 15.3 GiB of 16-bit
    # weights into RAM: too much for a 16 GiB host, fine for Kaggle's.
    job = cfg("model=Qwen/Qwen3-8B", "method=lora", "seq_len=512")
    small = copy.deepcopy(KAGGLE_T4X2)
    small["ram_bytes"] = 16 * GIB
    p = make_plan(small, job)  # changed, with the reason: one process splitting the layers loads in less
    assert p.strategy == "model_parallel"
    fsdp = reason(p, "passed_over_host_ram")
    assert (fsdp["strategy"], round(fsdp["load_gib"], 1), round(fsdp["ram_gib"], 1)) == ("fsdp", 20.3, 14.4)
    tiny = copy.deepcopy(KAGGLE_T4X2)
    tiny["ram_bytes"] = 4 * GIB  # not even one process loads: refused, exit 3
    with pytest.raises(CannotTrain) as e:
        make_plan(tiny, job)
    assert e.value.exit_code == 3 and "model_parallel: loading" in str(e.value) and "~4.5 GiB of host RAM" in str(e.value)
    p = make_plan(KAGGLE_T4X2, job)
    assert p.strategy == "fsdp" and round(reason(p, "host_ram")["load_gib"], 1) == 20.3


def test_host_ram_counts_ddp_ranks_too_and_changes_the_plan_with_the_reason():
    small = machine("Tesla T4", "7.5", 15_637_086_208, count=8)
    small["ram_bytes"] = 16 * GIB  # 8 ranks × ~4.5 GiB while loading
    p = make_plan(small, cfg("model=Qwen/Qwen3-8B", "method=qlora"))
    ddp = next(r for r in p.reasons if r.code == "passed_over_host_ram" and r["strategy"] == "ddp")
    assert (round(ddp["load_gib"], 1), ddp["ranks"]) == (36.0, 8)
    assert p.strategy == "model_parallel"  # one process loads: what 16 GiB of RAM allows
    assert make_plan(small, cfg("model=Qwen/Qwen3-8B", "method=qlora"), nproc=2).strategy == "ddp"


def test_model_parallel_asked_for_is_one_process_and_never_over_nodes():
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-8B", "method=qlora", "strategy=model_parallel"))
    assert (p.strategy, p.launch) == ("model_parallel", "python train_ddp.py")
    with pytest.raises(UsageError, match="one process on one machine"):
        make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-8B", "method=qlora", "strategy=model_parallel"), nodes=2)
    with pytest.raises(UsageError, match="splits the layers over several GPUs"):
        make_plan(gpu_table.synthesize("1xT4"), cfg("model=Qwen/Qwen3-8B", "method=qlora", "strategy=model_parallel"))


def test_two_nodes_get_a_torchrun_command_each_and_the_batch_spans_all_ranks():
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-8B", "method=qlora", "global_batch=32"), nodes=2,
                  rdzv_endpoint="10.0.0.1:29500")
    assert (p.strategy, p.nodes, p.nproc) == ("ddp", 2, 2)
    assert p.global_batch == p.per_device_batch * p.grad_accum * 4 == 32
    assert len(p.node_launch) == 2 and p.launch == p.node_launch[0]
    for rank, command in enumerate(p.node_launch):
        assert command.split() == ["torchrun", "--nnodes=2", "--nproc_per_node=2", f"--node_rank={rank}",
                                   "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29500", "--rdzv_id=kit-qwen3-8b",
                                   "--max_restarts=0", "train_ddp.py"]
    assert "#SBATCH --nodes=2" in p.snippets["slurm"] and '--node_rank="$SLURM_NODEID"' in p.snippets["slurm"]
    assert "num_nodes: 2" in p.snippets["skypilot"] and "accelerators: T4:2" in p.snippets["skypilot"]
    # FSDP shards over every rank of every node.
    p = make_plan(KAGGLE_T4X2, cfg("model=Qwen/Qwen3-14B", "method=qlora", "seq_len=4096"), nodes=2)
    assert p.strategy == "fsdp" and "sharded 4 ways" in " ".join(p.memory["notes"])


@pytest.mark.parametrize("args,words", [
    (["--nodes", "0"], "error: --nodes 0: a job runs on 1 to 1024 nodes"),
    (["--nodes", "5000"], "error: --nodes 5000: a job runs on 1 to 1024 nodes"),
    (["--node-rank", "0"], "error: --node-rank is for a job over several machines: add --nodes N"),
    (["--rdzv-endpoint", "10.0.0.1:29500"], "error: --rdzv-endpoint is for a job over several machines"),
    (["--nproc", "0"], "error: --nproc 0: use at least 1 process"),
    (["--nproc=-3"], "error: --nproc -3: use at least 1 process"),
    (["--nodes", "2", "--rdzv-endpoint", "10.0.0.1"], "is not HOST:PORT"),
    (["--nodes", "2", "--rdzv-endpoint", "node0:http"], "is not HOST:PORT"),
    (["--nodes", "2", "--node-rank", "2"], "error: --node-rank 2: node ranks run from 0 to 1 for --nodes 2"),
])
def test_bad_multi_node_flags_exit_2_with_one_line(args, words):
    r = kit("plan", "--config", "configs/default.yaml", "--gpus", "2xT4", "per_device_batch=4", *args)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_node_rank_prints_that_nodes_command():
    r = kit("plan", "--config", "configs/default.yaml", "--gpus", "2xT4", "per_device_batch=4", "global_batch=24",
            "--nodes", "3",
            "--node-rank", "2", "--rdzv-endpoint", "[fd00::1]:29400")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:4] == ["torchrun", "--nnodes=3", "--nproc_per_node=2", "--node_rank=2"]
    assert "--rdzv_endpoint=[fd00::1]:29400" in r.stdout


@pytest.mark.parametrize("overrides,words", [
    (["strategy=fsdp"], "strategy fsdp on one CPU process has nothing to shard over"),
    (["strategy=fsdp", "method=qlora"], "method=qlora needs a CUDA GPU"),
    (["strategy=model_parallel"], "strategy model_parallel splits the layers over GPUs, and this machine has none"),
])
def test_sharding_asked_for_where_it_cannot_run_on_a_cpu_exits_3(overrides, words):
    r = kit("plan", "--config", "configs/default.yaml", "--gpus", "cpu", *overrides)
    assert r.returncode == 3, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(CannotTrain, match=words.split(":")[0][:30]):
        make_plan(CPU_ONLY, cfg(*overrides))


def test_fsdp_on_two_cpu_processes_plans_for_checking_the_script():
    p = make_plan(CPU_ONLY, cfg("strategy=fsdp"), nproc=2)
    assert (p.strategy, p.device, p.nproc) == ("fsdp", "cpu", 2)
    assert p.launch.split() == ["torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py"]


@pytest.mark.slow
def test_model_parallel_script_under_torchrun_exits_2_with_one_line(tmp_path):
    script = tmp_path / "train_mp.py"
    r = kit("render", "--config", "configs/default.yaml", "--gpus", "2xT4", "strategy=model_parallel", "-o", str(script))
    assert r.returncode == 0, r.stderr
    # The next step is one process (not torchrun), and it names the script just written.
    assert r.stdout.splitlines()[-1] == f"next: python {script}" and "torchrun" not in script.read_text().split('"""')[1].split("\n")[3]
    run = subprocess.run(torchrun_cmd(script) + [f"output_dir={tmp_path / 'out'}", *FAST], cwd=ROOT, env=cpu_env(),
                         capture_output=True, text=True, timeout=180)
    assert run.returncode != 0
    assert "error: strategy " in run.stderr and "model_parallel runs as" in run.stderr and "not torchrun" in run.stderr
    assert "Traceback" not in run.stderr.split("error: strategy ")[0][-500:]
    assert not (tmp_path / "out").exists()


def _fsdp_measurements():
    """FSDP + QLoRA at world size 1 through the generated script on the H200 (bench/fsdp_qlora_gpu.py)."""
    import json

    doc = json.loads((ROOT / "bench" / "results" / "fsdp_qlora_h200.json").read_text())
    return [pytest.param(doc, r, id=r["precision"]) for r in doc["runs"]]


@pytest.mark.parametrize("doc,run", _fsdp_measurements())
def test_fsdp_qlora_estimate_within_5_percent_of_the_h200_measurement(doc, run):
    # The peak a user is told before an FSDP job, against rank 0's max_memory_allocated over real steps;
    # the gathered lm_head unit was missing from it at world size 1 (14 % under).
    c = cfg(f"model={doc['model_shape']}", "method=qlora", f"seq_len={doc['seq_len']}",
            f"per_device_batch={doc['per_device_batch']}", f"global_batch={doc['per_device_batch']}",
            "gradient_checkpointing=on", "lora.r=16", "lora.alpha=32", "lora.target_modules=all-linear",
            f"precision={run['precision']}", "strategy=fsdp",
            "batching=padded")  # what the script settled to for rows that fill seq_len
    p = make_plan(gpu_table.synthesize("1xH200"), c)
    assert p.strategy == "fsdp"
    assert p.memory["allocated_bytes"] / GIB == pytest.approx(run["measured_peak_allocated_gib"], rel=0.05)
