"""Every YAML under configs/, recursively: it loads, its first line is the command that runs it, and it
plans on the machine that line names (`--gpus ...`)."""

import re
from pathlib import Path

import pytest

from kit.planning import config
from kit.machine import gpu_table
from kit.planning.plan import make_plan

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
    # The YAML's values are what the run uses: every key it sets arrives in the loaded config.
    import yaml
    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    loaded = config.to_dict(cfg)
    for key, value in flat(yaml.safe_load(path.read_text()) or {}):
        got = loaded
        for part in key.split("."):
            got = got[part]
        if isinstance(value, bool) and got in ("on", "off"):  # YAML 1.1 reads `on` as true
            value = "on" if value else "off"
        assert got == value, f"{path.name}: {key} is {got!r} after loading, the YAML says {value!r}"
    gpus = re.search(r"--gpus\s+(\S+)", first)
    if gpus:  # a shipped config must fit the machine it was written for
        plan = make_plan(gpu_table.synthesize(gpus.group(1)), cfg)
        assert plan.strategy != "none"
        expected = "torchrun" if plan.nproc > 1 else "python train_ddp.py"
        assert expected in plan.launch and expected in first


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_comments_quote_no_memory_figures(path):
    """A figure the planner prints (GiB per GPU, of the budget) drifts as the planner learns; a comment
    that copies it goes stale ("~12 GiB of 14.6" while the plan said 9.87 of 14.56). Comments name
    the command that shows it instead."""
    comments = [line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line]
    # A GPU's own size ("one L4 (24 GB)") is the hardware's name, not a figure of the plan.
    stale = [c for c in comments if re.search(r"\d\.\d+\s*GiB|~\s*\d+(\.\d+)?\s*GiB|\bof \d+\.\d", c)]
    assert not stale, stale
