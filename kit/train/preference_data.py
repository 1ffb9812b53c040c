"""Preference data for trainer dpo and kto: recognised by its columns, checked row by row, split.

Formats (`data.format`, or `auto` from the columns; `data.columns` maps them onto a dataset's own,
e.g. `{prompt: question, chosen: response_j, rejected: response_k}`):
- `preference` (trainer dpo): prompt, chosen, rejected — a preferred and a dispreferred answer.
- `unpaired_preference` (trainer kto): prompt, completion, label — one answer, true when desirable.
Each text is a string, or chat messages (a list of {role, content}; ShareGPT turns are read as
messages): a conversational prompt needs conversational answers, as TRL renders them with the
chat template.

Unlike SFT data, the rows stay text: TRL's DPOTrainer and KTOTrainer tokenize them their own way
(prompt and answer apart, the answer's end where they diverge). kit checks the shape, holds out
the eval rows, refuses duplicates past `data.max_duplicate_fraction` and tokenizes only to measure
(`pair_ids`, the same split of prompt and answer).
"""

from __future__ import annotations

import hashlib
import json

from kit.errors import UsageError
from kit.train.data_checks import as_messages, row_problem, split_held_out

FORMATS = {
    "preference": ("prompt", "chosen", "rejected"),
    "unpaired_preference": ("prompt", "completion", "label"),
}
FOR_TRAINER = {"dpo": "preference", "kto": "unpaired_preference"}
TEXTS = {"preference": ("chosen", "rejected"), "unpaired_preference": ("completion",)}


def detect_format(columns: list[str], cfg) -> tuple[str, dict[str, str]]:
    """(format, {kit's column name: the dataset's}) for `cfg.trainer`; UsageError naming what is missing."""
    fmt = FOR_TRAINER[cfg.trainer]
    if cfg.data.format not in ("auto", fmt):
        raise UsageError(f"data.format={cfg.data.format} is SFT data, but trainer={cfg.trainer} trains on "
                         f"{fmt} rows ({', '.join(FORMATS[fmt])}): set data.format=auto or {fmt}")
    mapping = dict(cfg.data.columns or {})
    names = {k: mapping.get(k, k) for k in FORMATS[fmt]}
    missing = [k for k in FORMATS[fmt] if names[k] not in columns]
    if not missing:
        return fmt, names
    has = f"{cfg.data.path} has columns {sorted(columns)}"
    wrong = {k: v for k, v in mapping.items() if k in names and v not in columns}
    if wrong:
        pairs = ", ".join(f"{k} → {v!r}" for k, v in wrong.items())
        raise UsageError(f"data.columns maps {pairs}, but {has}: map to one of those")
    other = next((t for t, f in FOR_TRAINER.items() if f != fmt and all(c in columns for c in FORMATS[f])), None)
    hint = (f" (the data holds {FOR_TRAINER[other]} rows: set trainer={other})" if other else
            " (it looks like SFT data: set trainer=sft)" if {"messages", "conversations", "completion", "text",
                                                             "output"} & set(columns) else "")
    example = " (e.g. {prompt: question, chosen: response_j, rejected: response_k})" if fmt == "preference" else ""
    raise UsageError(f"trainer={cfg.trainer} needs columns {', '.join(FORMATS[fmt])} ({fmt} rows), but {has}"
                     f"{hint}; map yours with data.columns{example}")


def row_problem_of(row: dict, fmt: str, names: dict) -> str | None:
    """What is wrong with one preference row, in words; None when it is fine."""
    prompt = row[names["prompt"]]
    chat = isinstance(prompt, list)
    problem = row_problem({"p": prompt}, "prompt_completion", {"prompt": "p", "completion": "p"}) if chat else None
    if problem:
        return problem.replace("'p'", repr(names["prompt"]))
    if not chat and not isinstance(prompt, str):
        return f"field {names['prompt']!r} is {_kind(prompt)}, expected a string or chat messages"
    for key in TEXTS[fmt]:
        value = row[names[key]]
        if chat and not isinstance(value, list):
            return (f"field {names[key]!r} is {_kind(value)} while the prompt is chat messages: expected the "
                    "answer as messages too, e.g. [{\"role\": \"assistant\", \"content\": \"...\"}]")
        if not chat and not isinstance(value, str):
            return f"field {names[key]!r} is {_kind(value)}, expected a string (as the prompt is one)"
        if chat:
            problem = row_problem({"c": value}, "prompt_completion", {"prompt": "c", "completion": "c"})
            if problem:
                return problem.replace("'c'", repr(names[key]))
        elif not value.strip():
            return f"field {names[key]!r} is empty: nothing to prefer or avoid"
    if fmt == "unpaired_preference" and not isinstance(row[names["label"]], bool):
        return f"field {names['label']!r} is {_kind(row[names['label']])}, expected true (desirable) or false"
    return None


