"""Decisions about a machine's facts: can each GPU run this torch build, is bf16 native, what to do.

Pure functions of the facts (see `kit.machine.probe`), so they run on another machine's probe JSON
(`kit bootstrap --facts FILE`) and are tested with the facts of real machines.

bf16 is decided from the architecture, never from `torch.cuda.is_bf16_supported()`: that call
counts emulation and says True on a T4 (pytorch/pytorch#148322).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from kit.machine import platforms
from kit.machine.command import launch_command

_NV_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")
# ROCm archs with native bf16: MI200 (gfx90a), MI300 (gfx94x), MI350 (gfx95x), RDNA3/3.5 (gfx11xx),
# RDNA4 (gfx12xx).
_AMD_BF16 = re.compile(r"^gfx(90a|94[0-9a-f]|95[0-9a-f]|11[0-9a-f]{2}|12[0-9a-f]{2})$")
TORCH_INSTALL_URL = "https://pytorch.org/get-started/locally/"


@dataclass
class Verdicts:
    """What the facts mean for training.

    Attributes:
        gpus: Per GPU `{index, name, arch, arch_supported, bf16, reason}`; `arch_supported` is
            None when torch's arch list could not be read.
        usable_gpus: Indexes of the GPUs this torch build can run on.
        mixed: True when the usable GPUs are not all the same model.
        bf16: True when every usable GPU has native bf16.
        ok: True when training can run on at least one GPU.
        summary: One or two plain sentences on what was found.
        action: What to do next: the launch command when ok, otherwise the fix.
        warnings: Things that do not stop training but should be known.
    """

    gpus: list = field(default_factory=list)
    usable_gpus: list = field(default_factory=list)
    mixed: bool = False
    bf16: bool = False
    ok: bool = False
    summary: str = ""
    action: str = ""
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def arch_name(vendor: str, capability: str | None) -> str:
    """The name torch's arch list uses for a GPU: `"7.5"` → `"sm_75"`; AMD `"gfx90a:xnack-"` → `"gfx90a"`."""
    if not capability:
        return "arch unknown"
    if vendor == "nvidia":
        major, minor = _capability(capability)
        return f"sm_{major}{minor}"
    return capability.split(":")[0]


def arch_supported(capability: str, arch_list: list[str], vendor: str) -> tuple[bool, str]:
    """Whether a GPU can run the kernels compiled into a torch build.

    NVIDIA: an `sm_XY` kernel runs on capability X.Z with Z ≥ Y (same major; `sm_90a`-style
    arch-specific kernels only on exactly 9.0), and PTX `compute_XY` is JIT-compiled for any
    capability ≥ X.Y. AMD: the gfx arch must be in the list.

    Args:
        capability: `"7.5"` (NVIDIA) or `"gfx942"` (AMD).
        arch_list: The build's list, e.g. `["sm_70", "sm_75", "compute_75"]` or `["gfx942"]`.
        vendor: `"nvidia"` or `"amd"`.

    Returns:
        `(supported, reason)`; the reason reads after the GPU's name and arch, e.g.
        `"is not in this torch build's arch list sm_70…sm_120"`.

    Example:
        >>> arch_supported("7.5", ["compute_70"], "nvidia")
        (True, 'runs through PTX: compute_70 is JIT-compiled for it')
    """
    entries = [a.split(":")[0] for a in arch_list]
    build_vendor = _build_vendor(entries)
    if build_vendor is None:
        return False, "cannot run on this torch build: it has no GPU kernels"
    if build_vendor != vendor:
        kind = "NVIDIA (CUDA)" if build_vendor == "nvidia" else "AMD (ROCm)"
        return False, f"cannot run on this torch build: its arch list {span(entries)} is for {kind} GPUs"
    if vendor == "amd":
        if arch_name("amd", capability) in entries:
            return True, "is in this torch build's arch list"
        return False, f"is not in this torch build's arch list {span(entries)}"
    major, minor = _capability(capability)
    for entry in entries:
        match = _NV_ARCH.match(entry)
        if match is None:  # an entry this kit does not know how to read cannot vouch for the GPU
            continue
        kind, digits, suffix = match.groups()
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and (a_major, a_minor) == (major, minor):
            return True, "is in this torch build's arch list"
        if kind == "sm" and not suffix == "a" and a_major == major and a_minor < minor:
            return True, f"runs this torch build's {entry} kernels (same major version)"
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True, f"runs through PTX: {entry} is JIT-compiled for it"
    return False, f"is not in this torch build's arch list {span(entries)}"


def bf16_native(vendor: str, capability: str | None) -> bool:
    """Whether the GPU computes bf16 in hardware: NVIDIA capability ≥ 8.0, or a ROCm arch that has it.
    An unknown capability (nvidia-smi without compute_cap) counts as no: fp16 trains everywhere."""
    if not capability:
        return False
    if vendor == "nvidia":
        return _capability(capability) >= (8, 0)
    return bool(_AMD_BF16.match(arch_name("amd", capability)))


