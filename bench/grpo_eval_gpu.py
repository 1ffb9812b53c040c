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
batch (what the noise costs), and whether the CUDA and CPU random states were left as they were.
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

    from kit.evaluation import heldout, stage
    from kit.planning import config
    from kit.train.data import Prepared

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="Qwen/Qwen3-1.7B")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
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

    runs = [run(m) for m in sorted(MICRO_BATCHES, reverse=True)]
    ref = seen[max(MICRO_BATCHES)]
    for r in runs:
        mine = seen[r["micro_batch"]]
        r["identical_to_largest_batch"] = sum(a == b for a, b in zip(mine, ref)) / len(ref)
        r["mean_first_difference_token"] = round(sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                          len(a)) for a, b in zip(mine, ref)) / len(ref), 1)
    prompts = [list(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]) for r in rows]
    big = max(MICRO_BATCHES) * heldout.GENERATE_BATCH_FACTOR
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        heldout._generate(model, tok, prompts, args.tokens, big)
    if device == "cuda":
        torch.cuda.synchronize()
    greedy = round(time.perf_counter() - started, 2)
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "model": args.model,
           "rows": args.rows, "completion_tokens": args.tokens, "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "runs": runs,
           "greedy_seconds_at_largest_batch": greedy}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "grpo_eval_" + ("h100" if "H100" in out["device"] else "h200" if "H200" in out["device"] else device)
    (Path(args.out) / f"{name}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
