"""Bad input, as a new user or a hostile one types it: config, data, hardware facts, CLI, the
generated script and secrets.

Every case runs in a temp copy of the repo's configs, data, model and script, with a fake token
in HF_TOKEN, and asserts the same contract: the right exit code, exactly one `error:` line with
the expected words, no traceback, every file that was there before unchanged, and the token
nowhere in the output or in any file the case wrote. Most cases run in-process through
`kit.cli.main([...])` or the script's own `__main__` block (runpy), a few through the real script.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest

from kit.cli import main
from tests.scripts import ROOT, cpu_env

TOKEN = "hf_" + "fakeBADinputTOKEN" + "0123456789abcd"  # set as HF_TOKEN: must never come back
OTHER = "hf_" + "someoneELSEStoken" + "9876543210zyxw"  # token-shaped, not this environment's
MACHINES = ROOT / "tests" / "fixtures" / "machines"
T4X2 = json.loads((MACHINES / "kaggle_t4x2.json").read_text())


# ---- the sandbox and the contract -------------------------------------------------------------
@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A temp copy of what a user's checkout holds, as the working directory, with the fake token set."""
    box = tmp_path / "box"
    box.mkdir()
    for name in ("configs", "data", "models"):
        shutil.copytree(ROOT / name, box / name)
    shutil.copy(ROOT / "train_ddp.py", box / "train_ddp.py")
    (box / "mine.py").write_text("# a script with my own edits\n")
    monkeypatch.chdir(box)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read HF_HUB_OFFLINE when it was imported (conftest had cleared it): in-process
    # cases would otherwise try the real Hub (a missing model id: 23 s of retries, then the same error).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("KIT_PLATFORM", "local")
    return box


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_contract(box: Path, before: dict, code: int, out: str, err: str, want_code: int, want: str,
                   *, one_line_stderr: bool = True) -> None:
    assert code == want_code, f"exit {code}, wanted {want_code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    if one_line_stderr:
        assert [line for line in err.splitlines() if line.strip()] == errors, err
    assert re.search(want, errors[0]), errors[0]
    assert "Traceback" not in out + err
    assert TOKEN not in out + err and OTHER not in out + err
    after = snapshot(box)
    changed = [p for p, h in before.items() if after.get(p) != h]
    assert not changed, f"overwritten or removed: {changed}"
    for rel, digest in after.items():  # what the case wrote: never a token
        if before.get(rel) != digest:
            text = (box / rel).read_bytes()
            assert TOKEN.encode() not in text and OTHER.encode() not in text, rel


def write(box: Path, name: str, content) -> str:
    path = box / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return name


def facts(**changes) -> dict:
    d = json.loads(json.dumps(T4X2))
    for key, value in changes.items():
        if value is _DROP:
            d.pop(key)
        else:
            d[key] = value
    return d


_DROP = object()
CONTRACT_ONLY = {"platform": "kaggle", "python": "3.11.13",
                 "torch": {"version": "2.10.0+cu128", "cuda": "12.8", "hip": None, "arch_list": ["sm_75", "sm_80"]},
                 "gpus": [{"index": i, "name": "Tesla T4", "capability": "7.5", "memory_total_bytes": 15637086208}
                          for i in range(2)], "gpu_count": 2}


def notebook_with_token() -> str:
    """A real training notebook whose first cell logs in with a literal token, as people write it."""
    nb = json.loads((ROOT / "tests/fixtures/notebooks/tiny_cpu_sft.ipynb").read_text())
    nb["cells"].insert(0, {"cell_type": "code", "id": "login", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": ["from huggingface_hub import login\n", f"login(token=\"{OTHER}\")\n"]})
    return json.dumps(nb)


