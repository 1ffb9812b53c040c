"""kit.planning.memory against real H200 measurements (Qwen3 shapes, LoRA r16 all-linear, seq 2048, batch 4,
gradient checkpointing on; torch.cuda.max_memory_allocated, which excludes the CUDA context)."""

import pytest

from kit.planning import memory, shapes
from kit.planning.config import RunConfig

GIB = 2**30


def est(name, method, batch=4, seq=2048, gc=True, precision="bf16", **kw):
    cfg = RunConfig(model=name, method=method, seq_len=seq)
    return memory.estimate(shapes.model_facts(name), cfg, precision, batch, gc, method == "qlora", **kw)


@pytest.mark.parametrize("name,method,upcast,measured_gib", [
    ("Qwen/Qwen3-8B", "qlora", False, 22.5),   # kit's way: no prepare_model_for_kbit_training
    ("Qwen/Qwen3-8B", "qlora", True, 28.2),    # with prepare_model_for_kbit_training (fp32 upcasts)
    ("Qwen/Qwen3-8B", "lora", False, 32.1),
    ("Qwen/Qwen3-0.6B", "qlora", False, 16.1),  # 152k-vocab logits dominate
])
def test_estimate_within_15_percent_of_h200_measurements(name, method, upcast, measured_gib):
    e = est(name, method, kbit_upcast=upcast)
    assert e.allocated_bytes / GIB == pytest.approx(measured_gib, rel=0.15)


# bf16 LoRA r16 all-linear, random weights, SDPA, a plain loop (forward, backward, AdamW step) on one
# H200, torch 2.11 + transformers 5.17 + peft; max_memory_allocated after the model was built.
@pytest.mark.parametrize("name,seq,batch,gc,measured_gib", [
    ("Qwen/Qwen3-8B", 2048, 4, True, 32.09), ("Qwen/Qwen3-8B", 512, 4, True, 19.88),
    ("Qwen/Qwen3-8B", 4096, 1, True, 23.95), ("Qwen/Qwen3-8B", 512, 4, False, 39.59),
    ("Qwen/Qwen3-8B", 1024, 2, False, 39.59), ("Qwen/Qwen3-0.6B", 2048, 4, True, 15.67),
    ("Qwen/Qwen3-0.6B", 1024, 4, False, 18.15), ("Qwen/Qwen3-0.6B", 512, 8, False, 18.15),
    ("Qwen/Qwen3-0.6B", 2048, 1, False, 9.72),
])
def test_activations_with_and_without_checkpointing_match_h200(name, seq, batch, gc, measured_gib):
    e = est(name, "lora", batch=batch, seq=seq, gc=gc)
    assert e.allocated_bytes / GIB == pytest.approx(measured_gib, rel=0.05)


def test_terms_sum_to_total_and_include_context_and_slack():
    e = est("Qwen/Qwen3-8B", "qlora")
    assert sum(e.terms.values()) == e.total_bytes
    assert e.terms["cuda_context"] == GIB // 2
    assert e.terms["allocator_slack"] == pytest.approx(0.10 * e.allocated_bytes, rel=0.01)
    assert "cuda_context" not in est("Qwen/Qwen3-8B", "lora", batch=1, seq=64, device="cpu").terms


def test_logits_terms_named_and_sized():
    e = est("Qwen/Qwen3-8B", "qlora")
    entries = 4 * 2048 * 151936
    assert e.terms["logits_fp32"] == 4 * entries  # 5 GB at 4 × 2048 × 152k
    assert e.terms["logits_16bit"] == e.terms["logits_grad_16bit"] == 2 * entries
    assert e.terms["logits_grad_fp32"] == 4 * entries


def test_lora_adapter_is_175_mb_for_qwen3_8b_r16():
    # the measured 8B QLoRA checkpoint: adapter 175 MB fp32 + optimizer 350 MB
    e = est("Qwen/Qwen3-8B", "qlora")
    assert e.terms["lora_params_fp32"] / 1e6 == pytest.approx(175, rel=0.02)
    assert e.terms["optimizer_states"] / 1e6 == pytest.approx(350, rel=0.02)
    m = shapes.model_facts("Qwen/Qwen3-8B")
    assert memory.lora_params(m, ["q_proj", "v_proj"], 16) < memory.lora_params(m, "all-linear", 16) / 4


