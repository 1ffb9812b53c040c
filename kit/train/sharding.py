"""How the model is spread over the GPUs while it trains: the strategy block of train_ddp.py.

    args = sharding.trainer_args(plan, model, ctx)   # {} for DDP; fsdp + fsdp_config for FSDP
    SFTConfig(..., **args)
    trainer.train(resume_from_checkpoint=sharding.resumable(trainer, job.resume_from, plan, ctx))

- ddp: one full replica per rank (Trainer's DDP); nothing to add.
- fsdp: torch FSDP2 driven by HF Trainer through accelerate (`fsdp`/`fsdp_config` in the training
  arguments): every decoder layer is its own unit; the frozen base, the LoRA weights, their
  gradients and Adam states are sharded over all ranks; FSDP's own activation checkpointing; saves
  as FULL_STATE_DICT, so a checkpoint's adapter_model.safetensors is an ordinary PEFT adapter that
  loads under any world size, and its optimizer is one full state keyed by parameter name.
- model_parallel: device_map splits the layers over the GPUs of one process (see modeling).

Why Trainer/accelerate FSDP2 and not `fully_shard` by hand: the script keeps TRL's SFTTrainer,
its loss, PEFT and Trainer's checkpoint/resume, and FSDP1 is deprecated in transformers 5.2x. At
the installed versions the 4-bit path works through it: bitsandbytes 0.50 keeps `Params4bit`
(and its quant_state) through FSDP2's chunking and restores it in `Linear4bit.forward`, and
accelerate 1.15+ keeps 4-bit parameters off its meta-device loading path. The 4-bit weights must
be stored in a float dtype (`bnb_4bit_quant_storage`, see `quant_storage`) to be sharded at all.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kit.train import dist
from kit.errors import CannotTrain

FSDP_MODEL = "pytorch_model_fsdp.bin"   # what accelerate writes next to the adapter (adapter only)
FSDP_OPTIMIZER = "optimizer.bin"        # one full optimizer state, keyed by parameter name
DDP_OPTIMIZER = "optimizer.pt"          # torch's optimizer.state_dict(), keyed by position


def quant_storage(precision: str) -> str:
    """The dtype the 4-bit weights are stored in under FSDP: that of the other frozen weights.

    FSDP2 shards float tensors only and gathers each unit in one dtype, so the packed nf4 bytes
    are viewed as bf16 under bf16 and as fp16 under fp16 (PEFT's FSDP+QLoRA guide matches it to
    the dtype of the rest of the model).
    """
    return {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")


def loads_on_cpu(plan) -> bool:
    """16-bit LoRA under FSDP loads on the CPU and only one rank per node reads the weights.

    transformers then builds the model on the meta device on the other local ranks, and accelerate
    broadcasts the weights while sharding (cpu_ram_efficient_loading): host RAM holds one copy
    per node, no GPU ever holds a full replica. A 4-bit base cannot take that path (accelerate
    skips it for Params4bit): it is quantized on each rank's GPU and sharded right after.
    """
    return plan.strategy == "fsdp" and plan.quantization is None


def prepare_loading(plan) -> None:
    """Set what transformers reads at `from_pretrained` for `loads_on_cpu` (before loading)."""
    if loads_on_cpu(plan):
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"


def layer_classes(model) -> list[str]:
    """The decoder layer class names FSDP wraps one by one (transformers' `_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = sorted(set(getattr(base, "_no_split_modules", None) or []))
    if not names:
        raise CannotTrain(f"{type(base).__name__} does not name its decoder layers (_no_split_modules): FSDP "
                          "cannot tell how to wrap it; use strategy=ddp or strategy=model_parallel")
    return names


def trainer_args(plan, model, ctx) -> dict:
    """Training arguments of the strategy: {} for DDP and model parallel; FSDP's for FSDP."""
    if plan.strategy != "fsdp":
        return {}
    if ctx.device.type == "cpu":
        _allow_cpu_fsdp()
    return {
        "fsdp": _fsdp_flag(),
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": layer_classes(model),
            "reshard_after_forward": True,          # full sharding: free each layer after use
            "state_dict_type": "FULL_STATE_DICT",   # checkpoints stay plain PEFT adapters
            "activation_checkpointing": plan.gradient_checkpointing,
            "cpu_ram_efficient_loading": loads_on_cpu(plan),
        },
    }


def _fsdp_flag():
    """`fsdp=True` where transformers takes everything from fsdp_config (5.20+); the option string
    before, where auto_wrap must be named there (5.17 on the H200 image, Kaggle's 5.x)."""
    import transformers

    major, minor = (int("".join(ch for ch in part if ch.isdigit()) or 0) for part in
                    transformers.__version__.split(".")[:2])
    return True if (major, minor) >= (5, 20) else "full_shard auto_wrap"


