"""GRPO step time: TRL's GRPOTrainer driven directly vs the same trainer with kit's generation pass.

    python bench/grpo_speed.py --out DIR [--model Qwen/Qwen3-1.7B] [--variants trl,kit,merged]

Each variant runs in its own process, one after the other, on the same random-weight model (the
shape from kit's table, seeded bf16 weights built on the GPU, the tiny tokenizer in
models/tiny-qwen3; no downloads): bf16 LoRA r16 on all linears, 8 generations of 256 tokens from
one 128-token prompt per step, transformers generation, TRL's defaults otherwise (gradient
checkpointing on, beta 0). Random weights never emit the end token, so every completion runs its
256 tokens and time per generated token is what is compared.

Variants:
  trl     GRPOTrainer as TRL ships it (dynamic cache, eager decoding; compile disabled by TRL).
  kit     The same trainer after kit.train.generation.speed_up_generation (static cache, compiled
          one-token decoding under CUDA graphs, adapters unmerged).
  kit-nographs  kit's path compiled without CUDA graphs (run when `kit` fails, or when named).
  merged  TRL's path with the LoRA adapters merged into the base for each generation pass and
          unmerged after (eager decoding without the adapter kernels).
  unsloth Unsloth (2026.10) without vLLM: `import unsloth` first, the same random weights saved to disk
          and loaded through FastLanguageModel (fast_inference=False, bf16, no 4-bit), its LoRA r16 on
          the seven linears and its gradient checkpointing, and TRL's GRPOTrainer as Unsloth patches it
          at import. Unsloth's generation: `FastLanguageModel.for_inference` around TRL's generate,
          its own one-token decoding step replayed as CUDA graphs for the generate calls of an RL
          trainer (unsloth/models/_decode_graphs.py), released for the training pass.
  unsloth-kit  The same with kit.train.generation.speed_up_generation applied on top (whether kit's
          static cache and compiled decoding fight Unsloth's own).
  (--unsloth-site DIR puts a folder holding Unsloth first on the unsloth variants' PYTHONPATH only.)

Per step: wall time (CUDA synchronised), generation time (TRL's `_generate_single_turn`), the rest
(scoring, rewards, forward/backward, optimizer) as training time; peak `max_memory_allocated`.
Steady-state figures are medians over the steps after the warm-up steps (the first for eager
variants; the first two for `kit`, whose first generation compiles and records the graphs).

Equivalence, fixed before the run: kit's generation must sample from the distribution training
scores. With non-zero adapters (B drawn at std 0.02), one sampled generation through each path
records its logits; the training forward (eager PEFT, as TRL scores completions) then scores the
same tokens. Pass: kit's mean |Δ log p| over the sampled tokens is at most max(0.02 nat, 2 × the
same gap of TRL's own eager generation). Greedy agreement (tokens before the first difference)
is recorded too, not judged: bf16 rounding differs between kernels, and random weights leave
near-ties.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GIB = 2**30
TOKENIZER = ROOT / "models" / "tiny-qwen3"
PROMPT_WORD = " light"  # one token of the tiny tokenizer
MEAN_GAP_FLOOR = 0.02   # nat; see the module docstring
GAP_FACTOR = 2.0
WARMUP = {"trl": 1, "merged": 1, "kit": 2, "kit-nographs": 2, "unsloth": 2, "unsloth-kit": 2}
UNSLOTH_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(hub_id: str, device: str, seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kit.planning.shapes import from_table

    if hub_id == "tiny":  # CPU check of this script
        config = AutoConfig.for_model("qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                                      tie_word_embeddings=True, max_position_embeddings=2048)
    else:
        m = from_table(hub_id)
        config = AutoConfig.for_model(
            m.model_type, num_hidden_layers=m.layers, hidden_size=m.hidden, intermediate_size=m.intermediate,
            num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim, vocab_size=m.vocab,
            tie_word_embeddings=m.tied_embeddings, max_position_embeddings=m.max_position)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def even_tokens(completions, completion_ids=None, **kwargs):
    """A reward that depends on the tokens only: the share of even token ids."""
    return [sum(1 for t in ids if t % 2 == 0) / max(1, len(ids)) for ids in completion_ids]


def make_trainer(args, variant: str, out: Path):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    if variant.startswith("unsloth"):
        model, tokenizer = unsloth_model(args)
        peft_config = None  # Unsloth's own adapters, already on the model
    else:
        model = build_model(args.model, device)
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    prompt = PROMPT_WORD * args.prompt_tokens
    assert len(tokenizer(prompt)["input_ids"]) == args.prompt_tokens
    data = Dataset.from_dict({"prompt": [prompt] * (args.steps + 4)})
    config = GRPOConfig(
        output_dir=str(Path(tempfile.mkdtemp()) / f"run-{variant}"), per_device_train_batch_size=args.generations,
        num_generations=args.generations, max_completion_length=args.completion_tokens, max_steps=args.steps,
        learning_rate=1e-5, bf16=device == "cuda", logging_steps=1, report_to="none", save_strategy="no",
        seed=0, use_cpu=device == "cpu", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=[even_tokens], train_dataset=data,
                          processing_class=tokenizer, peft_config=peft_config)
    return trainer


def unsloth_model(args):
    """The same seeded random weights as `build_model`, saved (bench.gpu_common) and loaded through
    Unsloth's FastLanguageModel without vLLM, with Unsloth's LoRA r16 on the seven linears."""
    import torch
    from unsloth import FastLanguageModel

    from gpu_common import make_random_model

    path = make_random_model(args.model, Path(args.work) / "model")
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(path), max_seq_length=args.prompt_tokens + args.completion_tokens, dtype=torch.bfloat16,
        load_in_4bit=False, fast_inference=False)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=UNSLOTH_TARGETS, bias="none", random_state=0,
                                             use_gradient_checkpointing="unsloth")
    return model, tokenizer


def unsloth_graph_stats(model) -> dict:
    """Unsloth's decode-graph counters (captures, replays, eager steps) of whichever module holds them."""
    from unsloth.models import _decode_graphs

    for m in model.modules():
        found = _decode_graphs.stats(m)
        if found:
            return found
    return {}


