"""The notebook a Kaggle session runs, and its `kernel-metadata.json`.

Kaggle runs a pushed notebook top to bottom, headless, in `/kaggle/working`, and keeps what that
folder holds as the version's output. The cells, in order:

1. the token check: no `HF_TOKEN` (a secret attached in the web UI stays attached to later
   versions; a push cannot attach one) fails the session in seconds, before any install;
2. kit at the pinned commit: fetched from `repo` (that commit alone, no history), installed only
   where kit is not importable;
3. the config (its YAML text), the script rendered for this machine, and training, exactly as
   `notebooks/resume.ipynb` runs it;
4. `kit-outcome.json`: the outcome line, the session record and the log tail, for the scheduler.

No token is ever written here: the training script reads it from the Kaggle secret itself.
"""

from __future__ import annotations

import json
from pathlib import Path

CODE_FILE = "kit-run.ipynb"
OUTCOME_FILE = "kit-outcome.json"
MISSING_TOKEN = "missing HF_TOKEN"  # in the outcome of a session that had no token
ACCELERATOR = "NvidiaTeslaT4"  # 2×T4: a single T4 is not offered; without one Kaggle gives a P100

_TOKEN_CELL = '''\
# 1. The token, first: without it training could not reach the store, so stop before any install.
import json, os
from pathlib import Path

WORK = Path.cwd()


def _has_hf_token():
    if os.environ.get("HF_TOKEN", "").strip():
        return True
    try:
        from kaggle_secrets import UserSecretsClient
    except ImportError:
        return False
    try:
        return bool(UserSecretsClient().get_secret("HF_TOKEN"))
    except Exception as err:  # kaggle_secrets raises its own errors for a secret that is not attached
        print(f"(no Kaggle secret HF_TOKEN: {type(err).__name__})")
        return False


if not _has_hf_token():
    words = ("missing HF_TOKEN: attach a Kaggle secret named HF_TOKEN (a Hugging Face write token) to this notebook "
             "in its editor (Add-ons → Secrets); it stays attached to the versions kit pushes later")
    (WORK / "OUTCOME_FILE").write_text(json.dumps({"outcome": f"failed: {words}"}))
    raise RuntimeError(words)
'''

_KIT_CELL = '''\
# 2. kit at the pinned commit. pip never replaces the platform's torch: kit pins no torch version.
import importlib.util, subprocess, sys

SRC = WORK / "kit-src"
if not SRC.is_dir():  # that one commit only, not the history (GitHub serves a fetch by sha)
    subprocess.run(["git", "init", "--quiet", str(SRC)], check=True)
    subprocess.run(["git", "-C", str(SRC), "fetch", "--quiet", "--depth", "1", KIT_REPO, KIT_COMMIT], check=True)
    subprocess.run(["git", "-C", str(SRC), "checkout", "--quiet", "FETCH_HEAD"], check=True)
if importlib.util.find_spec("kit") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{SRC}[train]"], check=True)
'''

_TRAIN_CELL = '''\
# 3. The config, the script for this machine, then train (or resume) until done or the deadline.
import shlex, time

began = time.time()  # this session's record is the one started since (well before: the render runs first)
sys.path.insert(0, str(SRC))  # this kernel's kit is the pinned commit's, whichever else is installed
from kit.machine.command import launch_argv

config_path = WORK / "kit-config.yaml"
config_path.write_text(CONFIG_YAML)
subprocess.run([sys.executable, "-m", "kit", "render", "--config", str(config_path), "-o", "train_ddp.py",
                "--force"], cwd=SRC, check=True)
cmd = launch_argv(NPROC) + ["--config", str(config_path), f"output_dir={WORK / 'out'}", *OVERRIDES]
print("$", shlex.join(cmd), flush=True)
log = []
with subprocess.Popen(cmd, cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                      start_new_session=True) as proc:
    for line in proc.stdout:
        print(line, end="", flush=True)
        log.append(line)
returncode = proc.returncode
'''

