"""kit.train.generation: GRPO's transformers generation through a static cache and compiled decoding.

The speed is measured on the GPU (bench/grpo_speed.py, bench/results/grpo_speed_h100.json); here, on
the CPU, a real TRL GRPOTrainer over a tiny random Qwen3 with a LoRA adapter: which trainers get the
fast path, what it changes in the generation settings, and that the completions it produces are the
ones TRL's own path produces (greedy, so the comparison is exact)."""

import pytest
import torch

from kit.train import generation

PROMPT_TOKENS, COMPLETION_TOKENS = 12, 8


@pytest.mark.parametrize("kw,fast,words", [
    ({"device_type": "cuda", "use_vllm": False, "continuous_batching": False}, True, "static KV cache"),
    ({"device_type": "cpu", "use_vllm": False, "continuous_batching": False}, False, "CUDA only"),
    ({"device_type": "cuda", "use_vllm": True, "continuous_batching": False}, False, "vLLM generates"),
    ({"device_type": "cuda", "use_vllm": False, "continuous_batching": True}, False, "continuous batching"),
    ({"device_type": "cuda", "use_vllm": False, "continuous_batching": False, "quantization_compiles": False},
     False, "quantization cannot be compiled"),
])
def test_which_generation_passes_are_compiled(kw, fast, words):
    choice = generation.generation_choice(**kw)
    assert choice.fast is fast and words in choice.reason


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tests.scripts import ROOT

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                                  tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    tok = AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-qwen3")
    prompt = " light" * PROMPT_TOKENS
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo")), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=COMPLETION_TOKENS, max_steps=1, report_to="none",
                      save_strategy="no", use_cpu=True)
    t = GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"prompt": [prompt] * 4}),
                    reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], processing_class=tok,
                    peft_config=LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    t.model.gradient_checkpointing_disable()  # as TRL does around its generation pass
    return t


def test_cpu_trainer_keeps_trls_generation(trainer):
    before = trainer.generation_config.to_dict()
    choice = generation.speed_up_generation(trainer, max_prompt_tokens=PROMPT_TOKENS)
    assert not choice.fast and "cpu" in choice.reason
    assert trainer.generation_config.to_dict() == before
    assert trainer.generation_config.disable_compile is True  # TRL's own setting, left alone


def _greedy(trainer, config):
    ids = torch.tensor([trainer.processing_class(" light" * PROMPT_TOKENS)["input_ids"]] * 2)
    config.do_sample = False
    with torch.no_grad():
        return trainer.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)


def _copy(config):
    return config.__class__.from_dict(config.to_dict())


def test_fast_config_changes_the_cache_and_compilation_only(trainer):
    trl = trainer.generation_config
    fast = generation.fast_generation_config(_copy(trl), max_completion_length=COMPLETION_TOKENS,
                                             max_prompt_tokens=PROMPT_TOKENS)
    assert fast.cache_implementation == "static" and fast.disable_compile is False
    assert fast.compile_config.mode == "reduce-overhead"
    assert fast.max_cache_len == PROMPT_TOKENS + COMPLETION_TOKENS  # one cache, one compiled graph
    for key in ("temperature", "top_p", "top_k", "max_new_tokens", "eos_token_id", "pad_token_id", "do_sample"):
        assert getattr(fast, key) == getattr(trl, key), key


def test_static_cache_gives_trls_completions(trainer):
    fast = generation.fast_generation_config(_copy(trainer.generation_config), max_completion_length=COMPLETION_TOKENS,
                                             max_prompt_tokens=PROMPT_TOKENS)
    fast.disable_compile = True  # the cache alone here; compiled below (slow) and on the GPU (bench)
    assert torch.equal(_greedy(trainer, fast), _greedy(trainer, _copy(trainer.generation_config)))


@pytest.mark.slow
def test_compiled_decoding_gives_trls_completions_and_follows_the_adapter(trainer):
    """Inductor on the CPU (CompileConfig's all-devices switch): the compiled decoding step reads the
    adapter in place, so a changed adapter changes its completions exactly as it changes TRL's."""
    fast = generation.fast_generation_config(_copy(trainer.generation_config), max_completion_length=COMPLETION_TOKENS,
                                             max_prompt_tokens=PROMPT_TOKENS, mode="default")
    fast.compile_config._compile_all_devices = True
    before = _greedy(trainer, _copy(trainer.generation_config))
    assert torch.equal(_greedy(trainer, fast), before)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))  # in place, as the optimizer writes it
    changed = _greedy(trainer, _copy(trainer.generation_config))
    assert not torch.equal(changed, before)
    assert torch.equal(_greedy(trainer, fast), changed)
