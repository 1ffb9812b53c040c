"""trainer=dpo and kto: settings, plan and memory on the machines users bring, the rendered script's
trainer seam, and preference data checked row by row before any model loads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kit.cli import main as kit_main
from kit.errors import CannotTrain, UsageError
from kit.planning import config, memory, shapes, trainers
from kit.planning.plan import make_plan
from kit.script import arguments
from kit.script.render import render
from kit.train import preference_data
from tests.code_asserts import call, ifexp
from tests.test_plan import A100, COLAB_T4, CPU_ONLY, H200, KAGGLE_P100, KAGGLE_T4X2, QWEN8_QLORA, cfg, codes, reason

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("override, words", [
    ("trainer=orpo", "expected one of sft|dpo|kto"),
    ("dpo.beta=0", "'dpo.beta' in command line must be > 0"),
    ("dpo.loss_type=sigmod", "did you mean 'sigmoid'"),
    ("kto.desirable_weight=-1", "must be >= 0"),
    ("kto.precompute_ref_log_probs=maybe", "expected one of auto|on|off"),
    ("dpo.max_prompt_length=64", "unknown config key 'dpo.max_prompt_length'"),
])
def test_bad_trainer_settings_are_one_line_exit_2(override, words, capsys):
    assert kit_main(["plan", "--gpus", "1xT4", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err and "\n" not in err


@pytest.mark.parametrize("overrides, words", [
    (("trainer=dpo", "batching=packed"), "batching=packed is for trainer sft"),
    (("trainer=kto", "per_device_batch=1"), "at least 2"),
    (("trainer=kto", "compile=on"), "compile=on is for trainers sft and dpo"),
])
def test_settings_the_trainer_cannot_run_are_refused_before_a_plan(overrides, words):
    with pytest.raises(UsageError, match=words):
        make_plan(H200, cfg(*overrides))


# -- plan and memory --------------------------------------------------------------------------

@pytest.mark.parametrize("trainer", ["dpo", "kto"])
@pytest.mark.parametrize("facts, precision", [(KAGGLE_T4X2, "fp16"), (COLAB_T4, "fp16"), (A100, "bf16"),
                                              (H200, "bf16")])
def test_every_trainer_plans_on_the_gpus_users_bring(trainer, facts, precision):
    plan = make_plan(facts, cfg(*QWEN8_QLORA, f"trainer={trainer}"))
    assert plan.precision == precision  # the T4 fp16 path holds for every trainer
    assert plan.batching == "padded" and not plan.compile_layers
    assert plan.per_device_batch >= (2 if trainer == "kto" else 1)
    assert "reference_adapter_disabled" in codes(plan)
    assert reason(plan, "batching_trainer")["trainer"] == trainer
    assert "batching_padding_free" not in codes(plan)  # not said, then taken back
    assert any(n.startswith(f"{trainer}: ") for n in plan.memory["notes"])
    assert plan.memory["per_gpu_bytes"] <= plan.memory["budget_bytes"]


@pytest.mark.parametrize("trainer", ["dpo", "kto"])
def test_p100_and_cpu_refusals_hold_for_every_trainer(trainer):
    with pytest.raises(CannotTrain, match="sm_60"):
        make_plan(KAGGLE_P100, cfg(*QWEN8_QLORA, f"trainer={trainer}"))
    with pytest.raises(CannotTrain, match="too big to train on a CPU"):
        make_plan(CPU_ONLY, cfg("model=Qwen/Qwen3-8B", f"trainer={trainer}"))
    tiny = make_plan(CPU_ONLY, cfg(f"trainer={trainer}"))
    assert tiny.device == "cpu" and tiny.batching == "padded"


def test_a_pair_costs_two_sequences_and_the_refusal_names_the_cheapest_change():
    same = (*QWEN8_QLORA, "per_device_batch=4", "seq_len=2048", "activation_offloading=off")
    sft = make_plan(H200, cfg(*same))
    dpo = make_plan(H200, cfg(*same, "trainer=dpo"))
    # Chosen + rejected: the kept layer inputs (checkpointing) are twice SFT's at the same micro-batch.
    assert dpo.memory["terms"]["activations_checkpointed"] == 2 * sft.memory["terms"]["activations_checkpointed"]
    # 8B bf16 LoRA DPO at 4 pairs × 4096 does not fit one T4; the refusal says what would.
    with pytest.raises(CannotTrain, match="cheapest change that fits") as e:
        make_plan(COLAB_T4, cfg("model=Qwen/Qwen3-8B", "per_device_batch=4", "seq_len=4096", "trainer=dpo",
                                "gradient_checkpointing=off", "precision=fp16"))
    assert e.value.plan.strategy == "none"


def test_the_reference_is_the_disabled_adapter_for_lora_and_a_copy_or_precomputed_for_full():
    model = shapes.model_facts("Qwen/Qwen3-0.6B", None)
    lora = memory.estimate(model, cfg("trainer=dpo", "model=Qwen/Qwen3-0.6B"), "bf16", 2, True, False)
    full = memory.estimate(model, cfg("trainer=dpo", "model=Qwen/Qwen3-0.6B", "method=full"), "bf16", 2, True, False)
    pre = memory.estimate(model, cfg("trainer=dpo", "model=Qwen/Qwen3-0.6B", "method=full",
                                     "dpo.precompute_ref_log_probs=on"), "bf16", 2, True, False)
    assert "reference_model" not in lora.terms and "reference_model" not in pre.terms
    assert full.terms["reference_model"] == model.params * 2  # a 16-bit second copy
    assert [trainers.reference(c)[1].code for c in (cfg("trainer=dpo"), cfg("trainer=dpo", "method=full"),
                                                     cfg("trainer=dpo", "method=full", "dpo.precompute_ref_log_probs=on"))] \
        == ["reference_adapter_disabled", "reference_model_copy", "reference_precomputed"]


def test_precomputed_reference_is_refused_on_several_processes():
    from kit.planning import settle

    c = cfg("trainer=dpo", "dpo.precompute_ref_log_probs=on")
    planned = make_plan(CPU_ONLY, c)
    rank = settle.RankFacts(device="cpu", world_size=2, under_torchrun=True)
    with pytest.raises(UsageError, match="one process only"):
        settle.for_rank(planned, c, rank)
    assert settle.for_rank(planned, c, settle.RankFacts(device="cpu"))[0].reference == "precomputed"


def test_unsloth_runs_dpo_with_its_figure_but_not_kto_and_says_why():
    with_unsloth = copy.deepcopy(KAGGLE_T4X2)
    with_unsloth["packages"]["unsloth"] = "2026.1.1"
    plan = make_plan(with_unsloth, cfg(*QWEN8_QLORA, "trainer=dpo"), nproc=1)
    assert plan.backend == "unsloth" and plan.kernels == "none" and not plan.activation_offloading
    backend = reason(plan, "backend_unsloth")
    assert (backend["trainer"], backend["dpo_tokens_per_s"], backend["trl_tokens_per_s"]) == ("dpo", 7138, 4336)
    assert backend["dpo_vs_trl"] == pytest.approx(1.65, abs=0.005)
    kto = make_plan(with_unsloth, cfg(*QWEN8_QLORA, "trainer=kto"), nproc=1)
    assert kto.backend == "transformers"
    assert reason(kto, "backend_trainer_plain")["trainer"] == "kto"
    asked = make_plan(with_unsloth, cfg(*QWEN8_QLORA, "trainer=kto", "backend=unsloth"), nproc=1)
    assert asked.backend == "transformers"


def test_grpo_keeps_the_plain_stack_under_unsloth_with_the_measured_figure():
    # bench/results/grpo_speed_unsloth_h100.json: Unsloth without vLLM 3.70 s a step, kit's generation 2.57 s
    with_unsloth = copy.deepcopy(KAGGLE_T4X2)
    with_unsloth["packages"]["unsloth"] = "2026.1.1"
    for asked in ("auto", "unsloth"):
        plan = make_plan(with_unsloth, cfg(*QWEN8_QLORA, "trainer=grpo", f"backend={asked}",
                                           "grpo.rewards=configs/gsm8k_rewards.py:correct"), nproc=1)
        assert plan.backend == "transformers"
        figures = reason(plan, "backend_grpo_plain")
        assert figures["ratio"] > 1
        assert figures["ratio"] == pytest.approx(figures["unsloth_step_s"] / figures["kit_step_s"], abs=0.01)


def test_dpo_compiles_its_layers_only_when_asked_and_says_the_figure():
    auto = make_plan(H200, cfg(*QWEN8_QLORA, "trainer=dpo"))
    assert not auto.compile_layers
    why = reason(auto, "compile_off_trainer")
    assert (why["trainer"], why["measured"]) == ("dpo", True) and why["ratio"] == pytest.approx(1.02, abs=0.005)
    asked = make_plan(H200, cfg(*QWEN8_QLORA, "trainer=dpo", "compile=on"))
    assert asked.compile_layers


def test_a_checkpoint_of_another_trainer_needs_force():
    from kit.checkpoints import fingerprint

    sft, dpo = cfg(), cfg("trainer=dpo")
    assert "trainer" not in fingerprint.config_fields(sft)  # SFT manifests stay as they were
    forceable, shape = fingerprint.differences(fingerprint.config_fields(sft), dpo)
    assert any(line.startswith("trainer:") for line in forceable) and not shape


# -- the script -------------------------------------------------------------------------------

def _render(trainer: str) -> str:
    c = config.load(str(ROOT / f"configs/{trainer}-tiny.yaml"))
    return render(c, make_plan(CPU_ONLY, c), f"configs/{trainer}-tiny.yaml", "cpu")


@pytest.mark.parametrize("trainer, config_class, trainer_class, own", [
    ("dpo", "DPOConfig", "DPOTrainer", "beta=cfg.dpo.beta"),
    ("kto", "KTOConfig", "KTOTrainer", "desirable_weight=cfg.kto.desirable_weight"),
])
def test_the_script_shows_the_trainers_own_config(trainer, config_class, trainer_class, own):
    text = _render(trainer)
    compile(text, "train.py", "exec")
    assert f"from trl import {config_class}, {trainer_class}" in text
    assert f"training_args = {config_class}(" in text and f"Trainer = output_dir.without_card({trainer_class})" in text
    assert own in text and "SFT" not in text and "completion_only_loss" not in text
    assert "modeling.reference_is_base(trainer.model)" in text
    # Everything around training is the one template's: saves, resume, deadline, finish.
    for line in ("job.start()", "sharding.resumable(", "job.finish(trainer)", "dist.teardown("):
        assert line in text
    assert "'kto'" not in text if trainer == "dpo" else "'dpo'" not in text  # only its own settings


def test_a_script_refuses_settings_for_another_trainer(tmp_path):
    text = _render("dpo")
    namespace: dict = {}
    exec(text[text.index("SETTINGS = "):text.index("\n\n\ndef main")], namespace)
    args = arguments.parse(["trainer=sft"], "configs/dpo-tiny.yaml")
    with pytest.raises(UsageError, match="rendered for trainer=dpo.*trainer=sft"):
        arguments.settings(namespace["SETTINGS"], namespace["PLAN"], args)
    same, _, _ = arguments.settings(namespace["SETTINGS"], namespace["PLAN"], arguments.parse([], "x"))
    assert same.trainer == "dpo" and same.dpo.beta == 0.1


# -- data -------------------------------------------------------------------------------------

def _load(tmp_path, rows, *overrides, trainer="dpo"):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return preference_data.load(cfg(f"trainer={trainer}", f"data.path={path}", *overrides))


PAIR = {"prompt": "turn on the lights", "chosen": "light.turn_on", "rejected": "light.turn_off"}


def test_the_shipped_data_loads_for_its_trainer():
    for trainer, path in (("dpo", "data/prefs_tiny.jsonl"), ("kto", "data/kto_tiny.jsonl")):
        ds, fmt = preference_data.load(cfg(f"trainer={trainer}", f"data.path={ROOT / path}"))
        assert len(ds) == 320 and fmt == preference_data.FOR_TRAINER[trainer]


def test_sft_data_for_dpo_names_the_expected_columns(tmp_path):
    with pytest.raises(UsageError) as e:
        preference_data.load(cfg("trainer=dpo", f"data.path={ROOT / 'data/ha_commands.jsonl'}"))
    assert "prompt, chosen, rejected" in str(e.value) and "set trainer=sft" in str(e.value)
    with pytest.raises(UsageError, match="set trainer=dpo"):  # pairs given to kto
        _load(tmp_path, [PAIR] * 3, trainer="kto")


@pytest.mark.parametrize("bad, words", [
    ({"chosen": 3}, "field 'chosen' is int"),
    ({"rejected": " "}, "field 'rejected' is empty"),
    ({"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": "b"}, "field 'rejected' is str"),
    ({"prompt": [{"role": "boss", "content": "hi"}]}, "has role 'boss'"),
])
def test_a_bad_row_is_named_by_its_line(tmp_path, bad, words):
    # A value of another JSON type than the first row's is named by the file scan already: a row of its own.
    same_type = "rejected" in bad and "prompt" not in bad
    rows = [PAIR, PAIR, {**PAIR, **bad}] if same_type else [{**PAIR, **bad}]
    with pytest.raises(UsageError) as e:
        _load(tmp_path, rows)
    line = 3 if same_type else 1
    assert f"line {line}" in str(e.value) and words in str(e.value) and "prompt, chosen, rejected" in str(e.value)


def test_a_kto_label_must_be_a_boolean(tmp_path):
    rows = [{"prompt": "p", "completion": "c", "label": "yes"}, {"prompt": "p", "completion": "d", "label": "no"}]
    with pytest.raises(UsageError, match="line 1: field 'label' is str.*expected true"):
        _load(tmp_path, rows, trainer="kto")


def test_stack_exchange_style_columns_through_data_columns(tmp_path):
    rows = [{"question": f"q{i}", "response_j": f"good {i}", "response_k": f"bad {i}"} for i in range(4)]
    ds, _ = _load(tmp_path, rows, "data.columns={prompt: question, chosen: response_j, rejected: response_k}")
    assert ds[0]["prompt"] == "q0" and ds[0]["chosen"] == "good 0" and ds[0]["rejected"] == "bad 0"
    with pytest.raises(UsageError, match="data.columns maps chosen → 'response_x'"):
        _load(tmp_path, rows, "data.columns={prompt: question, chosen: response_x, rejected: response_k}")


def test_eval_rows_duplicating_train_rows_are_refused(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "models/tiny-qwen3")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(PAIR) + "\n" * 1 + "".join(json.dumps(PAIR) + "\n" for _ in range(19)))
    with pytest.raises(UsageError, match="exact duplicates of train rows"):
        preference_data.prepare(cfg("trainer=dpo", f"data.path={path}"), tok)
    train, held, fmt, dups, mean = preference_data.prepare(
        cfg("trainer=dpo", f"data.path={path}", "data.allow_duplicates=true"), tok)
    assert dups == len(held) == 2 and mean > 0


def test_a_dpo_script_for_unsloth_imports_it_before_trl_and_builds_dpotrainer():
    from kit.planning.plan import Plan
    from kit.script import render

    c = config.load(str(Path(__file__).resolve().parent.parent / "configs" / "dpo-tiny.yaml"))
    text = render.render(c, Plan(backend="unsloth", nproc=1, precision="bf16", strategy="single"),
                         "configs/dpo-tiny.yaml", "1 × H100")
    body = text.split('"""', 2)[2]
    # Unsloth rewrites TRL's DPOTrainer when it is imported: the script imports it first.
    assert body.index("    import unsloth") < body.index("from trl import DPO")
    assert "Trainer = output_dir.without_card(DPOTrainer)" in body  # Unsloth's DPOTrainer, writing no card
    # Compiled layers under DPO leave the RMSNorm to inductor, as for sft.
    assert ifexp(call(text, "DPOConfig")["liger_kernel_config"]) == ("{'rms_norm': False}", "plan.compile_layers", "None")
