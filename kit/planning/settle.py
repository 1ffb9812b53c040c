"""The plan settled for what only the running script knows: pure functions of (Plan, facts) → (Plan, notes).

    plan, notes = for_rank(plan, cfg, RankFacts.of(ctx))      # the device, world size, what is installed
    plan, notes = for_data(plan, cfg, RowStats(mean_tokens))  # the rows' lengths → batching, folding
    plan, notes = for_steps(plan, cfg, steps_left)            # the job's length → compiled layers

The plan written into `train_ddp.py` was made by `kit.planning.plan.make_plan` for the machine
`kit render` looked at. The same script must also run unchanged on a CPU laptop, on another GPU or
with a different number of processes, and it learns the data and the job's length only when it
runs; what depends on those is settled here with the planner's own rules (`kit.planning.precision`,
`kit.planning.device_rules`, `kit.planning.fit.batch_for_world`, `kit.planning.speed`). Each
function returns a new Plan (plans are frozen) and a note for every change, each a Reason
(`kit.planning.reasons`; the script words them with `kit.report.reasons.words` where it prints
them); everything else the plan chose is kept.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field, replace

from kit.errors import CannotTrain, UsageError
from kit.planning import device_rules, speed, trainers
from kit.planning import precision as precision_rule
from kit.planning.fit import batch_for_world
from kit.planning.plan import Plan
from kit.planning.reasons import Reason, why

__all__ = ["RankFacts", "RowStats", "for_data", "for_rank", "for_steps", "may_pack"]


@dataclass(frozen=True)
class RankFacts:
    """What this rank runs on, as plain data (so `for_rank` is a pure function, tested without GPUs)."""

    device: str                      # cuda | cpu
    rank: int = 0
    world_size: int = 1
    vendor: str | None = None        # nvidia | amd
    capability: str | None = None    # "7.5", or a ROCm arch such as "gfx90a"
    name: str = ""
    under_torchrun: bool = False     # LOCAL_RANK is set
    installed: frozenset = field(default_factory=frozenset)  # of "unsloth", "liger_kernel"

    @classmethod
    def of(cls, ctx) -> "RankFacts":
        """The facts of the rank `ctx` (a `kit.train.dist.Context`) describes."""
        installed = frozenset(m for m in ("unsloth", "liger_kernel") if importlib.util.find_spec(m) is not None)
        common = dict(rank=ctx.rank, world_size=ctx.world_size, under_torchrun="LOCAL_RANK" in os.environ,
                      installed=installed)
        if ctx.device.type != "cuda":
            return cls("cpu", **common)
        import torch

        props = torch.cuda.get_device_properties(ctx.device)
        if torch.version.hip:
            vendor, capability = "amd", props.gcnArchName
        else:
            vendor, capability = "nvidia", f"{props.major}.{props.minor}"
        return cls("cuda", vendor=vendor, capability=capability, name=props.name, **common)


@dataclass(frozen=True)
class RowStats:
    """The training rows as the batching rules read them: their mean length in tokens, and how many
    of them a packed sequence holds (None where they were not packed to see)."""

    mean_tokens: float
    rows_per_sequence: float | None = None


def for_rank(plan: Plan, cfg, rank: RankFacts) -> tuple[Plan, list[Reason]]:
    """`plan` settled for this rank's device, world size and installed packages, with the config's
    `key=value` overrides on top; the notes of what changed.

    Raises:
        CannotTrain: the config asks for what this device cannot run (a 4-bit base on the CPU, bf16 on a T4…).
        UsageError: the batch does not divide over these processes, model parallel under torchrun…
    """
    notes: list[Reason] = []
    if cfg.max_steps and cfg.warmup_steps > cfg.max_steps:  # said, not refused: a 2-step trial run is fine
        notes.append(why("warmup_over_max_steps", warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps,
                         learning_rate=cfg.learning_rate))
    cuda = rank.device == "cuda"
    quantization = "nf4" if cfg.method == "qlora" or plan.prequantized else None
    if not cuda and quantization:
        raise CannotTrain(device_rules.no_gpu_refusal(cfg, quantized=True))
    said = set()  # the fields whose change a note below explains
    precision, _ = precision_rule.choose(cfg.precision, rank.device, rank.vendor, rank.capability, rank.name)
    if cfg.precision == "auto" and cuda and plan.precision not in (precision, "fp32"):
        notes.append(why("precision_settled", precision=precision, planned=plan.precision))
        said.add("precision")
    # Keep the global batch the plan was made for, whatever the number of processes now.
    wanted = dataclasses.replace(cfg, global_batch=cfg.global_batch or plan.global_batch)
    per_device, accum, global_batch = batch_for_world(wanted, cfg.per_device_batch or plan.per_device_batch,
                                                      rank.world_size)
    trainers.check(cfg)  # an override the trainer cannot run (batching=packed for dpo…): one line, exit 2
    trainers.one_process_precompute(cfg, rank.world_size)

    def note(field_name: str, reason: Reason | None) -> None:
        if reason is not None:
            notes.append(reason)
            said.add(field_name)

    backend, trainer_said = trainers.backend(cfg, plan.backend if cfg.backend == "auto" else cfg.backend)  # kto: plain
    note("backend", trainer_said)
    missing = device_rules.unsloth_missing(rank.device, rank.installed) if backend == "unsloth" else None
    if missing:
        if cfg.backend == "unsloth":
            raise CannotTrain(device_rules.unsloth_refusal(rank.device, rank.installed))
        note("backend", why("unsloth_unavailable", because=missing))
        backend = "transformers"
    optimizer = plan.optimizer if cfg.optimizer == "auto" else cfg.optimizer
    if not cuda:
        optimizer, swapped = device_rules.cpu_optimizer(optimizer)
        note("optimizer", swapped)
    if cfg.gradient_checkpointing == "auto":
        checkpointing = plan.gradient_checkpointing
    else:
        checkpointing = cfg.gradient_checkpointing == "on"
    batching = plan.batching if cfg.batching == "auto" else cfg.batching
    kernels, kernels_said = _kernels(cfg, rank, plan.kernels, backend)
    note("kernels", kernels_said)
    strategy, strategy_said = _strategy(rank, cfg, plan.strategy)
    note("strategy", strategy_said)
    offloading, offloading_said = _offloading(cfg, rank, plan.activation_offloading, backend)
    note("activation_offloading", offloading_said)
    compiled, compile_said = _compiled(cfg, rank, plan.compile_layers, backend, strategy)
    note("compile_layers", compile_said)
    settled = replace(plan, precision=precision, per_device_batch=per_device, grad_accum=accum,
                      global_batch=global_batch, gradient_checkpointing=checkpointing, backend=backend,
                      optimizer=optimizer, batching=batching, kernels=kernels, strategy=strategy,
                      quantization=quantization, activation_offloading=offloading, compile_layers=compiled,
                      reference=trainers.reference(cfg)[0])
    return settled, notes + _unsaid(plan, settled, cfg, rank, said)


# The fields `for_rank` settles (the reference follows the config alone: kit.planning.trainers.reference).
SETTLED = ("precision", "strategy", "per_device_batch", "grad_accum", "global_batch", "gradient_checkpointing",
           "backend", "optimizer", "batching", "kernels", "quantization", "activation_offloading", "compile_layers")


def _unsaid(plan: Plan, settled: Plan, cfg, rank: RankFacts, said: set) -> list[Reason]:
    """One note for the changes no rule above explained: what the command line set, and what the
    device or the number of processes made of the rendered plan."""
    changed = [f for f in SETTLED if f not in said and getattr(plan, f) != getattr(settled, f)]
    if not changed:
        return []
    figures = {"world_size": rank.world_size, "device": rank.device, "gpu": rank.name, "changed": ",".join(changed)}
    for f in changed:
        figures[f"{f}_was"], figures[f"{f}_now"] = getattr(plan, f), getattr(settled, f)
    return [Reason("plan_settled", figures)]


def may_pack(plan: Plan, cfg, mean_tokens: float) -> bool:
    """Whether `for_data` may choose packing for rows of this mean length: then it needs the rows
    packed to see how many a sequence holds (`RowStats.rows_per_sequence`)."""
    return plan.batching != "packed" and speed.settle_batching(
        cfg, plan.batching, mean_tokens, cfg.seq_len, grad_accum=plan.grad_accum, backend=plan.backend)[0] == "packed"


def for_data(plan: Plan, cfg, rows: RowStats) -> tuple[Plan, list[Reason]]:
    """`plan` settled for the training rows: padding-free batches only where the rows are short,
    packed ones where gradient accumulation can fold (kit.planning.speed.settle_batching), with fewer
    micro-batches of packed sequences, so an optimizer step trains on about the rows it would have
    unpacked (kit.planning.speed.folded_batch); the notes. Where no fold keeps the rows per step (or
    the rows were not packed to see), the batches stay padding-free."""
    batching, said = speed.settle_batching(cfg, plan.batching, rows.mean_tokens, cfg.seq_len,
                                           grad_accum=plan.grad_accum, backend=plan.backend)
    notes = [said] if said else []
    if batching != "packed" or plan.batching == "packed":
        return replace(plan, batching=batching), notes
    world = plan.global_batch // (plan.per_device_batch * plan.grad_accum)
    folded = (speed.folded_batch(plan.per_device_batch, plan.grad_accum, world, rows.rows_per_sequence)
              if rows.rows_per_sequence else None)
    if folded is None:
        return plan, notes
    per_device, accum = folded
    notes.append(speed.fold_reason(rows.mean_tokens, cfg.seq_len, rows.rows_per_sequence,
                                  (plan.per_device_batch, plan.grad_accum), folded, plan.global_batch,
                                  per_device * accum * world * rows.rows_per_sequence))
    return replace(plan, batching="packed", per_device_batch=per_device, grad_accum=accum,
                   global_batch=per_device * accum * world), notes


def for_steps(plan: Plan, cfg, steps_left: int) -> tuple[Plan, list[Reason]]:
    """`plan` settled for the job's length: "auto" runs a job too short to repay compiling
    (`steps_left` optimizer steps of grad_accum micro-batches each) eagerly
    (kit.planning.speed.compile_unpaid); the notes."""
    unpaid = speed.compile_unpaid(cfg, steps_left * plan.grad_accum) if plan.compile_layers else None
    if unpaid is None:
        return plan, []
    return replace(plan, compile_layers=False), [unpaid]


def _strategy(rank: RankFacts, cfg, planned: str) -> tuple[str, Reason | None]:
    """The rendered strategy, or the config's when it names one; model parallel never under torchrun."""
    strategy = cfg.strategy if cfg.strategy != "auto" else planned
    if strategy == "model_parallel":
        if rank.world_size > 1:
            raise UsageError(f"strategy model_parallel runs as one process that spreads the layers over the GPUs, "
                             f"but this is rank {rank.rank} of {rank.world_size}: launch it with python train_ddp.py, "
                             "not torchrun")
        if rank.device != "cuda":
            raise CannotTrain(device_rules.MODEL_PARALLEL_WITHOUT_GPU)
    if strategy == "fsdp" and rank.world_size == 1 and (rank.device == "cpu" or not rank.under_torchrun):
        # Trainer runs FSDP only in a process group; one process alone shards nothing anyway.
        return "single", why("fsdp_one_process")
    if strategy in ("single", "ddp", "none") and rank.world_size > 1:
        strategy = "ddp"
    return ("single" if strategy == "none" else strategy), None


