"""What is measured on held-out prompts for trainer grpo, the same way before training and after.

- the mean of each reward function: the model answers each held-out prompt once, and each of the
  user's reward functions scores the answers, called as TRL's GRPOTrainer calls it (1.16,
  `_calculate_rewards`): `prompts=`, `completions=` (the decoded text for text prompts, a list
  `[{"role": "assistant", "content": text}]` for message prompts), `completion_ids=`, and every
  column of the rows but kit's own as keywords; `trainer_state` is None and `log_extra`/`log_metric`
  do nothing, as in the dry call at start (kit.train.rewards). A None (or NaN) value is skipped, as
  TRL's nanmean skips it; the mean is None when every value is None.
- reward: the mean over prompts of the sum of the functions' values (None values left out, a prompt
  every function left unscored left out), what TRL logs as `reward` during training.
- samples: the first `eval.samples` prompts, their answers and each function's value.

Decoding: sampled at `grpo.temperature`, as training samples, not greedy. The rewards GRPO raises
are those of the sampled policy, so these means are comparable with the `rewards/NAME/mean` TRL logs
during training; a greedy answer can score well when samples score badly, or the reverse. The
sampling is pure temperature sampling (TRL's defaults: top_p 1, top_k 0), drawn by the Gumbel-max
rule: the chosen token is argmax(logits / temperature + G), G a Gumbel noise computed from
(seed, the row's index, the token position, the vocabulary index) by an integer hash. So each row
gets the same noise before and after training, in whatever batch it is generated: the before and
after numbers differ by the model, not by a sampler, and the training's random number generators
are never touched, not even by a reward function that draws random numbers (their states are put
back): a resumed run samples as an uninterrupted one would. On a GPU in 16 bits,
another batch shape rounds the logits differently and a near-tie can go the other way: before and
after use the same batches (the same rows, the same micro-batch), so this happens only where a
resume elsewhere planned another micro-batch or memory ran out (random-weight Qwen3-1.7B, where near
-ties abound: 4 of 64 completions identical between batches of 32 and 8, the reward means 0.4916 and
0.4941; bench/results/grpo_eval_h100_batch_sizes.json).

Cost (bench/results/grpo_eval_h100.json; H100, random-weight Qwen3-1.7B bf16, 32 prompts x 256
tokens in one batch): the noise takes 0.84 ms a decoding step, generation 9.5 s with it and 10.2 s
plain greedy; the first generation of a process pays about 20 s of warm-up more.

At most `grpo.max_completion_length` new tokens, as in training, fewer only where the model's
context (`max_position_embeddings`) ends sooner. Prompts go `GENERATE_BATCH_FACTOR` training
micro-batches at a time (generation keeps no activations for a backward pass); out of GPU memory,
the same prompts go again in halves, each row with the same noise. A reward function that raises,
returns the wrong number of values or a value that is not a number: `RewardFailed` naming it (the
evaluation records it as skipped; the job is kept). Rank 0 runs this alone on the unwrapped model.
"""

from __future__ import annotations

import contextlib
import time

from kit.evaluation.heldout import GENERATE_BATCH_FACTOR, rows_fingerprint
from kit.redaction import redact
from kit.shown import shown

FORMATS = ("prompts",)
# Columns the reward functions do not receive as keywords: TRL's own, and kit's row hash.
NOT_KWARGS = ("prompt", "completion", "completion_ids", "row_hash")
_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


class RewardFailed(Exception):
    """A reward function failed on the evaluation's completions; the message names it (one line, shown,
    a token in it redacted: it is the user's code's own text)."""

    def __init__(self, message: str):
        super().__init__(shown(redact(message), 600))


def reward_names(funcs) -> list[str]:
    """Each function's name as TRL logs it (`rewards/NAME/mean`), a repeated one numbered (`name_2`)."""
    out: list[str] = []
    from kit.train.rewards import reward_name

    for func in funcs:
        name = reward_name(func)
        base, n = name, 2
        while name in out:
            name, n = f"{base}_{n}", n + 1
        out.append(name)
    return out