def timed_generation(trainer, sink: list, merged: bool):
    """Wrap TRL's generation call: its time (synchronised) goes to `sink`; optionally merged adapters."""
    import torch

    inner = trainer._generate_single_turn

    def wrapper(*a, **k):
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        started = time.perf_counter()
        if merged:
            trainer.model.merge_adapter()
        try:
            return inner(*a, **k)
        finally:
            if merged:
                trainer.model.unmerge_adapter()
            sync()
            sink.append(time.perf_counter() - started)

    trainer._generate_single_turn = wrapper


def step_timer(sink: list):
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            sink.append(time.perf_counter() - self.started)

    return StepTimer()


def equivalence(trainer, trl_config, kit_config, prompt_ids, sample_tokens: int, greedy_tokens: int) -> dict:
    """Sampled tokens' log p from each generation path vs the training forward's (see the docstring)."""
    import torch

    model = trainer.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)  # in place: compiled graphs keep reading the same storage
    temperature = trainer.temperature
    ids = torch.tensor([prompt_ids] * trainer.num_generations, device=trainer.accelerator.device)
    mask = torch.ones_like(ids)

    def sample(config, seed, **over):
        cfg = config.__class__.from_dict(config.to_dict())
        cfg.compile_config = config.compile_config
        for k, v in {"return_dict_in_generate": True, "output_logits": True, **over}.items():
            setattr(cfg, k, v)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        return out.sequences[:, ids.size(1):], torch.stack(out.logits, dim=1).float()

    def gap(config):
        tokens, logits = sample(config, seed=1, max_new_tokens=sample_tokens)
        gen_logp = torch.log_softmax(logits / temperature, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        full = torch.cat([ids, tokens], dim=1)
        with torch.no_grad(), trainer.accelerator.autocast():
            train_logits = model(input_ids=full, attention_mask=torch.ones_like(full)).logits
        train_logits = train_logits[:, ids.size(1) - 1:-1].float()
        train_logp = torch.log_softmax(train_logits / temperature, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        d = (gen_logp - train_logp).abs()
        return {"mean_abs_logp_gap": d.mean().item(), "max_abs_logp_gap": d.max().item(),
                "mean_sampled_logp": train_logp.mean().item()}

    result = {"trl_generation": gap(trl_config), "kit_generation": gap(kit_config)}
    greedy = {}
    for name, cfg in (("trl", trl_config), ("kit", kit_config)):
        greedy[name], _ = sample(cfg, seed=2, do_sample=False, max_new_tokens=greedy_tokens)
    same = (greedy["trl"] == greedy["kit"]).int().cumprod(dim=1).sum(dim=1)
    result["greedy_tokens_before_first_difference"] = same.tolist()
    result["greedy_tokens"] = greedy_tokens
    result["sampled_tokens"] = sample_tokens
    allowed = max(MEAN_GAP_FLOOR, GAP_FACTOR * result["trl_generation"]["mean_abs_logp_gap"])
    result["allowed_mean_abs_logp_gap"] = allowed
    result["passes"] = result["kit_generation"]["mean_abs_logp_gap"] <= allowed
    return result


def run_one(args) -> dict:
    variant = args.one
    if variant.startswith("unsloth"):
        import unsloth  # noqa: F401  (first: Unsloth patches transformers and trl on import)
    import torch

    out = Path(args.out)
    started = time.perf_counter()
    trainer = make_trainer(args, variant, out)
    trl_config = (trainer.generation_config.__class__.from_dict(trainer.generation_config.to_dict())
                  if variant.startswith("kit") else None)  # the check's reference: TRL's own settings
    choice = None
    if variant.startswith("kit") or variant == "unsloth-kit":
        from kit.train.generation import speed_up_generation

        mode = "default" if variant == "kit-nographs" else "reduce-overhead"
        choice = speed_up_generation(trainer, max_prompt_tokens=args.prompt_tokens, mode=mode)
    gen_times, step_times = [], []
    timed_generation(trainer, gen_times, merged=variant == "merged")
    trainer.add_callback(step_timer(step_times))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    setup_s = time.perf_counter() - started
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    warm = WARMUP[variant]
    generation_timed = bool(gen_times)  # False: the trainer never called TRL's _generate_single_turn
    gen_times = gen_times or [0.0] * len(step_times)
    steady = list(zip(step_times, gen_times))[warm:] or list(zip(step_times, gen_times))
    step_med = statistics.median(s for s, _ in steady)
    gen_med = statistics.median(g for _, g in steady)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    result = {
        "variant": variant, "choice": choice.reason if choice else None, "setup_s": round(setup_s, 2),
        "step_s": [round(s, 3) for s in step_times], "generation_s": [round(g, 3) for g in gen_times],
        "warmup_steps": warm, "median_step_s": round(step_med, 3), "median_generation_s": round(gen_med, 3),
        "median_training_s": round(step_med - gen_med, 3),
        "generation_ms_per_token": round(1000 * gen_med / args.completion_tokens, 2),
        "peak_allocated_gib": round(peak / GIB, 3), "generation_timed": generation_timed,
        "loss": [h.get("loss") for h in logs], "reward": [h.get("reward") for h in logs],
    }
    if variant.startswith("unsloth"):
        from importlib import metadata

        result["unsloth"] = metadata.version("unsloth")
        result["decode_graphs"] = unsloth_graph_stats(trainer.model)
    Path(args.json).write_text(json.dumps(result, indent=1))  # kept if the check below fails
    if variant.startswith("kit") and args.check:
        prompt_ids = trainer.processing_class(PROMPT_WORD * args.prompt_tokens)["input_ids"]
        # TRL turns gradient checkpointing off around its own generation (a checkpointed layer in
        # training mode drops the KV cache); the check calls generate itself, so it does the same.
        trainer.model.gradient_checkpointing_disable()
        result["equivalence"] = equivalence(trainer, trl_config, trainer.generation_config, prompt_ids,
                                            sample_tokens=args.check_tokens or args.completion_tokens,
                                            greedy_tokens=args.greedy_tokens)
    return result


def estimate_for(args) -> dict | None:
    """kit's GRPO memory estimate for this configuration (kit.planning.memory.grpo_estimate)."""
    if args.model == "tiny":
        return None
    from kit.planning.config import RunConfig
    from kit.planning.memory import grpo_estimate
    from kit.planning.shapes import from_table

    cfg = RunConfig()
    cfg.method = "lora"
    cfg.lora.r, cfg.lora.target_modules = 16, "all-linear"
    est = grpo_estimate(from_table(args.model), cfg, "bf16", completions_per_device=args.generations,
                        prompt_tokens=args.prompt_tokens, completion_tokens=args.completion_tokens, beta=0.0,
                        gradient_checkpointing=True, quantized=False)
    return {"allocated_gib": round(est.allocated_bytes / GIB, 3), "total_gib": round(est.total_bytes / GIB, 3),
            "terms_gib": {k: round(v / GIB, 3) for k, v in est.terms.items()}, "notes": est.notes}


def cold_caches() -> dict:
    from gpu_common import cold_caches as fresh

    return fresh()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="Qwen/Qwen3-1.7B")
    p.add_argument("--variants", default="trl,kit,merged")
    p.add_argument("--steps", type=int, default=0, help="0: 3 for eager variants, 5 for kit and unsloth")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "kit-grpo-bench"),
                   help="where the unsloth variants' saved random weights go (not the results folder)")
    p.add_argument("--unsloth-site", default=None, help="a folder holding Unsloth, put first on the unsloth "
                   "variants' PYTHONPATH only")
    p.add_argument("--eager-steps", type=int, default=3, help="steps of the eager variants (trl, merged) when "
                   "--steps is 0")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--completion-tokens", type=int, default=256)
    p.add_argument("--budget-s", type=float, default=540, help="start no variant after this much time")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--check-tokens", type=int, default=0, help="sampled tokens per completion in the check "
                   "(0: --completion-tokens)")
    p.add_argument("--greedy-tokens", type=int, default=64)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        if not args.steps:
            args.steps = 5 if args.one.startswith(("kit", "unsloth")) else args.eager_steps
        result = run_one(args)
        Path(args.json).write_text(json.dumps(result, indent=1))
        return 0

    started = time.perf_counter()
    results = {"what": (f"GRPO step, TRL's GRPOTrainer driven directly vs kit's generation pass: random-weight {args.model} shape, "
                        f"bf16 LoRA r16 all-linear, {args.generations} generations x {args.completion_tokens} tokens "
                        f"from one {args.prompt_tokens}-token prompt per step, transformers generation, gradient "
                        "checkpointing on, beta 0; command: python bench/grpo_speed.py --out DIR"),
               "machine": None, "versions": {}, "variants": {}}
    import torch
    from importlib import metadata

    results["machine"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    for name in ("torch", "transformers", "trl", "peft", "accelerate"):
        results["versions"][name] = metadata.version(name)
    results["estimate"] = estimate_for(args)
    path = out / "grpo_speed.json"
    variants = args.variants.split(",")
    for variant in variants + ([] if "kit-nographs" in variants else ["kit-nographs"]):
        kit_ran = "median_step_s" in results["variants"].get("kit", {"median_step_s": 0})  # timed, even if its check failed
        if variant == "kit-nographs" and variant not in variants and kit_ran:
            continue
        left = args.budget_s - (time.perf_counter() - started)
        if left < 30:
            results["variants"][variant] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        one = out / f"{variant}.json"
        cmd = [sys.executable, __file__, "--out", str(out), "--model", args.model, "--one", variant, "--json",
               str(one), "--steps", str(args.steps), "--generations", str(args.generations),
               "--prompt-tokens", str(args.prompt_tokens), "--completion-tokens", str(args.completion_tokens),
               "--eager-steps", str(args.eager_steps),
               "--check-tokens", str(args.check_tokens), "--greedy-tokens", str(args.greedy_tokens),
               "--work", args.work]
        if not args.check:
            cmd.append("--no-check")
        print(f"[grpo_speed] {variant} ({left:.0f} s left)", flush=True)
        log = out / f"{variant}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **cold_caches()}  # each variant compiles from scratch
        if variant.startswith("unsloth") and args.unsloth_site:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.unsloth_site, env.get("PYTHONPATH")]))
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=left, cwd=ROOT,
                                    env=env).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        if one.exists():
            results["variants"][variant] = json.loads(one.read_text())
            one.unlink()
        if rc != 0:
            results["variants"].setdefault(variant, {}).update(
                {"failed": rc, "log_tail": log.read_text(errors="replace")[-3000:]})
        summarise(results)
        path.write_text(json.dumps(results, indent=1))
        print(json.dumps({k: v for k, v in results["variants"][variant].items() if k not in ("log_tail",)})[:1500],
              flush=True)
        if rc != 0:
            print(results["variants"][variant]["log_tail"], flush=True)
    print(json.dumps(results.get("summary"), indent=1))
    return 0


