"""DPO step time and memory: TRL's DPOTrainer driven directly vs the script kit writes, and kit's
Kaggle 2×T4 plan under a T4-sized allocator.

    python bench/dpo_speed.py --out DIR [--model Qwen/Qwen3-8B] [--steps 12] [--variants trl,kit,t4]
        [--work DIR]   # reuse the model (and data) built there by an earlier run

One random-weight model of the shape in kit's table (seeded bf16 weights built on the GPU, saved
next to the tiny tokenizer of models/tiny-qwen3; no downloads), QLoRA nf4 (double quantisation,
bf16 compute, as kit loads it), LoRA r16 alpha 32 on all linears, 2 pairs per step, every prompt +
answer cut to 1024 tokens (the rows are longer), gradient checkpointing, reference = the base with
the adapter disabled, beta 0.1, sigmoid loss. Each variant runs in its own process with cold
compile caches:

  trl  DPOTrainer with those settings and TRL's defaults otherwise (no Liger, bf16).
  kit  `kit render` of configs/dpo-tiny.yaml with the same settings and everything else automatic
       (kernels, offloading, compile, batching: the plan of this machine), run as `python train_dpo.py`.
  kit-no-offload  the same with activation_offloading=off (what offloading costs here).
  kit-plain  backend=transformers, the rest automatic (where Unsloth is installed "auto" picks it for `kit`).
  kit-compile  backend=transformers compile=on (each decoder layer compiled, Liger's RMSNorm left to inductor).
  kit-unsloth  backend=unsloth (Unsloth's patched DPOTrainer, its model loading and checkpointing).
  kto  kit's KTO script (configs/kto-tiny.yaml), automatic choices, 2 × pairs rows of one answer a step of
       the same lengths (the same tokens a step as the DPO rows).
  t4   `kit render --gpus 2xT4` (fp16) run as one rank with torch.cuda.set_per_process_memory_fraction
       capping the allocator at a T4's usable 14.06 GiB: does it fit, peak vs kit's estimate.

Step time: the median of the steps after two warm-up steps (CUDA synchronised); tokens per step
= pairs × 2 answers × 1024 (checked from the first batch's input shape for trl); peak =
torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("KIT_ROOT", Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import make_random_model  # noqa: E402
TOKENIZER = ROOT / "models" / "tiny-qwen3"
GIB = 2**30
WARMUP = 2
T4_CAP_GIB = 14.06
WORDS = ["turn", "on", "the", "kitchen", "light", "set", "thermostat", "to", "degrees", "open", "garage",
         "door", "play", "music", "in", "living", "room", "lock", "front", "dim", "bedroom", "lamp"]


def make_model(hub_id: str, out: Path, seed: int = 0) -> Path:
    """`hub_id`'s shape with random weights (bench.gpu_common.make_random_model); "tiny" checks the
    bench on a CPU with a 2-layer Qwen3 of the same kind."""
    if hub_id != "tiny":
        return make_random_model(hub_id, out, seed)
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                                  tie_word_embeddings=True, max_position_embeddings=4096, dtype="bfloat16")
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    for name in os.listdir(TOKENIZER):
        if name.startswith("tokenizer") or name.endswith(".jinja") or name == "special_tokens_map.json":
            shutil.copy(TOKENIZER / name, out / name)
    return out


def make_pairs(path: Path, seq: int, rows: int = 64, seed: int = 0) -> Path:
    """Conversational pairs: a request of ~0.4 × seq tokens (the tiny tokenizer takes ~1.56 tokens a word),
    two answers of ~1.5 × seq tokens each, so prompt + answer is always cut to seq tokens in training."""
    rng = random.Random(seed)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            f.write(json.dumps({"prompt": [{"role": "user", "content": words(seq // 4)}],
                                "chosen": [{"role": "assistant", "content": words(seq)}],
                                "rejected": [{"role": "assistant", "content": words(seq)}]}) + "\n")
    return path


def make_kto_rows(path: Path, seq: int, rows: int = 128, seed: int = 0) -> Path:
    """KTO rows of the same lengths: a request of ~0.4 × seq tokens and one answer of ~1.5 × seq, labelled
    desirable or not in turn, so prompt + answer is always cut to seq tokens."""
    rng = random.Random(seed)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": [{"role": "user", "content": words(seq // 4)}],
                                "completion": [{"role": "assistant", "content": words(seq)}],
                                "label": i % 2 == 0}) + "\n")
    return path


def env(**extra) -> dict:
    paths = [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    caches = Path(tempfile.mkdtemp(prefix="kit-bench-cache-"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false", "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
            "TRITON_CACHE_DIR": str(caches / "triton"), **extra}


def run_trl(args) -> dict:
    """Child process: DPOTrainer driven directly."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    cuda = torch.cuda.is_available()
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16) if cuda else None
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16, quantization_config=quant,
                                                 device_map={"": 0} if cuda else None)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    data = load_dataset("json", data_files=str(args.data), split="train")
    config = DPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.pairs, max_length=args.seq,
                       max_steps=args.steps, learning_rate=1e-4, beta=0.1, loss_type=["sigmoid"],
                       gradient_checkpointing=True, bf16=cuda, logging_steps=1, report_to="none",
                       save_strategy="no", seed=0, use_cpu=not cuda, dataloader_num_workers=0,
                       use_liger_kernel=args.liger)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    times, shapes = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    trainer = DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                         peft_config=lora, callbacks=[Timer()])
    trainer.model.register_forward_pre_hook(
        lambda mod, a, k: shapes.append(tuple((k.get("input_ids") if k.get("input_ids") is not None else a[0]).shape))
        if len(shapes) < 4 else None, with_kwargs=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    step_s = statistics.median(times[WARMUP:] or times)
    return {"step_s": round(step_s, 4), "steps": len(times), "step_times_s": [round(t, 4) for t in times],
            "first_forward_input_shapes": shapes, "tokens_per_step": args.pairs * 2 * args.seq,
            "tokens_per_s": round(args.pairs * 2 * args.seq / step_s, 1),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3) if cuda else None,
            "liger": args.liger}