_OUTCOME_CELL = '''\
# 4. One outcome line and kit-outcome.json (kept as this version's output) for the scheduler: the
# outcome is the session record training wrote, read as `kit schedule` reads it, not printed words.
from kit.notebooks.schedule.kaggle_notebook import session_outcome

result = session_outcome(WORK / "out", began, returncode, log)
(WORK / "OUTCOME_FILE").write_text(json.dumps(result))
print(f"outcome: {result['outcome']}")
if result["outcome"].startswith("failed"):
    raise RuntimeError(f"training failed with exit code {returncode}")
'''


def session_outcome(output_dir: Path, began: float, returncode: int | None, log: list[str]) -> dict:
    """What `kit-outcome.json` says of a session, from the record training appended to
    `output_dir/kit_sessions.jsonl` since `began` (the reader `kit schedule` uses locally).

    A run that exited 0 with a record says the record's words ("paused at step 40 of 60",
    "complete: step 60 of 60"); one that failed, or left no record, says its exit code and last
    log line. `session` is the record itself (None when there is none), `log_tail` the last 40 lines.
    """
    from kit.notebooks.schedule.papermill_run import session_since
    from kit.notebooks.schedule.stops import words_of
    from kit.checkpoints.session_records import LOCAL

    path = Path(output_dir) / LOCAL
    record = session_since(path, began)
    last = next((line.strip() for line in reversed(log) if line.strip()), "no output")[:300]
    if returncode == 0 and record is not None:
        outcome = words_of(record)
    elif returncode == 0:
        outcome = f"failed: training exited 0 but left no session record in {path}: {last}"
    else:
        outcome = f"failed (exit code {returncode}): {last}"
    return {"outcome": outcome, "returncode": returncode, "session": record, "log_tail": "".join(log[-40:])}


def _code(source: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags or []}, "execution_count": None, "outputs": [],
            "source": source.replace("OUTCOME_FILE", OUTCOME_FILE)}


def notebook(*, repo: str, commit: str, config_yaml: str, overrides: list[str], nproc: int) -> dict:
    """The run notebook as nbformat-4 JSON. `overrides` must already be free of tokens."""
    settings = (f"# Settings, written by `kit schedule --kaggle`. No token here: the secret HF_TOKEN is read "
                f"by the training script.\nKIT_REPO = {repo!r}\nKIT_COMMIT = {commit!r}\nNPROC = {int(nproc)}\n"
                f"OVERRIDES = {list(overrides)!r}\nCONFIG_YAML = {config_yaml!r}\n")
    intro = ("# kit: resume a fine-tuning job (pushed by `kit schedule --kaggle`)\n\nEach version trains from "
             "the newest checkpoint in the store until the job is complete or the session ends; "
             f"`{OUTCOME_FILE}` tells the scheduler how it went.")
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}},
            "cells": [dict(cell, id=f"kit-{i}") for i, cell in enumerate([
                {"cell_type": "markdown", "metadata": {}, "source": intro}, _code(settings, ["parameters"]),
                _code(_TOKEN_CELL), _code(_KIT_CELL), _code(_TRAIN_CELL), _code(_OUTCOME_CELL)])]}


def metadata(ref: str) -> dict:
    """`kernel-metadata.json`: private, internet on (the Hub), 2×T4."""
    slug = ref.split("/")[1]
    return {"id": ref, "title": slug, "code_file": CODE_FILE, "language": "python", "kernel_type": "notebook",
            "is_private": True, "enable_gpu": True, "enable_tpu": False, "enable_internet": True,
            "machine_shape": ACCELERATOR, "dataset_sources": [], "competition_sources": [],
            "kernel_sources": [], "model_sources": [], "keywords": []}


def write(folder: Path, ref: str, **notebook_args) -> Path:
    """Write the notebook and its metadata into `folder` (what `kaggle kernels push -p` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CODE_FILE).write_text(json.dumps(notebook(**notebook_args), indent=1))
    (folder / "kernel-metadata.json").write_text(json.dumps(metadata(ref), indent=1))
    return folder
