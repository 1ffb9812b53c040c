"""Every YAML under configs/, recursively: it loads, its first line is the command that runs it, and it
plans on the machine that line names (`--gpus ...`)."""

import re
from pathlib import Path

import pytest

from kit import config, hardware
from kit.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").rglob("*.y*ml"))


def test_configs_are_found_recursively():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in CONFIGS}
    assert {"qwen3-8b-qlora-kaggle-t4x2.yaml", "qwen3-0.6b-lora-colab-t4.yaml"} <= names
    assert any("/" in n for n in names), "configs/examples/ must be searched too"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_loads_and_states_its_command(path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and re.search(r"(train_ddp\.py|\bkit\b)", first), first
    cfg = config.load(str(path))
    assert config.load(None, [f"{k}={v}" for k, v in config.fingerprint(cfg).items()
                              if not isinstance(v, (dict, list)) and v is not None]).model == cfg.model
    gpus = re.search(r"--gpus\s+(\S+)", first)
    if gpus:  # a shipped config must fit the machine it was written for
        plan = make_plan(hardware.synthesize(gpus.group(1)), cfg)
        assert plan.strategy != "none"
        expected = "torchrun" if plan.nproc > 1 else "python train_ddp.py"
        assert expected in plan.launch and expected in first
