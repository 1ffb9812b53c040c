"""GRPO's generation pass through transformers, fast: a static KV cache and compiled decoding.

TRL's GRPOTrainer (1.15, 1.16) generates with transformers' `generate` on a dynamic cache and turns
compilation off (`GenerationConfig(..., disable_compile=True)`); it already turns gradient
checkpointing off around the pass, so the KV cache is used. Each decoded token is still one eager
forward of every layer, LoRA adapters included: thousands of small kernels, bound by the CPU that
launches them, not by the GPU.

`speed_up_generation(trainer)` keeps TRL's generation path and its sampling settings and changes
only how each token is computed: the cache becomes a `StaticCache` sized once for the longest
prompt plus the completion, so transformers compiles the one-token decoding step
(`torch.compile`, mode "reduce-overhead": CUDA graphs) and replays it. The adapters stay
unmerged: the base weights are never rewritten, so training reads exactly the weights it would
have read, and the compiled step reads the adapter weights in place, so every step samples from
the current policy.

Measured on one H100 (bench/results/grpo_speed_h100.json; random-weight Qwen3-1.7B shape, bf16
LoRA r16, 8 completions x 256 tokens from one 128-token prompt, TRL 1.15, transformers 5.17):
    TRL direct                       15.3 s/step, generation 14.9 s (58 ms a token), peak 4.29 GiB
    LoRA merged for generation        8.6 s/step, generation  8.2 s (32 ms a token)   0.56x
    kit (static cache, compiled)      3.3 s/step, generation  2.8 s (11 ms a token)   0.21x, peak 4.29 GiB
The first step compiles (54-80 s on a cold cache), repaid after about six steps. Merging was
dropped: it halves the adapters' cost but keeps eager decoding, and merging then unmerging in 16 bits
rewrites the base weights with rounding each step. Equivalence, fixed before the run: kit's
sampled tokens' log-probabilities differ from the training forward's by 0.021 nat on average, TRL's
own eager generation by 0.022 (bf16 rounding both): the same distribution.

vLLM (`use_vllm=True`) is out of scope here (it cannot be installed on these machines); it would
replace this pass with paged attention and continuous batching, in its own memory outside
PyTorch's allocator, and TRL would sync the adapter into it every step. Kept out where it cannot help
or cannot run: not on CUDA (nothing to replay), vLLM or transformers' continuous batching (their own
generation), or a quantized model transformers will not compile (bitsandbytes 4-bit, so QLoRA, in
transformers 5.17: its quantizer says `is_compileable` False), which keeps TRL's eager pass.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODE = "reduce-overhead"  # CUDA graphs over the compiled decoding step


@dataclass(frozen=True)
class GenerationChoice:
    """What `speed_up_generation` did, and the words for the plan and the log."""

    fast: bool
    reason: str


def generation_choice(*, device_type: str, use_vllm: bool, continuous_batching: bool,
                      quantization_compiles: bool = True) -> GenerationChoice:
    """Whether the compiled static-cache decoding applies to this trainer's generation pass.

    `quantization_compiles`: False where the model's quantization (transformers' `hf_quantizer`)
    says it cannot be compiled; transformers would then decode eagerly on a static cache."""
    if use_vllm:
        return GenerationChoice(False, "generation: vLLM generates (kit's compiled decoding is not used)")
    if continuous_batching:
        return GenerationChoice(False, "generation: transformers' continuous batching generates "
                                       "(kit's compiled decoding is not used)")
    if device_type != "cuda":
        return GenerationChoice(False, f"generation: eager decoding on {device_type} "
                                       "(compiled decoding replays CUDA graphs: CUDA only)")
    if not quantization_compiles:
        return GenerationChoice(False, "generation: eager decoding (this model's quantization cannot be compiled)")
    return GenerationChoice(True, "generation: static KV cache and compiled one-token decoding (CUDA graphs); "
                                  "the LoRA adapters stay unmerged")


def speed_up_generation(trainer, *, max_prompt_tokens: int | None = None,
                        mode: str = COMPILE_MODE) -> GenerationChoice:
    """Switch a TRL GRPOTrainer's transformers generation to a static cache and compiled decoding.

    Args:
        trainer: A `trl.GRPOTrainer`, built (its `generation_config` exists).
        max_prompt_tokens: The longest prompt, in tokens, that generation will see. The static cache
            is sized for it plus `max_completion_length` once, so a longer prompt later does not
            reallocate the cache and recompile the decoding step. None: sized by the first batch
            (transformers grows it, recompiling, when a longer prompt comes).
        mode: torch.compile's mode for the decoding step ("default": compiled kernels, no CUDA graphs).

    Returns:
        The choice made and its reason (one line for the log).
    """
    import torch

    device_type = torch.device(trainer.accelerator.device).type
    choice = generation_choice(device_type=device_type, use_vllm=bool(getattr(trainer, "use_vllm", False)),
                               continuous_batching=bool(getattr(trainer, "use_transformers_continuous_batching",
                                                                False)),
                               quantization_compiles=_quantization_compiles(trainer.model))
    if not choice.fast:
        return choice
    fast_generation_config(trainer.generation_config, max_completion_length=trainer.max_completion_length,
                           max_prompt_tokens=max_prompt_tokens, mode=mode)
    # TRL hands the same settings to the model's own generation config on transformers < 5 (its
    # workaround for transformers#42762); keep the two in agreement.
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["cache_implementation"] = "static"
    return choice


def fast_generation_config(config, *, max_completion_length: int, max_prompt_tokens: int | None = None,
                           mode: str = COMPILE_MODE):
    """Turn a transformers GenerationConfig to a static cache and compiled decoding, in place.

    Sampling settings (temperature, top-p/k, tokens) are left as they are."""
    from transformers import CompileConfig

    config.cache_implementation = "static"
    config.disable_compile = False
    config.compile_config = CompileConfig(fullgraph=False, mode=mode)
    if max_prompt_tokens:
        config.max_cache_len = int(max_prompt_tokens) + int(max_completion_length)
    return config


def _quantization_compiles(model) -> bool:
    """Whether transformers would compile this (possibly PEFT-wrapped) model's quantization; True unquantized."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantizer = getattr(base, "hf_quantizer", None)
    return quantizer is None or bool(getattr(quantizer, "is_compileable", False))
