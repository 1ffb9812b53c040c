"""What torch was built for, read without importing it (no 2-6 s `import torch`, no CUDA init).

    build(unknown) -> {"installed", "version", "cuda", "hip", "arch_list"}   # via start_build()

Version, CUDA and HIP come from torch/version.py parsed as text. The compiled arch list of a CUDA
build is a string constant in libtorch_python.so, found with a regex over the mapped file (a few
tens of ms). Only when that is ambiguous, or on ROCm, does a subprocess import torch and ask
`torch._C._cuda_getArchFlags()` (never `get_arch_list()`, which calls `is_available()`); it runs in
parallel with the GPU query, and its answer is cached on disk per torch install.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import mmap
import os
import re
import site
import stat
import subprocess
import sys

from kit import files

TORCH_TIMEOUT_S = 120  # a cold `import torch` on a Kaggle disk can take well over 10 s

# Reads the build flags without touching the GPU: `torch.cuda.get_arch_list()` would call
# `is_available()` first, `_cuda_getArchFlags()` only returns a string compiled into torch.
_TORCH_SCRIPT = (
    "import json, torch\n"
    "f = getattr(torch._C, '_cuda_getArchFlags', None)\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,"
    " 'hip': torch.version.hip, 'arch_flags': f() if f else None}))\n"
)


def cache_dir() -> str:
    """Where kit caches torch's build facts: $KIT_CACHE_DIR, else $XDG_CACHE_HOME/kit, else ~/.cache/kit."""
    if os.environ.get("KIT_CACHE_DIR"):
        return os.environ["KIT_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kit")


def start_build(unknown: dict):
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


def _cache_entries() -> dict:
    """The cache file's entries; {} when it is absent, not a regular file (a FIFO would block the
    read), not UTF-8 JSON, or not an object. The cache only saves time: it is never an error."""
    path = os.path.join(cache_dir(), "torch_build.json")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return {}
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return {}
    return entries if isinstance(entries, dict) else {}


def _usable(entry) -> bool:
    """Whether a cache entry has exactly the shape `start_build` caches (edited or corrupted ones are not)."""
    if not isinstance(entry, dict) or set(entry) != {"version", "cuda", "hip", "installed", "arch_list"}:
        return False
    texts = all(entry[k] is None or isinstance(entry[k], str) for k in ("version", "cuda", "hip"))
    arch = entry["arch_list"]
    return texts and entry["installed"] is True and (
        arch is None or (isinstance(arch, list) and all(isinstance(a, str) for a in arch)))


def _cache_read(key: str) -> dict | None:
    """The cached build facts for `key`; None (a miss: they are read again) unless the entry is usable."""
    entry = _cache_entries().get(key)
    return entry if _usable(entry) else None


def _cache_write(key: str, value: dict) -> None:
    path = os.path.join(cache_dir(), "torch_build.json")
    entries = _cache_entries()
    entries[key] = value
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        files.write_atomic(path, json.dumps(entries, indent=1))  # readers never see half a file
    except OSError:
        return  # a read-only home only costs the next run the subprocess; the facts are unaffected