def measure(model, tokenizer, rows: dict, keys: list[int], funcs, cfg, batch_size: int) -> dict:
    """The result record on `rows` (columns of prompt rows); `keys`: each row's index in the held-out
    split, which picks its sampling noise."""
    import torch

    started = time.monotonic()
    prompts = list(rows["prompt"])
    ids = [_prompt_ids(tokenizer, p) for p in prompts]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            completion_ids = _sample(model, tokenizer, ids, keys, cfg, batch_size)
    finally:
        model.train(was_training)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completion_ids]
    chat = bool(prompts) and isinstance(prompts[0], list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
    columns = {k: list(v) for k, v in rows.items() if k not in NOT_KWARGS}
    names = reward_names(funcs)
    with _random_states_kept(next(model.parameters()).device):  # a reward function may draw random numbers
        values = {name: _call(func, name, prompts, completions, completion_ids, columns,
                              cfg.grpo.reward_timeout)
                  for name, func in zip(names, funcs)}
    result = {"rows": len(prompts), "rows_sha256": rows_fingerprint(ids), **summary(values),
              "decoding": {"temperature": cfg.grpo.temperature, "seed": cfg.seed,
                           "max_new_tokens": cfg.grpo.max_completion_length},
              "samples": [{"prompt": tokenizer.decode(ids[i], skip_special_tokens=False), "output": texts[i],
                           "rewards": {name: values[name][i] for name in names}}
                          for i in range(min(cfg.eval.samples, len(prompts)))]}
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def summary(values: dict[str, list]) -> dict:
    """{rewards: {name: mean or None}, scored: {name: values not None}, reward: mean total or None}."""
    means, scored = {}, {}
    for name, vals in values.items():
        kept = [float(v) for v in vals if v is not None]
        means[name], scored[name] = (sum(kept) / len(kept) if kept else None), len(kept)
    n = len(next(iter(values.values()), []))
    totals = [sum(float(values[k][i]) for k in values if values[k][i] is not None) for i in range(n)
              if any(values[k][i] is not None for k in values)]
    return {"rewards": means, "scored": scored, "reward": sum(totals) / len(totals) if totals else None}


def _call(func, name: str, prompts, completions, completion_ids, columns: dict, seconds: float) -> list:
    from kit.train.rewards import USER_FAILURES, BadValues, bounded, call, failure, values

    n = len(prompts)
    func = getattr(func, "__wrapped__", func)  # the user's own: its failure here is a recorded skip, not a stop
    try:
        with bounded(f"{name} (on {n} held-out completions)", seconds=seconds):  # a hang still ends the job
            out = call(func, dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                  trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None,
                                  **columns))
            floats = values(out, n)  # TRL's reading of it: NaN for None, a number else
    except BadValues as exc:
        raise RewardFailed(f"the reward function {name} {exc} (on {n} held-out completions)") from None
    except USER_FAILURES as exc:  # the user's code: named in the skipped reason, the job goes on
        raise RewardFailed(f"the reward function {name} {failure(exc)[:260]} (on {n} held-out completions)") from None
    return [None if v != v else v for v in floats]  # NaN (or None) is unscored, as TRL's nanmean leaves it out


@contextlib.contextmanager
def _random_states_kept(device):
    """Python's, NumPy's and torch's random states (CPU and this GPU) as they were after the block."""
    import random

    import numpy
    import torch

    states = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(states[0])
        numpy.random.set_state(states[1])


def _prompt_ids(tokenizer, prompt) -> list[int]:
    """The prompt's token ids as TRL's GRPOTrainer makes them: the chat template with the generation
    prompt for messages, the tokenizer's own rule for text."""
    if isinstance(prompt, list):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    return list(tokenizer(text=prompt)["input_ids"])


def _sample(model, tokenizer, prompts: list[list[int]], keys: list[int], cfg, batch_size: int) -> list[list[int]]:
    """One sampled completion per prompt (token ids up to and including the end token, no padding)."""
    import torch
    from transformers import LogitsProcessorList

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if eos is not None else tokenizer.eos_token_id
    ends = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    out: list[list[int]] = []
    i, size = 0, max(1, batch_size * GENERATE_BATCH_FACTOR)
    while i < len(prompts):
        batch, batch_keys = prompts[i:i + size], keys[i:i + size]
        width = max(map(len, batch))
        max_new = cfg.grpo.max_completion_length
        if context:
            max_new = max(1, min(max_new, context - width))
        x = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        noise = GumbelNoise(cfg.seed, batch_keys, width, cfg.grpo.temperature)
        try:
            gen = model.generate(input_ids=x, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                                 use_cache=True, pad_token_id=pad, temperature=None, top_p=None, top_k=None,
                                 logits_processor=LogitsProcessorList([noise]))
        except torch.OutOfMemoryError:
            if size == 1:
                raise
            del x, att  # the same rows again in halves: each row's noise is its own, so the answers are the same
            size = max(1, size // 2)
            _empty_cache(device)
            continue
        for row in gen[:, width:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in ends), len(row))
            out.append(row[:cut])
        i += len(batch)
    return out


def _empty_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


class GumbelNoise:
    """A logits processor that turns greedy decoding into temperature sampling with a fixed noise per
    (seed, row key, position, token): argmax(logits / T + Gumbel) is a sample of softmax(logits / T).

    The noise is a 32-bit integer hash of those four, its top 23 bits a uniform u in (0, 1) exact in
    float32, and -log(-log(1 - u)) the Gumbel value (its tail cut at 16.6, a chance of 6e-8)."""

    def __init__(self, seed: int, keys: list[int], width: int, temperature: float):
        self.rows = [_mix(_mix(int(seed) & _M32) ^ (int(k) & _M32)) for k in keys]
        self.width, self.temperature = width, temperature
        self._on = None  # (the rows' keys, each token's hashed index) on the device of the scores

    def __call__(self, input_ids, scores):
        import torch

        if self._on is None or self._on[1].device != scores.device or len(self._on[1]) != scores.shape[-1]:
            vocab = torch.arange(scores.shape[-1], dtype=torch.int64, device=scores.device)
            self._on = (torch.tensor(self.rows, dtype=torch.int64, device=scores.device), _mul32(vocab, _GOLDEN))
        rows, vocab = self._on
        step = _mix((input_ids.shape[1] - self.width) & _M32)
        h = _mix_tensor((_mix_tensor(rows ^ step)[:, None] + vocab[None, :]) & _M32)
        u = ((h >> 9).to(torch.float32) + 0.5) * 2.0 ** -23
        gumbel = -torch.log(-torch.log1p(-u))
        return scores.to(torch.float32) / self.temperature + gumbel


def _mix(x: int) -> int:
    """A 32-bit integer hash (lowbias32): every input bit moves about half the output bits."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _mul32(x, c: int):
    """x * c mod 2**32 for an int64 tensor x in [0, 2**32), without overflowing int64."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix_tensor(x):
    """`_mix` on an int64 tensor of values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)
