"""The planner's sentences: why this strategy, this checkpointing, this batch, this much host RAM.

Words only; every number in them was decided by `kit.planning.plan`.
"""

from __future__ import annotations

from kit.planning import hostram, memory
from kit.planning.fit import CHECKPOINTING_FROM_PARAMS
from kit.planning.memory import GIB


def things(n: int, one: str, many: str | None = None) -> str:
    """`things(1, "process", "processes")` → "1 process"; `things(8, "GPU")` → "8 GPUs"."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params:,}"


def host_words(model, strategy, quantized, ranks, cfg, ram, nodes: int = 1) -> str:
    load = hostram.node_load_bytes(model, strategy, quantized, ranks if strategy != "model_parallel" else 1,
                                   full_method=cfg.method == "full")
    have = (f"{ram / GIB:.1f} GiB usable" if ram else
            "the machine's RAM is not known, so this was not checked: make sure it has that much")
    where = " per node" if nodes > 1 else ""
    return f"host RAM while loading: ~{load.total_bytes / GIB:.1f} GiB{where} ({load.words}; {have})."


def strategy_reasons(strategy, n, gpu_name, est, budget, model, cfg, gc, quantized, plan, why=()) -> list[str]:
    """Why this strategy; `why`: the cheaper strategies passed over for something other than GPU memory
    in training (host RAM while loading, FSDP's 4-bit load peak)."""
    need = f"estimated {est.total_bytes / GIB:.1f} GiB per GPU of {budget / GIB:.1f} GiB"
    nodes = getattr(plan, "nodes", 1)
    over = (f"{things(n, 'GPU')} ({nodes} nodes × {n // nodes}× {gpu_name})" if nodes > 1 else f"{n}× {gpu_name}")
    passed = {w.split(":")[0] for w in why}
    replica = "a replica per GPU was passed over (above)" if "ddp" in passed else "a full replica does not fit one GPU"
    sharded = "FSDP was passed over (above)" if "fsdp" in passed else "FSDP does not fit"
    split = "as configured" if cfg.strategy == "model_parallel" else \
        f"{replica} and {sharded}, only the layers spread over the GPUs fit"
    out = {"single": f"single device: one {gpu_name}; {need}.",
           "ddp": f"DDP over {over}: one replica fits each GPU ({need}); each rank trains on its "
                  f"own share of the batches, so {n} GPUs give about {n}× the throughput.",
           "fsdp": (f"FSDP over {over} as configured ({need})." if cfg.strategy == "fsdp" else
                    f"FSDP over {over}: {replica}, sharded {n} ways it fits ({need})."),
           "model_parallel": f"model parallel (device_map) over {n}× {gpu_name}: {split} "
                             f"({need}): about {model.layers // max(n, 1)} of "
                             f"the {model.layers} layers on each GPU (device_map=\"auto\" balances them by size); "
                             "one process, the GPUs run one after another, so it is no speed-up; launched with "
                             "python, never torchrun."}[strategy]
    reasons = [out]
    if strategy == "fsdp" and quantized:
        reasons.append(f"QLoRA under FSDP: the 4-bit weights are stored as {plan.precision} "
                       "(bnb_4bit_quant_storage) so FSDP2 can shard them; each rank quantizes the whole base on its GPU "
                       f"while loading (~{memory.fsdp_qlora_load_bytes(model, plan.precision) / GIB:.1f} GiB) "
                       "before sharding it.")
    elif strategy == "fsdp":
        reasons.append("FSDP with a 16-bit base: the weights load on the CPU, one rank per node reads them and "
                       "the others receive their shards; no GPU holds a full replica.")
    why_gc = ("set in the config" if cfg.gradient_checkpointing != "auto" else
              f"the model has {model.params / 1e9:.1f}B ≥ 1B parameters" if model.params >= CHECKPOINTING_FROM_PARAMS
              else "needed to fit" if gc else f"the model is small ({count(model.params)} parameters)")
    reasons.append(f"gradient checkpointing {'on' if gc else 'off'}: {why_gc}.")
    b = "as configured" if cfg.per_device_batch else "the largest power of two ≤ 8 that fits"
    reasons.append(f"micro-batch {plan.per_device_batch} ({b}), {things(plan.grad_accum, 'accumulation step')}, "
                   f"global batch {plan.global_batch}.")
    return reasons
