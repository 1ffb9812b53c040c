"""Per-GPU memory of one full training step, term by term, from the model's shape alone.

    est = estimate(model_facts("Qwen/Qwen3-8B"), cfg, "bf16", per_device_batch=4,
                   gradient_checkpointing=True, quantized=True)
    est.terms          # {"weights_4bit": ..., "logits_fp32": ..., "cuda_context": ..., ...}
    est.total_bytes    # sum of the terms

Calibrated on one H200 in two settings. What `kit plan` uses, the generated script (TRL 1.15's
SFTTrainer under autocast, bf16 QLoRA adapters, the tiled loss that never holds the logits),
measured by bench/memory_accuracy.py through `max_memory_allocated` over real steps: 8 calibration
and 7 held-out configurations (Qwen3 0.6B–8B, QLoRA and bf16 LoRA, seq 512–4096, batch 1–8,
checkpointing on and off): the fitted ones within 4.8 %, the held-out ones within 3.1 %
(bench/results/memory_accuracy_h200*.json; `python bench/memory_accuracy.py --reestimate FILE`).

And the defaults (`autocast=False`, `fused_lm_head=False`): a plain transformers Trainer + PEFT
and a plain PyTorch loop, LoRA r16 all-linear, seq 2048, batch 4, checkpointing on:

    run                                   measured   `allocated_bytes` here
    8B QLoRA (no prepare_model_for_kbit)  22.5 GiB   22.5 GiB
    8B QLoRA with prepare_model_for_kbit  28.2 GiB   29.5 GiB
    8B bf16 LoRA                          32.1 GiB   32.1 GiB
    0.6B QLoRA (logits dominate)          16.1 GiB   15.0 GiB

and nine bf16 LoRA runs in a plain loop, 8B and 0.6B at seq 512–4096, batch 1–8, checkpointing
on and off, within 1 % (tests/test_memory.py).

Two things the measurements taught: full logits cost 12 bytes per (token × vocab) entry (the 16-bit
logits the model returns, the fp32 log-softmax the loss saves, its fp32 gradient and the 16-bit
gradient), and with checkpointing they are freed before the first layer is recomputed, so the peak
is the larger of the two phases, not their sum. Attention is SDPA/flash: no seq² term.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kit.files import GIB
from kit.planning import trainers

CUDA_CONTEXT = GIB // 2      # not counted by max_memory_allocated; ~0.3-0.6 GiB depending on GPU and CUDA
SLACK = 0.10                 # caching-allocator fragmentation: reserved exceeds allocated by about this much
NF4_BYTES = 0.5 + 0.127 / 8  # 4-bit weights + double-quantized absmax (blocksize 64)
# TRL's SFTTrainer (1.15 and later) projects through the LM head in [4096 tokens × 32768 vocab] tiles
# and never holds the logits (trl.kernels.chunked_logprob).
FUSED_HEAD_FROM_TRL = (1, 15)
FUSED_TILE = (4096, 32768)
# What Unsloth's backend does to a step's memory (kit.planning.plan estimates backend=unsloth with it):
# its gradient checkpointing ("unsloth", which kit's script asks for) copies each decoder layer's input to
# CPU memory and back for backward, as TRL's activation offloading does, and its loss never holds the
# logits (chunked cross-entropy), as TRL's tiled head does. Measured through kit's script on an H100
# (bench/results/unsloth_memory_h100.json).
UNSLOTH = {"offloads_checkpoints": True}


def fuses_lm_head(trl_version: str | None) -> bool:
    """Whether SFTTrainer of this TRL version computes the loss without materialising the logits.

    None (TRL not installed where the plan is for) counts as yes: `pip install -e ".[train]"` brings the
    newest TRL.
    """
    if not trl_version:
        return True
    parts = []
    for piece in trl_version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= FUSED_HEAD_FROM_TRL


@dataclass
class MemoryEstimate:
    """Bytes per GPU at the peak of a training step.

    Attributes:
        terms: name → bytes of everything live at the peak; they sum to `total_bytes`.
        total_bytes: What the GPU must hold, CUDA context and allocator slack included.
        allocated_bytes: The part torch's allocator hands out (comparable to max_memory_allocated).
        notes: Plain sentences on what was assumed or left out of the peak.
    """

    terms: dict = field(default_factory=dict)
    total_bytes: int = 0
    allocated_bytes: int = 0
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def lora_params(model, target_modules, r: int) -> int:
    """Trainable LoRA parameters: r × (in + out) per targeted linear, over all layers."""
    shapes = model.linear_shapes()
    names = list(shapes) if target_modules == "all-linear" else [n for n in shapes if n in set(target_modules)]
    return model.layers * sum(r * (shapes[n][0] + shapes[n][1]) for n in names)


def layer_activation_bytes(model, bp: int, method: str, target_modules, *, quantized: bool = False,
                           autocast: bool = False) -> int:
    """Bytes one decoder layer saves for backward, per token, without checkpointing.

    Counted from what autograd keeps (frozen linears keep nothing): the two RMSNorms' fp32 input
    copies (8h), q/k-norm fp32 copies, SDPA's q, k, v and output, the MLP's gate, up and act(gate);
    plus what the trained linears keep of their inputs, which depends on how LoRA runs:
    - 16-bit LoRA without autocast: PEFT casts each adapter's input to fp32, one copy per adapter
      (20h + 4q + 4i more); a plain PyTorch loop, within 1 % on the H200 (8B, 0.6B).
    - 16-bit LoRA under autocast (Trainer with bf16/fp16): that fp32 copy is cast back to 16 bits
      for the matmul, and the 16-bit copy is what is kept: one per adapter.
    - QLoRA under autocast: PEFT's 4-bit layers skip the cast, so the adapters keep the very input
      tensor, one per group (q/k/v, gate/up) plus down_proj's; o_proj's is SDPA's output.
    The last two measured through kit's script on the H200 (bench/results/memory_accuracy_h200.json).
    """
    h, q, kv, i = model.hidden, model.q_dim, model.kv_dim, model.intermediate
    base = 8 * h + 4 * (q + kv) + bp * (2 * q + 2 * kv) + bp * 3 * i
    shapes = model.linear_shapes()
    targets = set(shapes) if method == "full" or target_modules == "all-linear" else set(target_modules) & set(shapes)
    attn_in, mlp_in = targets & {"q_proj", "k_proj", "v_proj"}, targets & {"gate_proj", "up_proj"}
    per_adapter = h * (len(attn_in) + len(mlp_in)) + q * ("o_proj" in targets) + i * ("down_proj" in targets)
    shared = h * (bool(attn_in) + bool(mlp_in)) + i * ("down_proj" in targets)
    if method == "full" or bp != 2:  # the linears' own inputs, shared by the q/k/v and gate/up groups
        trained = bp * shared
    elif quantized and autocast:
        trained = bp * shared
    elif autocast:
        trained = bp * per_adapter
    else:
        trained = 4 * per_adapter
    return base + trained


def estimate(model, cfg, precision: str, per_device_batch: int, gradient_checkpointing: bool,
             quantized: bool, *, world_size: int = 1, sharding: str = "none", optimizer: str | None = None,
             kbit_upcast: bool = False, device: str = "cuda", fused_lm_head: bool = False,
             autocast: bool = False, qlora_bf16_adapters: bool = False, batching: str = "padded",
             packed_as_rows: bool = True, activation_offloading: bool = False) -> MemoryEstimate:
    """Estimate one GPU's memory for a training step.

    Args:
        model: `kit.planning.shapes.ModelFacts`.
        cfg: `kit.planning.config.RunConfig` (method, lora, seq_len, optimizer are read).
        precision: "bf16" | "fp16" | "fp32" (compute dtype; full fine-tuning in fp16/fp32 keeps fp32 masters).
        per_device_batch: Micro-batch per GPU.
        gradient_checkpointing: Recompute each layer in backward instead of keeping its activations.
        quantized: Linear weights in nf4 (QLoRA or a bnb-4bit checkpoint).
        world_size: GPUs in the job; with sharding "none" (DDP) each holds a full replica.
        sharding: "none" (replica), "fsdp" (weights, grads and optimizer sharded), "layers" (device_map).
        optimizer: Overrides cfg.optimizer; "auto" counts as adamw_torch.
        kbit_upcast: Model peft's prepare_model_for_kbit_training (fp32 norms, embeddings, lm_head),
            which kit does not call; for comparison with runs that do.
        device: "cuda" adds the CUDA context; "cpu" does not.
        fused_lm_head: The loss is computed in tiles without the full logits (TRL ≥ 1.15's SFTTrainer,
            see `fuses_lm_head`); False models a plain Trainer, whose logits are the largest term.
        autocast: 16-bit math under torch.autocast, as Trainer runs with bf16/fp16 (kit's script);
            False models a loop over a 16-bit model (see `layer_activation_bytes`).
        qlora_bf16_adapters: On a 4-bit base the LoRA weights (so their grads and AdamW states) are
            bf16, as TRL's SFTTrainer casts them, following the QLoRA paper; else fp32 (PEFT's default).
        batching: "padding_free" lays a micro-batch's rows end to end in one sequence of up to
            per_device_batch × seq_len tokens, which SDPA attends through a block-diagonal mask
            (see `packed_mask_bytes`); "packed" sequences are rows of a batch, each of up to seq_len
            tokens under its own block-diagonal mask (kit.train.collate), or laid end to end like
            padding-free ones where `packed_as_rows` is False (Unsloth's trainer); "padded"/"grouped"
            hold no mask (causal SDPA).
        activation_offloading: With checkpointing, the layer inputs wait in pinned CPU memory; on the
            GPU only the one being copied and the one prefetched for backward (kit.planning.speed).
    """
    if trainers.of(cfg).name == "grpo":  # generation, then training on the completions: its own two phases
        return grpo_step(model, cfg, precision, per_device_batch, gradient_checkpointing, quantized,
                         world_size=world_size, optimizer=optimizer, device=device,
                         qlora_bf16_adapters=qlora_bf16_adapters)
    bp = 2 if precision in ("bf16", "fp16") else 4
    optimizer = optimizer or cfg.optimizer
    state_bytes = 2 if optimizer in ("adamw_8bit", "paged_adamw_8bit") else None  # None: 2 × param dtype
    n = world_size if sharding in ("fsdp", "layers") else 1
    linear = model.layers * model.layer_linear_params()
    embed = model.embedding_params()
    other = max(0, model.params - linear - embed)  # norms
    terms: dict[str, float] = {}
    notes: list[str] = []

    # Weights and what training adds to them.
    if cfg.method == "full":
        master = 2 if precision == "bf16" else 4  # fp16 AMP needs fp32 master weights (GradScaler)
        terms["weights"] = model.params * master / n
        terms["grads"] = model.params * master / n
        terms["optimizer_states"] = model.params * (state_bytes or 2 * master) / n
        trainable_grad = terms["grads"]
    else:
        edge = 4 if kbit_upcast else bp
        if quantized:
            terms["weights_4bit"] = linear * NF4_BYTES / n
            terms[f"weights_{'fp32' if edge == 4 else '16bit'}_embed_norms"] = (embed + other) * edge / n
        else:
            terms["weights"] = model.params * bp / n
        t = lora_params(model, cfg.lora.target_modules, cfg.lora.r)
        # Under fp16, kit casts them back to fp32 (modeling.settle_adapter_dtype): loss scaling needs it.
        ab, name = (2, "bf16") if quantized and qlora_bf16_adapters and precision == "bf16" else (4, "fp32")
        terms[f"lora_params_{name}"] = t * ab / n
        terms[f"lora_grads_{name}"] = t * ab / n
        terms["optimizer_states"] = t * (state_bytes or 2 * ab) / n
        trainable_grad = t * ab / n
    if world_size > 1 and sharding == "none":
        terms["ddp_buckets"] = trainable_grad  # DDP's flat gradient buckets duplicate the grads
    if sharding == "fsdp":
        unit = model.layer_linear_params() * (NF4_BYTES if quantized and cfg.method != "full" else bp)
        terms["fsdp_gathered_layers"] = 2 * unit  # the layer being computed plus the prefetched one
        # accelerate puts the final norm and lm_head in one unit that stays gathered from the end of
        # forward to the start of backward. FSDP2 gathers into a buffer of the whole head, beside the
        # rank's own shard (counted above), so the whole head is here at the peak, at any world size:
        # measured at world size 1 on the H200 (bench/results/fsdp_qlora_h200.json).
        terms["fsdp_gathered_head"] = model.vocab * model.hidden * bp
        notes.append(f"weights, gradients and optimizer states are sharded {world_size} ways")

    # Preference trainers: DPO puts chosen and rejected through the policy as one batch of twice the
    # rows; the reference (the starting model) scores them without gradients, as the base with the
    # adapter disabled (LoRA), a second copy (full, precompute off) or not at all in training (precomputed).
    trainer = trainers.of(cfg)
    rows = per_device_batch * trainer.sequences
    ref_kind = trainers.reference(cfg)[0]
    if ref_kind == "model_copy":
        terms["reference_model"] = model.params * bp / n
    if trainer.reference:  # how the reference is had is the plan's reason (trainers.reference), said there
        notes.append(f"{trainer.name}: {rows} sequences of up to {cfg.seq_len} tokens per micro-batch of "
                     f"{per_device_batch}")

    # Activations and logits.
    tokens = rows * cfg.seq_len
    layer = layer_activation_bytes(model, bp, cfg.method, cfg.lora.target_modules, quantized=quantized,
                                   autocast=autocast) * tokens
    hidden = model.hidden * tokens * bp
    if fused_lm_head:
        logits, head = _fused_head_terms(tokens, model.hidden, model.vocab, bp), "loss tiles"
    else:
        logits, head = _logits_terms(tokens * model.vocab, bp, kbit_upcast), "logits"
    layers_here = model.layers / n
    if gradient_checkpointing:
        if activation_offloading:
            terms["activations_checkpointed_in_flight"] = 2 * hidden  # the rest wait in pinned CPU memory
            notes.append(f"the layer inputs kept for backward ({_gib((layers_here + 1) * hidden)}) wait in pinned CPU "
                         "memory (activation offloading)")
        else:
            terms["activations_checkpointed"] = (layers_here + 1) * hidden  # each layer's input, kept for backward
        # One layer's activations and their grads. bitsandbytes' dequantized weight (one per matmul,
        # freed at once) did not show in the H200 measurements of QLoRA through kit's script.
        layer_phase = {"layer_recompute": layer + 4 * hidden}
        if sum(layer_phase.values()) > sum(logits.values()):
            terms.update(layer_phase)
            notes.append(f"the {head} ({_gib(sum(logits.values()))}) are freed before layers are "
                         "recomputed: the recompute phase is the peak")
        else:
            terms.update(logits)
            notes.append(f"one layer's recomputed activations ({_gib(sum(layer_phase.values()))}) come "
                         f"after the {head} are freed: not at the peak")
    else:
        terms["activations"] = layers_here * layer + hidden
        terms.update(logits)

    no_grad = _no_grad_forward_tokens(trainer, ref_kind, per_device_batch, cfg.seq_len)
    if no_grad:
        # The reference's (or KTO's KL) forward runs after the policy's, its activations kept for backward
        # still held: one layer's working set and a loss tile at a time, never the whole forward.
        phase = {"no_grad_forward": no_grad * (3 * model.intermediate + 4 * model.hidden) * bp
                 + min(no_grad, FUSED_TILE[0]) * min(model.vocab, FUSED_TILE[1]) * bp}
        peak_phase = ("layer_recompute" in terms and terms["layer_recompute"]) or sum(logits.values())
        if gradient_checkpointing and phase["no_grad_forward"] > peak_phase:
            for k in ("layer_recompute", *logits):
                terms.pop(k, None)
            terms.update(phase)
            notes.append("the reference forward (no gradients) is the peak, over the kept layer inputs")
        elif not gradient_checkpointing and phase["no_grad_forward"] > sum(logits.values()):
            for k in logits:
                terms.pop(k, None)
            terms.update(phase)

    if batching == "packed" and packed_as_rows and device == "cuda":
        terms["packed_attention_mask"] = per_device_batch * packed_mask_bytes(cfg.seq_len, model.layers / n,
                                                                              gradient_checkpointing)
        notes.append(f"packed batches: {per_device_batch} rows of up to {cfg.seq_len} tokens, each under its own "
                     "block-diagonal attention mask")
    elif batching in ("padding_free", "packed") and device == "cuda":
        terms["packed_attention_mask"] = packed_mask_bytes(tokens, model.layers / n, gradient_checkpointing)
        notes.append(f"{batching} batches: one {tokens}-token sequence per micro-batch under a block-diagonal "
                     "attention mask")

    return _estimate(terms, notes, device)


def _no_grad_forward_tokens(trainer, ref_kind, per_device_batch: int, seq_len: int) -> int:
    """Tokens of the largest forward without gradients a step of `trainer` runs (0: none)."""
    ref = per_device_batch * trainer.sequences * seq_len if ref_kind in ("adapter_disabled", "model_copy") else 0
    kl = per_device_batch * trainer.no_grad_sequences * seq_len
    return max(ref, kl)


def packed_mask_bytes(tokens: int, layers: float, gradient_checkpointing: bool) -> int:
    """The attention mask of one sequence of `tokens` tokens holding several rows (padding-free or packed).

    transformers builds one boolean [tokens × tokens] mask from the restarting position_ids; SDPA's
    memory-efficient kernel takes it as an additive 16-bit bias, converted again in every layer and
    kept for that layer's backward. With checkpointing only the recomputed layer keeps one.
    """
    kept = 1 if gradient_checkpointing else layers
    return int(tokens * tokens * (1 + 2 * kept))


def _logits_terms(entries: int, bp: int, kbit_upcast: bool) -> dict[str, float]:
    """Bytes of the logits for `entries` = tokens × vocab: the model's copy, the loss's fp32 ones, grads."""
    if bp == 2 and not kbit_upcast:
        return {"logits_16bit": 2 * entries, "logits_fp32": 4 * entries,
                "logits_grad_fp32": 4 * entries, "logits_grad_16bit": 2 * entries}
    # An fp32 lm_head (fp32 training, or prepare_model_for_kbit_training) gives fp32 logits directly.
    terms = {"logits_fp32": 4 * entries, "log_softmax_fp32": 4 * entries, "logits_grad_fp32": 4 * entries}
    if kbit_upcast:
        terms["log_softmax_grad_fp32"] = 4 * entries
    return terms


def _fused_head_terms(tokens: int, hidden: int, vocab: int, bp: int) -> dict[str, float]:
    """The tiled loss: one logits tile, the gathered hidden states it reads, their fp32 gradient."""
    return {"loss_tile": min(tokens, FUSED_TILE[0]) * min(vocab, FUSED_TILE[1]) * bp,
            "loss_hidden_copy": tokens * hidden * bp,
            "loss_hidden_grad": tokens * hidden * (4 + bp)}


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def fsdp_qlora_load_bytes(model, precision: str) -> int:
    """GPU bytes while a 4-bit base loads under FSDP: each rank quantizes the whole base on its GPU.

    accelerate shards a 4-bit model only after it is loaded (it cannot put Params4bit on the
    meta device), so every rank briefly holds the full nf4 linears plus the 16-bit embeddings,
    norms and lm_head, before FSDP frees what is not its shard.
    """
    bp = 2 if precision in ("bf16", "fp16") else 4
    linear = model.layers * model.layer_linear_params()
    rest = max(0, model.params - linear)
    return int((linear * NF4_BYTES + rest * bp) * (1 + SLACK) + CUDA_CONTEXT)


# What stays on the GPU between the generation pass and the training pass of a GRPO step.
PERSISTENT_TERMS = ("weights", "weights_4bit", "lora_params", "optimizer_states", "ddp_buckets", "reference_weights")


def grpo_step(model, cfg, precision: str, per_device_batch: int, gradient_checkpointing: bool, quantized: bool, *,
              world_size: int = 1, optimizer: str | None = None, device: str = "cuda",
              qlora_bf16_adapters: bool = False) -> MemoryEstimate:
    """`grpo_estimate` for a config of trainer grpo: prompts of up to seq_len tokens, grpo.max_completion_length
    completion tokens, per_device_batch completions per micro-batch, each rank generating its share of the
    generation batch (per_device x accumulation completions, kit.planning.grpo) in one call."""
    from kit.planning import grpo

    accumulation = grpo.accumulation(cfg, per_device_batch, world_size)
    est = grpo_estimate(model, cfg, precision, completions_per_device=per_device_batch, prompt_tokens=cfg.seq_len,
                        completion_tokens=cfg.grpo.max_completion_length, beta=cfg.grpo.beta,
                        gradient_checkpointing=gradient_checkpointing, quantized=quantized,
                        generated_per_device=per_device_batch * accumulation, world_size=world_size,
                        optimizer=optimizer, device=device, qlora_bf16_adapters=qlora_bf16_adapters)
    est.notes.insert(0, grpo.batch_words(cfg, per_device_batch, world_size))
    return est


def kv_cache_bytes(model, sequences: int, tokens: int, bp: int) -> int:
    """The generation KV cache: keys and values of every layer for `sequences` × `tokens` positions."""
    return int(2 * model.layers * model.kv_heads * model.head_dim * tokens * sequences * bp)


def grpo_estimate(model, cfg, precision: str, *, completions_per_device: int, prompt_tokens: int,
                  completion_tokens: int, beta: float, gradient_checkpointing: bool, quantized: bool,
                  generated_per_device: int | None = None, world_size: int = 1, optimizer: str | None = None, device: str = "cuda",
                  qlora_bf16_adapters: bool = False) -> MemoryEstimate:
    """Per-GPU memory of one GRPO step (TRL's GRPOTrainer, transformers generation), term by term.

    A GRPO step has two phases and its peak is the larger:
    - generation: the weights, adapters and optimizer states, plus the KV cache of the completions
      the rank generates at once (layers × 2 × KV heads × head dim × (prompt + completion) ×
      completions × bytes) and the sampling logits of one decoded token per completion (fp32).
      TRL generates a rank's share of a whole generation batch in one call: per_device_train_batch_size
      × steps_per_generation completions (the accumulation steps, unless set), and then trains on
      them a micro-batch at a time;
    - training: one forward/backward over the completions (prompt + completion tokens each), as
      `estimate` counts it with TRL's tiled log-prob head (TRL ≥ 1.15 scores completions through
      `fused_lm_head`, never holding the completion logits), under autocast.
    The reference model counts only where beta > 0, and then only without LoRA: under LoRA TRL
    scores the reference by disabling the adapter on the same weights, which costs one no-grad
    forward (smaller than the training pass), no second copy.

    Args:
        completions_per_device: Completions this rank generates and trains on per micro-batch
            (TRL's per_device_train_batch_size; num_generations of them share a prompt).
        prompt_tokens / completion_tokens: Longest prompt and max_completion_length.
        generated_per_device: Completions this rank generates in one call (None: completions_per_device).
        beta: TRL's KL coefficient.
        The rest as for `estimate`.
    """
    from dataclasses import replace

    bp = 2 if precision in ("bf16", "fp16") else 4
    seq = prompt_tokens + completion_tokens
    generated = generated_per_device or completions_per_device
    # The training pass is a supervised one over prompt + completion tokens (trainer "sft" in the estimate).
    train = estimate(model, replace(cfg, seq_len=seq, trainer="sft"), precision, completions_per_device,
                     gradient_checkpointing, quantized, world_size=world_size, optimizer=optimizer, device=device,
                     fused_lm_head=True, autocast=True, qlora_bf16_adapters=qlora_bf16_adapters)
    train_terms = {k: v for k, v in train.terms.items() if k not in ("allocator_slack", "cuda_context")}
    notes = list(train.notes)
    if beta > 0 and cfg.method == "full":
        train_terms["reference_weights"] = model.params * bp
        notes.append("beta > 0 without LoRA: a frozen reference copy of the model")
    elif beta > 0:
        notes.append("beta > 0 under LoRA: the reference is the base with the adapter disabled (no second copy)")
    persistent = {k: v for k, v in train_terms.items() if k.startswith(PERSISTENT_TERMS)}
    generation = {**persistent,
                  "kv_cache": kv_cache_bytes(model, generated, seq, bp),
                  "sampling_logits_fp32": generated * model.vocab * 4 * 2}
    if sum(generation.values()) > sum(train_terms.values()):
        terms = generation
        notes.append(f"generation is the peak: the KV cache of {generated} completions of {seq} tokens "
                     f"({_gib(generation['kv_cache'])}) outweighs the training pass")
    else:
        terms = train_terms
        notes.append(f"the training pass is the peak; the generation KV cache "
                     f"({_gib(generation['kv_cache'])}) is freed before it")
    return _estimate(terms, notes, device)


def _estimate(terms: dict, notes: list, device: str) -> MemoryEstimate:
    """The estimate of what `terms` allocate, with the allocator's slack and (on a GPU) the CUDA context."""
    allocated = int(sum(terms.values()))
    terms["allocator_slack"] = allocated * SLACK
    if device == "cuda":
        terms["cuda_context"] = CUDA_CONTEXT
    terms = {k: int(v) for k, v in terms.items()}
    return MemoryEstimate(terms=terms, total_bytes=sum(terms.values()), allocated_bytes=allocated, notes=notes)
