"""Facts about this machine, gathered without starting CUDA and without importing torch.

`gather()` returns a JSON-able `Facts` (schema in docs/CONTRACTS.md). GPUs come from NVML or the
vendor's command-line tool; torch's build (version, CUDA/HIP, compiled arch list) from its files,
without importing it (`kit.machine.torch_build`). So the process that probes (often the notebook kernel) holds no CUDA context afterwards and torchrun's
ranks get the whole GPU. A fact that cannot be read is None, with the reason under `unknown`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform as _platform
import shutil
from dataclasses import asdict, dataclass, field, fields

from kit import files
from kit.machine import platforms, torch_build
from kit.errors import UsageError, shown
from kit.machine.gpu_table import MAX_GPUS
from kit.machine.gpus import is_capability, query_gpus

SCHEMA = 1
MAX_ARCHES = 100  # entries of torch.arch_list in a facts file (a CUDA 12.8 build lists 10)
MAX_ENTRIES = 1000  # packages or unknown facts in a facts file
PACKAGES = ("transformers", "trl", "peft", "bitsandbytes", "unsloth", "accelerate", "datasets", "huggingface_hub",
            "liger_kernel", "trackio", "wandb", "tensorboard")  # the last three: report_to (kit.planning.tracking)


@dataclass
class Facts:
    """What is true of a machine, as plain JSON-able data (see docs/CONTRACTS.md)."""

    platform: str
    python: str
    torch: dict
    gpus: list
    gpu_count: int
    platform_detected_by: str | None = None
    schema: int = SCHEMA
    driver: str | None = None
    gpu_source: str | None = None
    cpu_count: int | None = None
    ram_bytes: int | None = None
    disk_free_bytes: int | None = None
    packages: dict = field(default_factory=dict)
    hf_token_available: bool = False
    unknown: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}  # schema first, as a reader expects

    @classmethod
    def from_dict(cls, d: dict) -> "Facts":
        """Facts from `kit probe --json` output; raises ValueError naming what is missing or wrong."""
        _validate(d)
        known = {f.name for f in fields(cls)}
        facts = cls(**{k: _shown_strings(v) for k, v in d.items() if k in known})
        # The contract's keys suffice; every other fact the file lacks is unknown, and says why.
        facts.unknown = dict(facts.unknown or {})
        for name in sorted(known - set(d) - set(_REQUIRED) - {"schema", "unknown"}):
            facts.unknown.setdefault(name, "not in the facts file")
        facts.torch = {"installed": facts.torch.get("version") is not None, **facts.torch}
        for gpu in facts.gpus:
            gpu.setdefault("vendor", "amd" if str(gpu["capability"]).startswith("gfx") else "nvidia")
            gpu.setdefault("memory_free_bytes", None)
        return facts


def gather(cwd: str | None = None) -> Facts:
    """Probe this machine.

    Args:
        cwd: The working directory whose free disk space is recorded; the current one when None.

    Returns:
        The `Facts`. Nothing here imports torch or initialises CUDA in this process.
    """
    unknown: dict = {}
    finish_torch = torch_build.start_build(unknown)  # the subprocess runs while NVML is asked
    gpus, source, driver = query_gpus(unknown)
    plat, detected_by = platforms.detect()
    gpus = _shown_strings(gpus)  # names as the driver gave them, escaped where they hold a control character
    return Facts(
        platform=plat, platform_detected_by=detected_by, python=_platform.python_version(),
        torch=finish_torch(), gpus=gpus, gpu_count=len(gpus), driver=driver, gpu_source=source,
        cpu_count=_cpu_count(), ram_bytes=_ram_bytes(unknown), disk_free_bytes=_disk_free(cwd, unknown),
        packages={name: _version(name) for name in PACKAGES},
        hf_token_available=_hf_token(plat, unknown), unknown=_shown_strings(unknown))


def load_facts(path: str) -> Facts:
    """Read another machine's `kit probe --json` output; raises UsageError (exit 2) when unusable."""
    fix = "write it with `kit probe --json > facts.json`"
    if files.regular_file(path, f"cannot read facts file {path!r}") is None:  # a folder or a FIFO: refused, not read
        raise UsageError(f"facts file {path!r} does not exist: {fix}")
    data = files.read_json(path, "facts file", fix)  # not JSON, not UTF-8, too deep or too big: one line
    try:
        return Facts.from_dict(data)
    except ValueError as e:
        raise UsageError(f"facts file {path!r} {e}: write it with `kit probe --json > facts.json`") from None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_count() -> int | None:
    # The CPUs this process may use; os.cpu_count() counts the host's in a container.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _ram_bytes(unknown: dict) -> int | None:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError) as e:
        unknown["ram_bytes"] = f"sysconf cannot tell physical memory: {e}"
        return None
    try:  # a container's cgroup limit, when lower, is what the job can really use
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass  # no cgroup v2 limit file: the physical size stands
    return total


def _disk_free(cwd: str | None, unknown: dict) -> int | None:
    try:
        return shutil.disk_usage(cwd or os.getcwd()).free
    except OSError as e:
        unknown["disk_free_bytes"] = f"cannot stat the working dir: {e}"
        return None


