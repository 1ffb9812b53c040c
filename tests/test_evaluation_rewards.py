"""trainer=grpo's baseline and final evaluation in-process (kit.evaluation.rewards through
kit.evaluation.stage), on the real tiny model: the mean of each of the user's reward functions on
sampled completions of held-out prompts, called as TRL calls them, the same noise before and after,
a failing reward function recorded as a skip naming it, and the words, samples and model card."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kit.deliver import card
from kit.evaluation import results, rewards, stage
from kit.planning import config
from kit.train.data import Prepared

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny-qwen3"
N_EVAL = 12


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(TINY), AutoTokenizer.from_pretrained(TINY)


def _cfg(tmp_path, *overrides):
    return config.load(str(ROOT / "configs" / "default.yaml"),
                       [f"output_dir={tmp_path / 'out'}", "trainer=grpo", "grpo.rewards=my_rewards.py:length,digits",
                        "grpo.max_completion_length=12", "eval.samples=3", *overrides])


def _prompts(kind: str) -> Prepared:
    """Held-out prompt rows as grpo-core's data stage gives them: prompt (text or messages), the user's
    other columns, kit's row_hash."""
    from datasets import Dataset

    rows = [{"prompt": f"What is {i} + {i}?" if kind == "text" else
             [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": f"{i} + {i}?"}],
             "answer": str(2 * i), "row_hash": f"h{i}"} for i in range(N_EVAL)]
    ds = Dataset.from_list(rows)
    return Prepared(train=ds, eval=ds, format="prompts", dropped_too_long=0, eval_duplicates=0, mean_tokens=8.0)


class Recorder:
    """Reward functions that keep every call's keywords, so a test can compute the means by hand."""

    def __init__(self):
        self.calls: dict[str, dict] = {}

    def length(self, completions, **kwargs):
        self.calls["length"] = {"completions": completions, **kwargs}
        return [float(len(_text(c))) for c in completions]

    def digits(self, completions, answer, **kwargs):  # a column as a named parameter, as users write them
        self.calls["digits"] = {"completions": completions, "answer": answer, **kwargs}
        # None for every third row: TRL skips it in the mean (nanmean)
        return [None if i % 3 == 0 else float(sum(ch.isdigit() for ch in _text(c)))
                for i, c in enumerate(completions)]


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


@pytest.mark.parametrize("kind", ["text", "messages"])
def test_each_reward_mean_is_the_hand_computed_mean_of_what_trl_would_pass(tiny, tmp_path, kind):
    model, tok = tiny
    cfg, ds, rec = _cfg(tmp_path), _prompts(kind), Recorder()
    record = stage.measure(cfg, model, tok, ds, 4, "baseline", reward_funcs=[rec.length, rec.digits])
    assert record["skipped"] is None, record["skipped"]
    r = record["result"]
    seen = rec.calls["length"]
    rows = [ds.eval[i] for i in record["rows"]]
    # Called as TRL 1.16's _calculate_rewards calls it: the prompts as the data has them, completions as text
    # for text prompts and as one assistant message for chats, completion_ids, the user's columns as keywords.
    assert seen["prompts"] == [row["prompt"] for row in rows]
    assert seen["answer"] == rec.calls["digits"]["answer"] == [row["answer"] for row in rows]
    assert "row_hash" not in seen and seen["trainer_state"] is None
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen["completions"]) == (kind == "messages")
    assert all(isinstance(c, str) for c in seen["completions"]) == (kind == "text")
    assert [tok.decode(ids, skip_special_tokens=True) for ids in seen["completion_ids"]] == \
        [_text(c) for c in seen["completions"]]
    assert all(0 < len(ids) <= 12 for ids in seen["completion_ids"])  # grpo.max_completion_length
    # The means by hand, None values left out as TRL's nanmean leaves them out.
    lengths = [len(_text(c)) for c in seen["completions"]]
    digits = [sum(ch.isdigit() for ch in _text(c)) for i, c in enumerate(seen["completions"]) if i % 3]
    assert r["rewards"]["length"] == pytest.approx(sum(lengths) / len(lengths))
    assert r["rewards"]["digits"] == pytest.approx(sum(digits) / len(digits))
    assert r["scored"] == {"length": N_EVAL, "digits": N_EVAL - 4} and r["rows"] == N_EVAL
    totals = [lengths[i] + (0 if i % 3 == 0 else sum(ch.isdigit() for ch in _text(seen["completions"][i])))
              for i in range(N_EVAL)]
    assert r["reward"] == pytest.approx(sum(totals) / N_EVAL)  # TRL's logged `reward`: the per-row sum, averaged
    assert len(r["samples"]) == 3 and r["samples"][0]["output"] == _text(seen["completions"][0])
    assert r["samples"][0]["rewards"] == {"length": lengths[0], "digits": None}
    if kind == "messages":
        assert "<|im_start|>assistant" in r["samples"][0]["prompt"]  # the chat template's generation prompt