CAP_RUNNER = ("import sys, runpy, torch; total = torch.cuda.get_device_properties(0).total_memory; "
              "torch.cuda.set_per_process_memory_fraction(float(sys.argv[1]) * 2**30 / total, 0); "
              "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run_kit(args, work: Path, gpus: str | None, cap_gib: float | None, precision: str, global_batch: int,
            extra: tuple = (), config: str = "configs/dpo-tiny.yaml", data: Path | None = None,
            per_device: int | None = None) -> dict:
    per_device = per_device or args.pairs
    overrides = [*extra, f"model={args.model_dir}", "method=qlora" if args.model != "tiny" else "method=lora",
                 f"seq_len={args.seq}", f"per_device_batch={per_device}", f"global_batch={global_batch}",
                 "gradient_checkpointing=on", f"max_steps={args.steps}", f"data.path={data or args.data}",
                 "data.format=auto", "data.eval_fraction=0", "learning_rate=0.0001", "warmup_steps=0",
                 "logging_steps=1", "eval_steps=null", f"save_steps={10 * args.steps}", "store=null",
                 f"output_dir={work / 'out'}", f"precision={precision}", "lora.alpha=32", "lora.dropout=0.0"]
    work.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "kit"]
    where = ["--config", config] + (["--gpus", gpus] if gpus else [])
    plan = subprocess.run(base + ["plan", *where, *overrides, "--json"], cwd=ROOT, env=env(),
                          capture_output=True, text=True)
    if plan.returncode != 0:
        return {"error": f"kit plan exit {plan.returncode}: {(plan.stdout + plan.stderr)[-1500:]}"}
    planned = json.loads(plan.stdout)
    script = work / "train_dpo.py"
    done = subprocess.run(base + ["render", *where, *overrides, "-o", str(script), "--force"], cwd=ROOT,
                          env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"kit render exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"}
    argv = [sys.executable, str(script)] if cap_gib is None else [sys.executable, "-c", CAP_RUNNER, str(cap_gib),
                                                                     str(script)]
    log = work / "train.log"
    started = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(argv, cwd=work, env=env(), stdout=f, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    out = {"command": " ".join(["python", "-m", "kit", "render", *where, *overrides]),
           "rc": rc, "wall_s": round(time.monotonic() - started, 1),
           "plan": {k: planned.get(k) for k in ("precision", "per_device_batch", "grad_accum", "global_batch",
                                                  "gradient_checkpointing", "backend", "optimizer", "batching",
                                                  "kernels", "activation_offloading", "compile_layers",
                                                  "quantization")},
           "estimate_gib": round(planned["memory"]["per_gpu_bytes"] / GIB, 3),  # + slack and CUDA context
           "estimate_allocated_gib": round(planned["memory"]["allocated_bytes"] / GIB, 3),  # what max_memory_allocated sees
           "budget_gib": round(planned["memory"]["budget_bytes"] / GIB, 3),
           "reasons": planned.get("reasons"),
           "speed_lines": [line for line in text.splitlines() if "speed:" in line][-2:]}
    sessions = work / "out" / "kit_sessions.jsonl"
    if sessions.exists():
        out["session"] = json.loads(sessions.read_text().splitlines()[-1])
    if rc != 0:
        out["log_tail"] = text[-3000:]
    return out


def find(record, key):
    """The first value under `key` anywhere in a nested record."""
    if isinstance(record, dict):
        if key in record:
            return record[key]
        for v in record.values():
            found = find(v, key)
            if found is not None:
                return found
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="Qwen/Qwen3-8B")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--variants", default="trl,kit,t4")
    p.add_argument("--child", default=None)
    p.add_argument("--liger", action="store_true")
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--data", type=Path)
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child == "trl":
        (args.out / "trl.json").write_text(json.dumps(run_trl(args), indent=1))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="dpo-bench-"))
    args.model_dir = make_model(args.model, work / "model")
    args.data = make_pairs(work / "pairs.jsonl", args.seq)
    import torch

    results = {"model": args.model, "seq_len": args.seq, "pairs_per_step": args.pairs, "steps": args.steps,
               "warmup_steps": WARMUP,
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft")}}
    for variant in args.variants.split(","):
        started = time.monotonic()
        if variant in ("trl", "trl-liger"):
            log = args.out / f"{variant}.log"
            cmd = [sys.executable, __file__, "--child", "trl", "--out", str(args.out / variant),
                   "--model-dir", str(args.model_dir), "--data", str(args.data), "--steps", str(args.steps),
                   "--seq", str(args.seq), "--pairs", str(args.pairs)] + (["--liger"] if variant == "trl-liger" else [])
            with open(log, "w") as f:
                rc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT).returncode
            got = args.out / variant / "trl.json"
            results[variant] = json.loads(got.read_text()) if got.exists() else {
                "error": f"exit {rc}", "log_tail": log.read_text(errors="replace")[-3000:]}
        elif variant == "kit":
            results["kit"] = run_kit(args, work / "kit", None, None, "auto", args.pairs)
        elif variant == "kit-no-offload":  # kit's choices but activation offloading off
            results[variant] = run_kit(args, work / variant, None, None, "auto", args.pairs,
                                       ("activation_offloading=off",))
        elif variant == "kit-plain":  # kit's choices on the plain stack (where Unsloth is installed "auto" takes it)
            results[variant] = run_kit(args, work / variant, None, None, "auto", args.pairs, ("backend=transformers",))
        elif variant == "kit-compile":  # the plain stack with compiled decoder layers
            results[variant] = run_kit(args, work / variant, None, None, "auto", args.pairs,
                                       ("backend=transformers", "compile=on"))
        elif variant == "kit-unsloth":
            results[variant] = run_kit(args, work / variant, None, None, "auto", args.pairs, ("backend=unsloth",))
        elif variant == "kto":  # kit's KTO script, automatic choices, 2 × pairs rows of the same lengths a step
            rows = make_kto_rows(work / "kto.jsonl", args.seq)
            results[variant] = run_kit(args, work / variant, None, None, "auto", 2 * args.pairs,
                                       config="configs/kto-tiny.yaml", data=rows, per_device=2 * args.pairs)
        elif variant == "t4":
            results["t4"] = run_kit(args, work / "t4", "2xT4", T4_CAP_GIB, "auto", 2 * args.pairs)
            results["t4"]["cap_gib"] = T4_CAP_GIB
        results.setdefault(variant, {})["elapsed_s"] = round(time.monotonic() - started, 1)
        print(f"[bench] {variant}: {json.dumps(results[variant])[:1500]}", flush=True)
        (args.out / "dpo_speed.json").write_text(json.dumps(results, indent=1))
    trl, kit_run = results.get("trl", {}), results.get("kit", {})
    session = kit_run.get("session") or {}
    kit_tps, kit_peak = find(session, "tokens_per_s"), find(session, "peak_allocated_bytes")
    kit_step = find(session, "step_s")
    if kit_step and trl.get("tokens_per_s"):
        results["kit_vs_trl_tokens_per_s"] = round(args.pairs * 2 * args.seq / kit_step / trl["tokens_per_s"], 3)
    if kit_peak and kit_run.get("estimate_allocated_gib"):
        results["kit_peak_vs_estimate"] = round(kit_peak / GIB / kit_run["estimate_allocated_gib"], 3)
    results["kit_tokens_per_s_own_count"] = kit_tps
    summary = {}
    for name, run in results.items():
        if not isinstance(run, dict) or "session" not in run:
            continue
        step, peak = find(run["session"], "step_s"), find(run["session"], "peak_allocated_bytes")
        tokens = 2 * args.pairs * args.seq  # DPO: pairs × 2 answers; KTO: 2 × pairs rows of one answer
        row = {"step_s": step, "tokens_per_s": round(tokens / step, 1) if step else None,
               "peak_allocated_gib": round(peak / GIB, 3) if peak else None,
               "estimate_allocated_gib": run.get("estimate_allocated_gib"), "plan": run.get("plan")}
        if peak and run.get("estimate_allocated_gib"):
            row["peak_vs_estimate_allocated"] = round(peak / GIB / run["estimate_allocated_gib"], 3)
        for base in ("trl", "trl-liger"):
            if step and results.get(base, {}).get("tokens_per_s"):
                row[f"vs_{base}_tokens_per_s"] = round(tokens / step / results[base]["tokens_per_s"], 3)
        summary[name] = row
    results["summary"] = summary
    t4_peak = find(results.get("t4", {}).get("session") or {}, "peak_allocated_bytes")
    if t4_peak and results["t4"].get("estimate_allocated_gib"):
        results["t4_peak_vs_estimate"] = round(t4_peak / GIB / results["t4"]["estimate_allocated_gib"], 3)
    (args.out / "dpo_speed.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if not isinstance(v, dict)}, indent=1), flush=True)


if __name__ == "__main__":
    main()
