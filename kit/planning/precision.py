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
from kit.planning.reasons import Reason, why


def choose(asked: str, device: str, vendor: str | None = None, capability: str | None = None,
           name: str = "") -> tuple[str, Reason]:
    """(precision, its Reason) for `asked` (auto | bf16 | fp16 | fp32) on a cpu or cuda device.

    Raises:
        CannotTrain: bf16 or fp16 asked for on the CPU, bf16 on a GPU without native bf16.
    """
    if device != "cuda":
        if asked in ("bf16", "fp16"):
            raise CannotTrain(f"precision={asked} was asked for, but this runs on the CPU; use precision=fp32")
        return "fp32", why("precision_cpu")
    native = verdicts.bf16_native(vendor, capability)
    arch = verdicts.arch_name(vendor, capability)
    if asked == "bf16" and not native:
        raise CannotTrain(f"precision=bf16 was asked for, but {name} ({arch}) has no native bf16: use "
                          "precision=fp16 or precision=auto")
    if asked != "auto":
        if asked == "fp16" and vendor == "amd":
            return asked, why("precision_fp16_rocm")
        return asked, why("precision_configured", precision=asked)
    if not native:
        return "fp16", why("precision_no_bf16", gpu=name, arch=arch, fp16_vs_bf16=MEASURED["fp16_vs_bf16"])
    if vendor == "amd":
        return "bf16", why("precision_bf16_rocm", gpu=name, arch=arch)
    return "bf16", why("precision_bf16", gpu=name, arch=arch)
