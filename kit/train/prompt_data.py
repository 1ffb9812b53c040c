"""Prompt data for trainer grpo: a prompt per row, plus any columns the reward functions read.

Format `prompts` (`data.format: auto` or `prompts`): a column `prompt` (or the one `data.columns`
maps onto it, e.g. `{prompt: question}`) holding a string or chat messages (a list of
{role, content}; ShareGPT turns are read as messages). `grpo.system_prompt` puts a system message
first (`with_system`): a string prompt becomes chat messages. Every other column is kept as it is: TRL's
GRPOTrainer hands each one to the reward functions by name (an `answer` column arrives as
`answer=[...]`, one value per completion).

The rows stay text: TRL renders and tokenizes the prompts itself at each generation. kit checks the
shape (`load`, on rank 0 before any model loads), holds out the eval rows with the duplicate check
(kit.train.data_checks.split_held_out), and, with the tokenizer, leaves out prompts longer than
seq_len tokens (TRL 1.15 and 1.16 do not cut a prompt: the plan's memory counts prompts of up to
seq_len tokens), counted in the data summary.
"""

from __future__ import annotations

import hashlib
import json

from kit.errors import UsageError
from kit.train.data_checks import as_messages, row_problem, split_held_out

FORMAT = "prompts"
COLUMNS = ("prompt",)
# Keywords TRL's GRPOTrainer gives every reward function besides the data's columns.
RESERVED = {"prompts", "completions", "trainer_state", "log_extra", "log_metric", "environments"}
SFT_COLUMNS = {"messages", "conversations", "completion", "text", "output", "chosen", "rejected"}
# Columns TRL's GRPOTrainer reads as the prompt's images (multimodal prompts): with the text models kit
# trains it fails at the first step, after the model loaded (text prompts), or renders image parts the
# tokenizer cannot take (chat prompts).
IMAGE_COLUMNS = {"image", "images"}


def detect_format(columns: list[str], cfg) -> dict[str, str]:
    """{"prompt": the dataset's column}; UsageError naming the columns the data has and the one it needs."""
    if cfg.data.format not in ("auto", FORMAT):
        raise UsageError(f"data.format={cfg.data.format} is not prompt data, and trainer=grpo trains on prompts "
                         f"(a column prompt, plus any columns the reward functions read): set data.format=auto or "
                         f"{FORMAT}")
    mapping = dict(cfg.data.columns or {})
    name = mapping.get("prompt", "prompt")
    if name in columns:
        return {"prompt": name}
    has = f"{cfg.data.path} has columns {sorted(columns)}"
    if "prompt" in mapping:
        raise UsageError(f"data.columns maps prompt → {name!r}, but {has}: map to one of those")
    hint = (" (it looks like SFT or preference data: set trainer=sft or dpo)" if SFT_COLUMNS & set(columns) else "")
    raise UsageError(f"trainer=grpo needs a column prompt (a string or chat messages), but {has}{hint}; map yours "
                     "with data.columns, e.g. {prompt: question}")


def row_problem_of(row: dict, names: dict) -> str | None:
    """What is wrong with one prompt row, in words; None when it is fine."""
    column = names["prompt"]
    prompt = row[column]
    if isinstance(prompt, list):
        problem = row_problem({"p": prompt}, "prompt_completion", {"prompt": "p", "completion": "p"})
        if problem:
            return problem.replace("'p'", repr(column)).replace("p[", f"{column}[")
        texts = [m.get("content", m.get("value")) for m in prompt]
        if not any(isinstance(t, str) and t.strip() for t in texts):
            return f"field {column!r} holds only empty messages: nothing to answer"
        return None
    if not isinstance(prompt, str):
        text = repr(prompt)
        return (f"field {column!r} is {type(prompt).__name__} ({text[:40]}{'…' if len(text) > 40 else ''}), "
                "expected a string or chat messages")
    if not prompt.strip():
        return f"field {column!r} is empty: nothing to answer"
    return None


def with_system(prompt, system: str | None):
    """The prompt with `system` (grpo.system_prompt) as its first message: a string prompt becomes chat
    messages, the string as the user's; a chat prompt that has its own system message keeps it."""
    if system is None:
        return prompt
    if isinstance(prompt, str):
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    if prompt and prompt[0].get("role") == "system":
        return prompt
    return [{"role": "system", "content": system}, *prompt]


