"""Shared test setup: the `gpu` marker that skips without a CUDA GPU, and cleanup of any process
group a test left behind (a leaked group makes the next test's init fail or hang).

Plain `python -m pytest` is the fast tier (setup.cfg's addopts: `-m "not slow"`), on two worker
processes (`pytest_cmdline_main` below); README's test command adds `-m "slow or not slow"` and runs
every test. `slow` marks the end-to-end tests (real torchrun, papermill, Jupyter kernels, kill -9,
multi-second training subprocesses); `gpu` the ones that need a CUDA GPU (tests/test_gpu.py)."""

import os
import sys
from pathlib import Path

import pytest

# The suite must not depend on the caller's Hugging Face environment: HF_HUB_OFFLINE=1 (common on
# Kaggle and offline setups) is read once, when huggingface_hub is imported, and would turn the
# local test Hub off; a real token or endpoint would point tests at the real Hub. Cleared before any
# test module imports huggingface_hub; tests that need one of these set it themselves.
CALLER_HF_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN",
                  "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_TOKEN_PATH")
for _var in CALLER_HF_VARS:
    os.environ.pop(_var, None)
if "huggingface_hub.constants" in sys.modules:
    # A pytest plugin (or `-p`) imported huggingface_hub before this file ran, so its constants hold
    # the caller's values (offline mode blocks every request in-process): read them again, now.
    import importlib

    importlib.reload(sys.modules["huggingface_hub.constants"])

# Compiled modules are cached (in __pycache__/, which git ignores) even where the caller's environment sets
# PYTHONDONTWRITEBYTECODE: the full suite starts some 400 Python processes (script runs, torchrun ranks,
# kernels), each of which would compile kit from source again, and every pytest process would rewrite the
# asserts of every test module again (about 6 s of CPU per process on 2 cores). Set before any test module
# is imported; the processes the tests start inherit the environment.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# One intra-op thread, as torchrun gives each rank (tests.scripts.cpu_env does the same for
# subprocesses): in-process tests run two at a time under xdist, and two workers each spinning up
# one OpenMP thread per core on 2 cores slow both down many times over.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent

# The stderr of the session as this file is imported: pytest's own capture (started before conftest files are
# loaded, closed only at the end) or the terminal under -s. What a library imported at collection writes to.
SESSION_STDERR = sys.stderr
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Plain `python -m pytest` (no test paths, no -n) runs on two worker processes where this machine has
    two cores or more: the fast tier is some 1,900 in-process tests, and one process uses one core.
    Named files or tests (`pytest tests/test_x.py -k …`), -n, `-p no:xdist`, --pdb and --collect-only
    are left as given.

    The two workers steal work (`--dist worksteal`): each starts on its half of the tests in collection
    order (whole modules stay together, so a module's fixtures are built once) and one that runs out
    takes half of what the other has left. With `--dist load` a worker kept the tests queued for it, and
    a few multi-second ones queued last (a watchdog's timeout, a subprocess's imports) ran alone while
    the other core idled."""
    from _pytest.config import Config

    if (getattr(config.option, "numprocesses", 0) is None and config.args_source == Config.ArgsSource.TESTPATHS
            and not hasattr(config, "workerinput") and not config.getoption("usepdb", False)
            and not config.getoption("collectonly", False) and (os.cpu_count() or 1) >= 2):
        config.option.numprocesses = 2
        if config.option.dist == "no":
            config.option.dist = "worksteal"
    if hasattr(config.option, "loadscopereorder"):
        # --dist loadfile hands out whole modules in the order pytest_collection_modifyitems leaves them;
        # xdist's default re-sorts them by their number of tests, which puts the modules of a few long
        # end-to-end tests (FSDP, two nodes, preference trainers) last, running alone while a core idles.
        config.option.loadscopereorder = False


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    _longest_modules_first(items)
    has_gpu = None
    for item in items:
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = _has_cuda()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


def _longest_modules_first(items) -> None:
    """Modules with the most end-to-end tests first, each module's tests in their own order.

    With `pytest -n 2 --dist loadfile` (README's command) each worker takes whole modules in this
    order as it becomes free: a long module picked up last would run alone at the end while the
    other core idles. Deterministic, so every xdist worker collects the same order."""
    slow, first = {}, {}
    for i, item in enumerate(items):
        module = item.nodeid.split("::")[0]
        first.setdefault(module, i)
        slow[module] = slow.get(module, 0) + ("slow" in item.keywords)
    items.sort(key=lambda it: (-slow[it.nodeid.split("::")[0]], first[it.nodeid.split("::")[0]]))


@pytest.fixture(autouse=True)
def _destroy_leftover_process_group():
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def _library_log_handlers_outlive_the_test():
    """A library's log handlers keep the sys.stderr of the moment the library was imported (torch, transformers,
    datasets and TRL each add a StreamHandler then). Imported during a test that captures its output (capfd,
    capsys), they held that test's capture stream, which pytest closes after it: every later warning of the
    library printed a `--- Logging error ---` traceback (I/O operation on closed file) into the next tests'
    stderr (test_export's one-line checks failed after test_bad_input's in-process script runs). Such handlers
    get the session's stderr, as if the library had been imported at collection."""
    modules = len(sys.modules)
    yield
    if len(sys.modules) != modules:  # a test that imported nothing new added no library handler
        import logging

        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", ()):
                if not isinstance(handler, logging.StreamHandler):
                    continue
                if getattr(handler.stream, "closed", False):
                    handler.stream = SESSION_STDERR
                flush = vars(handler).get("flush")  # transformers sets that stream's own flush on its handler
                if getattr(getattr(flush, "__self__", None), "closed", False):
                    handler.flush = SESSION_STDERR.flush


@pytest.fixture
def repo_root() -> Path:
    return ROOT
