"""kit.planning.speed through kit.planning.plan: batching, kernels and the optimizer each chosen with a reason from the
H200 measurements; the memory estimate follows the batching; the script's launch-time settling."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kit.planning import config, memory, settle, shapes, speed
from kit.planning.plan import Plan
from kit.planning.reasons import Reason
from kit.errors import CannotTrain, UsageError
from kit.planning.plan import make_plan
from kit.planning.measured import MEASURED
from tests.test_plan import A100, COLAB_T4, CPU_ONLY, H200, KAGGLE_T4X2, MI300X, QWEN8_QLORA, cfg, machine, reason

GIB = 2**30
CHAT = ("seq_len=2048", "gradient_checkpointing=on", "per_device_batch=4", "global_batch=4")


@pytest.mark.parametrize("facts", [H200, A100, KAGGLE_T4X2, COLAB_T4])
def test_auto_batching_is_padding_free_on_nvidia_with_the_measured_ratio(facts):
    plan = make_plan(facts, cfg(*QWEN8_QLORA))
    assert plan.batching == "padding_free"
    why = reason(plan, "batching_padding_free")
    assert (why["padding_free_vs_padded"], why["packed_vs_padded"]) == (pytest.approx(1.15, abs=0.005),
                                                                        pytest.approx(2.90, abs=0.005))
    # On a T4 the reason says it was measured elsewhere.
    assert why["unmeasured_arch"] == ("sm_75" if facts["gpus"][0]["name"] == "Tesla T4" else None)


def test_auto_batching_is_padded_where_nothing_was_measured():
    assert make_plan(CPU_ONLY, cfg()).batching == "padded"
    plan = make_plan(MI300X, cfg(*QWEN8_QLORA))
    assert plan.batching == "padded" and reason(plan, "batching_not_nvidia")


def test_auto_batching_under_unsloth_is_padding_free_as_measured():
    with_unsloth = machine("NVIDIA H200", "9.0", 150_754_820_096, platform="local",
                           packages={"transformers": "5.17.0", "trl": "1.15.0", "bitsandbytes": "0.50.2",
                                     "unsloth": "2026.10.9"})
    plan = make_plan(with_unsloth, cfg(*QWEN8_QLORA))
    assert plan.backend == "unsloth" and plan.batching == "padding_free"  # measured to pay under Unsloth too
    assert reason(plan, "batching_unsloth")["ratio"] == pytest.approx(1.30, abs=0.005)
    assert not [r for r in plan.reasons if r.code == "batching_padding_free"]  # Unsloth's reason took its place


@pytest.mark.parametrize("value", ["padded", "grouped", "padding_free", "packed"])
def test_configured_batching_is_kept_and_packed_says_what_it_changes(value):
    plan = make_plan(H200, cfg(*QWEN8_QLORA, f"batching={value}"))
    assert plan.batching == value
    if value == "packed":  # says what packing changes: fewer optimizer steps an epoch
        assert reason(plan, "batching_packed_configured")
    else:
        assert reason(plan, "batching_configured")["batching"] == value


def test_memory_estimate_follows_the_batching():
    padded = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT, "batching=padded"))
    free = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT, "batching=padding_free"))
    assert "packed_attention_mask" not in padded.memory["terms"]
    # One 8,192-token sequence: a boolean mask plus one 16-bit bias for the recomputed layer.
    assert free.memory["terms"]["packed_attention_mask"] == 8192 * 8192 * 3
    assert free.memory["allocated_bytes"] - padded.memory["allocated_bytes"] == 8192 * 8192 * 3
    assert any("one 8192-token sequence" in n for n in free.memory["notes"])


def test_memory_estimate_of_packed_rows_is_one_mask_per_row_and_unsloths_one_flat_sequence():
    packed = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT, "batching=packed"))
    # kit.train.collate: 4 rows of 2,048 tokens, each its own mask: a quarter of one 8,192² mask.
    assert packed.memory["terms"]["packed_attention_mask"] == 4 * 2048 * 2048 * 3
    assert any("4 rows of up to 2048" in n for n in packed.memory["notes"])
    with_unsloth = machine("NVIDIA H200", "9.0", 150_754_820_096, platform="local",
                           packages={"transformers": "5.17.0", "trl": "1.15.0", "bitsandbytes": "0.50.2",
                                     "unsloth": "2026.10.9"})
    flat = make_plan(with_unsloth, cfg(*QWEN8_QLORA, *CHAT, "batching=packed"))
    assert flat.backend == "unsloth" and flat.batching == "packed"
    assert flat.memory["terms"]["packed_attention_mask"] == 8192 * 8192 * 3  # Unsloth's trainer: end to end


UNSLOTH_H200 = dict(packages={"transformers": "5.17.0", "trl": "1.15.0", "bitsandbytes": "0.50.2", "unsloth": "2026.10.9"})


@pytest.mark.parametrize("extra, measured_gib", [
    # kit's script with backend=unsloth on an H100 (bench/results/unsloth_memory_h100.json): full-length rows.
    (("seq_len=2048", "per_device_batch=4", "global_batch=4", "batching=padded"), 8.32),
    # trainer dpo, 2 pairs × 1,024 tokens (bench/results/dpo_speed_h100.json).
    (("trainer=dpo", "seq_len=1024", "per_device_batch=2", "global_batch=2"), 7.353),
])
def test_the_estimate_under_unsloth_is_unsloths_within_ten_percent_of_the_measured_peak(extra, measured_gib):
    with_unsloth = machine("NVIDIA H200", "9.0", 150_754_820_096, platform="local", **UNSLOTH_H200)
    plan = make_plan(with_unsloth, cfg(*QWEN8_QLORA, "gradient_checkpointing=on", *extra))
    assert plan.backend == "unsloth"
    assert plan.memory["allocated_bytes"] / GIB == pytest.approx(measured_gib, rel=0.10)
    # Its checkpointing keeps the layer inputs in CPU memory: only the ones in flight are on the GPU.
    assert "activations_checkpointed_in_flight" in plan.memory["terms"]
    plain = make_plan(H200, cfg(*QWEN8_QLORA, "gradient_checkpointing=on", "activation_offloading=off", *extra))
    assert plain.memory["allocated_bytes"] > plan.memory["allocated_bytes"]


def test_packed_mask_without_checkpointing_is_kept_by_every_layer():
    assert memory.packed_mask_bytes(1000, 36, gradient_checkpointing=False) == 1000 * 1000 * (1 + 2 * 36)
    m = shapes.model_facts("Qwen/Qwen3-8B")
    est = memory.estimate(m, cfg(*QWEN8_QLORA, *CHAT), "bf16", 4, True, True, device="cpu", batching="packed")
    assert "packed_attention_mask" not in est.terms  # the CPU's math kernel: no 16-bit bias to model


def test_kernels_auto_is_liger_where_measured_checked_and_installed():
    with_liger = {**H200, "packages": {**H200["packages"], "liger_kernel": "0.8.5"}}
    plan = make_plan(with_liger, cfg(*QWEN8_QLORA))
    assert plan.kernels == "liger"
    why = reason(plan, "kernels_liger")
    assert why["ratio"] == pytest.approx(1.29, abs=0.005) and why["loss_diff_pct"] == pytest.approx(0.10, abs=0.005)
    assert reason(make_plan(H200, cfg(*QWEN8_QLORA)), "kernels_none")["because"] == "not_installed"
    t4 = {**COLAB_T4, "packages": {**COLAB_T4["packages"], "liger_kernel": "0.8.5"}}
    plan = make_plan(t4, cfg(*QWEN8_QLORA))
    assert plan.kernels == "none" and reason(plan, "kernels_none")["because"] == "arch"
    assert reason(plan, "kernels_none")["arch"] == "sm_75"


def test_kernels_auto_stays_off_while_the_loss_curve_is_unchecked(monkeypatch):
    monkeypatch.setitem(speed.MEASURED, "liger_loss_checked", False)
    facts = {**H200, "packages": {**H200["packages"], "liger_kernel": "0.8.5"}}
    plan = make_plan(facts, cfg(*QWEN8_QLORA))
    assert plan.kernels == "none"
    why = reason(plan, "kernels_none")
    assert why["because"] == "loss_unchecked" and why["ratio"] == pytest.approx(1.29, abs=0.005)


def test_kernels_configured():
    plan = make_plan(H200, cfg(*QWEN8_QLORA, "kernels=liger"))
    assert plan.kernels == "liger" and reason(plan, "kernels_liger_configured").figures == {"off": None,
                                                                                           "installed": False}
    plan = make_plan(MI300X, cfg(*QWEN8_QLORA, "kernels=liger"))
    assert reason(plan, "kernels_liger_configured")["off"] == "not_nvidia"  # the script turns them off there
    assert make_plan(H200, cfg(*QWEN8_QLORA, "kernels=none")).kernels == "none"


def test_fused_adamw_is_not_chosen_at_its_measured_gain_but_can_be_asked_for(monkeypatch):
    assert speed.MEASURED["fused_adamw_vs_adamw"] < speed.FUSED_ADAMW_PAYS
    assert make_plan(H200, cfg(*QWEN8_QLORA)).optimizer == "adamw_torch"
    assert make_plan(H200, cfg(*QWEN8_QLORA, "optimizer=adamw_torch_fused")).optimizer == "adamw_torch_fused"
    monkeypatch.setitem(speed.MEASURED, "fused_adamw_vs_adamw", 1.05)
    assert make_plan(H200, cfg(*QWEN8_QLORA)).optimizer == "adamw_torch_fused"
    assert make_plan(CPU_ONLY, cfg("optimizer=adamw_torch_fused")).optimizer == "adamw_torch"


def test_backend_and_fp16_sentences_say_what_was_measured():
    with_unsloth = machine("NVIDIA H200", "9.0", 150_754_820_096, platform="local",
                           packages={"transformers": "5.17.0", "trl": "1.15.0", "unsloth": "2026.10.9"})
    why = reason(make_plan(with_unsloth, cfg(*QWEN8_QLORA)), "backend_unsloth")
    assert why["vs_direct"] == MEASURED["unsloth_backend_vs_direct"] and why["trainer"] == "sft"
    t4 = make_plan(KAGGLE_T4X2, cfg(*QWEN8_QLORA))
    assert t4.precision == "fp16"
    assert reason(t4, "precision_no_bf16")["fp16_vs_bf16"] == pytest.approx(0.97, abs=0.005)


@pytest.mark.parametrize("key,value", [("batching", "pack"), ("kernels", "flash"), ("optimizer", "adamw_fused")])
def test_unknown_speed_settings_are_usage_errors(key, value):
    with pytest.raises(UsageError, match=key):
        config.load(None, [f"{key}={value}"])


CPU_RANK = settle.RankFacts("cpu")
PLANNED = Plan(precision="bf16", strategy="single", per_device_batch=4, global_batch=4, backend="transformers",
               optimizer="adamw_torch_fused", batching="padding_free", kernels="liger")


def _on_cpu(c, planned=PLANNED):
    return settle.for_rank(planned, c, CPU_RANK)


def test_runtime_keeps_the_batching_and_drops_what_the_cpu_cannot_run():
    plan, notes = _on_cpu(cfg())
    assert plan.batching == "padding_free" and plan.padding_free
    assert plan.kernels == "none" and plan.optimizer == "adamw_torch"
    assert reason(notes, "kernels_off_here")["because"] == "cpu"
    old, _ = _on_cpu(cfg(), replace(PLANNED, batching="padded", kernels="none"))  # rendered before these existed
    assert old.batching == "padded" and old.kernels == "none"


def test_runtime_refuses_liger_asked_for_where_it_cannot_run():
    with pytest.raises(CannotTrain, match="kernels=liger was asked for, but this rank runs on the CPU"):
        _on_cpu(cfg("kernels=liger"))


def test_launch_settles_padding_free_back_to_padded_for_long_rows():
    plan, _ = _on_cpu(cfg("seq_len=600"))
    short, notes = settle.for_data(plan, cfg("seq_len=600"), settle.RowStats(150))
    assert notes == [] and short.batching == "padding_free"
    long, notes = settle.for_data(plan, cfg("seq_len=600"), settle.RowStats(450))
    assert long.batching == "padded" and notes[0].code == "batching_long_rows"
    assert (notes[0]["mean_tokens"], notes[0]["seq_len"]) == (450, 600)
    assert plan.batching == "padding_free"  # the plan settled from is not changed
    chosen, _ = _on_cpu(cfg("seq_len=600", "batching=padding_free"))
    kept, notes = settle.for_data(chosen, cfg("seq_len=600", "batching=padding_free"), settle.RowStats(450))
    assert notes == [] and kept.batching == "padding_free"  # what the user set is kept


def _accumulating(*overrides):
    """A plan settled on this CPU from a GPU render with padding-free batches: 4 rows × 4 accumulation steps."""
    c = cfg("seq_len=600", *overrides)
    return _on_cpu(c, replace(PLANNED, global_batch=16))[0], c


def test_launch_packs_short_rows_where_accumulation_folds_and_keeps_the_rows_per_step():
    plan, c = _accumulating()
    assert (plan.per_device_batch, plan.grad_accum, plan.batching) == (4, 4, "padding_free")
    assert settle.may_pack(plan, c, 150)
    folded, notes = settle.for_data(plan, c, settle.RowStats(150, rows_per_sequence=3.6))
    # 4 sequences of 3.6 rows in one micro-batch: 14.4 rows a step where 16 were asked, one forward instead of 4.
    assert (folded.batching, folded.per_device_batch, folded.grad_accum, folded.global_batch) == ("packed", 4, 1, 4)
    fold = reason(notes, "batching_folded")
    assert (fold["per_device_before"], fold["accum_before"], fold["per_device_after"], fold["accum_after"]) == \
        (4, 4, 4, 1)
    assert (round(fold["rows_now"]), fold["rows_before"]) == (14, 16)


@pytest.mark.parametrize("per_device,accum,world,rows,expected", [
    (8, 2, 1, 4.0, (4, 1)),    # the default config on one process: 16 rows either way
    (2, 8, 2, 3.5, (2, 2)),    # 2 ranks: 28 rows for 32
    (1, 16, 2, 3.6, (1, 4)),   # micro-batch 1 (an 8B on a T4): 16 micro-batches → 4
    (8, 2, 1, 1.3, None),      # long rows: no fold keeps the rows within 25 %
    (4, 1, 1, 3.6, None),      # no accumulation: nothing to fold
])
def test_folded_batch_keeps_the_rows_per_step_in_fewer_micro_batches(per_device, accum, world, rows, expected):
    got = speed.folded_batch(per_device, accum, world, rows)
    assert got == expected
    if got:
        pd, a = got
        assert pd <= per_device and a < accum  # never a bigger micro-batch than the memory plan sized
        assert abs(pd * a * world * rows - per_device * accum * world) <= speed.FOLD_TOLERANCE * per_device * accum * world


def test_launch_does_not_pack_without_accumulation_under_unsloth_or_when_batching_is_set():
    plan, _ = _on_cpu(cfg("seq_len=600"))  # 4 × 1: nothing to fold
    assert not settle.may_pack(plan, cfg("seq_len=600"), 150)
    assert settle.for_data(plan, cfg("seq_len=600"), settle.RowStats(150)) == (plan, [])
    plan, c = _accumulating()
    plan = replace(plan, backend="unsloth")  # packing not measured against padding-free under Unsloth
    assert not settle.may_pack(plan, c, 150) and settle.for_data(plan, c, settle.RowStats(150)) == (plan, [])
    plan, c = _accumulating("batching=padding_free")
    assert not settle.may_pack(plan, c, 150) and settle.for_data(plan, c, settle.RowStats(150)) == (plan, [])


def test_a_fold_that_keeps_no_rows_per_step_goes_back_to_padding_free():
    plan, c = _accumulating()
    assert settle.for_data(plan, c, settle.RowStats(150, rows_per_sequence=1.2)) == (plan, [])
    assert (plan.batching, plan.per_device_batch, plan.grad_accum) == ("padding_free", 4, 4)


def test_launch_packs_the_real_rows_and_folds_the_plan(tmp_path):
    """settle.for_data on the embedded data with the embedded tokenizer: rows packed, plan folded."""
    from transformers import AutoTokenizer

    from kit.train import data
    from tests.scripts import ROOT

    c = config.load(ROOT / "configs" / "default.yaml", [])
    tok = AutoTokenizer.from_pretrained(ROOT / c.model)
    prepared = data.prepare(c, tok)
    plan, _ = _on_cpu(c, replace(PLANNED, per_device_batch=8, global_batch=16))
    assert (plan.per_device_batch, plan.grad_accum) == (8, 2)
    assert settle.may_pack(plan, c, prepared.mean_tokens)
    rows = data.packed(prepared, c.seq_len)
    plan, notes = settle.for_data(plan, c, data.row_stats(prepared, rows))
    assert rows.packed_rows == len(prepared.train) and len(rows.train) < len(prepared.train) / 2
    assert set(rows.train.column_names) >= {"input_ids", "completion_mask", "seq_lengths"}
    assert max(len(x) for x in rows.train["input_ids"]) <= c.seq_len
    per_seq = len(prepared.train) / len(rows.train)
    assert plan.batching == "packed" and plan.grad_accum == 1
    assert abs(plan.per_device_batch * per_seq - 16) <= 4 and notes[0].code == "batching_folded"
    c8 = config.load(ROOT / "configs" / "default.yaml", ["global_batch=8"])
    unfolded, _ = _on_cpu(c8, replace(PLANNED, per_device_batch=8))
    assert not settle.may_pack(unfolded, c8, prepared.mean_tokens)  # no accumulation: the rows stay as they were
    assert settle.for_data(unfolded, c8, data.row_stats(prepared)) == (unfolded, [])


def test_sampler_args_name_length_grouping_as_the_installed_transformers_does():
    from dataclasses import fields

    from transformers import TrainingArguments

    from kit.train import collate

    grouped, _ = _on_cpu(cfg("batching=grouped"))
    args = collate.sampler_args(grouped)
    assert set(args) <= {f.name for f in fields(TrainingArguments)} and len(args) == 1
    assert list(args.values())[0] in (True, "group_by_length")
    assert collate.sampler_args(_on_cpu(cfg())[0]) == {}


def test_activation_offloading_auto_is_on_where_measured_and_the_estimate_drops_the_layer_inputs():
    on = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT))
    off = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT, "activation_offloading=off"))
    assert on.gradient_checkpointing and on.activation_offloading and not off.activation_offloading
    why = reason(on, "offloading_on")
    assert why["saved_gib"] == pytest.approx(2.0, abs=0.05) and why["ratio"] == MEASURED["offload_vs_liger"] >= speed.OFFLOAD_PAYS
    assert "activations_checkpointed" not in on.memory["terms"] and "activations_checkpointed" in off.memory["terms"]
    # 37 layer inputs of 4 × 2,048 tokens × 4,096 × 2 bytes leave the GPU; two stay in flight.
    hidden = 4 * 2048 * 4096 * 2
    assert on.memory["terms"]["activations_checkpointed_in_flight"] == 2 * hidden
    assert off.memory["allocated_bytes"] - on.memory["allocated_bytes"] == pytest.approx(35 * hidden * 1.0, rel=0.1)
    assert any("pinned CPU memory" in n for n in on.memory["notes"])


@pytest.mark.parametrize("facts,extra,because", [
    (COLAB_T4, (), "arch"),
    (MI300X, (), "not_nvidia"),
    (H200, ("gradient_checkpointing=off", "seq_len=512"), "no_checkpointing"),
    (H200, ("trainer=dpo",), "preference"),
    (H200, ("trainer=kto", "per_device_batch=2"), "preference"),
])
def test_activation_offloading_auto_stays_off_where_unmeasured_and_says_why(facts, extra, because):
    plan = make_plan(facts, cfg(*QWEN8_QLORA, *extra))
    assert not plan.activation_offloading
    why = reason(plan, "offloading_off")
    assert why["because"] == because
    if because == "preference":  # the DPO measurement's figure
        assert why["dpo_ratio"] == MEASURED["dpo_offload_vs_liger"] < speed.OFFLOAD_PAYS


def test_activation_offloading_configured_and_off_on_the_cpu():
    plan = make_plan(COLAB_T4, cfg(*QWEN8_QLORA, "activation_offloading=on"))
    assert plan.activation_offloading and reason(plan, "offloading_configured").figures == {"setting": "on", "off": None}
    cpu = make_plan(CPU_ONLY, cfg("activation_offloading=on"))
    assert not cpu.activation_offloading and reason(cpu, "offloading_configured")["off"] == "cpu"
    assert not make_plan(CPU_ONLY, cfg()).activation_offloading


@pytest.mark.parametrize("rank,backend,want", [
    (settle.RankFacts("cuda", vendor="nvidia", capability="9.0"), "transformers", (True, None)),
    (settle.RankFacts("cpu"), "transformers", (False, "cpu")),
    (settle.RankFacts("cuda", vendor="nvidia", capability="9.0", installed=frozenset({"unsloth"})), "unsloth",
     (False, "unsloth")),
])
def test_launch_keeps_activation_offloading_only_where_it_can_run(rank, backend, want):
    planned = Plan(strategy="single", backend=backend, activation_offloading=True, gradient_checkpointing=True)
    _settled_at_launch(planned, rank, "activation_offloading", "offloading_off_here", want)


def _settled_at_launch(planned: Plan, rank, key: str, note: str, want: tuple) -> None:
    """The launch keeps planned `key` on where it can run (want[0]), else turns it off with a note
    (code `note`) that says why (want[1]); configured off, it stays off."""
    launch, notes = settle.for_rank(planned, cfg("method=lora"), rank)
    attr = "compile_layers" if key == "compile" else key
    assert getattr(launch, attr) == want[0]
    notes = [n for n in notes if n.code == note]
    assert (want[1] is None and not notes) or (want[1] is not None and notes[0]["because"] == want[1])
    assert not getattr(settle.for_rank(planned, cfg("method=lora", f"{key}=off"), rank)[0], attr)


def test_compile_auto_is_on_where_measured_with_the_numbers_and_how_to_turn_it_off():
    plan = make_plan(H200, cfg(*QWEN8_QLORA, *CHAT))
    assert plan.compile_layers
    why = reason(plan, "compile_on")
    assert why["vs_unsloth"] == pytest.approx(0.89, abs=0.005) and why["memory_vs_unsloth"] == pytest.approx(0.95, abs=0.005)
    assert why["loss_diff_pct"] == pytest.approx(0.09, abs=0.005)  # the loss curve: inductor rounds as eager does
    assert why["repaid"] == speed.COMPILE_REPAID
    assert not make_plan(H200, cfg(*QWEN8_QLORA, *CHAT, "compile=off")).compile_layers


def test_auto_on_the_h200_is_the_stack_measured_at_0_89_of_unsloth_direct():
    """Issue #17's plain-backend row: Liger, activation offloading and compiled layers, all from "auto"
    (bench/results/speed_h200_fill_compile_eager_rounding.json, liger_offload_compile_on_casts)."""
    with_liger = {**H200, "packages": {**H200["packages"], "liger_kernel": "0.8.5"}}
    plan = make_plan(with_liger, cfg(*QWEN8_QLORA, *CHAT))
    assert plan.backend == "transformers" and plan.gradient_checkpointing
    assert (plan.kernels, plan.activation_offloading, plan.compile_layers) == ("liger", True, True)


@pytest.mark.parametrize("facts,extra,off_why", [
    (COLAB_T4, (), "arch"),  # fp16 on sm_75: unmeasured
    (MI300X, (), "arch"),
    (H200, ("backend=unsloth",), "unsloth"),
    (KAGGLE_T4X2, ("strategy=fsdp",), "strategy"),
])
def test_compile_auto_stays_off_where_unmeasured_and_says_why(facts, extra, off_why):
    plan = make_plan(facts, cfg(*QWEN8_QLORA, *extra))
    assert not plan.compile_layers
    assert reason(plan, "compile_off")["because"] == off_why


def test_compile_auto_says_nothing_on_the_cpu():
    plan = make_plan(CPU_ONLY, cfg())
    assert not plan.compile_layers and not [r for r in plan.reasons if r.code.startswith("compile")]


@pytest.mark.parametrize("setting,steps_left,accum,want", [
    ("auto", 30, 4, (False, 120)),  # a short job: eager
    ("auto", 75, 4, (True, None)),  # 300 micro-batches repay compiling
    ("auto", 0, 1, (False, 0)),  # resumed at its last step
    ("on", 1, 1, (True, None)),  # configured: compiled however short (a smoke run, a benchmark)
])
def test_script_runs_a_job_too_short_to_repay_compiling_eagerly(setting, steps_left, accum, want):
    launch, _ = settle.for_rank(Plan(global_batch=accum, compile_layers=True, strategy="single"),
                                cfg("method=lora", f"compile={setting}"),
                                settle.RankFacts("cuda", vendor="nvidia", capability="9.0"))
    assert launch.grad_accum == accum and launch.compile_layers
    settled, notes = settle.for_steps(launch, cfg("method=lora", f"compile={setting}"), steps_left)
    assert settled.compile_layers == want[0] and launch.compile_layers
    assert (want[1] is None and not notes) or (notes == [Reason("compile_unpaid", {"micro_batches": want[1],
                                                                                   "repaid": speed.COMPILE_REPAID})])


def test_settling_compile_leaves_a_plan_without_it_alone():
    launch, _ = settle.for_rank(Plan(strategy="single"), cfg("method=lora"), settle.RankFacts("cpu"))
    assert not launch.compile_layers and settle.for_steps(launch, cfg("method=lora"), 1) == (launch, [])


@pytest.mark.parametrize("facts,extra,on,off_why", [
    (H200, (), True, None),
    (KAGGLE_T4X2, (), True, None),  # DDP over two T4s: one replica per GPU
    (CPU_ONLY, (), False, "cpu"),
    (H200, ("backend=unsloth",), False, "unsloth"),
])
def test_compile_on_is_kept_where_it_can_run_and_says_why_not_elsewhere(facts, extra, on, off_why):
    args = () if facts is CPU_ONLY else QWEN8_QLORA
    plan = make_plan(facts, cfg(*args, *extra, "compile=on"))
    assert plan.compile_layers == on
    assert reason(plan, "compile_configured")["off"] == off_why


@pytest.mark.parametrize("rank,backend,strategy,want", [
    (settle.RankFacts("cuda", vendor="nvidia", capability="9.0"), "transformers", "ddp", (True, None)),
    (settle.RankFacts("cpu"), "transformers", "ddp", (False, "cpu")),
    (settle.RankFacts("cuda", vendor="nvidia", capability="9.0", installed=frozenset({"unsloth"})), "unsloth", "ddp",
     (False, "unsloth")),
    (settle.RankFacts("cuda", vendor="nvidia", capability="9.0", world_size=2, under_torchrun=True), "transformers",
     "fsdp", (False, "strategy")),
])
def test_launch_compiles_the_layers_only_where_it_was_measured(rank, backend, strategy, want):
    planned = Plan(global_batch=rank.world_size, backend=backend, compile_layers=True, strategy=strategy)
    _settled_at_launch(planned, rank, "compile", "compile_off_here", want)


@pytest.mark.parametrize("value,want", [("on", "on"), (True, "on"), (False, "off"), ("AUTO", "auto")])
def test_compile_config_values(value, want):
    assert config.from_dict({"compile": value}).compile == want


def test_compile_bad_value_and_the_name_from_transformers():
    with pytest.raises(UsageError, match="compile"):
        config.from_dict({"compile": "fast"})
    with pytest.raises(UsageError, match="'compile'"):
        config.from_dict({"torch_compile": True})
