"""Load the model and tokenizer for a plan, and add LoRA.

Backends:
- `transformers`: AutoModelForCausalLM (+ bitsandbytes nf4 for QLoRA) and PEFT LoRA.
- `unsloth`: Unsloth's FastLanguageModel, same shape. `import unsloth` must run before
  transformers/trl are imported (it patches them), which the generated script does first.

Every GPU load is pinned to this rank's device with `device_map={"": local_rank}`: a model
split over GPUs with device_map="auto"/"balanced" cannot be trained under DDP, and it
serializes the GPUs instead of using them in parallel.

No `prepare_model_for_kbit_training`: it upcasts norms, embeddings and lm_head to fp32, which
on a Qwen3-8B QLoRA step measured 28.2 GiB and 5,747 tokens/s against 22.5 GiB and 7,072
tokens/s without it (H200, DESIGN.md). The only part of it training needs is inputs that
require grad under gradient checkpointing, done below.
"""

from __future__ import annotations

from kit.planning import shapes
from kit.train import sharding
from kit.errors import CannotTrain, UsageError

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def torch_dtype(precision: str):
    """The torch dtype of a plan's precision: bf16 → torch.bfloat16, fp16 → torch.float16, fp32 → torch.float32."""
    import torch

    return getattr(torch, DTYPES[precision])


def compute_dtype(plan):
    """The dtype 4-bit matmuls compute in: the plan's 16-bit precision (fp16 where it planned fp32)."""
    return torch_dtype(plan.precision if plan.precision != "fp32" else "fp16")


def quant_storage(plan) -> dict:
    """`bnb_4bit_quant_storage` under FSDP, which shards float tensors only: the packed nf4 bytes are
    viewed as the dtype of the other frozen weights (kit.train.sharding.quant_storage); {} otherwise."""
    if plan.strategy != "fsdp":
        return {}
    return {"bnb_4bit_quant_storage": _torch_dtype_name(sharding.quant_storage(plan.precision))}


def _load_kwargs(cfg, plan, ctx, quantization) -> dict:
    import torch

    kwargs = {"revision": cfg.revision}
    # Full fine-tuning keeps fp32 master weights (AMP does the 16-bit math); LoRA loads the base in the plan's precision.
    kwargs["dtype"] = torch.float32 if cfg.method == "full" else torch_dtype(plan.precision)
    if ctx.device.type == "cuda" and _device_map(plan, ctx) is not None:
        kwargs["device_map"] = _device_map(plan, ctx)
    if cfg.method == "qlora":
        if ctx.device.type != "cuda":
            raise CannotTrain("method qlora needs a CUDA GPU (bitsandbytes 4-bit); use method=lora on CPU")
        if quantization is None:
            raise UsageError("method qlora needs the script's BitsAndBytesConfig: re-render train_ddp.py")
        kwargs["quantization_config"] = quantization
    return kwargs


def _device_map(plan, ctx):
    """Where the weights load: this rank's GPU; the CPU for 16-bit FSDP; spread for model parallel."""
    if plan.strategy == "model_parallel":
        return "auto"  # layers over all visible GPUs, in order; one process (see kit.train.sharding)
    if sharding.loads_on_cpu(plan):
        return None  # one rank per node reads, FSDP moves each rank's shard to its GPU
    return {"": ctx.local_rank}


def _torch_dtype_name(name: str):
    import torch

    return getattr(torch, name)


def check_seq_len(cfg, model_config) -> None:
    shapes.check_seq_len(cfg, getattr(model_config, "max_position_embeddings", None))


MIN_VOCAB = 16  # fewer tokens than this is no real tokenizer (kit's own tiny test model has 512)