def _allow_cpu_fsdp() -> None:
    """Let accelerate run FSDP2 over gloo on the CPU, as torch's `fully_shard` itself can.

    accelerate chooses FSDP only for GPU-like devices and silently trains with DDP on the CPU
    (AcceleratorState leaves MULTI_CPU out). kit's CPU runs exist to check the same code path a
    GPU runs (sharding, FULL_STATE_DICT saves and loads, resume), so on the CPU kit marks the
    state as FSDP once Trainer hands accelerate its FSDP plugin. Nothing changes on a GPU.
    """
    import accelerate.state as state
    from accelerate.utils import DistributedType

    if getattr(state.AcceleratorState, "_kit_cpu_fsdp", False):
        return
    original = state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # Both shared states: AcceleratorState re-reads PartialState's on every construction.
            state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    state.AcceleratorState.__init__ = init
    state.AcceleratorState._kit_cpu_fsdp = True


def resumable(trainer, path: str | None, plan, ctx) -> str | None:
    """`path`, or a copy in this strategy's checkpoint format when the other strategy wrote it.

    DDP saves the optimizer keyed by position (optimizer.pt), FSDP by parameter name (optimizer.bin,
    with the adapter once more in pytorch_model_fsdp.bin), and Trainer refuses the other's. Both
    hold the same numbers, so each node's first rank writes the converted copy next to the output
    folder (the checkpoint itself stays untouched), and the run resumes from it, optimizer state
    included.
    """
    if path is None:
        return None
    src = Path(path)
    fsdp_now, fsdp_ckpt = plan.strategy == "fsdp", (src / FSDP_MODEL).is_file()
    if fsdp_now == fsdp_ckpt or not (src / "adapter_model.safetensors").is_file():
        return path
    dest = src.parent / ".kit-resume" / src.name
    if ctx.local_rank == 0:
        groups = _trainer_groups(trainer)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        skip = {FSDP_MODEL, FSDP_OPTIMIZER, DDP_OPTIMIZER}
        for f in src.iterdir():
            if f.is_file() and f.name not in skip:
                shutil.copy2(f, dest / f.name)
        (_to_fsdp if fsdp_now else _to_ddp)(src, dest, groups)
    dist.barrier()
    return str(dest)


def _trainer_groups(trainer) -> list[list[str]]:
    """Trainable parameter names per optimizer group, in the order Trainer.create_optimizer builds them."""
    model = trainer.model
    decay = set(trainer.get_decay_parameter_names(model))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return [[n for n in names if n in decay], [n for n in names if n not in decay]]


def _check_sizes(found: list[int], groups: list[list[str]], src: Path) -> None:
    if found != [len(g) for g in groups][: len(found)]:
        raise CannotTrain(f"{src.name}: its optimizer has groups of {found} parameters, this model trains "
                          f"{[len(g) for g in groups]}: it was written for another LoRA shape; use another output_dir")


def _to_fsdp(src: Path, dest: Path, groups) -> None:
    import torch
    from safetensors.torch import load_file

    saved = torch.load(src / DDP_OPTIMIZER, map_location="cpu", weights_only=True)
    _check_sizes([len(g["params"]) for g in saved["param_groups"]], groups, src)
    adapter = load_file(src / "adapter_model.safetensors")
    names = [n for g in groups for n in g]
    # PEFT saves without the adapter's name: ...q_proj.lora_A.default.weight -> ...q_proj.lora_A.weight
    torch.save({n: adapter[n.replace(".default.", ".")] for n in names if n.replace(".default.", ".") in adapter},
               dest / FSDP_MODEL)
    state, param_groups = {}, []
    for group, names_here in zip(saved["param_groups"], groups):
        for index, name in zip(group["params"], names_here):
            if index in saved["state"]:
                state[name] = saved["state"][index]
        param_groups.append({**group, "params": list(names_here)})
    torch.save({"state": state, "param_groups": param_groups}, dest / FSDP_OPTIMIZER)


def _to_ddp(src: Path, dest: Path, groups) -> None:
    import torch

    saved = torch.load(src / FSDP_OPTIMIZER, map_location="cpu", weights_only=True)
    _check_sizes([len(g["params"]) for g in saved["param_groups"]], groups, src)
    state, param_groups, index = {}, [], 0
    for group in saved["param_groups"]:
        ids = []
        for name in group["params"]:
            if name in saved["state"]:
                state[index] = saved["state"][name]
            ids.append(index)
            index += 1
        param_groups.append({**group, "params": ids})
    torch.save({"state": state, "param_groups": param_groups}, dest / DDP_OPTIMIZER)