def test_nf4_weights_are_about_half_a_byte_per_linear_param():
    m = shapes.model_facts("Qwen/Qwen3-8B")
    e = est("Qwen/Qwen3-8B", "qlora")
    per_param = e.terms["weights_4bit"] / (m.layers * m.layer_linear_params())
    assert per_param == pytest.approx(0.5 + 0.127 / 8)
    assert e.terms["weights_16bit_embed_norms"] > 2 * 151936 * 4096 * 2 * 0.99  # untied embed + lm_head


def test_checkpointing_trades_activations():
    on, off = est("Qwen/Qwen3-8B", "qlora", seq=512, gc=True), est("Qwen/Qwen3-8B", "qlora", seq=512, gc=False)
    assert "activations" in off.terms and "activations_checkpointed" in on.terms
    assert off.total_bytes > on.total_bytes + 5 * GIB


def test_full_finetuning_counts_grads_and_optimizer():
    bf16 = est("Qwen/Qwen3-0.6B", "full", precision="bf16")
    fp16 = est("Qwen/Qwen3-0.6B", "full", precision="fp16")  # fp32 masters for the GradScaler
    assert fp16.terms["weights"] == 2 * bf16.terms["weights"]
    eight = est("Qwen/Qwen3-0.6B", "full", optimizer="adamw_8bit")
    assert eight.terms["optimizer_states"] * 2 == bf16.terms["optimizer_states"]


def test_sharding_divides_the_weights_and_ddp_adds_buckets():
    one = est("Qwen/Qwen3-8B", "lora", seq=512)
    fsdp = est("Qwen/Qwen3-8B", "lora", seq=512, world_size=2, sharding="fsdp")
    ddp = est("Qwen/Qwen3-8B", "lora", seq=512, world_size=2)
    assert fsdp.terms["weights"] == one.terms["weights"] // 2 and "fsdp_gathered_layers" in fsdp.terms
    assert ddp.terms["ddp_buckets"] == ddp.terms["lora_grads_fp32"]


def test_peak_is_the_larger_phase():
    # A plain Trainer holds the full logits: at seq 2048 × 4 they outweigh a recomputed layer.
    assert "logits_fp32" in est("Qwen/Qwen3-8B", "qlora").terms
    # TRL's tiled loss holds one 4096 × 32768 tile at most: the recomputed layer is the peak.
    e = est("Qwen/Qwen3-8B", "qlora", fused_lm_head=True, autocast=True)
    assert "layer_recompute" in e.terms and "logits_fp32" not in e.terms and "loss_tile" not in e.terms
    # Without checkpointing nothing is freed early: every layer's activations and the tile together.
    e = est("Qwen/Qwen3-8B", "qlora", gc=False, fused_lm_head=True, autocast=True)
    assert {"activations", "loss_tile"} <= set(e.terms)


def _script_measurements():
    """Rows measured through the script kit generates (bench/memory_accuracy.py on the H200)."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parent.parent / "bench" / "results"
    rows = []
    for name in ("memory_accuracy_h200.json", "memory_accuracy_h200_holdout.json"):
        rows += [pytest.param(r, id=r["name"]) for r in json.loads((results / name).read_text())["rows"]]
    return rows


@pytest.mark.parametrize("row", _script_measurements())
def test_plan_estimate_within_5_percent_of_the_generated_script_on_h200(row):
    # What `kit plan` tells the user before training, against rank 0's max_memory_allocated over
    # real steps of the generated script (TRL 1.15's tiled loss, autocast, bf16 QLoRA adapters).
    from bench.memory_accuracy import planned_allocated_gib

    assert planned_allocated_gib(row) == pytest.approx(row["measured_gib"], rel=0.05)


def test_tiled_loss_from_trl_1_15():
    assert memory.fuses_lm_head("1.15.0") and memory.fuses_lm_head("1.16.0.dev0") and memory.fuses_lm_head("2.0")
    assert not memory.fuses_lm_head("1.14.2") and not memory.fuses_lm_head("0.24.0")
    assert memory.fuses_lm_head(None)  # not installed there: `pip install -e ".[train]"` brings the newest
