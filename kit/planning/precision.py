"""The precision rule, written once: the planner uses it for the machine it plans for, and the
script again at launch for the device each rank actually got (`kit.planning.settle.for_rank`).

Native bf16 is a fact of the architecture (`kit.machine.verdicts.bf16_native`: NVIDIA compute
capability ≥ 8.0, or a ROCm arch that has it), never `torch.cuda.is_bf16_supported()`, which
counts emulation and says True on a T4.
"""

from __future__ import annotations

from kit.errors import CannotTrain
from kit.machine import verdicts
from kit.planning.measured import MEASURED


def choose(asked: str, device: str, vendor: str | None = None, capability: str | None = None,
           name: str = "") -> tuple[str, str]:
    """(precision, why) for `asked` (auto | bf16 | fp16 | fp32) on a cpu or cuda device.

    Raises:
        CannotTrain: bf16 or fp16 asked for on the CPU, bf16 on a GPU without native bf16.
    """
    if device != "cuda":
        if asked in ("bf16", "fp16"):
            raise CannotTrain(f"precision={asked} was asked for, but this runs on the CPU; use precision=fp32")
        return "fp32", "precision fp32 on the CPU"
    native = verdicts.bf16_native(vendor, capability)
    arch = verdicts.arch_name(vendor, capability)
    if asked == "bf16" and not native:
        raise CannotTrain(f"precision=bf16 was asked for, but {name} ({arch}) has no native bf16: use "
                          "precision=fp16 or precision=auto")
    if asked != "auto":
        if asked == "fp16" and vendor == "amd":
            return asked, "precision fp16 as configured; on ROCm fp16 has given NaNs (MI300X): bf16 is safer"
        return asked, f"precision {asked} as configured"
    if not native:
        return "fp16", (f"{name} ({arch}) has no native bf16: fp16 with loss scaling "
                        "(torch.cuda.is_bf16_supported() says True here only through emulation); on an H200, fp16 "
                        f"measured {MEASURED['fp16_vs_bf16']:.2f}× bf16's tokens/s for Qwen3-8B QLoRA (loss scaling and fp32 "
                        "LoRA weights are its cost; a T4's own speed was not measured)")
    if vendor == "amd":
        return "bf16", f"{name} ({arch}) has native bf16; on ROCm bf16 is preferred: fp16 gave NaNs on MI300X"
    return "bf16", f"{name} ({arch}) has native bf16: bf16, no loss scaling needed"
