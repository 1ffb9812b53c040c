"""The notebook a Kaggle session runs, and its `kernel-metadata.json`.

Kaggle runs a pushed notebook top to bottom, headless, in `/kaggle/working`, and keeps what that
folder holds as the version's output. The cells, in order:

1. the token check: no `HF_TOKEN` (a secret attached in the web UI stays attached to later
   versions; a push cannot attach one) fails the session in seconds, before any install;
2. kit at the pinned commit: cloned from `repo`, installed only where kit is not importable;
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
if not SRC.is_dir():
    subprocess.run(["git", "clone", "--quiet", KIT_REPO, str(SRC)], check=True)
    subprocess.run(["git", "-C", str(SRC), "checkout", "--quiet", KIT_COMMIT], check=True)
if importlib.util.find_spec("kit") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{SRC}[train]"], check=True)
'''

_TRAIN_CELL = '''\
# 3. The config, the script for this machine, then train (or resume) until done or the deadline.
import re, shlex, signal

config_path = WORK / "kit-config.yaml"
config_path.write_text(CONFIG_YAML)
subprocess.run([sys.executable, "-m", "kit", "render", "--config", str(config_path), "-o", "train_ddp.py",
                "--force"], cwd=SRC, check=True)
launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}"]
cmd = (launcher if NPROC > 1 else [sys.executable]) + ["train_ddp.py", "--config", str(config_path)]
cmd += [f"output_dir={WORK / 'out'}", *OVERRIDES]
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
# 4. One outcome line and kit-outcome.json (kept as this version's output) for the scheduler.
said = re.findall(r"\\[kit\\] (paused at step \\d+ of \\d+|complete: step \\d+ of \\d+|already complete: step \\d+ of \\d+)",
                  "".join(log))
sessions = WORK / "out" / "kit_sessions.jsonl"
lines = sessions.read_text().splitlines() if sessions.exists() else []
if said and returncode == 0:
    outcome = said[-1]
else:
    last = next((line.strip() for line in reversed(log) if line.strip()), "no output")
    outcome = f"failed (exit code {returncode}): {last[:300]}"
(WORK / "OUTCOME_FILE").write_text(json.dumps({
    "outcome": outcome, "returncode": returncode, "session": json.loads(lines[-1]) if lines else None,
    "log_tail": "".join(log[-40:])}))
print(f"outcome: {outcome}")
if outcome.startswith("failed"):
    raise RuntimeError(f"training failed with exit code {returncode}")
'''


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
