"""What `kit export` reads and where it writes, checked before any work: one-line UsageErrors, no download.

The adapter folder (its config, weights, tokenizer, run record, card and eval results), the base model
named by `--base` or by the adapter, the safetensors headers that size the export, and the `-o` folder.
A local adapter is never completed from the network: PEFT fetches missing weights from the Hub when a
folder lacks them, which for a local path is a long wait and a connection traceback, not an answer.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

from kit.errors import UsageError
from kit.evaluation import identity
from kit.files import parse_json, read_json, read_text, regular_file

ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
FIX = "restore or rewrite it"
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _optional_str(doc: dict, key: str, path) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{path}: {key} is {json.dumps(value)[:60]}, not a string: restore the file or pass "
                         "the value by hand" + (" (--base)" if key == "base_model_name_or_path" else ""))
    return value


def read_adapter(adapter_dir) -> tuple[dict, dict]:
    """(adapter_config.json, kit_run.json or {}) of an adapter folder, every file it needs checked."""
    folder = Path(adapter_dir)
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"--adapter {folder} {state}: give a final/ or checkpoint-N folder of a LoRA/QLoRA job")
    cfg_path = folder / "adapter_config.json"
    if regular_file(cfg_path, f"--adapter {folder}: adapter_config.json") is None:
        what = "a full model (nothing to merge)" if (folder / "config.json").is_file() else "not an adapter"
        raise UsageError(f"{folder} has no adapter_config.json: {what}; give --adapter a final/ or checkpoint-N folder "
                         "of a LoRA/QLoRA job")
    adapter_cfg = read_json(cfg_path, "adapter config", FIX)
    for key in ("base_model_name_or_path", "revision"):
        _optional_str(adapter_cfg, key, cfg_path)
    _check_lora_shape(adapter_cfg, cfg_path)
    _check_adapter_files(folder)
    return adapter_cfg, _run_record(folder)


def _check_lora_shape(cfg: dict, path) -> None:
    """A LoRA adapter kit can merge: peft_type LORA, a positive rank, a number for alpha, named targets."""
    kind, r, alpha, targets = cfg.get("peft_type"), cfg.get("r"), cfg.get("lora_alpha"), cfg.get("target_modules")
    number = (int, float)
    problem = (f"peft_type {kind!r}: kit merges LoRA adapters only" if kind not in (None, "LORA") else
               f"r {r!r} is not a rank >= 1" if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1) else
               f"lora_alpha {alpha!r} is not a number" if alpha is not None and (
                   isinstance(alpha, bool) or not isinstance(alpha, number)) else
               f"target_modules {targets!r} is not a module name or a list of them" if not (
                   isinstance(targets, str) or isinstance(targets, list) and targets
                   and all(isinstance(t, str) for t in targets)) else None)
    if problem:
        raise UsageError(f"{path}: {problem}: not a LoRA adapter kit can merge; give a final/ or checkpoint-N "
                         "folder of a LoRA/QLoRA job")


def _check_adapter_files(folder: Path) -> None:
    """Weights and tokenizer present; the card and eval results (read after the merge) readable now."""
    weights = [name for name in ADAPTER_WEIGHTS if regular_file(folder / name, f"--adapter {folder}: {name}")]
    if not weights:
        raise UsageError(f"--adapter {folder} has no {ADAPTER_WEIGHTS[0]}: the adapter's weights are missing "
                         "(an interrupted copy?); give a complete final/ or checkpoint-N folder")
    if weights[0].endswith(".safetensors"):
        safetensors_header(folder / weights[0])
    if not any(regular_file(folder / name, f"--adapter {folder}: {name}") for name in TOKENIZER_FILES):
        raise UsageError(f"--adapter {folder} has no tokenizer ({TOKENIZER_FILES[0]}): the merged model is saved "
                         "with the adapter's tokenizer; copy the base's tokenizer files into the folder")
    if regular_file(folder / "README.md", f"--adapter {folder}: README.md"):
        read_text(folder / "README.md", "model card")
    prompt_texts(folder)


def _run_record(folder: Path) -> dict:
    """kit_run.json beside or above the adapter, else a checkpoint manifest's `extra`; {} when neither."""
    run = {}
    for candidate in (folder / identity.RUN_LOCAL, folder.parent / identity.RUN_LOCAL):
        if regular_file(candidate, f"run record {candidate}"):
            run = read_json(candidate, "run record", FIX)
            break
    manifest = folder / "kit_manifest.json"
    if not run and regular_file(manifest, f"checkpoint manifest {manifest}"):  # it keeps the revision
        extra = read_json(manifest, "checkpoint manifest", FIX).get("extra") or {}
        if not isinstance(extra, dict):
            raise UsageError(f"checkpoint manifest {manifest}: 'extra' is not an object: restore the file")
        run = {k: v for k, v in extra.items() if v}
    _optional_str(run, "base_revision", "the adapter's run record")
    return run