def _normalised(row: dict, names: dict, system: str | None) -> dict:
    """The row with its prompt under the column name TRL reads, ShareGPT turns as {role, content}, and the
    system prompt put first."""
    out = {k: v for k, v in row.items() if k != names["prompt"]}
    prompt = row[names["prompt"]]
    out["prompt"] = with_system(as_messages(prompt) if isinstance(prompt, list) else prompt, system)
    out["row_hash"] = hashlib.sha1(json.dumps(out, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    return out


def load(cfg):
    """The dataset with `prompt`, the user's other columns and `row_hash`; UsageError naming the first bad row.

    Reads no model: `kit.train.job` calls it on rank 0 before anything loads."""
    from kit.train.data_source import load_located

    ds, locate = load_located(cfg.data, cfg.seq_len)
    names = detect_format(ds.column_names, cfg)
    taken = [c for c in ds.column_names if c in RESERVED or c == "row_hash"]
    if taken:
        raise UsageError(f"{cfg.data.path} has a column {taken[0]}, a name "
                         + ("kit uses for its duplicate check" if taken[0] == "row_hash" else
                            "TRL passes the reward functions itself (it would be given twice)")
                         + f": rename it, e.g. with data.columns, or in the data ({', '.join(sorted(RESERVED))} and "
                         "row_hash are taken)")
    images = sorted(IMAGE_COLUMNS & set(ds.column_names))
    if images:
        raise UsageError(f"{cfg.data.path} has a column {images[0]}, which TRL's GRPOTrainer reads as the prompts' "
                         "images (multimodal training); kit trains text models: rename it (e.g. to "
                         f"{images[0]}_path) in the data")
    for index, row in enumerate(ds):
        problem = row_problem_of(row, names)
        if problem:
            raise UsageError(f"{locate(index)}: {problem} (trainer grpo reads prompt rows: {names['prompt']}, plus "
                             "any columns the reward functions read)")
    # Columns the prompt's mapped name replaces are dropped; every other column stays for the rewards.
    drop = [names["prompt"]] if names["prompt"] != "prompt" else []
    if drop and "prompt" in ds.column_names:
        drop.append("prompt")
    ds = ds.map(_normalised, fn_kwargs={"names": names, "system": cfg.grpo.system_prompt}, remove_columns=drop,
                keep_in_memory=True, load_from_cache_file=False)
    return ds


def dry_rows(ds, n: int = 2) -> dict:
    """The first `n` rows as columns (column → values): what the reward functions are dry-called with."""
    head = ds.select(range(min(n, len(ds))))
    return {c: list(head[c]) for c in head.column_names if c != "row_hash"}


def prompt_ids(tokenizer, prompt) -> list[int]:
    """The prompt's tokens as TRL's GRPOTrainer renders them: the chat template with the generation
    prompt for messages, the plain text otherwise."""
    if isinstance(prompt, list):
        from jinja2 import TemplateError

        try:
            out = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
        except TemplateError as e:
            raise UsageError(f"the model's chat template fails ({type(e).__name__}: {str(e)[:120]}): fix its "
                             "chat_template.jinja or tokenizer_config.json") from None
        return list(out["input_ids"])
    return list(tokenizer(text=prompt)["input_ids"])


def prepare(cfg, tokenizer) -> tuple:
    """Load, check, drop over-long prompts, split and deduplicate (see the module docstring).

    Returns (train, eval or None, format, prompts dropped as too long, eval rows duplicating a train
    row, tokens per completion at most: the mean prompt plus grpo.max_completion_length)."""
    ds = load(cfg)
    if any(isinstance(p, list) for p in ds["prompt"][:1]) and not tokenizer.chat_template:
        if cfg.grpo.system_prompt is not None:
            raise UsageError(f"grpo.system_prompt makes every prompt chat messages, but the tokenizer of {cfg.model} "
                             "has no chat template: remove grpo.system_prompt and write the instruction into the "
                             "prompts, or use a model with a chat template")
        raise UsageError(f"{cfg.data.path} has chat prompts but the tokenizer of {cfg.model} has no chat template; "
                         "give the prompts as strings, or a model with a chat template")
    lengths = [len(prompt_ids(tokenizer, p)) for p in ds["prompt"]]
    keep = [i for i, n in enumerate(lengths) if n <= cfg.seq_len]
    dropped = len(ds) - len(keep)
    if not keep:
        system = "" if cfg.grpo.system_prompt is None else (
            f"; grpo.system_prompt's {len(tokenizer(text=cfg.grpo.system_prompt)['input_ids'])} tokens are in each")
        raise UsageError(f"every prompt of {cfg.data.path} is longer than seq_len={cfg.seq_len} tokens (the shortest "
                         f"has {min(lengths)}{system}): raise seq_len, or shorten the prompts")
    if dropped:
        ds = ds.select(keep)
    train, evald, dups = split_held_out(ds, cfg, "prompts")
    mean = sum(lengths[i] for i in keep) / len(keep) + cfg.grpo.max_completion_length
    return train, evald, FORMAT, dropped, dups, mean
