"""`kit probe`: the real probe of this machine, and every source failing in the ways real machines fail.

Each probe runs in a subprocess, as `python -m kit probe --json`, with a fresh torch-build cache,
so what is tested is what a user runs. Where a failure is simulated (a broken NVML, a missing
torch), the test says what is simulated and why.
"""

import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit.machine import platforms
from kit.errors import UsageError
from kit.machine.probe import load_facts
from kit.machine.torch_build import cache_dir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A torch-build cache filled once, for the tests about something other than torch's build."""
    cache = tmp_path_factory.mktemp("cache")
    probe(cache)
    return cache / "cache"


def probe(tmp_path, *args, python=sys.executable, env=None, check=True, cache=None):
    """Run `kit probe --json` in a subprocess and return (facts dict, completed process).

    The torch-build cache is fresh (under tmp_path) unless `cache` names one.
    """
    full_env = {**os.environ, "KIT_CACHE_DIR": str(cache or tmp_path / "cache"), **(env or {})}
    done = subprocess.run([python, "-m", "kit", "probe", "--json", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=180)
    if check:
        assert done.returncode == 0, done.stderr
    return (json.loads(done.stdout) if done.returncode == 0 else None), done


def write_module(folder: Path, name: str, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


def write_tool(folder: Path, name: str, stdout: str) -> Path:
    """An executable that prints `stdout`, standing in for a vendor tool (nvidia-smi, rocm-smi...)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.out").write_text(stdout)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\ncat '{folder / (name + '.out')}'\n")
    tool.chmod(0o755)
    return folder


# A pynvml that imports but whose nvmlInit fails, as with a driver/library version mismatch.
BROKEN_NVML = """
class NVMLError(Exception):
    pass

def nvmlInit():
    raise NVMLError("Driver/library version mismatch (simulated)")

def nvmlShutdown():
    pass
"""

# A pynvml answering for two T4s, for the NVML path on a machine that has no NVIDIA driver.
TWO_T4_NVML = """
from types import SimpleNamespace

class NVMLError(Exception):
    pass

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return b"560.35.03"
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return "Tesla T4"
def nvmlDeviceGetCudaComputeCapability(h): return (7, 5)
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=15360 * 2**20, free=15095 * 2**20, used=0)
def nvmlDeviceGetUUID(h): return f"GPU-000{h}-aaaa"
"""

NO_NVML = 'raise ImportError("simulated: nvidia-ml-py not installed")\n'


def assert_reports_installed_torch(torch_facts: dict, dist_version: str) -> None:
    """The probe's torch version is the installed wheel's, whichever index it came from.

    `torch.__version__` carries the build as a local version ("2.14.1+cu130", "+cpu", "+rocm6.4");
    the package metadata does only for wheels from PyTorch's own index: PyPI's CUDA wheel says
    "2.14.1". So the releases must match, and the local part must agree with the build facts.
    """
    release, _, local = torch_facts["version"].partition("+")
    dist_release, _, dist_local = dist_version.partition("+")
    assert release == dist_release
    assert not dist_local or dist_local == local
    if local.startswith("cu"):
        assert torch_facts["cuda"] and not torch_facts["hip"]
    elif local.startswith("rocm"):
        assert torch_facts["hip"] and not torch_facts["cuda"]
    elif local == "cpu":
        assert not torch_facts["cuda"] and not torch_facts["hip"]


# (torch.__version__, the wheel's metadata Version, version.py's cuda, hip) of the three wheel kinds.
WHEELS = {"cuda-pypi": ("2.14.1+cu130", "2.14.1", "13.0", None),
          "cpu-index": ("2.14.1+cpu", "2.14.1+cpu", None, None),
          "rocm-index": ("2.14.1+rocm6.4", "2.14.1+rocm6.4", None, "6.4")}


@pytest.mark.parametrize("wheel", list(WHEELS))
def test_probe_reports_the_torch_of_every_wheel_kind(tmp_path, wheel):
    # Simulated: this machine has one torch wheel; the other kinds are a torch package whose
    # version.py and dist-info metadata say what those wheels' say (item 1 of issue 11: the real
    # probe test compared "2.14.1+cu130" with "2.14.1" and failed on PyPI's CUDA wheel).
    version, dist_version, cuda, hip = WHEELS[wheel]
    site_dir = tmp_path / "site"
    (site_dir / "torch").mkdir(parents=True)
    (site_dir / "torch" / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\nhip = {hip!r}\n")
    (site_dir / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site_dir / f"torch-{dist_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {dist_version}\n")
    facts, _ = probe(tmp_path, env={"PYTHONPATH": str(site_dir)})
    dist = next(importlib.metadata.distributions(name="torch", path=[str(site_dir)]))
    assert facts["torch"]["version"] == version
    assert_reports_installed_torch(facts["torch"], dist.version)


def test_real_probe_of_this_machine(tmp_path):
    facts, _ = probe(tmp_path, env={"HF_TOKEN": "hf_secretvalue123"})
    assert facts["schema"] == 1 and facts["platform"] in platforms.PLATFORMS and facts["platform_detected_by"]
    assert facts["python"] == platform.python_version()
    assert facts["torch"]["installed"] is True
    assert_reports_installed_torch(facts["torch"], importlib.metadata.version("torch"))
    assert isinstance(facts["torch"]["arch_list"], list)
    assert facts["gpu_count"] == len(facts["gpus"])
    assert facts["cpu_count"] >= 1 and facts["ram_bytes"] > 2**30 and facts["disk_free_bytes"] > 0
    assert facts["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert set(facts["packages"]) == {"transformers", "trl", "peft", "bitsandbytes", "unsloth", "accelerate",
                                      "datasets", "huggingface_hub", "liger_kernel", "trackio", "wandb",
                                      "tensorboard"}
    assert facts["packages"]["liger_kernel"] is None  # not installed here: kernels auto reads it as absent
    assert facts["hf_token_available"] is True
    assert "hf_secretvalue123" not in json.dumps(facts)  # presence only, never the value
    if not facts["gpus"]:  # this CPU machine: the reason is recorded, not a crash
        assert "no GPU found" in facts["unknown"]["gpus"]
    load_facts_roundtrip = tmp_path / "facts.json"
    load_facts_roundtrip.write_text(json.dumps(facts))
    assert load_facts(str(load_facts_roundtrip)).to_dict() == facts


def test_probe_neither_imports_torch_nor_starts_cuda(tmp_path):
    code = "import sys, kit.machine.probe; kit.machine.probe.gather(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "KIT_CACHE_DIR": str(tmp_path)}, timeout=180)
    assert done.stdout.strip() == "False", done.stderr


def test_torch_build_is_cached_on_disk(tmp_path):
    first, _ = probe(tmp_path)
    cache = tmp_path / "cache" / "torch_build.json"
    entries = json.loads(cache.read_text())
    (key,) = entries
    assert key.startswith(str(Path(importlib.util.find_spec("torch").origin).parent))
    assert entries[key]["arch_list"] == first["torch"]["arch_list"]
    # Plant a sentinel: a second probe that reports it read the cache instead of starting torch.
    entries[key]["arch_list"] = ["sm_99"]
    cache.write_text(json.dumps(entries))
    second, _ = probe(tmp_path)
    assert second["torch"]["arch_list"] == ["sm_99"]


@pytest.mark.parametrize("entry", [
    {"version": 5, "cuda": [1], "arch_list": "sm_75"},  # valid JSON, wrong types: what the fuzzer planted
    {"version": "2.1", "cuda": None, "hip": None, "installed": True, "arch_list": "sm_75"},
    {"version": "2.1", "cuda": None, "hip": None, "installed": True, "arch_list": [75]},
    {"version": "2.1", "cuda": None, "hip": None, "installed": "yes", "arch_list": []},
    {"version": "2.1", "cuda": None, "hip": None, "installed": True, "arch_list": [], "extra": 1},
    "not an object",
])
def test_a_cache_entry_of_the_wrong_shape_is_a_miss_and_is_rebuilt(tmp_path, warm_cache, entry):
    first, _ = probe(tmp_path, cache=warm_cache)
    cache = tmp_path / "cache"
    cache.mkdir()
    (key,) = json.loads((warm_cache / "torch_build.json").read_text())
    (cache / "torch_build.json").write_text(json.dumps({key: entry}))
    second, _ = probe(tmp_path)
    assert second["torch"] == first["torch"]
    assert json.loads((cache / "torch_build.json").read_text())[key] != entry  # rebuilt, not trusted


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[1]", None])
def test_an_unreadable_cache_file_is_a_miss(tmp_path, warm_cache, content):
    first, _ = probe(tmp_path, cache=warm_cache)
    cache = tmp_path / "cache"
    cache.mkdir()
    if content is None:
        os.mkfifo(cache / "torch_build.json")  # a read would block: it is never opened
    else:
        (cache / "torch_build.json").write_bytes(content)
    second, _ = probe(tmp_path)
    assert second["torch"] == first["torch"]


def test_no_nvml_and_no_tools_on_path_is_recorded_not_a_crash(tmp_path, warm_cache):
    # Simulated: nvidia-ml-py missing (a module that raises ImportError shadows it) and PATH
    # holding no GPU tool at all, as on a machine with no GPU driver.
    fake = write_module(tmp_path / "site", "pynvml", NO_NVML)
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": str(tmp_path / "empty")})
    assert facts["gpus"] == [] and facts["gpu_count"] == 0 and facts["gpu_source"] is None
    reason = facts["unknown"]["gpus"]
    assert "nvidia-ml-py is not" in reason and "(simulated" in reason
    assert "nvidia-smi: not on PATH" in reason and "rocm-smi: not on PATH" in reason


def test_broken_nvml_falls_back_to_nvidia_smi(tmp_path, warm_cache):
    # Simulated: NVML that fails in nvmlInit (a driver/library mismatch) beside a working
    # nvidia-smi (a script printing what nvidia-smi prints for two T4s on Kaggle).
    fake = write_module(tmp_path / "site", "pynvml", BROKEN_NVML)
    smi = write_tool(tmp_path / "bin", "nvidia-smi",
                     "0, Tesla T4, 7.5, 15360, 15095, 560.35.03, GPU-0000\n"
                     "1, Tesla T4, 7.5, 15360, 15095, 560.35.03, GPU-0001\n")
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": f"{smi}:/usr/bin:/bin"})
    assert facts["gpu_source"] == "nvidia-smi" and facts["driver"] == "560.35.03"
    assert [(g["index"], g["name"], g["capability"]) for g in facts["gpus"]] == [(0, "Tesla T4", "7.5"), (1, "Tesla T4", "7.5")]
    assert facts["gpus"][0]["memory_total_bytes"] == 15360 * 2**20
    assert "uuid" not in facts["gpus"][0]  # used for CUDA_VISIBLE_DEVICES matching only
    assert "Driver/library version" in facts["unknown"]["nvml"] and "(simulated)" in facts["unknown"]["nvml"]


def test_nvml_path_and_cuda_visible_devices(tmp_path, warm_cache):
    # Simulated: an NVML that answers for two T4s (this machine has no NVIDIA driver).
    fake = write_module(tmp_path / "site", "pynvml", TWO_T4_NVML)
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake)})
    assert facts["gpu_source"] == "nvml" and facts["gpu_count"] == 2 and facts["driver"] == "560.35.03"
    assert facts["gpus"][1] == {"index": 1, "name": "Tesla T4", "vendor": "nvidia", "capability": "7.5",
                                "memory_total_bytes": 15360 * 2**20, "memory_free_bytes": 15095 * 2**20}
    one, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "CUDA_VISIBLE_DEVICES": "GPU-0001"})
    assert one["gpu_count"] == 1 and one["gpus"][0]["index"] == 0  # renumbered as torch sees it
    none, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "CUDA_VISIBLE_DEVICES": ""})
    assert none["gpu_count"] == 0


def test_amd_tools(tmp_path, warm_cache):
    # Simulated: amd-smi and rocm-smi output (JSON as ROCm 6.x prints it) on a machine without AMD GPUs.
    fake = write_module(tmp_path / "site", "pynvml", NO_NVML)
    amd = [{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
            "vram": {"type": "HBM", "size": {"value": 196592, "unit": "MB"}}, "driver": {"version": "6.10.5"}}]
    tools = write_tool(tmp_path / "amd", "amd-smi", json.dumps(amd))
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": f"{tools}:/usr/bin:/bin"})
    assert facts["gpu_source"] == "amd-smi" and facts["driver"] == "6.10.5"
    assert facts["gpus"][0]["capability"] == "gfx942" and facts["gpus"][0]["memory_total_bytes"] == 196592 * 2**20
    rocm = {"card0": {"Card Series": "AMD Radeon 8060S", "GFX Version": "gfx1151",
                      "VRAM Total Memory (B)": str(64 * 2**30), "VRAM Total Used Memory (B)": str(2**30)}}
    tools = write_tool(tmp_path / "rocm", "rocm-smi", json.dumps(rocm))
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": f"{tools}:/usr/bin:/bin"})
    assert facts["gpu_source"] == "rocm-smi"
    assert facts["gpus"][0] == {"index": 0, "name": "AMD Radeon 8060S", "vendor": "amd", "capability": "gfx1151",
                                "memory_total_bytes": 64 * 2**30, "memory_free_bytes": 63 * 2**30}
    garbled = write_tool(tmp_path / "garbled", "rocm-smi", "WARNING: rocm-smi is deprecated\n{")
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": f"{garbled}:/usr/bin:/bin"})
    assert facts["gpus"] == [] and "rocm-smi: could not" in facts["unknown"]["gpus"]
    assert "(JSONDecodeError" in facts["unknown"]["gpus"]


def test_failing_nvidia_smi_reason_is_recorded(tmp_path, warm_cache):
    fake = write_module(tmp_path / "site", "pynvml", NO_NVML)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    facts, _ = probe(tmp_path, cache=warm_cache, env={"PYTHONPATH": str(fake), "PATH": f"{bin_}:/usr/bin:/bin"})
    assert "nvidia-smi: exit code 9:" in facts["unknown"]["gpus"] and "NVIDIA-SMI has failed" in facts["unknown"]["gpus"]


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory):
    """A real Python with no torch: a fresh venv (no pip, no system site-packages) of this interpreter."""
    venv = tmp_path_factory.mktemp("notorch") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has torch installed globally")
    return python


def test_torch_not_installed(tmp_path, python_without_torch):
    facts, _ = probe(tmp_path, python=python_without_torch)
    assert facts["torch"] == {"installed": False, "version": None, "cuda": None, "hip": None, "arch_list": None}
    assert facts["unknown"]["torch"].startswith("no module named torch")
    assert facts["packages"]["transformers"] is None
    done = subprocess.run([python_without_torch, "-m", "kit", "bootstrap"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "KIT_CACHE_DIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 3
    assert "torch is not installed" in done.stdout and "Traceback" not in done.stderr


def test_broken_torch_import_is_recorded(tmp_path):
    # Simulated: a torch package whose import fails (a half-installed wheel shadowing the real one).
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libtorch_cuda.so: cannot open shared object file (simulated)")\n')
    facts, _ = probe(tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    assert facts["torch"]["installed"] is False
    assert "cannot open shared" in facts["unknown"]["torch"] and "(simulated)" in facts["unknown"]["torch"]
    assert "torch.version" in facts["unknown"]  # no version.py to read either


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "k"))
    assert cache_dir() == str(tmp_path / "k")
    monkeypatch.delenv("KIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == str(tmp_path / "x" / "kit")


@pytest.mark.parametrize("env,exists,expected", [
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, False, ("kaggle", "KAGGLE_KERNEL_RUN_TYPE set")),
    ({}, True, ("kaggle", "/kaggle/working exists")),
    ({"COLAB_RELEASE_TAG": "release-colab_20251201"}, False, ("colab", "COLAB_RELEASE_TAG set")),
    ({"SM_CURRENT_HOST": "algo-1"}, False, ("other", "SM_CURRENT_HOST set (SageMaker)")),
    ({}, False, ("local", "no hosted-notebook marker found")),
    ({"KIT_PLATFORM": "colab", "KAGGLE_KERNEL_RUN_TYPE": "x"}, False, ("colab", "KIT_PLATFORM=colab")),
])
def test_platform_detection(env, exists, expected):
    assert platforms.detect(env, path_exists=lambda p: exists) == expected


def test_platform_defaults():
    assert platforms.defaults("kaggle").session_hours == 12
    assert platforms.defaults("colab").session_hours == 12
    assert platforms.defaults("local").session_hours is None
    assert platforms.defaults("nonsense") == platforms.defaults("other")


def test_a_facts_file_that_is_a_folder_or_a_pipe_is_refused_unread(tmp_path):
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "pipe.json")  # reading it would wait forever for a writer
    with pytest.raises(UsageError, match="is a directory, not a file"):
        load_facts(str(tmp_path / "dir.json"))
    with pytest.raises(UsageError, match="not a regular file"):
        load_facts(str(tmp_path / "pipe.json"))


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list"),
    ('{"platform": "kaggle", "python": "3.11", "gpus": [], "gpu_count": 0}', "lacks torch"),
    ('{"platform": "kaggle", "python": "3.11", "gpu_count": 1, "torch": {"version": "2.10", "cuda": "12.8", "hip": null,'
     ' "arch_list": []}, "gpus": [{"index": 0, "name": "T4"}]}', "lacks gpus[0].capability, gpus[0].memory_total_bytes"),
    ('{"schema": 9}', "has schema 9"),
    ('{"platform": "x", "python": "3", "gpu_count": 1, "torch": {"version": "2", "cuda": null, "hip": null,'
     ' "arch_list": []}, "gpus": [{"index": 0, "name": "T4", "capability": "sm75", "memory_total_bytes": 1}]}',
     "gpus[0].capability 'sm75'"),
])
def test_bad_facts_files(tmp_path, content, message):
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_facts(str(path))


FAKE_CUDA_TORCH = """
__version__ = "2.10.0+cu128"
class version:
    cuda = "12.8"
    hip = None
class _C:
    pass
if {flags!r} is not None:
    _C._cuda_getArchFlags = staticmethod(lambda: {flags!r})
"""


@pytest.mark.parametrize("flags,arch_list", [("sm_70 sm_75 sm_120 compute_120", ["sm_70", "sm_75", "sm_120", "compute_120"]),
                                             (None, None)])
def test_arch_list_of_a_cuda_build(tmp_path, flags, arch_list):
    # Simulated: a CUDA build of torch (this machine's is CPU-only), as a package whose version.py
    # and torch._C answer like torch 2.10.0+cu128's; without _cuda_getArchFlags the list is unknown.
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "version.py").write_text("__version__ = '2.10.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n")
    (fake / "__init__.py").write_text(textwrap.dedent(FAKE_CUDA_TORCH.format(flags=flags)))
    facts, _ = probe(tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    assert facts["torch"] == {"installed": True, "version": "2.10.0+cu128", "cuda": "12.8", "hip": None, "arch_list": arch_list}
    assert ("torch.arch_list" in facts["unknown"]) is (arch_list is None)


def _fake_cuda_torch(tmp_path, library: bytes | None, flags: str | None) -> str:
    site_dir = tmp_path / "site"
    fake = site_dir / "torch"
    (fake / "lib").mkdir(parents=True)
    (fake / "version.py").write_text("__version__ = '2.10.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n")
    (fake / "__init__.py").write_text(textwrap.dedent(FAKE_CUDA_TORCH.format(flags=flags)))
    if library is not None:
        (fake / "lib" / "libtorch_python.so").write_bytes(library)
    return str(site_dir)


def test_arch_list_read_from_the_library_without_importing_torch(tmp_path):
    # Simulated: the string constant CUDA_ARCH_FLAGS inside a CUDA build's libtorch_python.so (this
    # machine's torch is a CPU build). The fake torch would answer "sm_99" if it were imported.
    library = b"\x7fELF" + b"\x00" * 64 + b"sm_80\x00" + b"\x00sm_70 sm_75 sm_120 compute_120\x00" + b"\x01" * 64
    site_dir = _fake_cuda_torch(tmp_path, library, flags="sm_99")
    facts, _ = probe(tmp_path, env={"PYTHONPATH": site_dir})
    assert facts["torch"]["arch_list"] == ["sm_70", "sm_75", "sm_120", "compute_120"]


@pytest.mark.parametrize("library", [None, b"\x00sm_70 sm_75\x00\x00sm_80 sm_90\x00", b"no flags here"],
                         ids=["no-library", "ambiguous", "no-string"])
def test_arch_list_falls_back_to_torch_when_the_library_does_not_say(tmp_path, library):
    site_dir = _fake_cuda_torch(tmp_path, library, flags="sm_75 sm_80")
    facts, _ = probe(tmp_path, env={"PYTHONPATH": site_dir})
    assert facts["torch"]["arch_list"] == ["sm_75", "sm_80"]