def summarise(results: dict) -> None:
    v = results["variants"]
    base, kit = v.get("trl", {}), v.get("kit", {})
    if "median_step_s" in base and "median_step_s" in kit:
        results["summary"] = {
            "step_ratio_kit_over_trl": round(kit["median_step_s"] / base["median_step_s"], 3),
            "generation_ratio_kit_over_trl": round(kit["median_generation_s"] / base["median_generation_s"], 3),
            "kit_first_step_s": kit["step_s"][0] if kit.get("step_s") else None,
        }
        for name in ("unsloth", "unsloth-kit"):
            other = v.get(name, {})
            if "median_step_s" in other:
                results["summary"][f"step_ratio_{name}_over_trl"] = round(other["median_step_s"] / base["median_step_s"], 3)
                results["summary"][f"step_ratio_{name}_over_kit"] = round(other["median_step_s"] / kit["median_step_s"], 3)
                results["summary"][f"{name}_first_step_s"] = other["step_s"][0] if other.get("step_s") else None
        est = results.get("estimate")
        if est:
            results["summary"]["estimate_vs_trl_peak"] = round(est["allocated_gib"] / base["peak_allocated_gib"], 3)
            results["summary"]["estimate_vs_kit_peak"] = round(est["allocated_gib"] / kit["peak_allocated_gib"], 3)


if __name__ == "__main__":
    raise SystemExit(main())
