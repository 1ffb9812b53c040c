"""Reasons are data (a code and its figures, `kit.planning.reasons`) and worded in one place
(`kit.report.reasons`): every code the planner and the settling functions can give has words, a plan's
reasons round-trip through the script's PLAN and JSON, and `kit plan --json` gives code, figures and words."""

from __future__ import annotations

import ast
import json
import re

import pytest

from kit.cli import main
from kit.errors import CannotTrain, UsageError
from kit.machine import gpu_table
from kit.planning import config, settle
from kit.planning.plan import Plan, make_plan
from kit.planning.reasons import Reason
from kit.report import reasons as report
from tests.scripts import ROOT

CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml"))
MACHINES = sorted((ROOT / "tests" / "fixtures" / "machines").glob("*.json"))
GPUS = ["cpu", "1xT4", "2xT4", "1xP100", "1xL4", "2xA100-80", "1xH100", "8xH100", "1xH200", "1xMI300X"]
# Settings that reach the rules' other branches: configured values, other trainers, no GPU packages.
VARIANTS = [(), ("batching=packed",), ("batching=grouped", "kernels=liger", "activation_offloading=on", "compile=on"),
            ("kernels=none", "activation_offloading=off", "compile=off", "gradient_checkpointing=on"),
            ("precision=fp16",), ("method=full",), ("strategy=fsdp",), ("optimizer=adamw_8bit",),
            ("optimizer=adamw_torch_fused",), ("backend=unsloth",), ("trainer=dpo",),
            ("trainer=kto", "per_device_batch=2"), ("report_to=auto",), ("report_to=tensorboard",),
            ("model=unsloth/Qwen3-8B-bnb-4bit", "method=lora")]
RANKS = [settle.RankFacts("cpu"), settle.RankFacts("cpu", world_size=2, under_torchrun=True),
         settle.RankFacts("cuda", vendor="nvidia", capability="7.5", name="Tesla T4"),
         settle.RankFacts("cuda", vendor="nvidia", capability="9.0", name="NVIDIA H100", installed=frozenset({"unsloth"})),
         settle.RankFacts("cuda", vendor="amd", capability="gfx942", name="AMD Instinct MI300X")]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)


def machines():
    return ([(p.stem, json.loads(p.read_text())) for p in MACHINES] +
            [(spec, gpu_table.synthesize(spec)) for spec in GPUS] +
            [("2xT4+unsloth+liger", {**gpu_table.synthesize("2xT4"), "packages": {
                "transformers": "5.17.0", "trl": "1.15.0", "unsloth": "2026.10.9", "liger_kernel": "0.8.5"}}),
             ("1xH200+unsloth", {**gpu_table.synthesize("1xH200"), "packages": {
                 "transformers": "5.17.0", "trl": "1.15.0", "bitsandbytes": "0.50.2", "unsloth": "2026.10.9"}}),
             ("1xH100+liger", {**gpu_table.synthesize("1xH100"), "packages": {
                 "transformers": "5.17.0", "trl": "1.15.0", "bitsandbytes": "0.50.2", "liger_kernel": "0.8.5"}}),
             ("8xT4, 16 GiB of RAM", {**gpu_table.synthesize("8xT4"), "ram_bytes": 16 * 2**30}),
             ("1xT4 held", {**gpu_table.synthesize("1xT4"), "gpus": [
                 {**gpu_table.synthesize("1xT4")["gpus"][0], "memory_free_bytes": 6 * 2**30}]})])


def plans():
    """Every plan (and refused plan) the planner makes for the configs on the test machines (the variants
    on the default config, the 8B QLoRA one and GRPO's)."""
    varied = {"default.yaml": VARIANTS, "qwen3-8b-qlora-kaggle-t4x2.yaml": VARIANTS,
              "grpo-tiny.yaml": [(), ("grpo.beta=0.04",), ("grpo.beta=0.04", "method=full")]}
    for path in CONFIGS:
        for variant in varied.get(path.name, [()]):
            try:
                cfg = config.load(str(path), list(variant))
            except UsageError:
                continue  # a setting this config's trainer refuses
            for name, facts in machines():
                try:
                    yield cfg, make_plan(facts, cfg, nodes=2 if name == "2xT4" and not variant else 1)
                except CannotTrain as e:
                    if getattr(e, "plan", None) is not None:
                        yield cfg, e.plan
                except UsageError:
                    continue


