"""`save_every_minutes: auto`: Young's interval from the measured save cost, the config's
accepted spellings and its refusal of others, and a real run that says what it chose."""

from __future__ import annotations

import math
import re

import pytest

from kit.planning import config, save_cadence
from kit.errors import UsageError
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, cpu_env, train


def test_the_interval_is_youngs_within_the_hub_budget_and_half_an_hour():
    assert save_cadence.interval_s(20, 4 * 3600) == pytest.approx(math.sqrt(2 * 20 * 4 * 3600))  # 12.6 min
    assert save_cadence.interval_s(0.1) == save_cadence.FLOOR_S  # never more often than once a minute
    assert save_cadence.interval_s(600) == save_cadence.CEILING_S
    assert save_cadence.interval_s(0) == save_cadence.CEILING_S  # nothing measured yet
    words = save_cadence.words(save_cadence.interval_s(20), 20)
    assert words.startswith("save_every_minutes auto:") and "every 12.6 min" in words
    assert "takes 20 s (2.6 %" in words
    assert "loses 6.3 min on average" in words


@pytest.mark.parametrize("value", ["auto", "AUTO", " auto "])
def test_auto_is_accepted(value):
    assert config.load(None, [f"save_every_minutes={value}"]).save_every_minutes == "auto"
    assert config.load(None, ["save_every_minutes=12"]).save_every_minutes == 12.0


@pytest.mark.parametrize("value", ["sometimes", "0", "-3"])
def test_anything_else_is_a_one_line_config_error(value):
    with pytest.raises(UsageError, match="save_every_minutes"):
        config.load(None, [f"save_every_minutes={value}"])


@pytest.mark.slow
def test_a_run_with_auto_says_the_interval_it_chose_from_the_measured_save(tmp_path):
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
        env = cpu_env(HF_ENDPOINT=hub.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        r = train([f"output_dir={tmp_path / 'out'}", "store=hf://me/auto", "max_steps=40", "save_steps=10",
                   "save_every_minutes=auto", *FAST], nproc=1, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stdout.splitlines() if "save_every_minutes auto: every" in line]
    assert said, r.stdout
    m = re.match(r"\[kit\] save_every_minutes auto: every ([\d.]+) min — a save \+ upload takes ([\d.]+) s", said[0])
    every_min, cost_s = float(m.group(1)), float(m.group(2))
    assert every_min == pytest.approx(save_cadence.interval_s(cost_s) / 60, abs=0.3), said[0]
