"""What fits one GPU: the search behind the planner's strategy, micro-batch and checkpointing.

    fit(model, cfg, "fp16", quantized=True, optimizer="adamw_torch", n=2, budget=15 * GIB, loop=training_loop(facts))
    # -> ("ddp", 2, 8, True, MemoryEstimate) or None

Strategies are tried cheapest first (DDP, then FSDP, then device_map model parallelism), micro-
batches largest first, no gradient checkpointing before checkpointing; the first combination whose
estimate fits the budget wins. When none does, `cheaper_change` says what the user could change.
"""

from __future__ import annotations

import copy

from kit import memory
from kit.errors import UsageError

GIB = 2**30
AUTO_BATCHES = (8, 4, 2, 1)
CHECKPOINTING_FROM_PARAMS = 1e9


def batch_for_world(cfg, per_device_batch: int, world_size: int) -> tuple[int, int, int]:
    """(per_device, grad_accum, global) keeping cfg.global_batch across world sizes.

    Without a global batch in the config, global = per_device × world. A micro-batch the planner
    picked shrinks to divide the global batch; one the config fixed must divide it.

    Raises:
        UsageError: global_batch is not a multiple of per_device × world_size.
    """
    if cfg.global_batch is None:
        return per_device_batch, 1, per_device_batch * world_size
    g = cfg.global_batch
    if g % world_size:
        raise UsageError(f"global_batch {g} is not a multiple of the {world_size} GPU(s)/processes: pick a "
                         f"multiple of {world_size}")
    if cfg.per_device_batch is None:
        per_device_batch = max(b for b in range(1, per_device_batch + 1) if (g // world_size) % b == 0)
    if g % (per_device_batch * world_size):
        raise UsageError(f"global_batch {g} is not a multiple of per_device_batch {per_device_batch} × "
                         f"{world_size} GPU(s) = {per_device_batch * world_size}: pick a global_batch that is, "
                         "or leave per_device_batch null")
    return per_device_batch, g // (per_device_batch * world_size), g


def training_loop(facts) -> dict:
    """How the generated script trains, as memory.estimate's keywords: TRL's SFTTrainer under
    autocast, bf16 LoRA weights on a 4-bit base, and the tiled loss where its version has it."""
    return {"autocast": True, "qlora_bf16_adapters": True,
            "fused_lm_head": memory.fuses_lm_head((facts.packages or {}).get("trl"))}


def fit(model, cfg, precision, quantized, optimizer, n, budget, device="cuda", loop=None, replica_only=False):
    """First (strategy, world, per_device_batch, checkpointing, estimate) that fits, or None."""
    if n == 1:
        strategies = [("single", 1, "none")]
    elif device == "cpu":  # gloo DDP only: sharding buys nothing when every rank shares the same RAM
        strategies = [("ddp", n, "none")]
    else:
        strategies = [("ddp", n, "none")] + ([] if replica_only else [("fsdp", n, "fsdp"), ("model_parallel", 1, "layers")])
    if cfg.gradient_checkpointing != "auto":
        gcs = [cfg.gradient_checkpointing == "on"]
    else:
        gcs = [False, True] if model.params < CHECKPOINTING_FROM_PARAMS else [True]
    for strategy, world, sharding in strategies:
        batches = [cfg.per_device_batch] if cfg.per_device_batch else list(AUTO_BATCHES)
        if cfg.global_batch is not None:
            batch_for_world(cfg, batches[0], world)  # raises UsageError when it cannot divide
            batches = [b for b in batches if cfg.global_batch % (b * world) == 0]
        for b in batches:
            for gc in gcs:
                est = memory.estimate(model, cfg, precision, b, gc, quantized, world_size=n,
                                      sharding=sharding, optimizer=optimizer, device=device, **(loop or {}))
                if est.total_bytes <= budget:
                    return strategy, world, b, gc, est
    return None


def cheaper_change(model, cfg, precision, optimizer, n, budget, gpu_name, loop=None, replica_only=False) -> str:
    """The cheapest change that would make the job fit, as a sentence.

    Changes, cheapest for the user first: gradient checkpointing (slower steps), micro-batch 1 (the
    global batch is kept by accumulation), LoRA instead of full, QLoRA, then shorter sequences.
    One change alone when one suffices; else the cheapest ones together, then shorter sequences.
    """
    options = []
    if cfg.gradient_checkpointing == "off":
        options.append(("gradient_checkpointing=on", {"gradient_checkpointing": "on"}))
    if cfg.per_device_batch and cfg.per_device_batch > 1:
        options.append(("per_device_batch=1 (keep the global batch with accumulation)", {"per_device_batch": 1}))
    if cfg.method == "full":
        options.append(("method=lora", {"method": "lora"}))
    if cfg.method != "qlora" and not model.prequantized:
        options.append(("method=qlora", {"method": "qlora"}))

    def attempt(changes):
        trial = copy.deepcopy(cfg)
        for _, change in changes:
            for k, val in change.items():
                setattr(trial, k, val)
        try:
            found = fit(model, trial, precision, trial.method == "qlora" or bool(model.prequantized), optimizer, n,
                        budget, loop=loop, replica_only=replica_only)
        except UsageError:
            return None
        if found is None:
            return None
        return (f"cheapest change that fits: {' and '.join(label for label, _ in changes)} (strategy {found[0]}, "
                f"micro-batch {found[2]}: estimated {found[4].total_bytes / GIB:.1f} GiB per GPU of "
                f"{budget / GIB:.1f} GiB)")

    candidates = [[option] for option in options] + [options[:k] for k in range(2, len(options) + 1)]
    seq = cfg.seq_len // 2
    while seq >= 128:
        candidates.append(options + [(f"seq_len={seq}", {"seq_len": seq})])
        seq //= 2
    for changes in candidates:
        found = attempt(changes)
        if found:
            return found
    return (f"nothing kit can change fits {n}× {gpu_name} ({budget / GIB:.1f} GiB each): pick a GPU with more "
            "memory, more GPUs, or a smaller model")
