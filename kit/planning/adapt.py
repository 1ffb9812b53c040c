"""The plan, adapted at launch to the device and world size this rank actually got.

    launch_plan = adapt(PLAN, cfg, RankFacts.of(ctx))   # pure, apart from RankFacts.of reading torch

The plan written into `train_ddp.py` was made by `kit.planning.plan` for the machine `kit render`
looked at. The same script must also run unchanged on a CPU laptop, on another GPU or with a
different number of processes, so what depends on those is settled again here with the
planner's own rules (`kit.planning.precision`, `kit.planning.fit.batch_for_world`); everything
else the plan chose is kept. Every change is a note the script prints.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import asdict, dataclass, field

from kit.errors import CannotTrain, UsageError
from kit.planning import precision as precision_rule
from kit.planning import speed, trainers
from kit.planning.fit import batch_for_world


@dataclass(frozen=True)
class RankFacts:
    """What this rank runs on, as plain data (so `adapt` is a pure function, tested without GPUs)."""

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


@dataclass
class LaunchPlan:
    precision: str               # bf16 | fp16 | fp32
    per_device_batch: int
    grad_accum: int
    global_batch: int
    gradient_checkpointing: bool
    backend: str                 # transformers | unsloth
    optimizer: str
    notes: list
    batching: str = "padded"     # padded | grouped | padding_free | packed
    kernels: str = "none"        # liger | none
    activation_offloading: bool = False  # TRL moves what autograd saves to pinned CPU memory
    compile_layers: bool = False  # torch.compile of each decoder layer (kit.train.modeling.compile_layers)
    strategy: str = "ddp"        # single | ddp | fsdp | model_parallel (see kit.train.sharding)
    quantization: str | None = None  # "nf4" for a 4-bit base
    reference: str | None = None  # dpo/kto: adapter_disabled | precomputed | model_copy (kit.planning.trainers)

    @property
    def packed_as_rows(self) -> bool:
        """Packed sequences batched as rows, each with its own block-diagonal mask (kit.train.collate)."""
        return self.batching == "packed" and self.backend == "transformers"

    @property
    def padding_free(self) -> bool:
        """Whether TRL lays a micro-batch's rows end to end as one sequence (Unsloth's packed batches too)."""
        return self.batching == "padding_free" or (self.batching == "packed" and not self.packed_as_rows)

    def to_dict(self) -> dict:
        return asdict(self)


def settle_batching(plan: LaunchPlan, cfg, mean_tokens: float) -> list[str]:
    """Padding-free batches only where the data's rows are short, packed ones where accumulation can
    fold (kit.planning.speed.settle_batching); the notes. `fold_batch` follows a "packed"."""
    notes: list[str] = []
    plan.batching = speed.settle_batching(cfg, plan.batching, mean_tokens, cfg.seq_len, notes,
                                          grad_accum=plan.grad_accum, backend=plan.backend)
    return notes


def fold_batch(plan: LaunchPlan, cfg, mean_tokens: float, rows_per_sequence: float) -> str | None:
    """After "auto" chose packing: fewer micro-batches of packed sequences, so an optimizer step
    trains on about the rows it would have unpacked (kit.planning.speed.folded_batch). The note,
    or None (and padding-free batches again) where no fold keeps the rows per step."""
    world = plan.global_batch // (plan.per_device_batch * plan.grad_accum)
    folded = speed.folded_batch(plan.per_device_batch, plan.grad_accum, world, rows_per_sequence)
    if folded is None:
        plan.batching = "padding_free"
        return None
    per_device, accum = folded
    note = speed.fold_words(mean_tokens, cfg.seq_len, rows_per_sequence, (plan.per_device_batch, plan.grad_accum),
                            folded, plan.global_batch, per_device * accum * world * rows_per_sequence)
    plan.per_device_batch, plan.grad_accum, plan.global_batch = per_device, accum, per_device * accum * world
    return note


def settle_compile(plan: LaunchPlan, cfg, steps_left: int) -> list[str]:
    """With the job's length in hand: "auto" runs a job too short to repay compiling (`steps_left`
    optimizer steps of grad_accum micro-batches each) eagerly (kit.planning.speed.compile_unpaid); the notes."""
    why = speed.compile_unpaid(cfg, steps_left * plan.grad_accum) if plan.compile_layers else None
    if why is None:
        return []
    plan.compile_layers = False
    return [f"compile off: {why}; compile=on compiles anyway"]


def sampler_args(plan) -> dict:
    """SFTConfig arguments for length-grouped batches, in the spelling of the installed transformers.

    transformers 5.2x replaced `group_by_length=True` with `train_sampling_strategy="group_by_length"`;
    older 5.x releases (5.17 on the H200 that measured this) know only the first.
    """
    if plan.batching != "grouped":
        return {}
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}


def adapt(planned: dict, cfg, rank: RankFacts) -> LaunchPlan:
    """The rendered plan (`planned`, a `Plan.to_dict()`), settled for this rank's device and world size."""
    notes: list[str] = [planned["replanned"]] if planned.get("replanned") else []
    if cfg.max_steps and cfg.warmup_steps > cfg.max_steps:  # said, not refused: a 2-step trial run is fine
        notes.append(f"warning: warmup_steps={cfg.warmup_steps} is more than max_steps={cfg.max_steps}: the learning "
                     f"rate never reaches learning_rate={cfg.learning_rate:g}; lower warmup_steps for a real run")
    cuda = rank.device == "cuda"
    if cfg.method == "qlora" and not cuda:
        raise CannotTrain("method=qlora needs a CUDA GPU (bitsandbytes 4-bit); on the CPU use method=lora")
    precision, _ = precision_rule.choose(cfg.precision, rank.device, rank.vendor, rank.capability, rank.name)
    planned_precision = planned.get("precision", "auto")
    if cfg.precision == "auto" and cuda and planned_precision not in (precision, "fp32"):
        notes.append(f"precision {precision} on this GPU (the rendered plan said {planned_precision})")
    # Keep the global batch the plan was made for, whatever the number of processes now.
    wanted = dataclasses.replace(cfg, global_batch=cfg.global_batch or planned.get("global_batch"))
    per_device, accum, global_batch = batch_for_world(
        wanted, cfg.per_device_batch or planned["per_device_batch"], rank.world_size)
    trainers.check(cfg)  # an override the trainer cannot run (batching=packed for dpo…): one line, exit 2
    trainers.one_process_precompute(cfg, rank.world_size)
    backend = planned.get("backend", "transformers") if cfg.backend == "auto" else cfg.backend
    backend = trainers.backend(cfg, backend, notes)  # kto: the plain stack (trainers.UNSLOTH_TRAINERS)
    if backend == "unsloth" and (not cuda or "unsloth" not in rank.installed):
        if cfg.backend == "unsloth":
            raise CannotTrain("backend=unsloth was asked for, but Unsloth is not installed or there is no CUDA GPU")
        notes.append("Unsloth is not available here: using the transformers backend")
        backend = "transformers"
    optimizer = (planned.get("optimizer") or "adamw_torch") if cfg.optimizer == "auto" else cfg.optimizer
    if optimizer.endswith("8bit") and not cuda:
        notes.append(f"optimizer {optimizer} needs a GPU: using adamw_torch")
        optimizer = "adamw_torch"
    if optimizer == "adamw_torch_fused" and not cuda:
        notes.append("optimizer adamw_torch_fused is planned for a GPU: using adamw_torch on the CPU")
        optimizer = "adamw_torch"
    if cfg.gradient_checkpointing == "auto":
        checkpointing = bool(planned.get("gradient_checkpointing", False))
    else:
        checkpointing = cfg.gradient_checkpointing == "on"
    batching = planned.get("batching", "padded") if cfg.batching == "auto" else cfg.batching
    if batching == "auto":
        batching = "padded"
    kernels = _kernels(cfg, rank, planned.get("kernels", "none"), backend, notes)
    strategy = _strategy(rank, cfg, planned, notes)
    quantization = "nf4" if cfg.method == "qlora" else planned.get("quantization")
    offloading = _offloading(cfg, rank, bool(planned.get("activation_offloading")), backend, notes)
    compiled = _compiled(cfg, rank, bool(planned.get("compile_layers")), backend, strategy, notes)
    return LaunchPlan(precision, per_device, accum, global_batch, checkpointing, backend, optimizer, notes,
                      batching=batching, kernels=kernels, strategy=strategy, quantization=quantization,
                      activation_offloading=offloading, compile_layers=compiled,
                      reference=trainers.reference(cfg)[0])