def load(cfg, plan, ctx, quantization=None):
    """(model, tokenizer) for `cfg` on this rank's device, as `plan` says; `quantization` is the
    script's BitsAndBytesConfig for QLoRA (Unsloth builds its own from load_in_4bit)."""
    if plan.backend == "unsloth":
        return _load_unsloth(cfg, plan, ctx)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        model_config = AutoConfig.from_pretrained(cfg.model, revision=cfg.revision)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, revision=cfg.revision)
    except (OSError, ValueError) as e:
        raise UsageError(f"model {cfg.model!r} could not be loaded: {str(e).splitlines()[0]} "
                         "(offline? give a local path or set HF_HUB_OFFLINE=0)") from e
    if len(tokenizer) < MIN_VOCAB:  # transformers 5 builds an empty tokenizer from a folder without one
        raise UsageError(f"model {cfg.model!r} has no usable tokenizer ({len(tokenizer)} tokens): its folder needs "
                         "the base model's tokenizer files (tokenizer.json or tokenizer.model, tokenizer_config.json)")
    check_seq_len(cfg, model_config)
    from safetensors import SafetensorError

    sharding.prepare_loading(plan)
    try:
        model = AutoModelForCausalLM.from_pretrained(cfg.model, **_load_kwargs(cfg, plan, ctx, quantization))
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        if (why := weights_problem(e)) is None:
            raise  # out of memory, a CUDA error: not the model files' fault
        raise UsageError(f"model {cfg.model!r}: its weights do not load ({why}): restore the model folder or "
                         "give another model") from None
    _prepare(model, tokenizer, plan)
    return model, tokenizer


def weights_problem(e: BaseException) -> str | None:
    """Why a model's files do not load, in one line; None for an error that is not about the files
    (out of memory, CUDA)."""
    text = " ".join(str(e).split())
    if isinstance(e, RuntimeError) and not any(w in text for w in ("size mismatch", "ignore_mismatched_sizes",
                                                                   "state_dict", "header", "safetensors")):
        return None
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return "their shapes differ from config.json's"
    return text[:200] or type(e).__name__


def _prepare(model, tokenizer, plan) -> None:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The model's configs name the same pad token, as TRL's trainers set them when they build their own
    # collator (SFT with packed rows gets kit's: kit.train.collate), so a saved config is the same either way.
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.use_cache = False  # the KV cache is useless in training and breaks checkpointing
    model.config.return_dict = True
    if plan.gradient_checkpointing and plan.strategy != "fsdp":  # FSDP checkpoints its own layers
        # Non-reentrant: works with frozen inputs and DDP without find_unused_parameters.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()


def compile_layers(model) -> int:
    """torch.compile each decoder layer in place (`nn.Module.compile`), the unit that repeats, so one
    compiled graph serves them all; the 4-bit matmuls inside are bitsandbytes' registered ops. It
    compiles at the layers' first call. Returns how many layers.

    Inductor rounds each fused intermediate to the layer's 16-bit dtype as eager does
    (`emulate_precision_casts`). Without that it keeps them in fp32 inside a fused kernel, and on the
    H200 the QLoRA loss curve of Qwen3-8B fell up to 3.95 % below eager's from the first update on
    (the LoRA sums that bf16 rounds away in eager survived); with it the curves agree to 0.04 % at the
    same speed (bench/results/speed_h200_fill_compile_eager_rounding.json). A torch whose inductor cannot
    round so compiles nothing: 0."""
    if not _inductor_rounds_as_eager():
        return 0
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(options={"emulate_precision_casts": True})
    return len(layers)


def eager_layers(model) -> None:
    """Undo `compile_layers`: the layers run eagerly again. After training, before the final
    evaluation generates: a compiled layer would compile again for eval mode, the prompt and each
    length of the KV cache (24 tokens from the tiny model on the CPU, cold caches: 35 s compiled, 2.5 s eager)."""
    for layer in decoder_layers(model):
        layer._compiled_call_impl = None  # what nn.Module.compile set; None is its eager default


