"""Facts about this machine, gathered without starting CUDA and without importing torch.

`gather()` returns a JSON-able `Facts` (schema in docs/CONTRACTS.md). GPUs come from NVML or the
vendor's command-line tool; torch's version from torch/version.py read as text; its compiled arch
list from a short subprocess started in parallel with the GPU query and cached on disk. So the
process that probes (often the notebook kernel) holds no CUDA context afterwards and torchrun's
ranks get the whole GPU. A fact that cannot be read is None, with the reason under `unknown`.
"""

from __future__ import annotations

import ast
import glob
import importlib.metadata
import importlib.util
import json
import mmap
import os
import platform as _platform
import re
import shutil
import site
import subprocess
import sys
from dataclasses import asdict, dataclass, field, fields

from kit import platforms
from kit.errors import UsageError
from kit.gpus import is_capability, query_gpus

SCHEMA = 1
PACKAGES = ("transformers", "trl", "peft", "bitsandbytes", "unsloth", "accelerate", "datasets", "huggingface_hub")
TORCH_TIMEOUT_S = 120  # a cold `import torch` on a Kaggle disk can take well over 10 s

# Reads the build flags without touching the GPU: `torch.cuda.get_arch_list()` would call
# `is_available()` first, `_cuda_getArchFlags()` only returns a string compiled into torch.
_TORCH_SCRIPT = (
    "import json, torch\n"
    "f = getattr(torch._C, '_cuda_getArchFlags', None)\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,"
    " 'hip': torch.version.hip, 'arch_flags': f() if f else None}))\n"
)


@dataclass
class Facts:
    """What is true of a machine, as plain JSON-able data (see docs/CONTRACTS.md)."""

    platform: str
    platform_detected_by: str
    python: str
    torch: dict
    gpus: list
    gpu_count: int
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
        facts = cls(**{k: v for k, v in d.items() if k in known})
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
    finish_torch = _start_torch_build(unknown)  # the subprocess runs while NVML is asked
    gpus, source, driver = query_gpus(unknown)
    plat, detected_by = platforms.detect()
    return Facts(
        platform=plat, platform_detected_by=detected_by, python=_platform.python_version(),
        torch=finish_torch(), gpus=gpus, gpu_count=len(gpus), driver=driver, gpu_source=source,
        cpu_count=_cpu_count(), ram_bytes=_ram_bytes(unknown), disk_free_bytes=_disk_free(cwd, unknown),
        packages={name: _version(name) for name in PACKAGES},
        hf_token_available=_hf_token(plat, unknown), unknown=unknown)


def load_facts(path: str) -> Facts:
    """Read another machine's `kit probe --json` output; raises UsageError (exit 2) when unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"facts file {path!r} does not exist: write one with `kit probe --json > facts.json`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read facts file {path!r}: {e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"facts file {path!r} is not valid JSON ({e.msg} at line {e.lineno}): "
                         "write it with `kit probe --json > facts.json`") from None
    try:
        return Facts.from_dict(data)
    except ValueError as e:
        raise UsageError(f"facts file {path!r} {e}: write it with `kit probe --json > facts.json`") from None


def cache_dir() -> str:
    """Where kit caches torch's build facts: $KIT_CACHE_DIR, else $XDG_CACHE_HOME/kit, else ~/.cache/kit."""
    if os.environ.get("KIT_CACHE_DIR"):
        return os.environ["KIT_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kit")


