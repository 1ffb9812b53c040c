"""GRPO planning: the batch rule TRL enforces, and the memory of a GRPO step term by term."""

import pytest

from kit.planning import grpo, memory, shapes
from kit.planning.config import RunConfig

GIB = 2**30


@pytest.mark.parametrize("pdb,world,accum,g", [(8, 1, 1, 8), (4, 2, 1, 8), (2, 2, 2, 8), (3, 2, 1, 6), (1, 1, 4, 4)])
def test_batches_holding_whole_groups_pass(pdb, world, accum, g):
    assert grpo.batch_problem(per_device_batch=pdb, world_size=world, accumulation=accum, num_generations=g) is None


def test_indivisible_global_batch_names_the_numbers_and_valid_choices():
    words = grpo.batch_problem(per_device_batch=3, world_size=2, accumulation=1, num_generations=4)
    assert "global batch 6" in words and "num_generations=4" in words
    assert "global_batch=12" in words  # lcm(6, 4): the nearest valid one above 6 (none below)
    words = grpo.batch_problem(per_device_batch=2, world_size=2, accumulation=5, num_generations=8)
    assert "global batch 20" in words and "global_batch=16 or 24" in words


def test_one_generation_is_refused():
    assert "at least 2" in grpo.batch_problem(per_device_batch=4, world_size=1, accumulation=1, num_generations=1)


def grpo_est(name="Qwen/Qwen3-1.7B", method="lora", completions=8, prompt=128, completion=256, beta=0.0, gc=True,
             generated=None):
    cfg = RunConfig(model=name, method=method)
    return memory.grpo_estimate(shapes.model_facts(name), cfg, "bf16", completions_per_device=completions,
                                prompt_tokens=prompt, completion_tokens=completion, beta=beta,
                                gradient_checkpointing=gc, quantized=method == "qlora",
                                generated_per_device=generated)


def test_grpo_estimate_within_15_percent_of_h100_measurement():
    # bench/results/grpo_speed_h100.json: TRL 1.15 GRPOTrainer, Qwen3-1.7B shape, bf16 LoRA r16, 8 x (128 + 256)
    # tokens, checkpointing on: max_memory_allocated 4.286 GiB (TRL direct and kit's generation alike)
    e = grpo_est()
    assert e.allocated_bytes / GIB == pytest.approx(4.286, rel=0.15)
    assert "kv_cache" not in e.terms and any("KV cache" in n for n in e.notes)


def test_kv_cache_is_layers_kv_heads_head_dim_tokens_generations_bytes():
    m = shapes.model_facts("Qwen/Qwen3-1.7B")
    assert memory.kv_cache_bytes(m, 8, 384, 2) == 2 * 28 * 8 * 128 * 384 * 8 * 2


def test_generating_several_micro_batches_at_once_makes_generation_the_peak():
    # 2 completions per micro-batch, 8 accumulation steps: TRL generates all 16 in one call
    e = grpo_est(completions=2, generated=16, completion=4096, prompt=512)
    m = shapes.model_facts("Qwen/Qwen3-1.7B")
    assert e.terms["kv_cache"] == memory.kv_cache_bytes(m, 16, 4608, 2)
    assert "lora_grads_fp32" not in e.terms and any("generation is the peak" in n for n in e.notes)


def test_reference_counts_only_with_beta_and_without_lora():
    assert "reference_weights" not in grpo_est(beta=0.04).terms
    assert any("adapter disabled" in n for n in grpo_est(beta=0.04).notes)
    full = grpo_est(method="full", beta=0.04)
    assert full.terms["reference_weights"] == shapes.model_facts("Qwen/Qwen3-1.7B").params * 2
    assert "reference_weights" not in grpo_est(method="full", beta=0.0).terms
