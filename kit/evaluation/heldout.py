"""What is measured on the held-out rows, the same way before training and after.

- loss and perplexity: mean cross-entropy over the tokens that carry the loss in training (the
  answer tokens of chat/instruction data, every token of plain text), exp of it.
- exact match (chat, alpaca and prompt/completion data): the model answers each row's prompt with
  greedy decoding; a hit is the decoded answer, stripped, equal to the reference answer (the first
  span the training loss covers: the first assistant turn). Greedy, so "before" and "after" differ
  by the model alone, not by a sampler. Plain text has no reference answer: no task metric.
- samples: the first `eval.samples` rows of the same subset, prompt, reference and answer.

The rows are a fixed, seeded choice of `eval.subset` rows of the held-out split, so the final
evaluation sees exactly the rows the baseline saw. Rank 0 runs this alone on the unwrapped model.
"""

from __future__ import annotations

import hashlib
import math
import random
import time

from kit.errors import UsageError

TEXT_PROMPT_TOKENS = 32  # plain text samples: continue the first tokens of a row
# Generation holds no activations for a backward pass, only a KV cache: it takes this many times
# the training micro-batch (fewer generate calls: on a small model their per-token overhead dominates).
GENERATE_BATCH_FACTOR = 4


def choose_rows(n_rows: int, subset: int, seed: int) -> list[int]:
    """A fixed, seeded choice of `subset` of `n_rows` row indices, ascending."""
    return sorted(random.Random(seed).sample(range(n_rows), min(subset, n_rows)))


def rows_fingerprint(ids: list[list[int]]) -> str:
    """sha256 of the evaluated token ids: the same value proves the same rows were evaluated."""
    h = hashlib.sha256()
    for row in ids:
        h.update(",".join(map(str, row)).encode() + b";")
    return h.hexdigest()


def metric_plan(eval_cfg, data_format: str) -> tuple[str | None, str | None]:
    """(metric name, None) or (None, why there is none).

    Raises:
        UsageError: eval.metric=exact_match on plain text, where no answer exists to match.
    """
    if eval_cfg.metric == "none":
        return None, "eval.metric is none"
    if data_format == "text":
        if eval_cfg.metric == "exact_match":
            raise UsageError("eval.metric=exact_match needs prompts with reference answers, but the data is plain "
                             "text (format text): use eval.metric=auto (loss and perplexity only) or none")
        return None, "plain text has no reference answer: loss and perplexity only"
    return "exact_match", None


def split_answer(ids: list[int], mask: list[int]) -> tuple[list[int], list[int]]:
    """(prompt, reference answer): the tokens before the first loss span, and that span."""
    start = mask.index(1)
    end = start
    while end < len(mask) and mask[end]:
        end += 1
    return ids[:start], ids[start:end]


def measure(model, tokenizer, rows: dict, *, metric: str | None, skip_reason: str | None, eval_cfg,
            batch_size: int) -> dict:
    """Loss, perplexity, the task metric and the samples on `rows` ({input_ids, completion_mask}).

    Returns a JSON-able dict; the model is left in the mode it was in.
    """
    import torch

    started = time.monotonic()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            loss, tokens = _loss(model, rows, batch_size, tokenizer.pad_token_id or 0)
            pairs = [split_answer(i, m) for i, m in zip(rows["input_ids"], rows["completion_mask"])]
            if metric is not None and len(pairs) < eval_cfg.min_rows:
                metric, skip_reason = None, (f"the held-out subset has {len(pairs)} rows; exact match needs at "
                                             f"least eval.min_rows={eval_cfg.min_rows}")
            asked = pairs if metric else pairs[: eval_cfg.samples]
            prompts = [p if p else ids[: min(TEXT_PROMPT_TOKENS, max(1, len(ids) // 2))]
                       for (p, _), ids in zip(asked, rows["input_ids"])]
            refs = [a if p else ids[len(pr):] for (p, a), ids, pr in zip(asked, rows["input_ids"], prompts)]
            longest = max((len(r) for r in refs), default=0)
            outputs = _generate(model, tokenizer, prompts, min(eval_cfg.max_new_tokens, longest + 8),
                                batch_size * GENERATE_BATCH_FACTOR)
    finally:
        model.train(was_training)
    words = [tokenizer.decode(r, skip_special_tokens=True).strip() for r in refs]
    result = {"rows": len(rows["input_ids"]), "rows_sha256": rows_fingerprint(rows["input_ids"]),
              "loss_tokens": tokens, "loss": loss, "perplexity": math.exp(min(loss, 700.0))}
    if metric:
        correct = sum(o == w for o, w in zip(outputs, words))
        result["metric"] = {"name": metric, "value": correct / len(words), "correct": correct, "of": len(words)}
    else:
        result["metric"] = {"name": None, "skipped": skip_reason}
    result["samples"] = [{"prompt": tokenizer.decode(p, skip_special_tokens=False), "reference": w, "output": o}
                         for p, w, o in list(zip(prompts, words, outputs))[: eval_cfg.samples]]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _loss(model, rows: dict, batch_size: int, pad_id: int) -> tuple[float, int]:
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    total, count = 0.0, 0
    ids_all, masks_all = rows["input_ids"], rows["completion_mask"]
    for i in range(0, len(ids_all), batch_size):
        ids, masks = ids_all[i:i + batch_size], masks_all[i:i + batch_size]
        width = max(map(len, ids))
        x = torch.tensor([r + [pad_id] * (width - len(r)) for r in ids], device=device)
        att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids], device=device)
        m = torch.tensor([r + [0] * (width - len(r)) for r in masks], device=device)
        logits = model(input_ids=x, attention_mask=att).logits[:, :-1].float()
        target, keep = x[:, 1:], m[:, 1:].bool()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
        total += nll[keep.reshape(-1)].sum().item()
        count += int(keep.sum().item())
    return (total / count if count else float("nan")), count


def _generate(model, tokenizer, prompts: list[list[int]], max_new: int, batch_size: int) -> list[str]:
    """Greedy answers, decoded and stripped; prompts are left-padded so each answer starts at the end."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i:i + batch_size]
        width = max(map(len, batch))
        x = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        gen = model.generate(input_ids=x, attention_mask=att, max_new_tokens=max(1, max_new), do_sample=False,
                             use_cache=True, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
        out += [tokenizer.decode(g[width:], skip_special_tokens=True).strip() for g in gen]
    return out