def _start_torch_build(unknown: dict):
    """Start reading torch's build facts; returns a function that finishes and returns the dict."""
    info = {"installed": False, "version": None, "cuda": None, "hip": None, "arch_list": None}
    spec = importlib.util.find_spec("torch")  # locates torch without importing it
    if spec is None or not spec.origin:
        unknown["torch"] = f"no module named torch for {sys.executable}"
        return lambda: info
    torch_dir = os.path.dirname(spec.origin)
    info.update(_read_version_py(torch_dir, unknown))
    key = _cache_key(torch_dir, info["version"])
    cached = _cache_read(key)
    if cached is not None:
        return lambda: {**info, **cached}
    # Without `import torch` (2-4 s) where the files say enough: a CPU build has no arch list, and
    # a CUDA build's is a string constant in its library.
    if info.get("version") and not info.get("cuda") and not info.get("hip"):
        arch_list = []
    else:
        arch_list = arch_flags_from_library(torch_dir) if info.get("cuda") else None
    if arch_list is not None:
        result = {"version": info["version"], "cuda": info["cuda"], "hip": info["hip"],
                  "installed": True, "arch_list": arch_list}
        _cache_write(key, result)
        return lambda: {**info, **result}
    env = dict(os.environ)
    parent = os.path.dirname(torch_dir)
    if parent not in site.getsitepackages() + [site.getusersitepackages()]:
        # torch was found on a path this process added itself (e.g. a notebook's sys.path.insert):
        # hand that path to the subprocess, or it would import another torch, or none.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [parent, os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-c", _TORCH_SCRIPT], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish() -> dict:
        try:
            out, err = proc.communicate(timeout=TORCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            info["installed"] = True  # it is there, just slow; the verdicts treat the list as unknown
            unknown["torch.arch_list"] = f"`import torch` took over {TORCH_TIMEOUT_S} s"
            return info
        if proc.returncode != 0:
            last = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            unknown["torch"] = f"`import torch` fails: {last}"
            return info
        try:
            built = json.loads(out.strip().splitlines()[-1])
            flags = built.pop("arch_flags")
        except (IndexError, ValueError, KeyError, AttributeError):
            info["installed"] = True
            unknown["torch.arch_list"] = f"unexpected output from the torch subprocess: {out.strip()[-200:]!r}"
            return info
        result = {**built, "installed": True, "arch_list": flags.replace(";", " ").split() if flags else []}
        if not flags and (built["cuda"] or built["hip"]):  # a GPU build that hides its list: unknown, not empty
            result["arch_list"] = None
            unknown["torch.arch_list"] = "this torch build does not expose its compiled arch list"
        else:  # only a complete answer is cached, so the reason above is given on every run
            _cache_write(key, result)
        return {**info, **result}

    return finish


# One arch token as torch's build writes it into CUDA_ARCH_FLAGS: sm_75, sm_90a, compute_120.
_ARCH_TOKEN = rb"(?:sm|compute)_[0-9]{2,3}[a-z]?"
_ARCH_FLAGS = re.compile(rb"\x00(" + _ARCH_TOKEN + rb"(?:[ ;]" + _ARCH_TOKEN + rb")+)\x00")
_FLAG_LIBRARIES = ("libtorch_python.so",)  # where torch/csrc/cuda/Module.cpp is linked


def arch_flags_from_library(torch_dir: str) -> list[str] | None:
    """The compiled arch list of a CUDA build of torch, read from its shared library as bytes.

    `torch._C._cuda_getArchFlags()` returns a string constant compiled into libtorch_python.so
    ("sm_75 sm_80 … compute_120"); reading it from the file skips the 2–4 s of `import torch`.
    Returns None unless exactly one such string is found, so the caller falls back to asking
    torch itself.
    """
    for name in _FLAG_LIBRARIES:
        path = os.path.join(torch_dir, "lib", name)
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = {m.group(1) for m in _ARCH_FLAGS.finditer(data)}
        except (OSError, ValueError):  # missing, unreadable, or empty (mmap of 0 bytes)
            continue
        if len(found) == 1:
            return found.pop().decode().replace(";", " ").split()
        if len(found) > 1:
            return None  # ambiguous: let torch say which
    return None


def _read_version_py(torch_dir: str, unknown: dict) -> dict:
    """`__version__`, `cuda` and `hip` from torch/version.py, parsed as text (no import)."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError) as e:
        unknown["torch.version"] = f"cannot read torch/version.py: {e}"
        return {}
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    return {"version": values.get("__version__"), "cuda": values.get("cuda"), "hip": values.get("hip")}


def _cache_key(torch_dir: str, version: str | None) -> str:
    # A reinstall replaces the compiled library, so its mtime tells builds of one version apart.
    libs = sorted(glob.glob(os.path.join(torch_dir, "_C*.so")) + glob.glob(os.path.join(torch_dir, "_C*.pyd")))
    mtime = os.path.getmtime(libs[0]) if libs else None
    return f"{torch_dir}|{version}|{mtime}|{sys.executable}"


def _cache_read(key: str) -> dict | None:
    try:
        with open(os.path.join(cache_dir(), "torch_build.json"), encoding="utf-8") as f:
            return json.load(f).get(key)
    except (OSError, ValueError, AttributeError):
        return None  # no usable cache: the subprocess reads the facts instead


def _cache_write(key: str, value: dict) -> None:
    path = os.path.join(cache_dir(), "torch_build.json")
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = value
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1)
        os.replace(tmp, path)  # readers never see half a file
    except OSError:
        return  # a read-only home only costs the next run the subprocess; the facts are unaffected


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
    for i, gpu in enumerate(d.get("gpus", [])):
        missing += [f"gpus[{i}].{k}" for k in _REQUIRED_GPU if k not in gpu]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}")
    arch_list = d["torch"]["arch_list"]
    if arch_list is not None and not (isinstance(arch_list, list) and all(isinstance(a, str) for a in arch_list)):
        raise ValueError("has a torch.arch_list that is not a list of strings like \"sm_75\"")
    for i, gpu in enumerate(d["gpus"]):
        cap = gpu["capability"]
        if cap is not None and not (isinstance(cap, str) and (cap.startswith("gfx") or is_capability(cap))):
            raise ValueError(f"has gpus[{i}].capability {cap!r}; expected \"7.5\" or \"gfx942\"")
