"""A built-in table of GPUs people fine-tune on, turned into Facts dicts (the `kit probe` schema).

    facts = synthesize("2xT4")    # what `kit plan --gpus 2xT4` plans for, without being on that machine

Memory is what the driver reports as total (NVML), which on a T4 is 14.56 GiB of the nominal 16 GB.
NVIDIA machines get the arch list of torch 2.10.0+cu128, what Kaggle ships: it has no sm_60, so a
P100 is refused exactly as it is there.

Host RAM is a fact only of the notebook platforms' machines (PLATFORM_MACHINES: Kaggle's T4×2 and
P100, Colab's T4); any other machine is rented or built with whatever RAM, so its RAM stays unknown
(null, with the reason under `unknown`) and the planner does not check it.

    skypilot_name("NVIDIA H100 80GB HBM3", 81_559 * MIB)   # 'H100': SkyPilot's name, from SKYPILOT
"""

from __future__ import annotations

import re

from kit.errors import UsageError, shown
from kit.files import GIB

MIB = 2**20
# key: (probe name, vendor, capability, memory_total_bytes)
GPUS = {
    "T4": ("Tesla T4", "nvidia", "7.5", 15_637_086_208),
    "P100": ("Tesla P100-PCIE-16GB", "nvidia", "6.0", 16_280 * MIB),
    "V100": ("Tesla V100-SXM2-16GB", "nvidia", "7.0", 16_160 * MIB),
    "V100-32": ("Tesla V100-SXM2-32GB", "nvidia", "7.0", 32_510 * MIB),
    "L4": ("NVIDIA L4", "nvidia", "8.9", 23_034 * MIB),
    "A10G": ("NVIDIA A10G", "nvidia", "8.6", 23_028 * MIB),
    "A100-40": ("NVIDIA A100-SXM4-40GB", "nvidia", "8.0", 40_960 * MIB),
    "A100-80": ("NVIDIA A100-SXM4-80GB", "nvidia", "8.0", 81_920 * MIB),
    "H100": ("NVIDIA H100 80GB HBM3", "nvidia", "9.0", 81_559 * MIB),
    "H200": ("NVIDIA H200", "nvidia", "9.0", 143_771 * MIB),
    "MI300X": ("AMD Instinct MI300X", "amd", "gfx942", 196_592 * MIB),
    "RTX3090": ("NVIDIA GeForce RTX 3090", "nvidia", "8.6", 24_576 * MIB),
    "RTX4090": ("NVIDIA GeForce RTX 4090", "nvidia", "8.9", 24_564 * MIB),
}
ALIASES = {"A100": "A100-40", "A100-40GB": "A100-40", "A100-80GB": "A100-80", "V100-16": "V100",
           "3090": "RTX3090", "4090": "RTX4090", "TESLA-T4": "T4"}

# SkyPilot's accelerator name for each GPU of GPUS (`sky show-gpus -a`).
SKYPILOT = {"T4": "T4", "P100": "P100", "V100": "V100", "V100-32": "V100-32GB", "L4": "L4", "A10G": "A10G",
            "A100-40": "A100", "A100-80": "A100-80GB", "H100": "H100", "H200": "H200", "MI300X": "MI300X",
            "RTX3090": "RTX3090", "RTX4090": "RTX4090"}
# A GPU name as a probe reads it (other boards of a model too, e.g. "NVIDIA H100 PCIe") → its key
# in GPUS: (pattern, key, the key of the model's bigger-memory board, from how many GiB).
_FAMILIES = [(r"\bT4\b", "T4", None, 0), (r"\bP100\b", "P100", None, 0), (r"\bV100", "V100", "V100-32", 20),
             (r"\bL4\b", "L4", None, 0), (r"\bA10G\b", "A10G", None, 0), (r"\bA100\b", "A100-40", "A100-80", 50),
             (r"\bH100\b", "H100", None, 0), (r"\bH200\b", "H200", None, 0), (r"\bMI300X\b", "MI300X", None, 0),
             (r"\bRTX 3090\b", "RTX3090", None, 0), (r"\bRTX 4090\b", "RTX4090", None, 0)]

RAM_KAGGLE = 33_662_676_992  # MemTotal of Kaggle's GPU machines, T4×2 and P100 (tests/fixtures/machines)
RAM_COLAB = 13_609_431_040   # MemTotal of Colab's free runtime (tests/fixtures/machines/cpu_only.json)
# --gpus specs that name a notebook platform's machine, whose host RAM is therefore known:
# sorted GPU keys → (platform, RAM bytes, the machine in words).
PLATFORM_MACHINES = {
    ("T4", "T4"): ("kaggle", RAM_KAGGLE, "Kaggle's T4×2"),
    ("P100",): ("kaggle", RAM_KAGGLE, "Kaggle's P100"),
    ("T4",): ("colab", RAM_COLAB, "Colab's T4"),
}

