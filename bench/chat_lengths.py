"""Synthetic chat rows whose token lengths follow LMSYS-Chat-1M's published statistics.

    python bench/chat_lengths.py --rows 256 --out /tmp/chat.jsonl    # writes rows, prints their stats

The distribution: LMSYS-Chat-1M (Zheng et al. 2023, arXiv:2309.11998, Table 1), one million real
conversations with 25 chat models: 2.0 turns per conversation on average, 69.5 ± 143.3 tokens per
user prompt and 214.5 ± 226.5 tokens per response (mean ± standard deviation, Llama tokenizer). The
paper gives means and deviations, not the shape; here each prompt and each response length is
drawn from the log-normal with that mean and deviation (so medians of 30 and 147 tokens: short
rows with a long tail, as such data is), and the number of turns is geometric with mean 2.0.
The percentiles `stats` prints are those of the rows written, after the chat template and
truncation to seq_len: that is what the benchmark trains on.

Words are ones that the tiny tokenizer (models/tiny-qwen3) encodes as one token each, so a drawn
length of n tokens is n words; the loss is on the assistant turns only (kit's `messages` format).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SOURCE = ("LMSYS-Chat-1M (Zheng et al. 2023, arXiv:2309.11998, Table 1): 2.0 turns per conversation, "
          "69.5 ± 143.3 tokens per prompt, 214.5 ± 226.5 per response; log-normal lengths with that mean and "
          "deviation, geometric turn count")
PROMPT = (69.5, 143.3)
RESPONSE = (214.5, 226.5)
MEAN_TURNS = 2.0
MAX_TURNS = 8


def lognormal(mean: float, sd: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal with this mean and standard deviation."""
    sigma2 = math.log(1 + (sd / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def one_token_words(tokenizer) -> list[str]:
    words = [k[1:] for k in tokenizer.get_vocab() if k.startswith("Ġ") and k[1:].isalpha()]
    return sorted(w for w in words if len(tokenizer.encode(" " + w, add_special_tokens=False)) == 1)


def make_rows(n: int, words: list[str], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    p_mu, p_sigma = lognormal(*PROMPT)
    r_mu, r_sigma = lognormal(*RESPONSE)

    def text(mu, sigma):
        return " ".join(rng.choice(words) for _ in range(max(1, round(rng.lognormvariate(mu, sigma)))))

    rows = []
    for _ in range(n):
        turns = 1
        while turns < MAX_TURNS and rng.random() > 1 / MEAN_TURNS:
            turns += 1
        messages = []
        for _ in range(turns):
            messages += [{"role": "user", "content": text(p_mu, p_sigma)},
                         {"role": "assistant", "content": text(r_mu, r_sigma)}]
        rows.append({"messages": messages})
    return rows


def write(path: Path, n: int, tokenizer, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in make_rows(n, one_token_words(tokenizer), seed):
            f.write(json.dumps(row) + "\n")
    return path


def stats(lengths: list[int], trained: list[int]) -> dict:
    """Mean and percentiles of the tokenized rows, and the share of tokens that carry the loss."""
    s = sorted(lengths)

    def pct(p):
        return s[min(len(s) - 1, int(p / 100 * len(s)))]

    return {"rows": len(s), "mean_tokens": round(sum(s) / len(s), 1), "p10": pct(10), "p50": pct(50),
            "p90": pct(90), "p99": pct(99), "max": s[-1], "trained_tokens": sum(trained),
            "trained_fraction": round(sum(trained) / sum(s), 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--out", default="/tmp/kit-chat.jsonl")
    a = p.parse_args()
    from transformers import AutoTokenizer

    from bench.gpu_common import TOKENIZER
    from kit.train import data

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    write(Path(a.out), a.rows, tok)
    names = {"messages": "messages"}
    rows = [data.tokenize_row(json.loads(line), "messages", names, tok, a.seq_len) for line in open(a.out)]
    print(json.dumps({"source": SOURCE, **stats([len(r["input_ids"]) for r in rows],
                                                [sum(r["completion_mask"]) for r in rows])}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
