"""What a device can run: the rules the planner (`kit.planning.plan`) and the rank's settling
(`kit.planning.settle`) both apply, each written once, so a plan made for the CPU and a GPU plan
started on the CPU refuse and swap the same things with the same words.

    no_gpu_refusal(cfg, quantized=True)    # "method=qlora needs a CUDA GPU (bitsandbytes 4-bit); …"
    cpu_optimizer("adamw_8bit")            # ("adamw_torch", Reason("optimizer_needs_gpu", {"optimizer": "adamw_8bit"}))

Precision has its own module (`kit.planning.precision`); the speed choices that need a GPU say so
in `kit.planning.speed`.
"""

from __future__ import annotations

from kit.planning.reasons import Reason, why

MODEL_PARALLEL_WITHOUT_GPU = ("strategy model_parallel splits the layers over GPUs, and this machine has none: use "
                              "strategy=auto")


def no_gpu_refusal(cfg, quantized: bool) -> str | None:
    """Why `cfg` cannot train where there is no CUDA GPU (4-bit weights, Unsloth), or None."""
    if quantized:
        if cfg.method == "qlora":
            return "method=qlora needs a CUDA GPU (bitsandbytes 4-bit); on the CPU use method=lora"
        return (f"{cfg.model} is a 4-bit checkpoint, and 4-bit weights need a CUDA GPU (bitsandbytes): on the CPU use "
                "the unquantized model")
    if cfg.backend == "unsloth" and cfg.trainer == "sft":  # other trainers run the plain stack (kit.planning.trainers)
        return unsloth_refusal("cpu", frozenset())
    return None


def unsloth_missing(device: str, installed) -> str | None:
    """Why Unsloth cannot run here, as a code ("no_gpu", "not_installed"), or None."""
    if device != "cuda":
        return "no_gpu"
    return None if "unsloth" in installed else "not_installed"


def unsloth_refusal(device: str, installed) -> str:
    """The refusal of backend=unsloth asked for where it cannot run."""
    if device != "cuda":
        return "backend=unsloth needs a CUDA GPU, and there is none: use backend=auto (or transformers) on the CPU"
    return ("backend=unsloth was asked for, but Unsloth is not installed here: install it, or use backend=auto "
            "(or transformers)")


def cpu_optimizer(name: str) -> tuple[str, Reason | None]:
    """The optimizer a CPU runs in place of `name`, and the Reason when it is another one: bitsandbytes'
    8-bit Adam and torch's fused AdamW are CUDA kernels."""
    if name.endswith("8bit"):
        return "adamw_torch", why("optimizer_needs_gpu", optimizer=name)
    if name == "adamw_torch_fused":
        return "adamw_torch", why("optimizer_fused_on_cpu")
    return name, None