def prompt_texts(adapter_dir, n: int = 3) -> list[str]:
    """Up to `n` held-out prompts from the job's eval_results.json ([] without one); malformed samples skipped."""
    path = Path(adapter_dir) / "eval_results.json"
    if regular_file(path, f"eval results {path}") is None:
        return []
    doc = read_json(path, "eval results", FIX)
    texts = []
    for side in ("final", "baseline"):
        result = doc.get(side) if isinstance(doc.get(side), dict) else {}
        result = result.get("result") if isinstance(result.get("result"), dict) else {}
        samples = result.get("samples") if isinstance(result.get("samples"), list) else []
        texts += [s["prompt"] for s in samples if isinstance(s, dict) and isinstance(s.get("prompt"), str)]
    return [t for t in texts if t][:n]


def base_location(base: str | None, adapter_cfg: dict, adapter_dir) -> tuple[str, str]:
    """(the base model's folder or Hub id, how to name it in errors); a path-like name must be a folder."""
    name = base or adapter_cfg.get("base_model_name_or_path")
    if not name:
        raise UsageError(f"{adapter_dir}/adapter_config.json names no base model: pass --base")
    what = f"--base {base}" if base else f"the adapter's base model {name!r}"
    if _looks_like_path(name):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            state = "is not a folder" if folder.exists() else "does not exist"
            how = "give a local model folder or a Hub id" if base else "pass --base PATH_OR_ID"
            raise UsageError(f"{what}: folder {folder} {state}: {how}")
        return str(folder), what
    return name, what


def _looks_like_path(name: str) -> bool:
    """A folder, not a Hub id (`owner/name` has one slash and starts with neither `/`, `.` nor `~`)."""
    return Path(name).is_dir() or name.startswith(("/", ".", "~")) or name.count("/") > 1 \
        or (os.sep != "/" and os.sep in name)


def check_out_dir(out: Path) -> None:
    """`-o` must be a new or empty folder in a place kit can write; refused before any work."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"-o {out}: exists and is not a folder: export writes a new folder; pick another -o")
    try:
        if out.is_dir() and any(out.iterdir()):
            raise UsageError(f"{out} exists and is not empty: export writes a new folder; pick another -o")
    except OSError as e:
        raise UsageError(f"-o {out}: cannot list it ({e.strerror or e}): pick another -o") from None
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"-o {out}: {parent} is not a folder: pick another -o")
    try:  # a real write: root passes os.access even on a read-only filesystem
        os.rmdir(tempfile.mkdtemp(prefix=".kit-export-probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"-o {out}: cannot write in {parent} ({e.strerror or e}): pick another -o") from None


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (no tensor is read); a UsageError when the file is not one."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"header of {n} bytes")
            header = parse_json(f.read(n))
    except (OSError, struct.error, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"{path} is not a readable safetensors file ({str(e)[:80]}): restore it") from None
    if not isinstance(header, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
            and all(isinstance(d, int) for d in t["shape"]) for k, t in header.items() if k != "__metadata__"):
        raise UsageError(f"{path} is not a readable safetensors file (malformed header): restore it")
    return header


def sixteen_bit_bytes(base_dir: Path) -> int:
    """Bytes of the base's weights stored in 16 bits, from the safetensors headers (no tensor is read)."""
    total = 0
    files = sorted(Path(base_dir).glob("*.safetensors"))
    if not files:
        raise UsageError(f"{base_dir} has no .safetensors weights: kit export reads safetensors only")
    for path in files:
        for key, t in safetensors_header(path).items():
            if key == "__metadata__":
                continue
            numel = 1
            for d in t["shape"]:
                numel *= d
            size = _DTYPE_BYTES.get(t["dtype"], 2)
            total += numel * (2 if t["dtype"] in ("F32", "F64", "F16", "BF16") else size)
    return total
