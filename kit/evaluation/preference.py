"""What is measured on held-out preference rows (trainer dpo and kto), the same way before and after.

- implicit reward of an answer: beta × (log p_policy(answer | prompt) − log p_reference(answer | prompt)),
  the quantity DPO and KTO train; the reference is the starting model (with LoRA: the adapter
  disabled; else the baseline's own log-probabilities, kept in its record).
- preference accuracy: dpo, the share of pairs whose chosen answer gets the higher reward; kto, the
  share of rows whose reward has the label's sign (above 0 for desirable, below for undesirable).
  Before training the policy is the reference, every reward 0: accuracy 0, margin 0.
- reward margin: dpo, the mean of reward(chosen) − reward(rejected); kto, the mean reward of the
  desirable rows minus that of the undesirable ones.
- loss: DPO's sigmoid loss −log σ(margin) per pair (kto: −log σ(±reward) per row), the training objective.
- samples: greedy answers to the first `eval.samples` prompts, the preferred answer as the reference.

Rank 0 runs this alone on the unwrapped model.
"""

from __future__ import annotations

import math
import time

from kit.evaluation.heldout import _generate, rows_fingerprint
from kit.train.preference_data import TEXTS, pair_ids

FORMATS = ("preference", "unpaired_preference")


def beta(cfg) -> float:
    return cfg.dpo.beta if cfg.trainer == "dpo" else cfg.kto.beta


def measure(model, tokenizer, rows: dict, cfg, batch_size: int, reference: dict | None,
            starting: bool = False) -> dict:
    """The result record on `rows` (columns of preference rows). `reference`: the baseline's record,
    whose log-probabilities are the reference where the model has no adapter to disable; `starting`:
    the model has not trained yet (the baseline), so it is its own reference."""
    import torch

    started = time.monotonic()
    fmt = "preference" if "chosen" in rows else "unpaired_preference"
    n = len(rows["prompt"])
    seqs = {key: [pair_ids(tokenizer, rows["prompt"][i], rows[key][i], cfg.seq_len) for i in range(n)]
            for key in TEXTS[fmt]}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            policy = {key: _logps(model, s, batch_size, tokenizer) for key, s in seqs.items()}
            ref = policy if starting else _reference(model, seqs, batch_size, tokenizer, reference)
            prompts = [p for p, _ in seqs[TEXTS[fmt][0]][: cfg.eval.samples]]
            answers = _generate(model, tokenizer, prompts, cfg.eval.max_new_tokens, batch_size) if prompts else []
    finally:
        model.train(was_training)
    b = beta(cfg)
    result = {"rows": n, "rows_sha256": rows_fingerprint([p + a for key in seqs for p, a in seqs[key]]),
              "logps": policy}
    if ref is None:
        result["metric"] = {"name": None, "skipped": "no reference log-probabilities: full fine-tuning without a "
                                                     "baseline (eval.baseline is false)"}
        result["loss"] = None
    else:
        rewards = {key: [b * (p - r) for p, r in zip(policy[key], ref[key])] for key in policy}
        result.update(_scores(fmt, rewards, rows))
    first = TEXTS[fmt][0]
    result["samples"] = [{"prompt": tokenizer.decode(p, skip_special_tokens=False),
                          "reference": tokenizer.decode(a, skip_special_tokens=True).strip(), "output": o}
                         for (p, a), o in zip(seqs[first], answers)]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _scores(fmt: str, rewards: dict, rows: dict) -> dict:
    if fmt == "preference":
        margins = [c - r for c, r in zip(rewards["chosen"], rewards["rejected"])]
        correct = sum(m > 0 for m in margins)
        losses = [_softplus(-m) for m in margins]
        margin = sum(margins) / len(margins)
    else:
        labels = rows["label"]
        signed = [r if good else -r for r, good in zip(rewards["completion"], labels)]
        correct = sum(s > 0 for s in signed)
        losses = [_softplus(-s) for s in signed]
        good = [r for r, g in zip(rewards["completion"], labels) if g]
        bad = [r for r, g in zip(rewards["completion"], labels) if not g]
        margin = (sum(good) / len(good) if good else 0.0) - (sum(bad) / len(bad) if bad else 0.0)
    of = len(losses)
    return {"loss": sum(losses) / of, "reward_margin": margin,
            "metric": {"name": "preference_accuracy", "value": correct / of, "correct": correct, "of": of}}


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))  # −log σ(−x), stable for large |x|


def _reference(model, seqs: dict, batch_size: int, tokenizer, reference: dict | None) -> dict | None:
    """The reference's log-probabilities: the model with its adapter disabled, else the baseline's."""
    if hasattr(model, "disable_adapter") and getattr(model, "peft_config", None):
        with model.disable_adapter():
            return {key: _logps(model, s, batch_size, tokenizer) for key, s in seqs.items()}
    kept = ((reference or {}).get("result") or {}).get("logps")
    if kept and all(len(kept.get(k, ())) == len(s) for k, s in seqs.items()):
        return kept
    return None


def _logps(model, pairs: list, batch_size: int, tokenizer) -> list[float]:
    """log p(answer | prompt), summed over the answer's tokens, for each (prompt ids, answer ids)."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[float] = []
    for i in range(0, len(pairs), batch_size):
        batch = pairs[i:i + batch_size]
        ids = [p + a for p, a in batch]
        width = max(map(len, ids))
        x = torch.tensor([r + [pad] * (width - len(r)) for r in ids], device=device)
        att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids], device=device)
        mask = torch.tensor([[0] * len(p) + [1] * len(a) + [0] * (width - len(p) - len(a)) for p, a in batch],
                            device=device)
        logits = model(input_ids=x, attention_mask=att).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
        out += (logp * mask[:, 1:]).sum(dim=1).tolist()
    return out
