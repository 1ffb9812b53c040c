"""What the generated script decides when it starts: its arguments, its settings, and the plan
adapted to the device and world size it actually runs on.

The plan written into `train_ddp.py` was made for the machine `kit render` looked at. The same
script must also run unchanged on a CPU laptop and on a different GPU, so precision and
gradient accumulation are settled again here; everything else the plan chose is kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import warnings
from dataclasses import asdict, dataclass

from kit.planning import config
from kit.errors import CannotTrain, UsageError

# transformers 5.2x renamed gradient_checkpointing to activation_checkpointing; the old names
# still work and are the only ones older 5.x releases (e.g. 5.17) know, so kit keeps them.
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)


def parse_args(argv: list[str], config_path: str) -> argparse.Namespace:
    from kit.cli import _Parser

    parser = _Parser(prog="train_ddp.py", description=f"Train as configured in {config_path}.")
    config.add_config_arguments(parser)
    parser.set_defaults(config=None)
    parser.add_argument("--smoke", action="store_true", help="one optimizer step, then check that training works")
    parser.add_argument("--force", action="store_true",
                        help="resume even if the checkpoint's config fingerprint differs from this config")
    return parser.parse_args(argv)


def settings(embedded: dict, args: argparse.Namespace) -> config.RunConfig:
    """`--config FILE` replaces the embedded settings; `key=value` overrides apply on top."""
    if args.config:
        return config.load(args.config, args.overrides or ())
    cfg = config.from_dict(embedded, source="train_ddp.py SETTINGS")
    for key, value in config.parse_overrides(args.overrides or ()):
        config.set_value(cfg, key, value, source="command line")
    return cfg


@dataclass
class RuntimePlan:
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
    strategy: str = "ddp"        # single | ddp | fsdp | model_parallel (see kit.train.sharding)
    quantization: str | None = None  # "nf4" for a 4-bit base

    @property
    def padding_free(self) -> bool:
        """Whether batches are rows laid end to end (packed sequences are batched that way too)."""
        return self.batching in ("padding_free", "packed")

    def to_dict(self) -> dict:
        return asdict(self)


def settle_batching(plan: RuntimePlan, cfg, mean_tokens: float) -> list[str]:
    """Padding-free batches only where the data's rows are short (kit.planning.speed.settle_batching); the notes."""
    from kit.planning import speed

    notes: list[str] = []
    plan.batching = speed.settle_batching(cfg, plan.batching, mean_tokens, cfg.seq_len, notes)
    return notes


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


def _native_bf16(device) -> bool:
    import torch

    if device.type != "cuda":
        return False
    if torch.version.hip:
        return True  # ROCm archs that run current torch (MI200+, RDNA3+) have bf16
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def _precision(cfg, device, planned: str, notes: list) -> str:
    if device.type == "cpu":
        if cfg.precision in ("bf16", "fp16"):
            raise CannotTrain(f"precision={cfg.precision} was asked for, but this rank runs on the CPU; use precision=fp32")
        return "fp32"
    native = _native_bf16(device)
    if cfg.precision == "bf16" and not native:
        import torch

        name = torch.cuda.get_device_name(device)
        raise CannotTrain(f"precision=bf16 was asked for, but {name} has no native bf16 (compute capability < 8.0); "
                          "use precision=fp16 or auto")
    if cfg.precision != "auto":
        return cfg.precision
    chosen = "bf16" if native else "fp16"
    if planned not in (chosen, "fp32"):
        notes.append(f"precision {chosen} on this GPU (the rendered plan said {planned})")
    return chosen