def test_the_same_seed_gives_the_same_numbers_whatever_the_batch_and_leaves_training_randomness_alone(tiny, tmp_path):
    import torch

    model, tok = tiny
    cfg, ds = _cfg(tmp_path), _prompts("messages")
    import random

    import numpy

    def noisy(completions, **kwargs):  # a reward function that draws from every generator
        return [random.random() + numpy.random.rand() + torch.rand(1).item() for _ in completions]

    state, py, np_state = torch.random.get_rng_state(), random.getstate(), numpy.random.get_state()
    first = stage.measure(cfg, model, tok, ds, 4, "baseline", reward_funcs=[Recorder().length, noisy])["result"]
    # The trainer's sampler and the data order are left as they were, whatever the reward functions draw.
    assert torch.equal(torch.random.get_rng_state(), state) and random.getstate() == py
    assert numpy.array_equal(numpy.random.get_state()[1], np_state[1])
    torch.manual_seed(1234)  # another global state: the evaluation's noise is its own
    again = stage.measure(cfg, model, tok, ds, 1, "final", reward_funcs=[Recorder().length])["result"]
    assert again["rewards"]["length"] == first["rewards"]["length"] and again["rows_sha256"] == first["rows_sha256"]
    assert [s["output"] for s in again["samples"]] == [s["output"] for s in first["samples"]]
    # Sampled, not greedy: another seed draws other completions.
    other = stage.measure(_cfg(tmp_path, "seed=7"), model, tok, ds, 4, "baseline", reward_funcs=[Recorder().length])
    assert [s["output"] for s in other["result"]["samples"]] != [s["output"] for s in first["samples"]]


def test_out_of_gpu_memory_goes_again_in_halves_with_the_same_answers(tiny, tmp_path, monkeypatch):
    import torch

    model, tok = tiny
    cfg, ds = _cfg(tmp_path), _prompts("text")
    first = stage.measure(cfg, model, tok, ds, 4, "baseline", reward_funcs=[Recorder().length])["result"]
    real, sizes = model.generate, []

    def small_gpu(*args, input_ids, **kwargs):  # stands in for a GPU that has room for 3 rows (none here)
        sizes.append(len(input_ids))
        if len(input_ids) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model, "generate", small_gpu)
    again = stage.measure(cfg, model, tok, ds, 4, "final", reward_funcs=[Recorder().length])
    assert again["skipped"] is None and sizes[:3] == [N_EVAL, 8, 4] and max(sizes[3:]) <= 2
    assert [s["output"] for s in again["result"]["samples"]] == [s["output"] for s in first["samples"]]
    assert again["result"]["rewards"] == first["rewards"]


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_the_noise_samples_softmax_at_the_temperature(temperature):
    import torch

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    draws = 20_000
    noise = rewards.GumbelNoise(seed=42, keys=list(range(draws)), width=5, temperature=temperature)
    picked = noise(torch.zeros(draws, 5, dtype=torch.long), logits.expand(draws, 4).clone()).argmax(-1)
    freq = torch.bincount(picked, minlength=4).double() / draws
    expected = torch.softmax(logits.double() / temperature, -1)
    assert torch.allclose(freq, expected, atol=0.015), (freq, expected)
    # The next position draws fresh noise; the same position and row, the same noise.
    later = noise(torch.zeros(draws, 6, dtype=torch.long), logits.expand(draws, 4).clone()).argmax(-1)
    assert not torch.equal(later, picked)
    assert torch.equal(noise(torch.zeros(draws, 5, dtype=torch.long), logits.expand(draws, 4).clone()).argmax(-1),
                       picked)


def _broken(completions, **kwargs):
    return [1.0 / 0 for _ in completions]


def _short(completions, **kwargs):
    return [1.0]


def _words(completions, **kwargs):
    return ["good" for _ in completions]


def _leaky(completions, **kwargs):
    raise RuntimeError("bad key hf_" + "abcdefghijklmnopqrstuvwxyz0123 \x1b[31mred\nsecond line")


def _huge(completions, **kwargs):
    return [10 ** 400 for _ in completions]


