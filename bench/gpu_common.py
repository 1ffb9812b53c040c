"""What the GPU benchmarks share: random-weight models of real shapes, full-length text data, and
running the script `kit render` writes for a config.

No downloads: a model is its family's config (from kit's table) with random bf16 weights, saved
next to the tiny tokenizer that ships in models/tiny-qwen3. Random weights train as fast and take
as much memory as real ones; only the loss values mean nothing.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "models" / "tiny-qwen3"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
GIB = 2**30


def make_random_model(hub_id: str, out: Path, seed: int = 0) -> Path:
    """`hub_id`'s architecture (kit's table) with random bf16 weights in `out`; reused when present.

    Seeded, so two device machines of one kind build the same weights and their loss curves compare."""
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kit.planning.shapes import from_table

    m = from_table(hub_id)
    config = AutoConfig.for_model(
        m.model_type, num_hidden_layers=m.layers, hidden_size=m.hidden, intermediate_size=m.intermediate,
        num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim, vocab_size=m.vocab,
        tie_word_embeddings=m.tied_embeddings, max_position_embeddings=m.max_position, dtype="bfloat16")
    started = time.monotonic()
    torch.manual_seed(seed)  # the CPU and every CUDA generator
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds, not minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the runs that follow (and kit's plan of free memory) get the whole GPU
    for name in TOKENIZER_FILES:
        if (TOKENIZER / name).exists():
            shutil.copy(TOKENIZER / name, out / name)
    print(f"[bench] {hub_id} shape with random weights -> {out} ({time.monotonic() - started:.0f} s)", flush=True)
    return out


def make_long_text(path: Path, rows: int = 64, words: int = 4000, seed: int = 0) -> Path:
    """A `text` dataset whose every row is longer than any seq_len benchmarked (truncated to it)."""
    if path.exists():
        return path
    rng = random.Random(seed)
    vocab = ["turn", "on", "the", "kitchen", "light", "set", "thermostat", "to", "degrees", "open", "garage",
             "door", "play", "music", "in", "living", "room", "lock", "front", "dim", "bedroom", "lamp"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(words))}) + "\n")
    return path


def bench_env(**extra) -> dict:
    """The environment for a rendered script: kit importable from the repo, offline, unbuffered."""
    paths = [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def render(overrides: list[str], script: Path, gpus: str = "1xH200") -> dict:
    """Write the script kit generates for configs/default.yaml + `overrides`; returns the plan JSON."""
    base = [sys.executable, "-m", "kit"]
    args = ["--config", "configs/default.yaml", "--gpus", gpus, *overrides]
    plan = subprocess.run(base + ["plan", *args, "--json"], cwd=ROOT, env=bench_env(), capture_output=True, text=True)
    if plan.returncode != 0:
        raise SystemExit(f"kit plan failed: {plan.stdout[-800:]}{plan.stderr[-800:]}")
    done = subprocess.run(base + ["render", *args, "-o", str(script), "--force"], cwd=ROOT, env=bench_env(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kit render failed: {done.stdout[-800:]}{done.stderr[-800:]}")
    return json.loads(plan.stdout)


def cold_caches() -> dict:
    """Fresh, empty compile caches for one run: it compiles as a new notebook session would.

    TorchInductor, Triton and Unsloth keep compiled kernels on disk (/tmp/torchinductor_$USER,
    ~/.triton, ./unsloth_compiled_cache) and a later process reuses them. Shared, the second of
    two Unsloth runs skipped the first's compilation: Unsloth direct measured 0.70x kit's
    whole-epoch time running after it (speed_h200_chat_batching_unsloth.json) and 1.20x running before it
    (speed_h200_chat_unsloth_probe_unmatched_batches.json).
    """
    root = Path(tempfile.mkdtemp(prefix="kit-bench-cache-"))
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "UNSLOTH_COMPILE_LOCATION": str(root / "unsloth_compiled_cache")}


def start(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start one measured run, with its own cold compile caches (`cold_caches`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**(env or bench_env()), **cold_caches()}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def session_record(output_dir: Path) -> dict:
    """The last session record the script wrote (speed, peak memory, outcome)."""
    lines = (output_dir / "kit_sessions.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def common_overrides(model: Path, data: Path, out: Path, *, method: str, seq: int, batch: int, gc: bool,
                     steps: int) -> list[str]:
    """One training configuration, as `key=value` for kit: LoRA r16 all-linear, text data, no eval."""
    return [f"model={model}", f"method={method}", f"seq_len={seq}", f"per_device_batch={batch}",
            f"global_batch={batch}", f"gradient_checkpointing={'on' if gc else 'off'}", f"max_steps={steps}",
            f"data.path={data}", "data.format=text", "data.eval_fraction=0", "lora.r=16", "lora.alpha=32",
            "lora.target_modules=all-linear", "learning_rate=0.0001", "warmup_steps=0", "logging_steps=1",
            "eval_steps=null", f"save_steps={10 * steps}", f"output_dir={out}", "precision=bf16"]


def package_version(module: str) -> str | None:
    """The installed version of `module` (liger_kernel → liger-kernel), None when absent; read from
    package metadata, since not every package has `__version__` (liger_kernel has none)."""
    from importlib import metadata

    try:
        return metadata.version(module.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None