def plan_for(ctx, cfg: config.RunConfig, planned: dict) -> RuntimePlan:
    """The rendered plan, settled for this device and this world size."""
    notes: list[str] = []
    if cfg.method == "qlora" and ctx.device.type != "cuda":
        raise CannotTrain("method=qlora needs a CUDA GPU (bitsandbytes 4-bit); on the CPU use method=lora")
    precision = _precision(cfg, ctx.device, planned.get("precision", "auto"), notes)
    from kit.planning.plan import batch_for_world

    # Keep the global batch the plan was made for, whatever the number of processes now.
    wanted = dataclasses.replace(cfg, global_batch=cfg.global_batch or planned.get("global_batch"))
    per_device, accum, global_batch = batch_for_world(
        wanted, cfg.per_device_batch or planned["per_device_batch"], ctx.world_size)
    backend = planned.get("backend", "transformers")
    if cfg.backend != "auto":
        backend = cfg.backend
    if backend == "unsloth" and (ctx.device.type != "cuda" or importlib.util.find_spec("unsloth") is None):
        if cfg.backend == "unsloth":
            raise CannotTrain("backend=unsloth was asked for, but Unsloth is not installed or there is no CUDA GPU")
        notes.append("Unsloth is not available here: using the transformers backend")
        backend = "transformers"
    optimizer = planned.get("optimizer") or "adamw_torch"
    if cfg.optimizer != "auto":
        optimizer = cfg.optimizer
    if optimizer.endswith("8bit") and ctx.device.type != "cuda":
        notes.append(f"optimizer {optimizer} needs a GPU: using adamw_torch")
        optimizer = "adamw_torch"
    if cfg.gradient_checkpointing == "auto":
        checkpointing = bool(planned.get("gradient_checkpointing", False))
    else:
        checkpointing = cfg.gradient_checkpointing == "on"
    batching = planned.get("batching", "padded") if cfg.batching == "auto" else cfg.batching
    if batching == "auto":
        batching = "padded"
    kernels = _kernels(cfg, ctx, planned.get("kernels", "none"), backend, notes)
    if optimizer == "adamw_torch_fused" and ctx.device.type != "cuda":
        notes.append("optimizer adamw_torch_fused is planned for a GPU: using adamw_torch on the CPU")
        optimizer = "adamw_torch"
    strategy = _strategy(ctx, cfg, planned, notes)
    quantization = "nf4" if cfg.method == "qlora" else planned.get("quantization")
    return RuntimePlan(precision, per_device, accum, global_batch, checkpointing, backend, optimizer, notes,
                       batching=batching, kernels=kernels, strategy=strategy, quantization=quantization)


def _strategy(ctx, cfg, planned: dict, notes: list) -> str:
    """The rendered strategy, or the config's when it names one; model parallel never under torchrun."""
    strategy = cfg.strategy if cfg.strategy != "auto" else planned.get("strategy", "ddp")
    if strategy == "model_parallel":
        if ctx.world_size > 1:
            raise UsageError(f"strategy model_parallel runs as one process that spreads the layers over the GPUs, "
                             f"but this is rank {ctx.rank} of {ctx.world_size}: launch it with python train_ddp.py, "
                             "not torchrun")
        if ctx.device.type != "cuda":
            raise CannotTrain("strategy model_parallel spreads the layers over GPUs, and this machine has none: "
                              "use strategy=auto")
    if strategy == "fsdp" and ctx.world_size == 1 and (ctx.device.type == "cpu" or "LOCAL_RANK" not in os.environ):
        # Trainer runs FSDP only in a process group; one process alone shards nothing anyway.
        notes.append("one process without torchrun (or on the CPU): training without FSDP sharding; start it with "
                     "torchrun --standalone --nproc_per_node=N train_ddp.py to shard")
        strategy = "single"
    if strategy in ("single", "ddp") and ctx.world_size > 1:
        strategy = "ddp"
    return strategy


def _kernels(cfg, ctx, planned: str, backend: str, notes: list) -> str:
    """Liger's kernels where they can run: a CUDA device, liger-kernel installed, the plain backend."""
    wanted = planned if cfg.kernels == "auto" else cfg.kernels
    if wanted != "liger":
        return "none"
    why = ("this rank runs on the CPU" if ctx.device.type != "cuda" else
           "Unsloth brings its own kernels" if backend == "unsloth" else
           "liger-kernel is not installed" if importlib.util.find_spec("liger_kernel") is None else None)
    if why is None:
        return "liger"
    if cfg.kernels == "liger" and backend != "unsloth":
        raise CannotTrain(f"kernels=liger was asked for, but {why}: `pip install liger-kernel` on a CUDA GPU, "
                          "or set kernels=none")
    notes.append(f"Liger kernels off: {why}")
    return "none"


def check_output_dir(path: str) -> None:
    """Refuse an output_dir that cannot hold checkpoints, before anything is loaded (UsageError, exit 2).

    Trainer would find out only at its first save, after the model load and the first steps. The
    folder is created (Trainer would create it anyway) and a file is written into it and removed:
    permission bits say little when running as root or on a read-only mount.
    """
    import os
    import tempfile
    from pathlib import Path

    out = Path(path)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == out else f"is under {blocker}, which is a file"
        raise UsageError(f"output_dir {out} {where}, not a directory: choose another output_dir")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out, prefix=".kit-write-check-"):
            pass
    except OSError as e:
        raise UsageError(f"output_dir {out} is not writable ({e.strerror or e}): choose another output_dir") from None