def plan_for(ctx, cfg, planned: dict) -> LaunchPlan:
    """`adapt` for the rank `ctx` describes: what the script calls."""
    return adapt(planned, cfg, RankFacts.of(ctx))


def _strategy(rank: RankFacts, cfg, planned: dict, notes: list) -> str:
    """The rendered strategy, or the config's when it names one; model parallel never under torchrun."""
    strategy = cfg.strategy if cfg.strategy != "auto" else planned.get("strategy", "ddp")
    if strategy == "model_parallel":
        if rank.world_size > 1:
            raise UsageError(f"strategy model_parallel runs as one process that spreads the layers over the GPUs, "
                             f"but this is rank {rank.rank} of {rank.world_size}: launch it with python train_ddp.py, "
                             "not torchrun")
        if rank.device != "cuda":
            raise CannotTrain("strategy model_parallel spreads the layers over GPUs, and this machine has none: "
                              "use strategy=auto")
    if strategy == "fsdp" and rank.world_size == 1 and (rank.device == "cpu" or not rank.under_torchrun):
        # Trainer runs FSDP only in a process group; one process alone shards nothing anyway.
        notes.append("one process without torchrun (or on the CPU): training without FSDP sharding; start it with "
                     "torchrun --standalone --nproc_per_node=N train_ddp.py to shard")
        strategy = "single"
    if strategy in ("single", "ddp") and rank.world_size > 1:
        strategy = "ddp"
    return strategy


