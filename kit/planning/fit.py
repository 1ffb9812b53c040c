"""What fits one GPU: the search behind the planner's strategy, micro-batch and checkpointing.

    fit(model, cfg, "fp16", quantized=True, optimizer="adamw_torch", n=2, budget=15 * GIB, loop=training_loop(facts))
    # -> ("ddp", 2, 8, True, MemoryEstimate) or None
    search(...)   # -> (that or None, the Reasons cheaper strategies were passed over for host RAM or FSDP's load)

Strategies are tried cheapest first (DDP, then FSDP, then device_map model parallelism), micro-
batches largest first, no gradient checkpointing before checkpointing; the first combination whose
estimate fits the budget wins. When none does, `cheaper_change` says what the user could change.
"""

from __future__ import annotations

import copy

from kit.planning import grpo, hostram, memory, trainers
from kit.planning.reasons import Reason, why
from kit.errors import UsageError
from kit.files import GIB

AUTO_BATCHES = (8, 4, 2, 1)
CHECKPOINTING_FROM_PARAMS = 1e9


def batch_for_world(cfg, per_device_batch: int, world_size: int) -> tuple[int, int, int]:
    """(per_device, grad_accum, global) keeping cfg.global_batch across world sizes.

    Trainer grpo follows its own rule (kit.planning.grpo: whole groups of num_generations
    completions per generation batch); every other trainer `_batch_for_world`'s.
    """
    if getattr(cfg, "trainer", "sft") == "grpo":
        if cfg.global_batch is None:
            return grpo.chosen_batch(cfg, per_device_batch, world_size)
        batch = _batch_for_world(cfg, per_device_batch, world_size)
        grpo.check_batch(cfg, batch[0], world_size, batch[1])
        return batch
    return _batch_for_world(cfg, per_device_batch, world_size)