# ---- CLI cases: (id, files to create, argv, exit code, words of the error) ---------------------
CLI_CASES = [
    # config
    ("yaml-malformed", {"c.yaml": "model: x\nlora:\n  r: 8\n   alpha: [1\n"}, ["plan", "--config", "c.yaml"], 2,
     r"malformed YAML in c.yaml line \d"),
    ("yaml-list", {"c.yaml": "- a\n- b\n"}, ["plan", "--config", "c.yaml"], 2, "must be a mapping"),
    ("yaml-not-utf8", {"c.yaml": b"\xff\xfe model: x"}, ["plan", "--config", "c.yaml"], 2, "not UTF-8"),
    ("yaml-missing", {}, ["plan", "--config", "nope.yaml"], 2, "cannot read config nope.yaml"),
    ("yaml-is-a-folder", {}, ["plan", "--config", "configs"], 2, "cannot read config configs"),
    ("key-typo", {"c.yaml": "lerning_rate: 0.1\n"}, ["plan", "--config", "c.yaml"], 2, "did you mean 'learning_rate'"),
    ("key-alias", {}, ["plan", "lr=0.1"], 2, "did you mean 'learning_rate'"),
    ("key-nested-typo", {}, ["plan", "lora.rr=3"], 2, "did you mean 'lora.r'"),
    ("key-strategy", {}, ["plan", "strategy=zero3"], 2, r"strategy.*zero3.*expected one of auto\|ddp\|fsdp\|model_parallel"),
    ("key-by-value", {}, ["plan", "dtype=bf16"], 2, "did you mean 'precision=bf16'"),
    # What the script found only after loading the model, found by the planner.
    ("plan-data-missing", {}, ["plan", "data.path=nope.jsonl"], 2, "data file nope.jsonl does not exist \\(data.path\\)"),
    ("render-seq-len-past-the-model", {}, ["render", "--config", "configs/default.yaml", "seq_len=4096", "-o", "t.py"],
     2, "seq_len=4096 is longer than models/tiny-qwen3's max_position_embeddings=1024"),
    ("bootstrap-data-missing", {}, ["bootstrap", "--config", "configs/default.yaml", "data.path=d/x.csv"], 2,
     "data file d/x.csv does not exist"),
    ("model-hf-scheme", {}, ["plan", "model=hf://Qwen/Qwen3-8B"], 2, "repo id alone, e.g. 'Qwen/Qwen3-8B'"),
    ("model-double-slash", {"c.yaml": "model: Qwen//Qwen3-8B\n"}, ["render", "--config", "c.yaml", "-o", "t.py"], 2,
     "not a Hub repo id"),
    ("model-url", {"c.yaml": "model: https://hf.co/Qwen/Qwen3-8B\n"}, ["bootstrap", "--config", "c.yaml"], 2,
     "web address"),
    ("store-bucket", {"c.yaml": "store: gs://my-bucket/ckpts\n"}, ["render", "--config", "c.yaml", "-o", "t.py"], 2,
     "a store is hf://owner/name or a local directory"),
    ("choice-typo", {}, ["plan", "precision=bf61"], 2, "expected one of auto|bf16|fp16|fp32 \\(did you mean 'bf16'"),
    ("method-typo", {}, ["plan", "method=qlorra"], 2, "did you mean 'qlora'"),
    ("int-word", {"c.yaml": "seq_len: long\n"}, ["plan", "--config", "c.yaml"], 2, "must be an integer, got 'long'"),
    ("int-bool", {}, ["plan", "max_steps=true"], 2, "must be an integer, got True"),
    ("negative-batch", {}, ["plan", "per_device_batch=-4"], 2, "must be > 0, got -4"),
    ("negative-lr", {}, ["plan", "learning_rate=-1"], 2, ">= 0"),
    ("dropout-range", {}, ["plan", "lora.dropout=1.5"], 2, r"in \[0, 1\)"),
    ("eval-fraction", {}, ["plan", "data.eval_fraction=1"], 2, r"in \[0, 1\)"),
    ("section-not-mapping", {"c.yaml": "lora: 5\n"}, ["plan", "--config", "c.yaml"], 2, "must be a mapping"),
    ("columns-list", {}, ["plan", "data.columns=[a, b]"], 2, "mapping of column names"),
    ("targets-empty", {}, ["plan", "lora.target_modules=[]"], 2, "list of module names"),
    ("override-no-equals", {}, ["plan", "lora.r"], 2, "is not KEY=VALUE"),
    ("null-required", {}, ["plan", "seq_len=null"], 2, "must not be null"),
    ("batch-indivisible", {}, ["plan", "--gpus", "2xT4", "global_batch=5"], 2, "global_batch 5"),
    ("unknown-model", {}, ["plan", "--gpus", "T4", "model=someone/Unknown-13B"], 2, "not in kit's table"),
    ("yaml-alias-bomb", {"c.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{k}: &{k} [{', '.join(['*' + p] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi")) + "model: *i\n"},
     ["plan", "--config", "c.yaml"], 2, "expands to over 10,000 values"),
    ("alias-bomb-override", {}, ["plan", "lora.target_modules=[&a [x, x, x, x], [*a, *a, *a, *a], "
                                         + ", ".join(["[*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]"] * 1100) + "]"], 2,
     "override 'lora.target_modules' expands to over 10,000 values"),
    ("yaml-huge-int", {"c.yaml": "seed: 1" + "0" * 5000 + "\n"}, ["plan", "--config", "c.yaml"], 2,
     "config c.yaml holds a value too large or nested too deep"),
    ("yaml-deep", {"c.yaml": "model: " + "[" * 50_000 + "]" * 50_000 + "\n"}, ["plan", "--config", "c.yaml"], 2,
     "c.yaml"),
    ("override-huge-int", {}, ["plan", "seed=1" + "0" * 5000], 2, "override 'seed': a value too large"),
    ("override-deep", {}, ["plan", "max_steps=" + "[" * 50_000], 2, "max_steps"),
    ("facts-huge-int", {"f.json": '{"schema": 1' + "0" * 5000 + "}"}, ["plan", "--facts", "f.json"], 2,
     r"facts file f.json is not usable JSON \(a number over 4,300 digits\)"),
    ("facts-deep", {"f.json": "[" * 100_000 + "]" * 100_000}, ["plan", "--facts", "f.json"], 2,
     r"facts file f.json is not usable JSON \(nested too deeply"),
    ("config-is-a-device", {}, ["plan", "--config", "/dev/zero"], 2, "cannot read config /dev/zero: not a regular file"),
    ("float-nan", {}, ["plan", "learning_rate=.nan"], 2, "'learning_rate'.*must be a finite number"),
    ("float-inf", {"c.yaml": "epochs: .inf\n"}, ["plan", "--config", "c.yaml"], 2, "'epochs' in c.yaml.*finite"),
    ("float-nan-render", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "t.py",
                              "max_grad_norm=.nan"], 2, "'max_grad_norm'.*finite"),
    ("seed-negative", {}, ["plan", "seed=-1"], 2, r"'seed'.*must be in \[0, 2\*\*32\)"),
    ("seed-huge", {}, ["plan", f"seed={2**40}"], 2, r"'seed'.*must be in \[0, 2\*\*32\)"),
    ("output-dir-empty", {}, ["plan", "output_dir="], 2, "'output_dir'.*must not be empty"),
    ("model-empty", {}, ["plan", "model=' '"], 2, "'model'.*must not be empty"),
    ("path-control-char", {"c.yaml": 'output_dir: "a\\nb"\n'}, ["plan", "--config", "c.yaml"], 2,
     "'output_dir' in c.yaml holds a control character"),
    ("override-flow-key-twice", {}, ["plan", "lora={r: 4, r: 8}"], 2, "override 'lora': key 'r' is given twice"),
    # An empty option value was taken as not given: a merge into the default folder, no plot, this machine.
    ("export-o-empty", {}, ["export", "--adapter", "a", "-o", ""], 2, "argument -o: an empty value"),
    ("plan-gpus-empty", {}, ["plan", "--gpus="], 2, "argument --gpus: an empty value"),
    ("status-plot-empty", {}, ["status", "--config", "configs/default.yaml", "--plot", ""], 2,
     "argument --plot: an empty value"),
    ("render-o-names-a-folder", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "newdir/"], 2,
     r"-o newdir/: names a folder \(it ends in /\): give a file name such as newdir/train_ddp.py"),  # was a file 'newdir'
    ("bootstrap-o-names-a-folder", {}, ["bootstrap", "--config", "configs/default.yaml", "-o", "newdir/"], 2,
     r"-o newdir/: names a folder"),
    # A name past 255 bytes: the script's first touch of output_dir was an OSError traceback.
    ("path-name-too-long", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "t.py",
                                "output_dir=runs/" + "z" * 300], 2, "'output_dir'.*'zzz.* is 300 bytes long, over the 255"),
    ("data-name-too-long", {}, ["plan", "data.path=d/" + "é" * 130 + ".jsonl"], 2, "'data.path'.* 266 bytes long"),
    ("unsloth-on-cpu", {}, ["plan", "backend=unsloth"], 3, "backend=unsloth needs a CUDA GPU"),
    ("model-config-negative", {"m/config.json": {"hidden_size": 0, "num_hidden_layers": -2, "num_attention_heads": 4,
                                                 "intermediate_size": 8, "vocab_size": 10, "head_dim": 8}},
     ["plan", "model=m"], 2, "num_hidden_layers -2, hidden_size 0: not a model"),
    ("model-config-heads", {"m/config.json": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0,
                                              "intermediate_size": 8, "vocab_size": 10}}, ["plan", "model=m"], 2,
     "lacks a decoder-only shape"),
    ("model-config-list", {"m/config.json": [1, 2]}, ["plan", "model=m"], 2,
     "model config m/config.json holds a JSON list, not an object"),
    ("gpus-huge", {}, ["plan", "--gpus", "100000000xH100"], 2, "the count must be 1 to 16"),
    ("gpus-sum-too-many", {}, ["plan", "--gpus", "9xH100+9xH100"], 2, "18 GPUs; one machine has at most 16"),
    ("nproc-zero-cpu", {}, ["plan", "--nproc", "0"], 2, "--nproc 0: use at least 1 process"),
    ("render-o-device", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "/dev/null"], 2,
     "-o /dev/null: not a regular file"),
    # CLI
    ("unknown-command", {}, ["trian"], 2, "unknown command 'trian'"),
    ("unknown-flag", {}, ["plan", "--bogus"], 2, "unrecognized arguments: --bogus"),
    ("gpus-option-like", {}, ["plan", "--gpus", "-1xT4"], 2, "write --gpus=-1xT4"),
    ("gpus-negative", {}, ["plan", "--gpus=-1xT4"], 2, "must be 1 to 16.*got -1"),
    ("gpus-zero", {}, ["plan", "--gpus", "0xT4"], 2, "must be 1 to 16.*got 0"),
    ("gpus-unknown", {}, ["plan", "--gpus", "3xGTX1080"], 2, "unknown GPU 'GTX1080'"),
    ("gpus-and-facts", {}, ["plan", "--gpus", "2xT4", "--facts", "f.json"], 2, "not allowed with"),
    ("nproc-too-many", {}, ["plan", "--gpus", "2xT4", "--nproc", "5"], 2, "nproc 5"),
    ("nproc-not-int", {}, ["plan", "--nproc", "two"], 2, "invalid int value: 'two'"),
    ("render-no-config", {}, ["render", "-o", "x.py", "--config", "configs/nope.yaml"], 2, "nope.yaml"),
    ("render-o-folder", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "configs"], 2,
     "-o configs: is a directory"),
    ("render-o-no-folder", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "no/such/x.py"],
     2, "folder no/such does not exist"),
    ("render-o-under-file", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "mine.py/x.py"],
     2, "is not a directory"),
    ("render-o-is-the-config", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o",
                                    "./configs/../configs/default.yaml", "--force"], 2, "is the config .* itself"),
    ("bootstrap-o-is-the-config", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "--config",
                                       "configs/default.yaml", "-o", "configs/default.yaml"], 2, "itself"),
    # `-o -` wrote a file named '-': render prints the script (as --stdout), the others refuse it.
    ("bootstrap-o-dash", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "--config",
                              "configs/default.yaml", "-o", "-"], 2, "-o -: this command writes a file, not to standard"),
    ("convert-o-dash", {"nb.ipynb": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}},
     ["convert", "nb.ipynb", "-o", "-"], 2, "-o -: this command writes a file"),
    ("convert-nbformat3-with-v4-cells", {"nb.ipynb": {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [], "source": "trainer.train()"}]}},
     ["convert", "nb.ipynb", "-o", "nb.py"], 2, "nbformat cannot read this notebook"),
    ("convert-nested-json", {"nb.ipynb": "[" * 100_000 + "]" * 100_000}, ["convert", "nb.ipynb", "-o", "nb.py"], 2,
     r"nb.ipynb: not usable JSON \(nested too deeply"),
    ("bootstrap-o-folder", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "--config",
                                "configs/default.yaml", "-o", "data"], 2, "-o data: is a directory"),
    ("schedule-every", {}, ["schedule", "--every", "-1"], 2, "argument --every: must be a number above 0"),
    ("status-plot-nothing", {}, ["status", "--plot", "p.png", "output_dir=outputs/none"], 2, "nothing to plot"),
    ("status-store-symlink-loop", {}, ["status", "store=loop/x", "output_dir=outputs/none"], 4,
     "reading kit/lease.lock from directory loop/x failed: Too many levels of symbolic links"),
    ("status-store-under-a-file", {}, ["status", "store=mine.py/store", "output_dir=outputs/none"], 4,
     "from directory mine.py/store failed: Not a directory"),
    ("status-bad-store-key", {}, ["status", "stor=x"], 2, "did you mean 'store'"),
    # hardware: the machine cannot train (3), and facts files (2)
    ("p100-plan", {}, ["plan", "--gpus", "1xP100"], 3, "sm_60.*assumed for --gpus"),
    ("p100-plan-json", {}, ["plan", "--gpus", "1xP100", "--json"], 3, "sm_60"),
    ("p100-render", {}, ["render", "--config", "configs/default.yaml", "--gpus", "2xP100", "-o", "p.py"], 3, "sm_60"),
    ("p100-bootstrap", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_p100.json"), "--config",
                            "configs/default.yaml", "-o", "mine.py"], 3, "sm_60|cannot train"),
    ("facts-missing", {}, ["plan", "--facts", "nope.json"], 2, "facts file 'nope.json' does not exist"),
    ("facts-not-json", {"f.json": "{\n  \"platform\": kaggle\n}"}, ["plan", "--facts", "f.json"], 2, "at line 2"),
    ("facts-list-plan", {"f.json": [1, 2]}, ["plan", "--facts", "f.json"], 2, "holds a JSON list"),
    ("facts-list-render", {"f.json": [1, 2]}, ["render", "--config", "configs/default.yaml", "--facts", "f.json"], 2,
     "holds a JSON list"),
    ("facts-list-bootstrap", {"f.json": [1, 2]}, ["bootstrap", "--facts", "f.json"], 2, "holds a JSON list"),
    ("facts-not-utf8", {"f.json": b"\xff{}"}, ["plan", "--facts", "f.json"], 2, "facts file f.json is not UTF-8 text"),
    ("facts-no-torch", {"f.json": facts(torch=_DROP)}, ["plan", "--facts", "f.json"], 2, "lacks torch"),
    ("facts-gpus-dict", {"f.json": facts(gpus={"0": 1})}, ["plan", "--facts", "f.json"], 2, "not a list of objects"),
    ("facts-capability", {"f.json": facts(gpus=[{**T4X2["gpus"][0], "capability": "seven"}], gpu_count=1)},
     ["plan", "--facts", "f.json"], 2, "capability 'seven'"),
    ("facts-count-mismatch", {"f.json": facts(gpu_count=5)}, ["bootstrap", "--facts", "f.json"], 2,
     "gpu_count 5 but lists 2"),
    ("facts-packages-list", {"f.json": facts(packages=["trl"])}, ["plan", "--facts", "f.json"], 2,
     "packages = \\['trl'\\]; expected an object"),
    ("facts-memory-text", {"f.json": facts(gpus=[{**T4X2["gpus"][0], "memory_total_bytes": "16GB"}], gpu_count=1)},
     ["render", "--config", "configs/default.yaml", "--facts", "f.json", "-o", "r.py"], 2, "memory_total_bytes"),
    ("facts-schema", {"f.json": facts(schema=2)}, ["plan", "--facts", "f.json"], 2, "schema 2"),
    ("facts-memory-null", {"f.json": facts(gpus=[{**g, "memory_total_bytes": None} for g in T4X2["gpus"]])},
     ["render", "--config", "configs/default.yaml", "--facts", "f.json", "-o", "r.py"], 2,
     "GPU 0's memory could not be read"),
    ("facts-gpu-name-null", {"f.json": facts(gpus=[{**T4X2["gpus"][0], "name": None}], gpu_count=1)},
     ["bootstrap", "--facts", "f.json", "--config", "configs/default.yaml", "-o", "t.py"], 2,
     "gpus\\[0\\].name = None; expected a string"),
    # secrets: refused, never echoed
    ("token-max-steps", {}, ["plan", f"max_steps={TOKEN}"], 2, "'max_steps'.*looks like a Hugging Face token"),
    ("token-store-render", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "t.py",
                                f"store={TOKEN}"], 2, "'store'.*token"),
    ("token-other-model", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", "t.py",
                               f"model=me/{OTHER}"], 2, "'model'.*token"),
    ("token-as-key", {}, ["plan", f"{TOKEN}=1"], 2, r"unknown config key '\*\*\*'"),
    ("bootstrap-overrides-without-config", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"),
                                                "lora.r=8"], 2, "lora.r=8: config overrides need --config"),
    ("lr-huge", {}, ["plan", "learning_rate=1e300"], 2, "'learning_rate' in command line must be at most 1"),
    ("lora-targets-empty-name", {}, ["plan", "lora.target_modules=['']"], 2, "must be 'all-linear' or a list"),
    ("lora-targets-empty", {}, ["plan", "lora.target_modules=''"], 2, "must be 'all-linear' or a list"),
    ("token-in-yaml", {"c.yaml": f"store: hf://me/x\nmodel: {OTHER}\n"}, ["plan", "--config", "c.yaml"], 2,
     "'model' in c.yaml.*token"),
    ("token-in-config-path", {f"{OTHER}.yaml": "max_steps: 3\n"},
     ["render", "--config", f"{OTHER}.yaml", "--gpus", "cpu", "-o", "t.py"], 2, "the script for t.py.*token"),
    ("token-in-output-name", {}, ["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", f"{TOKEN}.py"],
     2, "token"),
    ("token-in-facts", {"f.json": facts(platform=OTHER)},
     ["bootstrap", "--facts", "f.json", "--config", "configs/default.yaml", "-o", "t.py"], 2, "token"),
    ("token-bootstrap-override", {}, ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "--config",
                                      "configs/default.yaml", "-o", "mine.py", f"data.path={TOKEN}.jsonl"], 2, "token"),
    ("token-status-store", {}, ["status", f"store={TOKEN}"], 2, "token"),
    ("token-schedule", {}, ["schedule", "--store", TOKEN, "--print-cron"], 2, "refusing to pass a token"),
    ("token-lora", {}, ["plan", f"lora.target_modules=[q_proj, {TOKEN}]"], 2, "token"),
    # a file name whose bytes are not UTF-8 (kit writes paths into scripts and commands as UTF-8)
    ("path-not-utf8-config", {"c\udcff.yaml": "max_steps: 3\n"},
     ["render", "--config", "c\udcff.yaml", "--gpus", "cpu", "-o", "t.py"], 2, r"c\\xff.yaml: .*not UTF-8"),
    ("path-not-utf8-output", {}, ["bootstrap", "--gpus", "cpu", "-o", "t\udce9.py"], 2, r"t\\xe9.py: .*not UTF-8"),
    ("token-schedule-config", {f"{OTHER}.yaml": "max_steps: 3\n"}, ["schedule", "--config", f"{OTHER}.yaml",
                                                                     "--print-cron"], 2, "refusing to pass a token"),
]