def judge(facts) -> Verdicts:
    """Decide what a machine's facts mean for training.

    Args:
        facts: A `kit.machine.probe.Facts` (from `gather()` or `Facts.from_dict`).

    Returns:
        The `Verdicts`; `ok` is False when no GPU can train (CPU-only included).
    """
    torch = facts.torch
    hint = platforms.defaults(facts.platform).accelerator_hint
    synthesized = str(facts.platform_detected_by or "").startswith("synthesized")
    if hint and synthesized:
        # `--gpus 1xP100` is planned as Kaggle's machine, which the user did not say: name the platform.
        hint = f"on {facts.platform.capitalize()}, {hint}; elsewhere,"
    gpus = [_judge_gpu(g, torch, hint) for g in facts.gpus]
    if synthesized:
        # `--gpus`: the torch judged is the one assumed for that machine, not the one installed here.
        assumed = f"torch {torch.get('version')} (assumed for --gpus, not the torch installed here)"
        for g in gpus:
            g["reason"] = (g["reason"].replace("this torch build's arch list", f"the arch list of {assumed}")
                           .replace("this torch build", assumed))
    v = Verdicts(gpus=gpus)
    v.usable_gpus = [g["index"] for g in gpus if g["arch_supported"] is not False]
    usable = [g for g in gpus if g["index"] in v.usable_gpus]
    v.mixed = len({g["name"] for g in usable}) > 1
    v.bf16 = bool(usable) and all(g["bf16"] for g in usable)
    v.ok = bool(usable)
    v.warnings = [g["reason"] for g in gpus if g["arch_supported"] is None]

    if not torch.get("installed"):
        why = facts.unknown.get("torch", "import torch failed")
        v.summary = f"torch is not installed here ({why}), so nothing can train."
        v.action = f"install the torch build for this machine ({TORCH_INSTALL_URL}), then run `kit bootstrap` again"
    elif not gpus:
        v.summary = "No GPU found: training would run on the CPU, which is only fit for the tiny default model (CPU-slow)."
        v.action = (f"{hint}, then run `kit bootstrap` again" if hint else
                    "use a machine with a supported GPU; `python train_ddp.py` runs only the tiny default on the CPU")
    elif not usable:
        v.summary = _unique(g["reason"] for g in gpus)
        v.action = gpus[0]["advice"]
    else:
        v.summary = _ok_summary(usable, torch, v.bf16)
        v.action = _launch(usable, len(gpus))
        v.warnings += [g["reason"] for g in gpus if g["arch_supported"] is False]
        if v.mixed:
            names = ", ".join(sorted({g["name"] for g in usable}))
            v.warnings.append(f"mixed GPU models ({names}): DDP runs every rank at the pace and memory "
                              "of the slowest, smallest GPU")
    for g in gpus:
        g.pop("advice")
    return v


def span(arch_list: list[str]) -> str:
    """A short form of an arch list for messages: `"sm_70…sm_120"`, or the list when it is short."""
    if len(arch_list) <= 3:
        return " ".join(arch_list) or "(empty)"
    return f"{arch_list[0]}…{arch_list[-1]}"


def _judge_gpu(gpu: dict, torch: dict, hint: str | None) -> dict:
    vendor, cap, name = gpu["vendor"], gpu["capability"], gpu["name"]
    arch = arch_name(vendor, cap) if cap else "arch unknown"
    if not torch.get("installed"):
        ok, why = False, "cannot run: torch is not installed"
    elif not cap:
        ok, why = None, "was not checked: its compute capability could not be read, so it is assumed to run"
    elif torch.get("arch_list") is None:
        ok, why = None, "was not checked: torch's arch list could not be read, so it is assumed to run"
    else:
        ok, why = arch_supported(cap, torch["arch_list"], vendor)
    build = "a CUDA" if vendor == "nvidia" else "a ROCm"
    fix = f"install a torch built for {arch}" if torch.get("installed") else f"install {build} build of torch"
    advice = f"{hint}{' ' if hint.endswith(',') else ' or '}{fix}" if hint and "T4" not in name else fix
    reason = f"{name} ({arch}) {why}" + (f": {advice}" if ok is False else "")
    return {"index": gpu["index"], "name": name, "arch": arch, "arch_supported": ok,
            "bf16": bool(cap) and bf16_native(vendor, cap), "reason": reason, "advice": advice}


def _ok_summary(usable: list[dict], torch: dict, bf16: bool) -> str:
    models = ", ".join(f"{sum(g['name'] == n for g in usable)}× {n} ({a})"
                       for n, a in dict.fromkeys((g["name"], g["arch"]) for g in usable))
    precision = "bf16 is native" if bf16 else "no native bf16: train in fp16"
    return f"{models} can train with torch {torch.get('version')}; {precision}."


def _launch(usable: list[dict], total: int) -> str:
    # Hide the GPUs this torch cannot run, or the ranks would land on them.
    visible = [g["index"] for g in usable] if len(usable) < total else None
    vendor = "nvidia" if usable[0]["arch"].startswith("sm_") else "amd"
    return launch_command(len(usable), visible=visible, vendor=vendor)


def _unique(lines) -> str:
    return " ".join(dict.fromkeys(lines))


def _build_vendor(entries: list[str]) -> str | None:
    if any(_NV_ARCH.match(a) for a in entries):
        return "nvidia"
    if any(a.startswith("gfx") for a in entries):
        return "amd"
    return None


def _capability(capability: str) -> tuple[int, int]:
    major, _, minor = capability.partition(".")
    return int(major), int(minor or 0)
