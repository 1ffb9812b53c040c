"""Every GPU of this machine, read through NVML or the vendor's tool, never through CUDA.

NVML (`nvidia-ml-py`) first, then `nvidia-smi`, `amd-smi`, `rocm-smi`. Each reader returns plain
dicts in the Facts schema (docs/CONTRACTS.md); a reader that fails records why in `unknown`
and the next one is tried. Visible devices are filtered and renumbered the way torch numbers them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess


def query_gpus(unknown: dict) -> tuple[list, str | None, str | None]:
    """Every visible GPU, from NVML, else nvidia-smi, else amd-smi, else rocm-smi.

    Args:
        unknown: Receives the reasons of sources that failed: under "nvml" when NVML broke but
            another source answered, under "gpus" when none did.

    Returns:
        `(gpus, source, driver)`; gpus are dicts in the Facts schema, indexed as torch will see them.
    """
    reasons = {}
    for source, reader in (("nvml", _gpus_nvml), ("nvidia-smi", _gpus_nvidia_smi),
                           ("amd-smi", _gpus_amd_smi), ("rocm-smi", _gpus_rocm_smi)):
        try:
            gpus, driver = reader()
        except _Unavailable as e:
            reasons[source] = str(e)
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # a tool version printing another format
            reasons[source] = f"could not parse its output ({type(e).__name__}: {e})"
            continue
        if gpus:
            if "nvml" in reasons and gpus[0]["vendor"] == "nvidia":
                unknown["nvml"] = reasons["nvml"]  # the driver is there, so NVML should have worked
            return _visible(gpus), source, driver
    unknown["gpus"] = "no GPU found: " + "; ".join(f"{s}: {r}" for s, r in reasons.items())
    return [], None, None


class _Unavailable(Exception):
    """A GPU source that cannot answer on this machine, with the reason."""


def _gpus_nvml():
    try:
        import pynvml  # nvidia-ml-py: a ctypes binding; it loads libnvidia-ml only in nvmlInit
    except ImportError as e:
        raise _Unavailable(f"nvidia-ml-py is not importable ({e})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise _Unavailable(f"nvmlInit failed: {e}") from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "vendor": "nvidia",
                         "capability": f"{major}.{minor}", "memory_total_bytes": int(mem.total),
                         "memory_free_bytes": int(mem.free), "uuid": _text(pynvml.nvmlDeviceGetUUID(h))})
        return gpus, driver
    except pynvml.NVMLError as e:
        raise _Unavailable(f"NVML query failed: {e}") from None
    finally:
        pynvml.nvmlShutdown()


def _gpus_nvidia_smi():
    fields_ = "index,name,compute_cap,memory.total,memory.free,driver_version,uuid"
    out = _run_tool(["nvidia-smi", f"--query-gpu={fields_}", "--format=csv,noheader,nounits"])
    gpus, driver = [], None
    for line in filter(None, out.splitlines()):
        index, name, cap, total, free, driver, uuid = [c.strip() for c in line.split(",")]
        gpus.append({"index": int(index), "name": name, "vendor": "nvidia",
                     "capability": cap if is_capability(cap) else None,
                     "memory_total_bytes": _mib(total), "memory_free_bytes": _mib(free), "uuid": uuid})
    return gpus, driver


def _gpus_amd_smi():
    data = json.loads(_run_tool(["amd-smi", "static", "--asic", "--vram", "--driver", "--json"]))
    entries = data.get("gpu_data", data) if isinstance(data, dict) else data
    gpus, driver = [], None
    for n, entry in enumerate(entries):
        asic, vram = entry.get("asic", {}), entry.get("vram", {})
        size = vram.get("size", {})
        value, unit = (size.get("value"), size.get("unit", "MB")) if isinstance(size, dict) else (str(size).split() + ["MB"])[:2]
        driver = (entry.get("driver") or {}).get("version", driver)
        gpus.append({"index": int(entry.get("gpu", n)), "name": asic.get("market_name", "AMD GPU"), "vendor": "amd",
                     "capability": asic.get("target_graphics_version"),
                     "memory_total_bytes": int(float(value) * {"MB": 2**20, "GB": 2**30}.get(unit, 2**20)),
                     "memory_free_bytes": None})
    return gpus, driver


def _gpus_rocm_smi():
    data = json.loads(_run_tool(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"]))
    gpus = []
    for n, (card, props) in enumerate(sorted(data.items())):
        if not card.startswith("card"):
            continue
        p = {k.lower(): v for k, v in props.items()}
        total, used = int(p.get("vram total memory (b)", 0)), int(p.get("vram total used memory (b)", 0))
        gpus.append({"index": n, "name": p.get("card series") or p.get("card model") or "AMD GPU", "vendor": "amd",
                     "capability": p.get("gfx version"), "memory_total_bytes": total,
                     "memory_free_bytes": total - used if total else None})
    return gpus, _read_text("/sys/module/amdgpu/version")


def _run_tool(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise _Unavailable("not on PATH")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _Unavailable(f"failed to run: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise _Unavailable(f"exit code {done.returncode}: {last}")
    return done.stdout


def _visible(gpus: list) -> list:
    """The GPUs torch will see under CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, renumbered as torch does."""
    names = ("CUDA_VISIBLE_DEVICES",) if gpus[0]["vendor"] == "nvidia" else ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    spec = next((os.environ[n] for n in names if n in os.environ), None)
    if spec is None:
        return [_without_uuid(g) for g in gpus]
    chosen = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        match = [g for g in gpus if str(g["index"]) == item or g.get("uuid", "").startswith(item)]
        if not match:
            break  # CUDA stops at the first entry it cannot resolve
        chosen.append(match[0])
    return [{**_without_uuid(g), "index": i} for i, g in enumerate(chosen)]


def _without_uuid(gpu: dict) -> dict:
    # The UUID only serves the matching above; facts files are shared, and it identifies the card.
    return {k: v for k, v in gpu.items() if k != "uuid"}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mib(value: str) -> int | None:
    return int(float(value) * 2**20) if value.replace(".", "", 1).isdigit() else None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None  # no amdgpu module version: the driver stays unknown (null)


def is_capability(text: str) -> bool:
    """True for an NVIDIA compute capability such as "7.5"."""
    major, dot, minor = text.partition(".")
    return major.isdigit() and dot == "." and minor.isdigit()