@pytest.mark.parametrize("func, words", [
    (_broken, "the reward function _broken raised ZeroDivisionError: float division by zero"),
    (_short, f"the reward function _short returned 1 values for {N_EVAL} completions"),
    (_words, "the reward function _words returned str values"),
    (_huge, "past float32's range"),
    # one line, the token redacted, the escape shown escaped
    (_leaky, "the reward function _leaky raised RuntimeError: bad key *** \\x1b[31mred (on 12"),
])
def test_a_failing_reward_function_is_a_recorded_skip_naming_it(tiny, tmp_path, func, words):
    model, tok = tiny
    cfg = _cfg(tmp_path)
    record, notes = stage.before(stage.open_run(cfg, None), cfg, model, tok, _prompts("text"), None, batch_size=4,
                                 force=False, reward_funcs=[Recorder().length, func])
    assert record["result"] is None and words in record["skipped"]
    assert results.primary(record, record) == {"name": "reward", "baseline": None, "final": None,
                                               "higher_is_better": True}
    assert words in json.loads((Path(cfg.output_dir) / results.BASELINE_LOCAL).read_text())["skipped"]
    assert notes[-1].startswith("baseline: skipped: ") and words in notes[-1]


def test_no_reward_functions_is_a_recorded_skip(tiny, tmp_path):
    model, tok = tiny
    record = stage.measure(_cfg(tmp_path), model, tok, _prompts("text"), 4, "baseline")
    assert record["skipped"].startswith("no reward functions") and record["result"] is None


def _numbers(text: str, *values: float) -> None:
    for v in values:
        assert f"{v:.4g}" in text, (v, text)


def test_results_samples_and_card_name_each_reward_and_its_means_before_and_after(tiny, tmp_path):
    model, tok = tiny
    cfg, ds, rec = _cfg(tmp_path), _prompts("messages"), Recorder()
    run = stage.open_run(cfg, None)
    funcs = [rec.length, rec.digits]
    baseline, notes = stage.before(run, cfg, model, tok, ds, None, batch_size=4, force=False, reward_funcs=funcs)
    # A changed model for the final evaluation: its means differ from the baseline's.
    import torch
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    try:
        out = stage.after(run, baseline, cfg, model, tok, ds, 4, 20, reward_funcs=funcs)
    finally:
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)
    b, f = baseline["result"], out["final"]["result"]
    assert b["rewards"] != f["rewards"]
    assert out["primary_metric"] == {"name": "reward", "baseline": b["reward"], "final": f["reward"],
                                     "higher_is_better": True}
    assert "length" in notes[-1] and "digits" in notes[-1]
    _numbers(notes[-1], b["rewards"]["length"], b["rewards"]["digits"], b["reward"])
    line = results.change_line(out)
    assert "length" in line and "digits" in line and f"on {N_EVAL} held-out prompts" in line
    _numbers(line, b["rewards"]["length"], f["rewards"]["length"], b["rewards"]["digits"], f["rewards"]["digits"],
             b["reward"], f["reward"])
    md = results.samples_markdown(out)
    assert "temperature 1" in md and "Reference:" not in md and md.count("## Sample ") == 3
    assert f["samples"][0]["output"] in md and "rewards: length" in md
    text = card.render(cfg, run, out, {"plan": "p", "hardware": "h"})
    assert "TRL GRPOTrainer" in text and "reward functions length," in text and "length, digits" in text
    for name in ("length", "digits"):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        _numbers(row, b["rewards"][name], f["rewards"][name])
    total = next(line for line in text.splitlines() if line.startswith("| sum"))
    _numbers(total, b["reward"], f["reward"])
    assert "reward functions" in text.split("## Limitations")[1]


def test_a_reward_none_everywhere_is_said_not_divided_by_zero(tmp_path):
    summary = rewards.summary({"judge": [None, None], "length": [2.0, 4.0]})
    assert summary == {"rewards": {"judge": None, "length": 3.0}, "scored": {"judge": 0, "length": 2}, "reward": 3.0}
    record = {"result": {"rows": 2, **summary}}
    assert "judge none scored" in results.words(record) and "length 3" in results.words(record)
    assert math.isfinite(summary["reward"])


def test_nan_is_left_out_of_the_mean_as_none_is(tiny, tmp_path):
    model, tok = tiny

    def judge(completions, **kwargs):
        return [float("nan") if i % 2 else 1.0 for i in range(len(completions))]

    r = stage.measure(_cfg(tmp_path), model, tok, _prompts("text"), 4, "baseline", reward_funcs=[judge])["result"]
    assert r["rewards"] == {"judge": 1.0} and r["scored"] == {"judge": N_EVAL // 2} and r["reward"] == 1.0


def test_names_are_trls_and_a_repeated_name_is_numbered():
    import functools

    def correct(completions, **kwargs):
        return [0.0] * len(completions)

    assert rewards.reward_names([correct, functools.partial(correct), Recorder().length]) == \
        ["correct", "correct_2", "length"]