@pytest.mark.parametrize("files,argv,code,want", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(sandbox, capsys, files, argv, code, want):
    (sandbox / "loop").symlink_to(sandbox / "loop")  # a symlink loop, for the store cases
    for name, content in files.items():
        write(sandbox, name, notebook_with_token() if content == "TOKEN_NOTEBOOK" else content)
    before = snapshot(sandbox)
    got = main(list(argv))
    out, err = capsys.readouterr()
    check_contract(sandbox, before, got, out, err, code, want)


# ---- the generated script, in-process (its real __main__ block, through runpy) ------------------
GOOD_ROWS = [json.loads(line) for line in (ROOT / "data" / "ha_commands.jsonl").read_text().splitlines()[:24]]


def jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


SCRIPT_CASES = [
    ("data-missing", {}, ["data.path=data/nope.jsonl"], 2, "data file data/nope.jsonl does not exist"),
    ("data-empty", {"d.jsonl": ""}, ["data.path=d.jsonl"], 2, "is empty"),
    # The format pinned, or a data.columns entry naming a missing column: "match no format" misled.
    ("data-format-pinned", {}, ["data.format=alpaca"], 2, "data.format=alpaca needs columns instruction, output, "
     "but data/ha_commands.jsonl has columns \\['messages'\\] \\(the data is in format messages"),
    ("data-columns-missing", {}, ["data.columns={messages: conv}"], 2,
     "data.columns maps messages → 'conv', but data/ha_commands.jsonl has columns"),
    # A Hub split name on a local file was ignored: the whole file trained.
    ("data-split-local", {}, ["data.split=validation"], 2, "data.split='validation': a local file or folder is one"),
    ("data-split-tail", {}, ["data.split=train[50%:]"], 2, "or its first rows, such as train"),
    ("data-bad-line", {"d.jsonl": jsonl(GOOD_ROWS[:2] + ["{not json"] + GOOD_ROWS[2:])}, ["data.path=d.jsonl"], 2,
     "d.jsonl line 3: not valid JSON"),
    ("data-list-line", {"d.jsonl": jsonl(GOOD_ROWS[:1] + ["[1, 2]"])}, ["data.path=d.jsonl"], 2,
     "d.jsonl line 2: a JSON list"),
    ("data-messages-string", {"d.jsonl": jsonl([{"messages": "a string"}] * 3)}, ["data.path=d.jsonl"], 2,
     "d.jsonl line 1: field 'messages' is a string"),
    ("data-bad-role", {"d.jsonl": jsonl(GOOD_ROWS[:3] + [{"messages": [{"role": "bot", "content": "x"}]}])},
     ["data.path=d.jsonl"], 2, "d.jsonl line 4: messages\\[0\\] has role 'bot'"),
    ("data-content-not-text", {"d.jsonl": jsonl(GOOD_ROWS[:2] + [{"messages": [{"role": "user", "content": 5}]}])},
     ["data.path=d.jsonl"], 2, "d.jsonl line 3"),
    ("data-mixed-types", {"d.jsonl": jsonl([{"prompt": "a", "completion": "b"}, {"prompt": ["x"], "completion": "c"}])},
     ["data.path=d.jsonl", "data.format=auto"], 2, "line 2"),
    ("data-no-format", {"d.jsonl": jsonl([{"a": 1, "b": 2}] * 3)}, ["data.path=d.jsonl", "data.format=auto"], 2,
     "match no format"),
    ("data-not-utf8", {"d.jsonl": b'{"text": "\xff\xfe"}\n'}, ["data.path=d.jsonl"], 2, "not UTF-8"),
    ("data-unknown-type", {"d.txt": "hello\n"}, ["data.path=d.txt"], 2, "unknown type '.txt'"),
    ("output-dir-is-file", {}, ["output_dir=mine.py"], 2, "output_dir mine.py is a file"),
    ("output-dir-under-file", {}, ["output_dir=mine.py/run"], 2, "is under mine.py, which is a file"),
    ("output-dir-unwritable", {}, ["output_dir=/proc/kit-bad-input/run"], 2, "output_dir /proc/kit-bad-input/run is not writable"),
    ("resume-missing", {}, ["resume=outputs/none/checkpoint-4"], 2, "no such checkpoint folder"),
    ("bf16-on-cpu", {}, ["precision=bf16"], 3, "runs on the CPU; use precision=fp32"),
    ("qlora-on-cpu", {}, ["method=qlora"], 3, "needs a CUDA GPU"),
    ("script-bad-override", {}, ["max_steps=0"], 2, "'max_steps' in command line must be > 0"),
    ("script-token", {}, [f"store={TOKEN}"], 2, "'store'.*token"),
    ("script-unknown-flag", {}, ["--smokee"], 2, "unrecognized arguments"),
    ("data-deep-line", {"d.jsonl": jsonl(GOOD_ROWS[:2]) + "[" * 100_000 + "]" * 100_000 + "\n"},
     ["data.path=d.jsonl"], 2, "d.jsonl line 3: JSON nested too deep"),
    ("data-huge-number", {"d.jsonl": jsonl(GOOD_ROWS[:2]) + '{"messages": 1' + "0" * 5000 + "}\n"},
     ["data.path=d.jsonl"], 2, "d.jsonl line 3: a value kit cannot read"),
    ("data-no-assistant-turn", {"d.jsonl": jsonl([{"messages": [{"role": "system", "content": f"s{i}"},
                                                                 {"role": "user", "content": f"u{i}"}]}
                                                   for i in range(12)])},
     ["data.path=d.jsonl"], 2, "no example of d.jsonl has an assistant turn"),
    ("data-csv-ragged", {"d.csv": "prompt,completion\n" + "".join(f"q{i},a{i}\n" for i in range(8)) + "q8,a8,extra\n"},
     ["data.path=d.csv"], 2, "d.csv row 10: 3 fields, the header has 2"),
    ("data-csv-ragged-in-folder", {"parts/a.csv": "prompt,completion\n" + "".join(f"q{i},a{i}\n" for i in range(8)),
                                   "parts/b.csv": "prompt,completion\nq,a\nq9,a9,extra\n"},
     ["data.path=parts"], 2, "b.csv row 3: 3 fields, the header has 2"),
    ("data-csv-not-utf8", {"d.csv": b"prompt,completion\n" + b"".join(b"q%d,a%d\n" % (i, i) for i in range(8)) +
                           b"q\xff,a\n"}, ["data.path=d.csv"], 2, "d.csv line 10 is not UTF-8 text"),
    ("data-jsonl-not-utf8-line", {"d.jsonl": jsonl(GOOD_ROWS[:3]).encode() + b'{"text": "\xff"}\n'},
     ["data.path=d.jsonl"], 2, "d.jsonl line 4 is not UTF-8 text"),
    ("data-folder-columns-differ", {"parts/a.csv": "prompt,completion\n" + "".join(f"q{i},a{i}\n" for i in range(8)),
                                    "parts/b.csv": "instruction,output\nq,a\n"}, ["data.path=parts"], 2,
     r"b.csv has columns \['instruction', 'output'\] where a.csv has \['prompt', 'completion'\]"),
    ("data-json-empty-array", {"d.json": "[]"}, ["data.path=d.json"], 2, "d.json holds an empty JSON array"),
    ("data-csv-header-only", {"d.csv": "prompt,completion\n"}, ["data.path=d.csv"], 2,
     "d.csv has a header \\(prompt,completion\\) but no rows"),
    ("data-jsonl-empty-objects", {"d.jsonl": "{}\n{}\n"}, ["data.path=d.jsonl"], 2, "d.jsonl line 1: an empty JSON object"),
    ("data-parquet-damaged", {"d.parquet": b"PAR1" + b"\0" * 100 + b"PAR1"}, ["data.path=d.parquet"], 2,
     "data file d.parquet could not be read: Couldn't deserialize thrift"),  # it blamed the datasets cache
    ("data-is-a-device", {}, ["data.path=/dev/zero"], 2, "data file /dev/zero \\(data.path\\): not a regular file"),
    ("lora-targets-a-block", {}, ["lora.target_modules=[q_proj, mlp]", "max_steps=1"], 2,
     "lora.target_modules: mlp names a Qwen3MLP, not a layer LoRA can wrap; its linear layers are down_proj"),
    ("lora-targets-a-norm", {}, ["lora.target_modules=[norm]", "max_steps=1"], 2, "norm names a Qwen3RMSNorm"),
    ("lora-targets-missing", {}, ["lora.target_modules=[q_proj, nope_proj]", "max_steps=1"], 2,
     "nope_proj is no module of models/tiny-qwen3; its linear layers are down_proj, gate_proj"),
]


def run_script_in_process(box: Path, argv: list[str], name: str = "train_ddp.py") -> int:
    """`python NAME ARGV` in this process: the script's own __main__ block, its exit code."""
    saved = sys.argv
    sys.argv = [str(box / name), *argv]
    try:
        runpy.run_path(str(box / name), run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = saved
    return 0


@pytest.mark.parametrize("files,argv,code,want", [c[1:] for c in SCRIPT_CASES], ids=[c[0] for c in SCRIPT_CASES])
def test_script_bad_input(sandbox, capfd, files, argv, code, want):
    for name, content in files.items():
        write(sandbox, name, content)
    before = snapshot(sandbox)
    got = run_script_in_process(sandbox, ["output_dir=outputs/bad", *argv])
    out, err = capfd.readouterr()
    # Libraries may log warnings to stderr; kit's own error is still exactly one line.
    check_contract(sandbox, before, got, out, err, code, want, one_line_stderr=False)
    if any(a.startswith("output_dir=") and a != "output_dir=outputs/bad" for a in argv):
        assert "trainable parameters" not in out  # refused before the model was loaded


@pytest.mark.parametrize("env, want", [
    ({"WORLD_SIZE": "abc"}, "environment variable WORLD_SIZE='abc' is not a whole number"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a whole number"),
    ({"WORLD_SIZE": TOKEN}, r"WORLD_SIZE='\*\*\*' is not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "RANK 0 / LOCAL_RANK 0 is not a rank of WORLD_SIZE 0"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK 5 / LOCAL_RANK 0 is not a rank of WORLD_SIZE 2"),  # said, not silent
    ({"RANK": "abc"}, "RANK='abc' is not a whole number"),
    ({"LOCAL_RANK": "99999999999999999999"}, "LOCAL_RANK 99999999999999999999 is not a rank of WORLD_SIZE 1"),
    # Read by accelerate inside Trainer: int('') there was a traceback after kit had written files.
    ({"WORLD_SIZE": ""}, "WORLD_SIZE='' is not a whole number"),
    ({"LOCAL_RANK": ""}, "LOCAL_RANK='' is not a whole number"),
    ({"OMPI_COMM_WORLD_SIZE": "abc"}, "OMPI_COMM_WORLD_SIZE='abc' is not a whole number"),
    ({"PMI_SIZE": "x"}, "PMI_SIZE='x' is not a whole number"),
    ({"ACCELERATE_MIXED_PRECISION": "garbage"}, "ACCELERATE_MIXED_PRECISION='garbage' is not one of no, fp16"),
])
@pytest.mark.parametrize("own_config", [False, True], ids=["settings", "own-config"])
def test_script_refuses_a_broken_torchrun_environment(sandbox, capfd, monkeypatch, env, want, own_config):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = snapshot(sandbox)
    # --config FILE plans again for this machine, reading WORLD_SIZE before the process group starts.
    got = run_script_in_process(sandbox, ["output_dir=outputs/bad", *(["--config", "configs/default.yaml"]
                                                                       if own_config else [])])
    out, err = capfd.readouterr()
    check_contract(sandbox, before, got, out, err, 2, want, one_line_stderr=False)


def test_script_says_where_the_datasets_cache_cannot_be_written(sandbox, capfd, monkeypatch):
    """HF_HOME (or HF_DATASETS_CACHE) naming a file: datasets read it when imported, so the test sets
    the value it derived, as the user's environment would have."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", sandbox / "mine.py" / "datasets")
    before = snapshot(sandbox)
    got = run_script_in_process(sandbox, ["output_dir=outputs/bad", "max_steps=1"])
    out, err = capfd.readouterr()
    check_contract(sandbox, before, got, out, err, 2, "cannot write the datasets cache: Not a directory",
                   one_line_stderr=False)


@pytest.mark.parametrize("error, code, want", [
    (IsADirectoryError(21, "Is a directory", "some/folder"), 2, "error: Is a directory: some/folder$"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 2, "can't decode byte 0xff"),
    (ValueError(f"bad value {TOKEN}\nsecond line"), 1, r"ValueError: bad value \*\*\* \(a bug in kit: please report it"),
])
def test_an_unforeseen_error_is_still_one_redacted_line(sandbox, capsys, monkeypatch, error, code, want):
    """The CLI's last net, for what no command turned into a KitError. The command's failure is
    stood in for (a probe that raises): a real one would be a bug that the rest of this file exists to find."""
    import kit.commands.probe

    def fails(args):
        raise error

    monkeypatch.setattr(kit.commands.probe, "run", fails)
    before = snapshot(sandbox)
    got = main(["probe"])
    out, err = capsys.readouterr()
    check_contract(sandbox, before, got, out, err, code, want)
    monkeypatch.setenv("KIT_DEBUG", "1")  # the traceback, for a bug report: still without the token
    main(["probe"])
    err = capsys.readouterr().err
    assert "Traceback" in err and TOKEN not in err


@pytest.mark.parametrize("args, code, words", [
    (["data.path=missing.jsonl"], 2, "data file missing.jsonl does not exist"),
    (["data.path=empty.jsonl"], 2, "is empty"),
    (["data.path=odd.jsonl", "data.format=auto"], 2, "match no format"),
    (["seq_len=4096"], 2, "longer than models/tiny-qwen3's max_position_embeddings=1024"),
    (["model=nobody/no-such-model"], 2, "could not be loaded"),
    (["method=qlora"], 3, "method=qlora needs a CUDA GPU"),
])
def test_script_bad_input_adds_nothing_to_an_existing_output_dir(sandbox, capfd, args, code, words):
    write(sandbox, "empty.jsonl", "")
    write(sandbox, "odd.jsonl", '{"question": "q", "answer": "a"}\n' * 5)
    out = sandbox / "outputs" / "mine"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    before = snapshot(sandbox)
    got = run_script_in_process(sandbox, [f"output_dir={out}", "max_steps=4", *args])
    stdout, err = capfd.readouterr()
    check_contract(sandbox, before, got, stdout, err, code, re.escape(words), one_line_stderr=False)
    if "odd" in str(args):
        line = [ln for ln in err.splitlines() if ln.startswith("error:")][0]
        assert "['answer', 'question']" in line and "messages: messages" in line, line
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # nothing added either


# ---- a few through the real script and the real `kit` command ----------------------------------
@pytest.mark.slow
def test_real_script_refuses_a_token_and_bad_data(sandbox):
    write(sandbox, "d.jsonl", jsonl(GOOD_ROWS[:3] + ['{"messages": [}']))
    before = snapshot(sandbox)
    env = cpu_env(HF_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    for argv, code, want in ((["max_steps=" + TOKEN], 2, "'max_steps'.*token"),
                             (["data.path=d.jsonl", "output_dir=outputs/bad"], 2, "d.jsonl line 4: not valid JSON")):
        done = subprocess.run([sys.executable, "train_ddp.py", *argv], cwd=sandbox, env=env, capture_output=True,
                              text=True, timeout=300)
        check_contract(sandbox, before, done.returncode, done.stdout, done.stderr, code, want, one_line_stderr=False)


@pytest.mark.slow
def test_ctrl_c_while_the_script_loads_is_one_line_and_exit_130(sandbox):
    """Ctrl-C one second in (torch, transformers and trl still importing): no traceback, nothing written.
    Ctrl-C during training pauses cleanly instead (tests/test_new_user_path.py)."""
    import signal
    import time

    before = snapshot(sandbox)
    proc = subprocess.Popen([sys.executable, "train_ddp.py", "output_dir=outputs/int"], cwd=sandbox, text=True,
                            env=cpu_env(HF_TOKEN=TOKEN, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and err.strip().splitlines()[-1].startswith("interrupted")
    assert snapshot(sandbox) == before and not (sandbox / "outputs" / "int").exists()


def test_real_kit_command_redacts_and_refuses(sandbox):
    before = snapshot(sandbox)
    env = {**os.environ, "HF_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "kit", "render", "--config", "configs/default.yaml", "--gpus", "cpu",
                           "-o", "t.py", f"store={TOKEN}"], cwd=sandbox, env=env, capture_output=True, text=True,
                          timeout=120)
    check_contract(sandbox, before, done.returncode, done.stdout, done.stderr, 2, "'store'.*token")
    assert not (sandbox / "t.py").exists()


def test_contract_keys_suffice_for_every_facts_reader(sandbox, capsys):
    """Item 14: a facts file with exactly the contract's keys plans, renders and bootstraps."""
    write(sandbox, "f.json", CONTRACT_ONLY)
    assert main(["plan", "--facts", "f.json", "--config", "configs/default.yaml"]) == 0
    assert main(["render", "--facts", "f.json", "--config", "configs/default.yaml", "-o", "r.py"]) == 0
    assert main(["bootstrap", "--facts", "f.json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "unknown    ram_bytes: not in the facts file" in out
    assert "ddp" in (sandbox / "r.py").read_text()


@pytest.mark.parametrize("make, want", [
    (lambda d: (d / "kit_run.json").mkdir(), "holds kit_run.json, which is not a file"),
    (lambda d: (d / "final").write_text("mine"), "holds final, which is not a folder"),
    (lambda d: (d / "checkpoint-4").symlink_to(d / "nowhere"), "holds checkpoint-4, which is not a checkpoint folder"),
    (lambda d: (d / "checkpoint-4").write_text("mine"), "holds checkpoint-4, which is not a checkpoint folder"),
], ids=["run-record-folder", "final-file", "checkpoint-dangling-link", "checkpoint-file"])
def test_output_dir_entries_kit_must_write_are_checked_first(sandbox, capfd, make, want):
    """A folder where kit writes a file, or a file or link named like a checkpoint, failed a save
    after training (or a resume at the wrong step): refused before the model is loaded."""
    out = sandbox / "outputs" / "odd"
    out.mkdir(parents=True)
    make(out)
    before = snapshot(sandbox)
    got = run_script_in_process(sandbox, [f"output_dir={out}"])
    o, err = capfd.readouterr()
    check_contract(sandbox, before, got, o, err, 2, want, one_line_stderr=False)
    assert "trainable parameters" not in o


def _hidden_size(d: Path) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": cfg["hidden_size"] * 2}))


@pytest.mark.parametrize("damage, want", [
    (lambda d: (d / "model.safetensors").unlink(), "model 'm': its weights do not load"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"garbage!"), "its weights do not load"),
    (_hidden_size, "its weights do not load \\(their shapes differ from config.json's\\)"),
    (lambda d: (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content | nofilter }}{% endfor %}"),
     "the model's chat template fails"),
    (lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")],
     "model 'm' has no usable tokenizer \\(1 tokens\\)"),
], ids=["no-weights", "garbage-weights", "config-shape-edited", "broken-template", "no-tokenizer"])
@pytest.mark.slow
def test_a_model_folder_whose_files_do_not_load_is_one_line(sandbox, damage, want):
    """The real script in its own process (transformers' warnings about the weights go to its stderr)."""
    shutil.copytree(sandbox / "models" / "tiny-qwen3", sandbox / "m")
    damage(sandbox / "m")
    before = snapshot(sandbox)
    done = subprocess.run([sys.executable, "train_ddp.py", "output_dir=outputs/bad", "model=m", "max_steps=1"],
                          cwd=sandbox, env=cpu_env(HF_TOKEN=TOKEN, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=300)
    check_contract(sandbox, before, done.returncode, done.stdout, done.stderr, 2, want, one_line_stderr=False)


def test_the_launcher_copied_away_from_its_package(tmp_path):
    """`kit.py` alone in a folder imported itself as `kit`, again and again (RecursionError): it now
    uses an installed kit, or says in one line that there is none."""
    shutil.copy(ROOT / "kit.py", tmp_path / "kit.py")
    alone = subprocess.run([sys.executable, "-I", "-S", "kit.py", "probe"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)  # -S: no site-packages, so no installed kit either
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1, alone.stderr
    assert "the kit package is neither beside it nor installed" in alone.stderr
    found = subprocess.run([sys.executable, "kit.py", "probe", "--json"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env=cpu_env(PYTHONPATH=str(ROOT)))
    assert found.returncode == 0 and json.loads(found.stdout)["schema"] == 1, found.stderr[-2000:]


# ---- an output_dir that is a shared folder (issue 33, item 10) -------------------------------------
def _shared_folder(sandbox: Path, monkeypatch, which: str) -> str:
    """The output_dir value for each folder kit must not fill with checkpoint-N/, final/ and kit_*.json."""
    if which == "root":
        return "/"
    if which == "home":
        home = sandbox / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        return str(home)
    if which == "above-home":
        (sandbox / "users" / "me").mkdir(parents=True)
        monkeypatch.setenv("HOME", str(sandbox / "users" / "me"))
        return str(sandbox / "users")
    if which == "kit-checkout":
        return str(ROOT)
    if which == "git-root":  # the sandbox itself, as a real git work tree, named relatively
        subprocess.run(["git", "init", "-q", str(sandbox)], check=True)
        return "."
    if which == "link-to-root":
        (sandbox / "out").symlink_to("/")
        return "out"
    if which == "link-to-git-root":
        repo = sandbox / "repo"
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (sandbox / "outputs").mkdir(exist_ok=True)
        (sandbox / "outputs" / "run").symlink_to(repo)
        return "outputs/run"
    raise AssertionError(which)


SHARED = {"root": "is the filesystem's root", "home": "is the home folder",
          "above-home": "is a folder above the home folder", "kit-checkout": "is the kit checkout",
          "git-root": "is the root of a git work tree", "link-to-root": "is the filesystem's root \\(it leads to /\\)",
          "link-to-git-root": "is the root of a git work tree \\(it leads to"}


@pytest.mark.parametrize("which", list(SHARED))
@pytest.mark.parametrize("command", ["plan", "render", "bootstrap", "script"])
def test_output_dir_that_is_a_shared_folder_is_refused(sandbox, capfd, monkeypatch, which, command):
    """output_dir=/ wrote checkpoint-2/, final/ and kit_*.json into /: refused when the config is read
    (plan, render, bootstrap) and again by the script at launch, before anything is loaded or written."""
    out = _shared_folder(sandbox, monkeypatch, which)
    real = Path(os.path.realpath(out))
    listing = sorted(p.name for p in real.iterdir())
    before = snapshot(sandbox)
    if command == "script":
        got = run_script_in_process(sandbox, [f"output_dir={out}"])
    else:
        argv = {"plan": ["plan", "--gpus", "cpu"], "render": ["render", "--gpus", "cpu", "-o", "t.py"],
                "bootstrap": ["bootstrap", "--facts", str(MACHINES / "kaggle_t4x2.json"), "-o", "t.py"]}[command]
        got = main([*argv, "--config", "configs/default.yaml", f"output_dir={out}"])
    o, err = capfd.readouterr()
    check_contract(sandbox, before, got, o, err, 2, f"output_dir='{re.escape(out)}' {SHARED[which]}",
                   one_line_stderr=command != "script")
    assert sorted(p.name for p in real.iterdir()) == listing, "something was written into it"
    assert "trainable parameters" not in o


@pytest.mark.parametrize("out", ["outputs/default", "repo/outputs"])
def test_a_subfolder_of_a_git_work_tree_is_fine(sandbox, capsys, out):
    subprocess.run(["git", "init", "-q", str(sandbox)], check=True)
    assert main(["plan", "--gpus", "cpu", "--config", "configs/default.yaml", f"output_dir={out}"]) == 0


def test_a_final_folder_kit_did_not_write_is_refused(sandbox, capfd):
    """kit adds only its own names to an existing folder; a final/ of someone else's would be replaced."""
    out = sandbox / "outputs" / "mine"
    (out / "final").mkdir(parents=True)
    (out / "final" / "notes.txt").write_text("mine")
    before = snapshot(sandbox)
    got = run_script_in_process(sandbox, [f"output_dir={out}"])
    o, err = capfd.readouterr()
    check_contract(sandbox, before, got, o, err, 2, "holds a final/ folder that kit did not write",
                   one_line_stderr=False)


def test_a_20_mb_row_is_one_line_and_no_cache_copy(sandbox, capfd, monkeypatch):
    """A 150 MB JSONL of one row: no message, 23.7 GB of memory, the OOM killer after 218 s and a 157 MB
    cache copy. Now (20 MB here, the box has 23 GB): one line naming the file, the line and the limit."""
    import time

    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(sandbox / "cache"))
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "lorem ipsum " * ((20 << 20) // 12)}]}
    write(sandbox, "big.jsonl", jsonl(GOOD_ROWS[:2] + [row]))
    before = snapshot(sandbox)
    started = time.monotonic()
    got = run_script_in_process(sandbox, ["output_dir=outputs/bad", "data.path=big.jsonl", "seq_len=64"])
    o, err = capfd.readouterr()
    check_contract(sandbox, before, got, o, err, 2, r"data file big.jsonl line 3: the row is over the 1.0 MiB a row may hold "
                   r"\(the limit for seq_len=64", one_line_stderr=False)
    assert time.monotonic() - started < 60
    assert not list((sandbox / "cache").rglob("*.arrow")), "datasets kept a cache copy"