def _batch_for_world(cfg, per_device_batch: int, world_size: int) -> tuple[int, int, int]:
    """(per_device, grad_accum, global) for every trainer but grpo.

    Without a global batch in the config, global = per_device × world. A micro-batch the planner
    picked shrinks to divide the global batch; one the config fixed must divide it.

    Raises:
        UsageError: global_batch is not a multiple of per_device × world_size.
    """
    if cfg.global_batch is None:
        return per_device_batch, 1, per_device_batch * world_size
    g = cfg.global_batch
    if g % world_size:
        raise UsageError(f"global_batch {g} is not a multiple of the {world_size} processes: pick a "
                         f"multiple of {world_size}")
    if cfg.per_device_batch is None:
        per_device_batch = max(b for b in range(1, per_device_batch + 1) if (g // world_size) % b == 0)
    if g % (per_device_batch * world_size):
        ranks = f"{world_size} process" + ("es" if world_size != 1 else "")
        raise UsageError(f"global_batch {g} is not a multiple of per_device_batch {per_device_batch} × {ranks} = "
                         f"{per_device_batch * world_size}: pick a global_batch that is, or leave per_device_batch null")
    return per_device_batch, g // (per_device_batch * world_size), g


def training_loop(facts) -> dict:
    """How the generated script trains, as memory.estimate's keywords: TRL's SFTTrainer under
    autocast, bf16 LoRA weights on a 4-bit base, and the tiled loss where its version has it."""
    return {"autocast": True, "qlora_bf16_adapters": True,
            "fused_lm_head": memory.fuses_lm_head((facts.packages or {}).get("trl"))}


def strategies(cfg, n: int, nodes: int = 1, device: str = "cuda") -> list[tuple]:
    """(strategy, processes, sharding) to try, cheapest first, as cfg.strategy allows.

    A replica per GPU (DDP) first: no communication but the gradients'. FSDP next: all-gathers
    every layer each step. The layer split last: one process, the GPUs take turns, one node only.

    Raises:
        UsageError: the config asks for a strategy this machine cannot express.
    """
    world = n * nodes
    replica = [("single", 1, "none")] if world == 1 else [("ddp", world, "none")]
    if not trainers.of(cfg).shards:
        return replica  # GRPO generates on each rank with a whole replica (trainers.check refuses the others)
    if cfg.strategy == "model_parallel":
        if nodes > 1:
            raise UsageError(f"strategy model_parallel runs in one process on one machine, not over {nodes} nodes: "
                             "use strategy=fsdp or strategy=auto")
        if device == "cpu":
            return [("model_parallel", 1, "layers")]  # refused by the CPU planner, with the reason
        if n < 2:
            raise UsageError("strategy model_parallel splits the layers over several GPUs, and this plan has one: "
                             "use strategy=auto")
        return [("model_parallel", 1, "layers")]
    if cfg.strategy == "fsdp":
        return [("fsdp", world, "fsdp")]
    if cfg.strategy == "ddp" or device == "cpu":
        return replica  # on a CPU every rank shares one RAM: sharding buys nothing
    if world == 1:
        return replica
    return replica + [("fsdp", world, "fsdp")] + ([("model_parallel", 1, "layers")] if nodes == 1 else [])


def fit(model, cfg, precision, quantized, optimizer, n, budget, device="cuda", loop=None,
        nodes=1, ram=None, speed=None):
    """First (strategy, world, per_device_batch, checkpointing, estimate) that fits, or None (`search`'s
    answer without the strategies it passed over)."""
    return search(model, cfg, precision, quantized, optimizer, n, budget, device, loop, nodes, ram, speed)[0]


def search(model, cfg, precision, quantized, optimizer, n, budget, device="cuda", loop=None,
           nodes=1, ram=None, speed=None) -> tuple[tuple | None, tuple[Reason, ...]]:
    """(the first (strategy, world, per_device_batch, checkpointing, estimate) that fits or None, the
    Reasons the cheaper strategies were passed over for something other than GPU memory in training:
    host RAM while loading, FSDP's 4-bit load peak; `passed_over_words` words them for a refusal).

    `ram`: host RAM per node for loading (None: not checked); `speed`: a function of (strategy,
    checkpointing) giving memory.estimate's keywords for the speed choices made for that candidate
    (batching, activation offloading), so each is estimated as it would run.
    """
    why = []
    if cfg.gradient_checkpointing != "auto":
        gcs = [cfg.gradient_checkpointing == "on"]
    else:
        gcs = [False, True] if model.params < CHECKPOINTING_FROM_PARAMS else [True]
    for strategy, world, sharding in strategies(cfg, n, nodes, device):
        if device == "cuda" and ram is not None:
            load = hostram.node_load_bytes(model, strategy, quantized, world // nodes if strategy != "model_parallel"
                                           else 1, full_method=cfg.method == "full")
            if load.total_bytes > ram:
                why.append(Reason("passed_over_host_ram", {"strategy": strategy, **load.figures(),
                                                           "ram_gib": ram / GIB}))
                continue
        if strategy == "fsdp" and quantized and device == "cuda":
            load = memory.fsdp_qlora_load_bytes(model, precision)
            if load > budget:
                why.append(Reason("passed_over_fsdp_load", {"strategy": "fsdp", "load_gib": load / GIB,
                                                            "budget_gib": budget / GIB}))
                continue
        smallest = trainers.of(cfg).min_batch  # KTO's KL term needs two rows in a micro-batch
        batches = [cfg.per_device_batch] if cfg.per_device_batch else [b for b in AUTO_BATCHES if b >= smallest]
        if cfg.global_batch is not None:
            batch_for_world(cfg, batches[0], world)  # raises UsageError when it cannot divide
            batches = [b for b in batches if cfg.global_batch % (b * world) == 0]
        for b in batches:
            for gc in gcs:
                run = {**(loop or {}), **(speed(strategy, gc) if speed else {})}
                est = memory.estimate(model, cfg, precision, b, gc, quantized,
                                      world_size=n if sharding == "layers" else world,
                                      sharding=sharding, optimizer=optimizer, device=device, **run)
                if est.total_bytes <= budget:
                    return (strategy, world, b, gc, est), tuple(why)
    return None, tuple(why)


def passed_over_words(reason: Reason) -> str:
    """Why a strategy was passed over (a Reason `fit` collected), in the words of a refusal and of the plan."""
    f = reason.figures
    if reason.code == "passed_over_fsdp_load":
        return (f"fsdp: each rank quantizes the whole 4-bit base on its GPU before sharding it (~{f['load_gib']:.1f} "
                f"GiB, more than the {f['budget_gib']:.1f} GiB of one GPU)")
    return (f"{f['strategy']}: loading needs ~{f['load_gib']:.1f} GiB of host RAM per node "
            f"({hostram.load_words(f)}), more than the {f['ram_gib']:.1f} GiB usable here")


def cheaper_change(model, cfg, precision, optimizer, n, budget, gpu_name, loop=None,
                   nodes=1, ram=None) -> str:
    """The cheapest change that would make the job fit, as a sentence.

    Changes, cheapest for the user first: gradient checkpointing (slower steps), micro-batch 1 (the
    global batch is kept by accumulation), LoRA instead of full, QLoRA, then shorter sequences.
    One change alone when one suffices; else the cheapest ones together, then shorter sequences.
    """
    options = []
    if cfg.gradient_checkpointing == "off":
        options.append(("gradient_checkpointing=on", {"gradient_checkpointing": "on"}))
    if cfg.per_device_batch and cfg.per_device_batch > 1 and trainers.of(cfg).min_batch == 1:
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
                        budget, loop=loop, nodes=nodes, ram=ram)
        except UsageError:
            return None
        if found is None:
            return None
        return (f"cheapest change that fits: {' and '.join(label for label, _ in changes)} (strategy {found[0]}, "
                f"micro-batch {found[2]}: estimated {found[4].total_bytes / GIB:.1f} GiB per GPU of "
                f"{budget / GIB:.1f} GiB)")

    if ram is not None:
        ram_only = _host_ram_change(model, cfg, precision, optimizer, n, budget, loop, nodes, ram)
        if ram_only:
            return ram_only
    candidates = [[option] for option in options] + [options[:k] for k in range(2, len(options) + 1)]
    seq = cfg.seq_len // 2
    while seq >= 128:
        candidates.append(options + [(f"seq_len={seq}", {"seq_len": seq})])
        seq //= 2
    for changes in candidates:
        found = attempt(changes)
        if found:
            return found
    bigger = _bigger_gpu(model, cfg, precision, optimizer, n, budget, loop, nodes, ram)
    if bigger:
        return bigger
    where = f"{nodes} nodes of {n}× {gpu_name}" if nodes > 1 else f"{n}× {gpu_name}"
    return (f"nothing kit can change fits {where} ({budget / GIB:.1f} GiB each): pick a GPU with more "
            "memory, more GPUs or nodes, or a smaller model")


def _host_ram_change(model, cfg, precision, optimizer, n, budget, loop, nodes, ram) -> str | None:
    """When the GPUs hold the job and only loading outgrows host RAM: fewer processes per node, as a sentence."""
    quantized = cfg.method == "qlora" or bool(model.prequantized)
    try:
        if fit(model, cfg, precision, quantized, optimizer, n, budget, loop=loop, nodes=nodes) is None:
            return None  # GPU memory is (also) what does not fit
        for fewer in range(n - 1, 0, -1):
            found = fit(model, cfg, precision, quantized, optimizer, fewer, budget, loop=loop, nodes=nodes, ram=ram)
            if found:
                return (f"the GPUs hold it, the host RAM while loading does not; cheapest change that fits: --nproc "
                        f"{fewer} (fewer processes load at once; strategy {found[0]}, micro-batch {found[2]}: "
                        f"estimated {found[4].total_bytes / GIB:.1f} GiB per GPU of {budget / GIB:.1f} GiB)")
    except UsageError:
        return None
    return (f"the GPUs hold it, the host RAM while loading does not ({ram / GIB:.1f} GiB usable): use a machine "
            "with more RAM")


def _bigger_gpu(model, cfg, precision, optimizer, n, budget, loop, nodes, ram) -> str | None:
    """The smallest GPU of kit's table with more memory on which the same config fits, as a sentence."""
    from kit.machine.gpu_table import GPUS

    quantized = cfg.method == "qlora" or bool(model.prequantized)
    for key, (name, vendor, _, total) in sorted(GPUS.items(), key=lambda item: item[1][3]):
        if vendor != "nvidia" or total <= budget:
            continue
        try:
            found = fit(model, cfg, precision, quantized, optimizer, n, total, loop=loop,
                        nodes=nodes, ram=ram)
        except UsageError:
            return None
        if found:
            return (f"cheapest change that fits: a machine with {n}× {key} ({name}, {total / GIB:.0f} GiB each; "
                    f"strategy {found[0]}, micro-batch {found[2]}: estimated {found[4].total_bytes / GIB:.1f} GiB "
                    "per GPU)")
    return None


def rank_budget(usable: list[dict]) -> tuple[int, Reason | None]:
    """The memory each rank may use: the smallest GPU's total, or its free memory when something holds a
    lot (then with the Reason)."""
    unknown = [g["index"] for g in usable if g.get("memory_total_bytes") is None]
    if unknown:
        raise UsageError(f"GPU {unknown[0]}'s memory could not be read (memory_total_bytes is null), and the plan "
                         "is sized by it: give the machine instead, e.g. --gpus 2xT4")
    budget = min(g["memory_total_bytes"] for g in usable)
    held = [g for g in usable if g.get("memory_free_bytes") is not None
            and g["memory_total_bytes"] - g["memory_free_bytes"] > GIB]
    if not held:
        return budget, None
    budget = min(budget, min(g["memory_free_bytes"] for g in held))
    used = max(g["memory_total_bytes"] - g["memory_free_bytes"] for g in held)
    return budget, why("gpu_memory_held", gpu=held[0]["index"], used_gib=used / GIB, budget_gib=budget / GIB)