def _codes_in_source() -> set[str]:
    found = set()
    for p in list((ROOT / "kit" / "planning").glob("*.py")) + [ROOT / "kit" / "script" / "arguments.py"]:
        found |= set(re.findall(r'(?:why|Reason)\(\s*"([a-z_0-9]+)"', p.read_text()))
    return found


def test_every_code_the_source_gives_has_words():
    codes = _codes_in_source()
    assert len(codes) > 60
    missing = sorted(c for c in codes if c not in report.TEMPLATES and c not in report.WORDERS)
    assert not missing, f"codes with no template in kit/report/reasons.py: {missing}"


def test_every_reason_the_planner_and_the_settling_give_formats():
    """The planner walked over configs/ and the test machines, each plan then settled for several ranks,
    its rows and its length: every Reason words without a KeyError, and round-trips as the script holds it."""
    seen, plans_made = set(), 0
    for cfg, plan in plans():
        plans_made += 1
        for r in plan.reasons:
            seen.add(r.code)
            text = report.sentence(r)
            assert text.endswith(".") and "{" not in text, (r, text)
        assert Plan.from_dict(ast.literal_eval(repr(plan.to_dict()))) == plan  # the script's PLAN literal
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
        if plan.strategy == "none":
            continue
        for rank in RANKS:
            try:
                settled, notes = settle.for_rank(plan, cfg, rank)
            except (CannotTrain, UsageError):
                continue
            for mean in (20, 10_000):
                data, more = settle.for_data(settled, cfg, settle.RowStats(mean, rows_per_sequence=3.6))
                steps, last = settle.for_steps(data, cfg, 1)
                notes = [*notes, *more, *last]
            for r in notes:
                seen.add(r.code)
                assert report.words(r) and "{" not in report.words(r)
    assert plans_made > 400
    # The walk reaches most of the codes (the rest: tests of their own rules, e.g. memory held by another process).
    assert len(seen) >= 63, sorted(_codes_in_source() - seen)


def test_a_reason_holds_plain_figures_and_round_trips():
    r = Reason("batch", {"per_device_batch": 8, "configured": False, "grad_accum": 1, "global_batch": 16})
    assert Reason.from_dict(r.to_dict()) == r and r["per_device_batch"] == 8
    assert Reason.from_dict({**r.to_dict(), "words": "ignored"}) == r  # as `kit plan --json` prints it
    with pytest.raises(TypeError, match="batch"):
        Reason("batch", {"sizes": [8, 16]})


def test_a_plan_from_an_older_script_keeps_its_sentences():
    """A script rendered before reasons were data holds plain sentences in its PLAN: shown as they were."""
    old = "precision fp32 on the CPU; one process."
    plan = Plan.from_dict({"strategy": "single", "reasons": [old]})
    assert plan.reasons[0].code == "said" and report.sentence(plan.reasons[0]) == old


def test_kit_plan_json_gives_each_reasons_code_figures_and_words(capsys):
    assert main(["plan", "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4", "--json"]) == 0
    reasons = json.loads(capsys.readouterr().out)["reasons"]
    assert all(set(r) == {"code", "figures", "words"} for r in reasons)
    by_code = {r["code"]: r for r in reasons}
    assert by_code["precision_no_bf16"]["figures"]["arch"] == "sm_75"
    assert by_code["batch"]["figures"] == {"per_device_batch": 8, "configured": False, "grad_accum": 1,
                                           "global_batch": 16}
    assert by_code["batch"]["words"] == report.sentence(Reason("batch", by_code["batch"]["figures"]))
    # A refused plan too, its refusal a reason of its own.
    assert main(["plan", "--gpus", "1xP100", "--json"]) == 3
    refused = json.loads(capsys.readouterr().out)["reasons"]
    assert refused[-1]["code"] == "refused" and "sm_60" in refused[-1]["figures"]["message"]


def test_bootstrap_json_words_the_plans_reasons_too(capsys, tmp_path):
    out = tmp_path / "t.py"
    code = main(["bootstrap", "--facts", str(ROOT / "tests/fixtures/machines/kaggle_t4x2.json"), "--config",
                 "configs/default.yaml", "-o", str(out), "--json"])
    assert code == 0
    reasons = json.loads(capsys.readouterr().out)["plan"]["reasons"]
    assert reasons and all(r["words"] == report.sentence(Reason(r["code"], r["figures"])) for r in reasons)
