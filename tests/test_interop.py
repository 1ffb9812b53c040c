"""Interop with plain Hugging Face: a vanilla Trainer's Hub checkpoint resumes under kit, and a kit
checkpoint resumes under a vanilla Trainer. Real Trainer, real huggingface_hub over HTTP."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, cpu_env, train

# A plain TRL/PEFT training script, as a user would write it without kit.
VANILLA = """
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import SFTConfig, SFTTrainer
from kit.planning import config
from kit.train import data

out, max_steps, resume, hub_repo = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None, sys.argv[4] or None
cfg = config.load("configs/default.yaml")
set_seed(cfg.seed)
tok = AutoTokenizer.from_pretrained(cfg.model)
model = get_peft_model(AutoModelForCausalLM.from_pretrained(cfg.model),
                       LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
train_ds = data.prepare(cfg, tok).train
hub = dict(push_to_hub=True, hub_model_id=hub_repo, hub_strategy="checkpoint", hub_private_repo=True) if hub_repo else {}
args = SFTConfig(output_dir=out, max_steps=max_steps, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                 learning_rate=cfg.learning_rate, save_steps=4, logging_steps=1, report_to="none", use_cpu=True,
                 gradient_checkpointing=False, completion_only_loss=True, max_length=cfg.seq_len, **hub)
trainer = SFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tok)
trainer.train(resume_from_checkpoint=resume)
print("VANILLA_STEP", trainer.state.global_step)
"""


def vanilla(tmp_path, *args, env=None):
    script = tmp_path / "vanilla.py"
    script.write_text(VANILLA)
    env = env or cpu_env()
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_kit_checkpoint_resumes_under_a_vanilla_trainer(tmp_path):
    out = tmp_path / "run"
    assert train([f"output_dir={out}", "max_steps=4", "save_steps=4", *FAST], nproc=1).returncode == 0
    r = vanilla(tmp_path, tmp_path / "vanilla-out", 8, out / "checkpoint-4", "")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "VANILLA_STEP 8" in r.stdout


@pytest.mark.slow
def test_kit_resumes_from_a_vanilla_trainers_hub_checkpoint(tmp_path):
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        env = cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        r = vanilla(tmp_path, tmp_path / "vanilla-out", 4, "", "me/vanilla", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "last-checkpoint/trainer_state.json" in server.files("me/vanilla")
        out = tmp_path / "kit-run"
        k = train([f"output_dir={out}", "store=hf://me/vanilla", "max_steps=8", "save_steps=4", *FAST],
                  nproc=1, env=env)
        assert k.returncode == 0, k.stderr[-3000:]
        assert "resuming from step 4 (store" in k.stdout
        assert "complete: step 8 of 8" in k.stdout
