"""Reward functions of configs/grpo-tiny.yaml (`grpo.rewards: grpo_rewards.py:json_format,brevity`).

TRL's GRPOTrainer calls each with the keyword `completions` (for chat prompts, each completion is a
list holding one assistant message) plus every column of the data (here `answer`, the service call
the request asks for) and returns one number per completion. They run on every rank, each on that
rank's own completions.
"""


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def json_format(completions, answer=None, **kwargs):
    """1 for an answer that opens as JSON, 1 more when it names the asked-for service; else 0."""
    scores = []
    for i, completion in enumerate(completions):
        text = _text(completion).strip()
        score = float(text.startswith("{"))
        if answer is not None and answer[i].split('"service":"')[-1].split('"')[0] in text:
            score += 1.0
        scores.append(score)
    return scores


def brevity(completions, **kwargs):
    """Shorter answers score higher: 1 for an empty one, 0 from 64 characters on."""
    return [max(0.0, 1.0 - len(_text(c)) / 64) for c in completions]
