"""The generated train_ddp.py on a real CUDA GPU: rendered for the tiny default with the plan for the GPU
this machine has (`kit render` probes it), then `python train_ddp.py` to the end. Marked `gpu`: skipped
where no CUDA GPU is present (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.scripts import ROOT, kit_cli, losses

STEPS = 10


def gpu_env(**extra) -> dict:
    """The caller's environment, GPU visible, no Hub."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "KIT_PLATFORM": "local"}
    env.update(extra)
    return env


@pytest.mark.gpu
def test_the_script_rendered_for_this_gpu_trains_on_it_to_the_end(tmp_path):
    import torch

    name = torch.cuda.get_device_name(0)
    script, out = tmp_path / "train_ddp.py", tmp_path / "run"
    rendered = kit_cli(["render", "--config", "configs/default.yaml", "-o", str(script)], env=gpu_env())
    assert rendered.returncode == 0, rendered.stderr
    source = script.read_text()
    assert "'device': 'cuda'" in source and name in source  # the plan for this GPU, not the CPU's

    done = subprocess.run([sys.executable, str(script), f"output_dir={out}", f"max_steps={STEPS}",
                           f"save_steps={STEPS}", "eval_steps=null", "logging_steps=1"], cwd=ROOT, env=gpu_env(),
                          capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert log.count(f"[kit] complete: step {STEPS} of {STEPS}") == 1, log[-4000:]
    assert "plan: bf16, 1 × cuda," in log or "plan: fp16, 1 × cuda," in log, log[-4000:]
    final = out / f"checkpoint-{STEPS}"
    assert (final / "adapter_model.safetensors").is_file() and (final / "kit_manifest.json").is_file()
    trace = losses(final)
    assert [s for s, _ in trace] == list(range(1, STEPS + 1)) and trace[-1][1] < trace[0][1], trace