def _hf_token(plat: str, unknown: dict) -> bool:
    """Whether a Hugging Face token is available; presence only, the value is never read."""
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return True
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    path = os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return True
    if plat in ("kaggle", "colab"):
        store = "Kaggle secrets" if plat == "kaggle" else "Colab userdata"
        unknown["hf_token_available"] = (f"{store} are not read by the probe; "
                                         "export the secret as HF_TOKEN before training")
    return False


def _shown_strings(value):
    """`value` with every string in it as `kit.errors.shown` writes it: facts are printed in plans,
    reports, scripts and errors, and a GPU name, a platform or a version from a facts file (or a
    driver) is text from elsewhere: a newline in it forged a line, an ESC recoloured the terminal,
    a bidi override made it read backwards, and 100 kB of it filled the screen."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, list):
        return [_shown_strings(v) for v in value]
    if isinstance(value, dict):
        return {_shown_strings(k): _shown_strings(v) for k, v in value.items()}
    return value


_REQUIRED = ("platform", "python", "torch", "gpus", "gpu_count")
_REQUIRED_TORCH = ("version", "cuda", "hip", "arch_list")
_REQUIRED_GPU = ("index", "name", "capability", "memory_total_bytes")


def _validate(d) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"holds a JSON {type(d).__name__}, not the object `kit probe --json` writes")
    if d.get("schema", SCHEMA) != SCHEMA:
        raise ValueError(f"has schema {d.get('schema')!r}; this kit reads schema {SCHEMA}")
    missing = [k for k in _REQUIRED if k not in d]
    if isinstance(d.get("torch"), dict):
        missing += [f"torch.{k}" for k in _REQUIRED_TORCH if k not in d["torch"]]
    elif "torch" in d:
        raise ValueError("has a `torch` that is not an object")
    if "gpus" in d and not (isinstance(d["gpus"], list) and all(isinstance(g, dict) for g in d["gpus"])):
        raise ValueError("has a `gpus` that is not a list of objects")
    if len(d.get("gpus") or ()) > MAX_GPUS:  # as --gpus is: every step after this walks the list, some pairwise
        raise ValueError(f"lists {len(d['gpus']):,} GPUs; kit plans for at most {MAX_GPUS} in one machine")
    for i, gpu in enumerate(d.get("gpus", [])):
        missing += [f"gpus[{i}].{k}" for k in _REQUIRED_GPU if k not in gpu]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}")
    _check_types(d)
    arch_list = d["torch"]["arch_list"]
    if arch_list is not None and not (isinstance(arch_list, list) and all(isinstance(a, str) for a in arch_list)):
        raise ValueError("has a torch.arch_list that is not a list of strings like \"sm_75\"")
    for key, most in (("torch.arch_list", MAX_ARCHES), ("packages", MAX_ENTRIES), ("unknown", MAX_ENTRIES)):
        items = arch_list if key == "torch.arch_list" else d.get(key)
        if items is not None and len(items) > most:  # a real build lists ~10 arches; a probe ~10 packages
            raise ValueError(f"has {len(items):,} entries in {key}; a real one has at most {most}")
    for i, gpu in enumerate(d["gpus"]):
        cap = gpu["capability"]
        if cap is not None and not (isinstance(cap, str) and (cap.startswith("gfx") or is_capability(cap))):
            raise ValueError(f"has gpus[{i}].capability {cap!r}; expected \"7.5\" or \"gfx942\"")


# What each known key must hold (None = unknown is always allowed), so a hand-edited file gets one
# line naming the key instead of a traceback deep in the planner.
_TYPES = {"platform": str, "platform_detected_by": str, "python": str, "gpu_count": int, "driver": str,
          "gpu_source": str, "cpu_count": int, "ram_bytes": int, "disk_free_bytes": int, "packages": dict,
          "hf_token_available": bool, "unknown": dict}
_GPU_TYPES = {"index": int, "name": str, "memory_total_bytes": int, "memory_free_bytes": int, "vendor": str}
_TORCH_TYPES = {"version": str, "cuda": str, "hip": str, "installed": bool}


def _wrong(value, kind) -> bool:
    if value is None:
        return False
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int) or value < 0
    return not isinstance(value, kind)


def _check_types(d: dict) -> None:
    names = {int: "a whole number", str: "a string", dict: "an object", bool: "true or false"}
    for key, kind in _TYPES.items():
        if key in d and _wrong(d[key], kind):
            raise ValueError(f"has {key} = {d[key]!r}; expected {names[kind]}")
    for key, kind in _TORCH_TYPES.items():
        if _wrong(d["torch"].get(key), kind):
            raise ValueError(f"has torch.{key} = {d['torch'][key]!r}; expected {names[kind]}")
    for i, gpu in enumerate(d["gpus"]):
        for key, kind in _GPU_TYPES.items():
            if _wrong(gpu.get(key), kind) or (key in ("index", "name") and gpu.get(key) is None):
                raise ValueError(f"has gpus[{i}].{key} = {gpu[key]!r}; expected {names[kind]}")
    if d["gpu_count"] != len(d["gpus"]):
        raise ValueError(f"has gpu_count {d['gpu_count']} but lists {len(d['gpus'])} GPUs")
