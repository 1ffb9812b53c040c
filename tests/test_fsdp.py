"""The FSDP path of the generated script, for real on the CPU: torchrun, 2 gloo ranks, the tiny
model, Trainer's FSDP2 through accelerate (kit lets accelerate pick FSDP on the CPU, see
kit.train.sharding._allow_cpu_fsdp; the sharding, saving and loading code is the GPU's). Trains,
checkpoints, is killed -9 and resumes to the same adapter; the adapter loads in plain PEFT; a DDP
checkpoint resumes under FSDP and back."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.scripts import FAST, ROOT, cpu_env, kill_job, kit_cli, losses, torchrun_cmd, train

STEPS = ["max_steps=8", "save_steps=2", "keep_checkpoints=4", *FAST]
# Same numbers, reduced in another order: FSDP reduce-scatters the gradients where DDP all-reduces
# them, so an FSDP run and a DDP run agree to float32 rounding, not bit for bit.
ACROSS_STRATEGIES = 1e-5


def render(tmp_path: Path, strategy: str) -> Path:
    script = tmp_path / f"train_{strategy}.py"
    r = kit_cli(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", f"strategy={strategy}", "-o",
                 str(script), "--force"])  # `python -m kit render …`, in this process
    assert r.returncode == 0, r.stderr
    return script


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripts")
    return {s: render(folder, s) for s in ("fsdp", "ddp")}


@pytest.fixture(scope="module")
def reference(scripts, tmp_path_factory):
    """An uninterrupted FSDP run: 8 steps, a checkpoint every 2."""
    out = tmp_path_factory.mktemp("reference") / "run"
    r = train([f"output_dir={out}", *STEPS], script=scripts["fsdp"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return out


def adapter(ckpt: Path) -> dict:
    from safetensors.torch import load_file  # imports torch: only where a test reads an adapter

    return load_file(Path(ckpt) / "adapter_model.safetensors")


def worst_difference(a: Path, b: Path) -> float:
    wa, wb = adapter(a), adapter(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


@pytest.mark.slow
def test_fsdp_trains_and_saves_plain_adapters_with_a_named_optimizer(reference):
    ckpt = reference / "checkpoint-8"
    names = {p.name for p in ckpt.iterdir()}
    # FSDP's own files (adapter-only model state, optimizer keyed by name), both ranks' RNG, sealed.
    assert {"adapter_model.safetensors", "pytorch_model_fsdp.bin", "optimizer.bin", "rng_state_0.pth",
            "rng_state_1.pth", "kit_manifest.json"} <= names
    assert "optimizer.pt" not in names
    trace = losses(ckpt)
    assert [s for s, _ in trace] == list(range(1, 9)) and trace[-1][1] < trace[0][1]
    # The full adapter, not rank 0's shard: every LoRA matrix has its whole shape (r = 16 rows of A).
    weights = adapter(ckpt)
    a = next(v for k, v in weights.items() if k.endswith("q_proj.lora_A.weight"))
    assert a.shape[0] == 16 and a.shape[1] == 64


@pytest.mark.slow
def test_the_fsdp_adapter_loads_in_plain_peft(reference):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = reference / "checkpoint-8"
    base = AutoModelForCausalLM.from_pretrained(ROOT / "models" / "tiny-qwen3", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(ckpt))
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    saved = adapter(ckpt)
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert any(saved[k].abs().sum() > 0 for k in saved if "lora_B" in k)  # trained, not the zero init


@pytest.mark.slow
def test_kill_9_then_rerun_resumes_to_the_same_adapter(scripts, reference, tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", *STEPS]
    log = tmp_path / "cut.log"
    proc = subprocess.Popen(torchrun_cmd(scripts["fsdp"]) + args, cwd=ROOT, env=cpu_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not (out / "checkpoint-4" / "kit_manifest.json").exists():
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + log.read_text()[-2000:]
    kill_job(proc, str(out))
    assert not (out / "checkpoint-8").exists()
    r = train(args, script=scripts["fsdp"])
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert "resuming from step" in text
    assert [s for s, _ in losses(out / "checkpoint-8")] == list(range(1, 9))
    # Same world size, same data order, same RNG states: the same numbers, to float32 rounding
    # of the resumed optimizer state (observed: bit-identical).
    assert worst_difference(reference / "checkpoint-8", out / "checkpoint-8") <= 1e-6


@pytest.mark.slow
def test_a_ddp_checkpoint_resumes_under_fsdp_and_back(scripts, reference, tmp_path):
    out = tmp_path / "run"
    base = [f"output_dir={out}", "save_steps=2", "keep_checkpoints=4", *FAST]
    r = train(base + ["max_steps=4"], script=scripts["ddp"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert (out / "checkpoint-4" / "optimizer.pt").exists()
    r = train(base + ["max_steps=8"], script=scripts["fsdp"])  # the schedule as the reference's
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert "resuming from step 4" in text
    assert (out / "checkpoint-6" / "optimizer.bin").exists()
    # The converted copy fed the Trainer; the DDP checkpoint itself is untouched.
    assert not (out / "checkpoint-4" / "optimizer.bin").exists()
    assert worst_difference(reference / "checkpoint-8", out / "checkpoint-8") <= ACROSS_STRATEGIES
    # And back: the FSDP checkpoint-6 resumed under DDP (the newest, 8, moved aside to make 6 the newest).
    (out / "checkpoint-8").rename(out / "set-aside-8")
    r = train(base + ["max_steps=8"], script=scripts["ddp"])
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert "resuming from step 6" in text
    assert (out / "checkpoint-8" / "optimizer.pt").exists()
    assert [s for s, _ in losses(out / "checkpoint-8")] == list(range(1, 9))
    assert worst_difference(reference / "checkpoint-8", out / "checkpoint-8") <= ACROSS_STRATEGIES
