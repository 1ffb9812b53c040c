"""What a grpo job's baseline (or final) evaluation costs on a GPU, and how far its answers hold across
generation batch sizes in bf16.

    python bench/grpo_eval_gpu.py --out DIR [--model Qwen/Qwen3-1.7B] [--rows 64] [--tokens 256]

kit.evaluation.stage.measure on a random-weight model of the shape from kit's table (seeded bf16
weights built on the GPU, the tiny tokenizer; no downloads), `--rows` held-out chat prompts of 40 to
120 tokens, `grpo.max_completion_length` = `--tokens`, two reward functions on the token ids.
Random weights never emit the end token: every completion runs its full length, the worst case.

Recorded per training micro-batch (the evaluation generates 4 of them at a time): seconds, peak
`max_memory_allocated`, each reward's mean, and the share of completions identical to those of the
largest batch (the noise is per row, so only bf16 rounding of other batch shapes can move a token;
random weights leave near-ties). Also: plain greedy decoding of the same prompts at the largest
batch (what the noise costs), the noise alone per decoding step, one batch generated directly with
and without the noise (no warm-up in it), and whether the CUDA and CPU random states were left as
they were.

Results: grpo_eval_h100.json (`--micro 8 --rows 32`, the current noise); grpo_eval_h100_batch_sizes.json
(`--micro 2,8`, 64 rows) was measured with an earlier form of the same noise (float64, the same hash
over 32 bits): what it shows, how far bf16 answers hold across batch shapes, does not depend on it.
The first stage.measure of a process includes the warm-up of its first generation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.grpo_speed import TOKENIZER, build_model, even_tokens  # noqa: E402

GIB = 2**30
MICRO_BATCHES = (2, 8)


def length(completions, completion_ids=None, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def main() -> int:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from kit.evaluation import heldout, rewards, stage
    from kit.planning import config
    from kit.train.data import Prepared

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="Qwen/Qwen3-1.7B")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--micro", default=",".join(map(str, MICRO_BATCHES)), help="training micro-batches, e.g. 2,8")
    args = p.parse_args()
    micro_batches = tuple(int(m) for m in args.micro.split(","))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.model if device == "cuda" else "tiny", device)
    model.eval()
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    rng = random.Random(0)
    words = [w for w in (tok.decode([i]) for i in range(3, 500)) if w.strip().isalpha()]
    rows = [{"prompt": [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(30, 110)))}],
             "answer": str(i)} for i in range(args.rows)]
    ds = Dataset.from_list(rows)
    data = Prepared(train=ds, eval=ds, format="prompts", dropped_too_long=0, eval_duplicates=0, mean_tokens=0.0)
    cfg = config.load(str(ROOT / "configs" / "default.yaml"), [
        f"output_dir={tempfile.mkdtemp()}", "trainer=grpo", "grpo.rewards=r.py:even_tokens,length",
        f"grpo.max_completion_length={args.tokens}", f"eval.subset={args.rows}", "data.eval_fraction=0.5"])
    seen: dict[int, list] = {}

    def run(micro: int) -> dict:
        got = []

        def record(completions, completion_ids=None, **kwargs):
            got.extend(completion_ids)
            return [0.0] * len(completions)

        cpu_state = torch.random.get_rng_state()
        cuda_state = torch.cuda.get_rng_state() if device == "cuda" else None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        rec = stage.measure(cfg, model, tok, data, micro, "baseline", reward_funcs=[even_tokens, length, record])
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        assert rec["skipped"] is None, rec["skipped"]
        seen[micro] = got
        return {"micro_batch": micro, "generation_batch": micro * heldout.GENERATE_BATCH_FACTOR,
                "seconds": round(seconds, 2), "ms_per_token_step": round(1000 * seconds / (
                    -(-args.rows // (micro * heldout.GENERATE_BATCH_FACTOR)) * args.tokens), 2),
                "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 3) if device == "cuda" else None,
                "rewards": {k: v for k, v in rec["result"]["rewards"].items() if k != "record"},
                "rng_untouched": torch.equal(torch.random.get_rng_state(), cpu_state) and (
                    cuda_state is None or torch.equal(torch.cuda.get_rng_state(), cuda_state))}

    runs = [run(m) for m in sorted(micro_batches, reverse=True)]
    ref = seen[max(micro_batches)]
    for r in runs:
        mine = seen[r["micro_batch"]]
        r["identical_to_largest_batch"] = sum(a == b for a, b in zip(mine, ref)) / len(ref)
        r["mean_first_difference_token"] = round(sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                          len(a)) for a, b in zip(mine, ref)) / len(ref), 1)
    prompts = [list(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]) for r in rows]
    big = max(micro_batches) * heldout.GENERATE_BATCH_FACTOR
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        heldout._generate(model, tok, prompts, args.tokens, big)
    if device == "cuda":
        torch.cuda.synchronize()
    greedy = round(time.perf_counter() - started, 2)
    from transformers import LogitsProcessorList

    direct = {}
    batch = prompts[:big]
    width = max(map(len, batch))
    x = torch.tensor([[0] * (width - len(q)) + q for q in batch], device=device)
    att = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in batch], device=device)
    for name, extra in (("greedy", {}), ("noise", {"logits_processor": LogitsProcessorList([
            rewards.GumbelNoise(cfg.seed, list(range(len(batch))), width, 1.0)])})):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(input_ids=x, attention_mask=att, max_new_tokens=args.tokens, do_sample=False,
                                 use_cache=True, pad_token_id=0, temperature=None, top_p=None, top_k=None, **extra)
        if device == "cuda":
            torch.cuda.synchronize()
        steps = gen.shape[1] - width
        direct[name] = {"seconds": round(time.perf_counter() - started, 2), "steps": steps,
                        "ms_per_step": round(1000 * (time.perf_counter() - started) / max(1, steps), 2),
                        "mean_tokens_before_eos": round(sum(next((i for i, t in enumerate(r) if t == 2), len(r))
                                                            for r in gen[:, width:].tolist()) / len(batch), 1)}
    noise = rewards.GumbelNoise(cfg.seed, list(range(big)), 100, cfg.grpo.temperature)
    scores = torch.randn(big, model.config.vocab_size, device=device)
    ids = torch.zeros(big, 101, dtype=torch.long, device=device)
    noise(ids, scores)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(20):
        noise(ids, scores)
    if device == "cuda":
        torch.cuda.synchronize()
    noise_ms = round((time.perf_counter() - started) / 20 * 1000, 3)
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "model": args.model,
           "rows": args.rows, "completion_tokens": args.tokens, "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "runs": runs,
           "greedy_seconds_at_largest_batch": greedy, "noise_ms_per_step_at_largest_batch": noise_ms,
           "generate_direct_at_largest_batch": direct}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "grpo_eval_" + ("h100" if "H100" in out["device"] else "h200" if "H200" in out["device"] else device)
    (Path(args.out) / f"{name}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