# torch 2.10.0+cu128 (Kaggle, 2026): sm_70 … sm_120, no sm_60.
NVIDIA_TORCH = {"installed": True, "version": "2.10.0+cu128", "cuda": "12.8", "hip": None,
                "arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]}
ROCM_TORCH = {"installed": True, "version": "2.10.0+rocm7.0", "cuda": None, "hip": "7.0",
              "arch_list": ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030",
                            "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"]}
PACKAGES = {"transformers": "5.17.0", "trl": "1.15.0", "peft": "0.18.0", "bitsandbytes": "0.49.0",
            "unsloth": None, "accelerate": "1.12.0", "datasets": "4.4.0", "huggingface_hub": "1.2.0"}


MAX_GPUS = 16  # in one machine (an HGX board has 8; a few servers 16)


def parse_gpus(spec: str) -> list[str]:
    """`2xT4` → ["T4", "T4"]; `T4+L4` → mixed; `cpu` → []."""
    if spec.strip().lower() in ("cpu", "0", "none"):
        return []
    out: list[str] = []
    for part in spec.split("+"):
        m = re.fullmatch(r"\s*(?:(-?\d{1,9})\s*[x×*]\s*)?([A-Za-z0-9._-]+)\s*", part)
        if not m:
            raise UsageError(f"--gpus {shown(spec, quote=True)}: expected COUNTxNAME, e.g. 2xT4 (known: {', '.join(GPUS)})")
        count, name = int(m.group(1) or 1), m.group(2).upper()
        name = ALIASES.get(name, name)
        if not 1 <= count <= MAX_GPUS:
            raise UsageError(f"--gpus {shown(spec, quote=True)}: the count must be 1 to {MAX_GPUS} (GPUs in one machine; "
                             f"more machines: --nodes), got {count}")
        if name not in GPUS:
            raise UsageError(f"--gpus {shown(spec, quote=True)}: unknown GPU {shown(m.group(2), quote=True)}; known: {', '.join(GPUS)}, cpu")
        out += [name] * count
        if len(out) > MAX_GPUS:  # said at once: `T4+T4+…` 100,000 times is no machine either
            raise UsageError(f"--gpus {shown(spec, quote=True)}: {len(out)} GPUs; one machine has at most "
                             f"{MAX_GPUS} (more machines: --nodes)")
    return out


def table_key(name: str, memory_total_bytes: int | None = None) -> str | None:
    """The key in GPUS of a GPU a probe named `name` ("NVIDIA H100 80GB HBM3" → "H100"), or None."""
    for key, (probe_name, *_rest) in GPUS.items():
        if probe_name == name:
            return key
    for pattern, key, bigger, from_gib in _FAMILIES:
        if re.search(pattern, name or "", re.IGNORECASE):
            return bigger if bigger and (memory_total_bytes or 0) > from_gib * GIB else key
    return None


def skypilot_name(name: str, memory_total_bytes: int | None = None) -> str | None:
    """SkyPilot's accelerator name for a GPU a probe named `name`, or None when kit's table lacks it."""
    key = table_key(name, memory_total_bytes)
    return SKYPILOT.get(key) if key else None


def synthesize(spec: str) -> dict:
    """A Facts dict (schema 1) for a machine with the GPUs of `spec`, e.g. "2xT4"."""
    names = parse_gpus(spec)
    gpus = []
    for index, key in enumerate(names):
        name, vendor, capability, total = GPUS[key]
        gpus.append({"index": index, "name": name, "vendor": vendor, "capability": capability,
                     "memory_total_bytes": total, "memory_free_bytes": None})
    amd = any(g["vendor"] == "amd" for g in gpus)
    # Kaggle's and Colab's machines are planned as there (their RAM, Kaggle's fix for a P100);
    # any other machine's host RAM is unknown, so not checked.
    platform, ram, words = PLATFORM_MACHINES.get(tuple(sorted(names)), ("other", None, None))
    unknown = {} if ram else {"ram_bytes": f"not known for --gpus {spec}: kit knows the RAM of Kaggle's and "
                                           "Colab's machines only (2xT4, 1xP100, 1xT4), so host RAM is not checked"}
    torch = dict(ROCM_TORCH if amd else NVIDIA_TORCH)
    return {
        "schema": 1,
        "platform": platform,
        "platform_detected_by": f"synthesized from --gpus {spec} (kit.machine.gpu_table table"
                                + (f"; {words}, with its RAM)" if words else ")"),
        "python": "3.11.13",
        "torch": torch,
        "driver": None if not gpus else ("rocm" if amd else "580.82.07"),
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_source": None if not gpus else ("rocm-smi" if amd else "nvml"),
        "cpu_count": 4 * max(1, len(gpus)),
        "ram_bytes": ram,
        "disk_free_bytes": 50 * GIB,
        "packages": dict(PACKAGES),
        "hf_token_available": False,
        "unknown": unknown,
    }