def _offloading(cfg, rank: RankFacts, planned: bool, backend: str) -> tuple[bool, Reason | None]:
    """TRL's activation offloading where it can run: a CUDA device (pinned host memory, a side
    stream), the plain backend (Unsloth offloads its own way)."""
    wanted = planned if cfg.activation_offloading == "auto" else cfg.activation_offloading == "on"
    off = (None if not wanted else "cpu" if rank.device != "cuda" else "unsloth" if backend == "unsloth" else None)
    return wanted and off is None, why("offloading_off_here", because=off) if off is not None else None


def _compiled(cfg, rank: RankFacts, planned: bool, backend: str, strategy: str) -> tuple[bool, Reason | None]:
    """torch.compile of the decoder layers where it was measured: a CUDA device, the plain backend,
    one replica per GPU (kit.planning.speed.compile_layers)."""
    wanted = planned if cfg.compile == "auto" else cfg.compile == "on"
    off = None if not wanted else "cpu" if rank.device != "cuda" else speed.compile_blocked(backend, strategy)
    return wanted and off is None, why("compile_off_here", because=off, strategy=strategy) if off is not None else None


def _kernels(cfg, rank: RankFacts, planned: str, backend: str) -> tuple[str, Reason | None]:
    """Liger's kernels where they can run: a CUDA device, liger-kernel installed, the plain backend."""
    wanted = planned if cfg.kernels == "auto" else cfg.kernels
    if wanted != "liger":
        return "none", None
    off = ("cpu" if rank.device != "cuda" else "unsloth" if backend == "unsloth" else
           "not_installed" if "liger_kernel" not in rank.installed else None)
    if off is None:
        return "liger", None
    if cfg.kernels == "liger" and backend != "unsloth":
        because = "this rank runs on the CPU" if off == "cpu" else "liger-kernel is not installed"
        raise CannotTrain(f"kernels=liger was asked for, but {because}: `pip install liger-kernel` on a CUDA GPU, "
                          "or set kernels=none")
    return "none", why("kernels_off_here", because=off)