def _kind(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} ({text[:40]}{'…' if len(text) > 40 else ''})"


def _normalised(row: dict, fmt: str, names: dict) -> dict:
    """The row under kit's (and TRL's) column names, ShareGPT turns as {role, content}."""
    out = {}
    for key in FORMATS[fmt]:
        value = row[names[key]]
        out[key] = as_messages(value) if isinstance(value, list) else value
    out["row_hash"] = hashlib.sha1(json.dumps(out, sort_keys=True).encode("utf-8")).hexdigest()
    return out


def load(cfg):
    """(the dataset with kit's column names and a row_hash, its format); UsageError naming the first bad row.

    Reads no model: `kit.train.job` calls it on rank 0 before anything loads, so a wrong shape for
    the trainer is one line and exit 2 in seconds.
    """
    from kit.train.data_source import load_located

    # A row holds the prompt and two answers (or one): the size limit is that of 2 × seq_len tokens.
    ds, locate = load_located(cfg.data, 2 * cfg.seq_len)
    fmt, names = detect_format(ds.column_names, cfg)
    for index, row in enumerate(ds):
        problem = row_problem_of(row, fmt, names)
        if problem:
            raise UsageError(f"{locate(index)}: {problem} (trainer {cfg.trainer} reads {fmt} rows: "
                             f"{', '.join(names[k] for k in FORMATS[fmt])})")
    if fmt == "preference":
        _refuse_ties(ds, names, locate, cfg)
    ds = ds.map(_normalised, fn_kwargs={"fmt": fmt, "names": names}, remove_columns=ds.column_names,
                keep_in_memory=True, load_from_cache_file=False)
    return ds, fmt


def _refuse_ties(ds, names: dict, locate, cfg) -> None:
    """Pairs whose chosen and rejected answers are the same teach DPO nothing (the loss is log 2 whatever the
    model, its gradient 0): more of them than data.max_duplicate_fraction is refused, as duplicates are."""
    ties = [i for i, (c, r) in enumerate(zip(ds[names["chosen"]], ds[names["rejected"]])) if c == r]
    if not ties or len(ties) <= cfg.data.max_duplicate_fraction * len(ds) or cfg.data.allow_duplicates:
        return
    raise UsageError(f"{len(ties)} of {len(ds)} pairs have the same {names['chosen']} and {names['rejected']} (the "
                     f"first at {locate(ties[0])}): DPO learns nothing from a pair whose answers are equal (limit "
                     f"data.max_duplicate_fraction={cfg.data.max_duplicate_fraction}); fix the pairs or set "
                     "data.allow_duplicates=true")


def prepare(cfg, tokenizer) -> tuple:
    """Load, check, split and deduplicate preference data (see the module docstring).

    Returns (train, eval or None, format, eval rows duplicating a train row, mean tokens per example).
    """
    ds, fmt = load(cfg)
    train, evald, dups = split_held_out(ds, cfg, "rows")
    return train, evald, fmt, dups, mean_tokens(train, fmt, tokenizer, cfg.seq_len)


def pair_ids(tokenizer, prompt, completion, seq_len: int) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) as TRL's trainers split them: the answer starts where the tokenized
    prompt and prompt + answer diverge; a plain-text answer ends with the EOS token; cut to seq_len."""
    if isinstance(prompt, list):
        head = _chat_ids(tokenizer, prompt, add_generation_prompt=True)
        full = _chat_ids(tokenizer, prompt + completion)
    else:
        eos = tokenizer.eos_token or ""
        head = tokenizer(text=prompt)["input_ids"]
        full = tokenizer(text=prompt + completion + ("" if completion.endswith(eos) else eos))["input_ids"]
    n = 0
    while n < min(len(head), len(full)) and head[n] == full[n]:
        n += 1
    full = full[:seq_len]
    return full[:n], full[n:]


def _chat_ids(tokenizer, messages: list, **kwargs) -> list[int]:
    from jinja2 import TemplateError

    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    except TemplateError as e:
        raise UsageError(f"the model's chat template fails ({type(e).__name__}: {str(e)[:120]}): fix its "
                         "chat_template.jinja or tokenizer_config.json") from None
    return list(out["input_ids"])


def mean_tokens(ds, fmt: str, tokenizer, seq_len: int, sample: int = 256) -> float:
    """Tokens per training example (a pair counts both sequences), from the first `sample` rows."""
    rows = ds.select(range(min(sample, len(ds))))
    total = 0
    for row in rows:
        for key in TEXTS[fmt]:
            p, a = pair_ids(tokenizer, row["prompt"], row[key], seq_len)
            total += len(p) + len(a)
    return total / max(1, len(rows))
