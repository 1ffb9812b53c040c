"""Reward functions of configs/qwen3-4b-grpo-kaggle-t4x2.yaml (`grpo.rewards: gsm8k_rewards.py:correct,format`).

GSM8K's rows are `question` (the config maps it onto `prompt`) and `answer`: worked steps, then the final
number after `#### ` ("... = <<30-17=13>>13 marbles.\\n#### 13"). TRL's GRPOTrainer calls each function
with the keyword `completions` (for chat prompts, each completion is a list holding one assistant
message) plus every other column of the batch as a list (here `answer`), and takes one float per
completion. They run on every rank, each on that rank's own completions; `**kwargs` takes the columns
a function does not read (and TRL's own keywords), so a dataset with more columns still works.
"""

import re

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def _number(text: str) -> float | None:
    """The number after the last `####`, else the last number in the text; None when there is none."""
    found = _FINAL.findall(text) or _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def correct(completions, answer, **kwargs):
    """2 when the completion's final number equals the reference answer's (after its `####`), else 0."""
    scores = []
    for completion, reference in zip(completions, answer):
        got, want = _number(_text(completion)), _number(reference)
        scores.append(2.0 if got is not None and want is not None and abs(got - want) < 1e-6 else 0.0)
    return scores


def format(completions, **kwargs):
    """0.5 when the completion ends its reasoning with a `#### <number>` line, as GSM8K's answers do."""
    return [0.5 if re.search(r"####\s*-?[\d,]*\.?\d+\s*$", _text(c).strip()) else 0.0 for c in completions]