def _offloading(cfg, rank: RankFacts, planned: bool, backend: str, notes: list) -> bool:
    """TRL's activation offloading where it can run: a CUDA device (pinned host memory, a side
    stream), the plain backend (Unsloth offloads its own way)."""
    wanted = planned if cfg.activation_offloading == "auto" else cfg.activation_offloading == "on"
    why = (None if not wanted else "this rank runs on the CPU" if rank.device != "cuda" else
           "Unsloth offloads checkpointed activations its own way" if backend == "unsloth" else None)
    if why is not None:
        notes.append(f"activation offloading off: {why}")
    return wanted and why is None


def _compiled(cfg, rank: RankFacts, planned: bool, backend: str, strategy: str, notes: list) -> bool:
    """torch.compile of the decoder layers where it was measured: a CUDA device, the plain backend,
    one replica per GPU (kit.planning.speed.compile_layers)."""
    wanted = planned if cfg.compile == "auto" else cfg.compile == "on"
    why = (None if not wanted else "this rank runs on the CPU" if rank.device != "cuda" else
           speed.compile_blocked(backend, strategy))
    if why is not None:
        notes.append(f"compile off: {why}")
    return wanted and why is None


def _kernels(cfg, rank: RankFacts, planned: str, backend: str, notes: list) -> str:
    """Liger's kernels where they can run: a CUDA device, liger-kernel installed, the plain backend."""
    wanted = planned if cfg.kernels == "auto" else cfg.kernels
    if wanted != "liger":
        return "none"
    why = ("this rank runs on the CPU" if rank.device != "cuda" else
           "Unsloth brings its own kernels" if backend == "unsloth" else
           "liger-kernel is not installed" if "liger_kernel" not in rank.installed else None)
    if why is None:
        return "liger"
    if cfg.kernels == "liger" and backend != "unsloth":
        raise CannotTrain(f"kernels=liger was asked for, but {why}: `pip install liger-kernel` on a CUDA GPU, "
                          "or set kernels=none")
    notes.append(f"Liger kernels off: {why}")
    return "none"