def decoder_layers(model) -> list:
    """The model's decoder layers (Qwen3DecoderLayer, LlamaDecoderLayer, …), in order."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def _inductor_rounds_as_eager() -> bool:
    import torch._inductor.config

    return hasattr(torch._inductor.config, "emulate_precision_casts")


def target_modules(cfg, model) -> list[str] | str:
    """The module names LoRA wraps: the config's list (each checked against the model), or every linear
    projection of the decoder for "all-linear"."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    wanted = cfg.lora.target_modules
    if wanted != "all-linear":
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        # PEFT matches a name against the end of each module's path; a name matching nothing would stop
        # the run in get_peft_model with a traceback, after the model loaded.
        import torch
        from transformers.pytorch_utils import Conv1D

        # PEFT wraps these layer types only; a name matching anything else (a block such as `mlp`, a
        # norm) fails in get_peft_model with "Target module … is not supported".
        wrappable = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                     torch.nn.MultiheadAttention, Conv1D)
        matched = {t: [m for n, m in model.named_modules() if n == t or n.endswith("." + t)] for t in wanted}
        missing = [t for t in wanted if not matched[t]]
        blocks = [t for t in wanted if matched[t] and not all(isinstance(m, wrappable) for m in matched[t])]
        if missing or blocks:
            linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                             if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] != "lm_head"})
            what = (f"{', '.join(missing)} is no module of {cfg.model}" if missing else
                    f"{', '.join(blocks)} names a {type(matched[blocks[0]][0]).__name__}, not a layer LoRA can wrap")
            raise UsageError(f"lora.target_modules: {what}; its linear layers are {', '.join(linear)} (or use "
                             "all-linear)")
        return wanted
    found = [m for m in ALL_LINEAR if m in present]
    return found or "all-linear"  # unknown architecture: let PEFT find the linear layers


def add_lora(model, cfg, plan, lora):
    """Wrap `model` with the adapters `lora` (a peft LoraConfig) describes; None (full fine-tuning) returns it as is."""
    if lora is None:
        return model
    if plan.backend == "unsloth":
        from unsloth import FastLanguageModel

        return FastLanguageModel.get_peft_model(
            model, r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
            target_modules=sorted(lora.target_modules) if not isinstance(lora.target_modules, str) else lora.target_modules,
            bias=lora.bias, random_state=cfg.seed,
            use_gradient_checkpointing="unsloth" if plan.gradient_checkpointing else False)
    from peft import get_peft_model

    return get_peft_model(model, lora)


def reference_is_base(model) -> None:
    """Score the reference of DPO/KTO with the adapter disabled, not through TRL's copy of it.

    Given a PeftModel, TRL's DPOTrainer and KTOTrainer copy its adapter as "ref" and score the
    reference through that copy, for an adapter that was trained before. kit's adapter is fresh (LoRA's
    B is zero: the base's own outputs), so the base is the same reference; without the copy TRL
    disables the adapter instead, and checkpoints and final/ hold the trained adapter alone.
    """
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def _load_unsloth(cfg, plan, ctx):
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=cfg.model, revision=cfg.revision, max_seq_length=cfg.seq_len, dtype=torch_dtype(plan.precision),
        load_in_4bit=cfg.method == "qlora", full_finetuning=cfg.method == "full",
        device_map={"": ctx.local_rank})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def settle_adapter_dtype(model, plan) -> int:
    """Make the trainable weights fp32 when training in fp16; returns how many were cast.

    TRL's SFTTrainer casts LoRA weights on a 4-bit base to bf16 (the QLoRA paper's choice). That
    is fine under bf16, but fp16 AMP (T4, V100) scales the loss, and its GradScaler cannot unscale
    bf16 gradients: the first step fails with "_amp_foreach_non_finite_check_and_unscale_cuda not
    implemented for 'BFloat16'" (seen on the H200 with precision=fp16). fp32 weights also keep
    small updates that fp16 or bf16 would round away. Call after building the trainer, before
    `train()` creates the optimizer.
    """
    if plan.precision != "fp16":
        return 0
    import torch

    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()
            cast += 1
    return cast


def trainable_summary(model) -> str:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == total:  # full fine-tuning: every weight trains
        return f"trainable parameters: all {total:,}"
    # With LoRA the total counts the adapter too: say so, so it matches the model's own size.
    return (f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / max(total, 1):.2f} %; "
            f"the model's {total - trainable:,} frozen + {trainable:,} trainable)")
