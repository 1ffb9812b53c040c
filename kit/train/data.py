"""Training data: load, recognise the format, tokenize with loss masks, split, check duplicates.

Formats (the `data.format` setting, or `auto`):
- `messages`: chat, a list of {role, content}; loss on every assistant turn (and its end token).
- `alpaca`: instruction, optional input, output; loss on the output.
- `prompt_completion`: prompt, completion; loss on the completion.
- `text`: plain text; loss on everything.
`data.columns` maps these names onto a dataset's own, e.g. `{messages: conversations}`.

The result is pre-tokenized (`input_ids`, `completion_mask`), so what is trained on is decided
here, the same way for every TRL version, and tested.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from kit.errors import UsageError
from kit.train.data_checks import as_messages, as_turns, row_problem, split_held_out
from kit.train.data_source import load_located
from kit.train import preference_data, prompt_data

FORMATS = {
    "messages": ("messages",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"


@dataclass
class Prepared:
    train: object  # datasets.Dataset with input_ids, completion_mask
    eval: object | None
    format: str
    dropped_too_long: int
    eval_duplicates: int
    mean_tokens: float  # per train example, after truncation to seq_len
    packed_rows: int | None = None  # train rows packed into the `train` sequences; None = not packed

    def summary(self) -> str:
        n_eval = 0 if self.eval is None else len(self.eval)
        if self.format == prompt_data.FORMAT:
            return (f"data: {len(self.train)} train / {n_eval} eval prompts, format prompts (columns "
                    f"{', '.join(self.train.column_names)}); up to {self.mean_tokens:.0f} tokens per completion on "
                    f"average (prompt + max_completion_length); {self.eval_duplicates} eval prompts duplicate a train "
                    f"prompt; {self.dropped_too_long} dropped (prompt longer than seq_len)")
        train = (f"{self.packed_rows} train rows packed into {len(self.train)} sequences"
                 if self.packed_rows is not None else f"{len(self.train)} train")
        return (f"data: {train} / {n_eval} eval examples of {self.mean_tokens:.0f} tokens on average, "
                f"format {self.format}; "
                f"{self.eval_duplicates} eval rows duplicate a train row; "
                f"{self.dropped_too_long} dropped (no trainable token within seq_len)")


def detect_format(columns: list[str], data_cfg) -> tuple[str, dict[str, str]]:
    """The format and a map from kit's column names to the dataset's."""
    mapping = dict(data_cfg.columns or {})
    wanted = [data_cfg.format] if data_cfg.format != "auto" else list(FORMATS)
    for fmt in wanted:
        names = {k: mapping.get(k, k) for k in FORMATS[fmt] + (("input",) if fmt == "alpaca" else ())}
        if fmt == "messages" and names["messages"] not in columns and "conversations" in columns \
                and "messages" not in mapping:
            names["messages"] = "conversations"  # ShareGPT's column name
        if all(names[k] in columns for k in FORMATS[fmt]):
            return fmt, names
    has = f"{data_cfg.path} has columns {sorted(columns)}"
    # A data.columns entry naming a column the data lacks is the mistake to name, not the format.
    wrong = {k: v for k, v in mapping.items() if v not in columns and any(k in FORMATS[f] for f in wanted)}
    if wrong:
        pairs = ", ".join(f"{k} → {v!r}" for k, v in wrong.items())
        raise UsageError(f"data.columns maps {pairs}, but {has}: map to one of those")
    if data_cfg.format != "auto":  # pinned: say what it needs, and which format the data is in
        fits = [f for f in FORMATS if f != data_cfg.format and all(mapping.get(k, k) in columns for k in FORMATS[f])]
        also = f" (the data is in format {fits[0]}: set data.format={fits[0]} or auto)" if fits else \
            " (map yours with data.columns)"
        raise UsageError(f"data.format={data_cfg.format} needs columns {', '.join(FORMATS[data_cfg.format])}, but "
                         f"{has}{also}")
    expected = "; ".join(f"{f}: {', '.join(c)}" for f, c in FORMATS.items())
    pairs = " (preference pairs: set trainer=dpo)" if {"chosen", "rejected"} <= set(columns) else ""
    raise UsageError(f"columns {sorted(columns)} of {data_cfg.path} match no format{pairs}; expected {expected} "
                     f"(map yours with data.columns)")


def _render(tokenizer, messages: list[dict], **kwargs) -> str:
    """The chat template's text; a template that fails (a broken chat_template.jinja) is one line."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except TemplateError as e:
        raise UsageError(f"the model's chat template fails ({type(e).__name__}: {str(e)[:120]}): fix its "
                         "chat_template.jinja or tokenizer_config.json") from None


def _chat_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of the assistant turns in it."""
    text = _render(tokenizer, messages)
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        # A conversation may open with the assistant (a greeting): nothing precedes it to render.
        before = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else None
        through = _render(tokenizer, messages[: i + 1])
        if before is not None and text.startswith(before) and text.startswith(through):
            spans.append((len(before), len(through)))
        else:  # templates that rewrite earlier turns (e.g. dropping reasoning): find the content itself
            start = text.find(m["content"], cursor)
            if start < 0:
                raise UsageError("the chat template does not reproduce an assistant turn verbatim; "
                                 "use data.format=prompt_completion")
            spans.append((start, start + len(m["content"])))
        cursor = spans[-1][1]
    return text, spans


def _to_text(row: dict, fmt: str, names: dict, tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """One row as text plus the character spans that carry the loss."""
    if fmt == "text":
        text = row[names["text"]]
        return text, [(0, len(text))]
    if fmt == "messages":
        return _chat_spans(tokenizer, as_messages(row[names["messages"]]))
    if fmt == "alpaca":
        instruction = row[names["instruction"]]
        extra = row.get(names["input"]) or ""
        prompt, completion = (instruction + ("\n\n" + extra if extra else "")), row[names["output"]]
    else:
        prompt, completion = row[names["prompt"]], row[names["completion"]]
    if isinstance(prompt, list) or isinstance(completion, list):  # conversational (either may be plain text)
        return _chat_spans(tokenizer, as_turns(prompt, "user") + as_turns(completion, "assistant"))
    if tokenizer.chat_template:
        return _chat_spans(tokenizer, [{"role": "user", "content": prompt},
                                       {"role": "assistant", "content": completion}])
    head = ALPACA_PROMPT.format(instruction=prompt) if fmt == "alpaca" else prompt
    eos = tokenizer.eos_token or ""
    return head + completion + eos, [(len(head), len(head) + len(completion) + len(eos))]


def tokenize_row(row: dict, fmt: str, names: dict, tokenizer, seq_len: int) -> dict:
    text, spans = _to_text(row, fmt, names, tokenizer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=True,
                    max_length=seq_len)
    # A token carries the loss when its characters overlap a loss span.
    mask = [int(end > start and any(start < e and end > s for s, e in spans))
            for start, end in enc["offset_mapping"]]
    return {"input_ids": enc["input_ids"], "completion_mask": mask,
            "row_hash": hashlib.sha1(text.encode("utf-8")).hexdigest()}


def _checked_row(row: dict, index: int, fmt: str, names: dict, tokenizer, seq_len: int, locate) -> dict:
    """`tokenize_row`, after checking the row's shape: a bad row is named, not a jinja2 traceback."""
    problem = row_problem(row, fmt, names)
    if problem:
        raise UsageError(f"{locate(index)}: {problem} (format {fmt})")
    return tokenize_row(row, fmt, names, tokenizer, seq_len)


def prepare(cfg, tokenizer, pack: bool = False) -> Prepared:
    """Load, tokenize, split and check `cfg.data` for training with `tokenizer`.

    `pack` packs the train rows into sequences of at most seq_len tokens (best-fit decreasing, whole
    rows only, TRL's `pack_dataset`); each keeps its rows' lengths in `seq_lengths`, from which the
    collator restarts position_ids at every row, so rows stay apart in attention. Eval rows are not
    packed: eval loss stays per row, comparable with an unpacked run.
    """
    if cfg.trainer == "grpo":  # prompts stay text: TRL's GRPOTrainer renders them at each generation
        train, evald, fmt, dropped, dups, mean = prompt_data.prepare(cfg, tokenizer)
        return Prepared(train, evald, fmt, dropped, dups, mean)
    if cfg.trainer != "sft":  # preference rows stay text: TRL's DPO/KTO trainers tokenize them
        train, evald, fmt, dups, mean = preference_data.prepare(cfg, tokenizer)
        return Prepared(train, evald, fmt, 0, dups, mean)
    ds, locate = load_located(cfg.data, cfg.seq_len)
    fmt, names = detect_format(ds.column_names, cfg.data)
    if fmt == "messages" and not tokenizer.chat_template:
        raise UsageError(f"{cfg.data.path} is chat data but the tokenizer of {cfg.model} has no chat template; "
                         "set one or use data.format=prompt_completion")
    raw = ds
    ds = ds.map(_checked_row, with_indices=True,
                fn_kwargs=dict(fmt=fmt, names=names, tokenizer=tokenizer, seq_len=cfg.seq_len, locate=locate),
                remove_columns=ds.column_names, keep_in_memory=True, load_from_cache_file=False)
    before = len(ds)
    ds = ds.filter(lambda m: 1 in m, input_columns="completion_mask", keep_in_memory=True)
    dropped = before - len(ds)
    if len(ds) == 0:
        if fmt == "messages" and not any(any(isinstance(t, dict) and t.get("role") == "assistant" for t in
                                             as_messages(turns) or []) for turns in raw[names["messages"]]):
            raise UsageError(f"no example of {cfg.data.path} has an assistant turn: the loss is on the assistant's "
                             "replies, so there is nothing to train on")
        raise UsageError(f"no example of {cfg.data.path} keeps a trainable token within seq_len={cfg.seq_len}")
    train, evald, dups = split_held_out(ds, cfg, "usable examples")
    prepared = Prepared(train, evald, fmt, dropped, dups, _mean_length(train))
    return packed(prepared, cfg.seq_len) if pack else prepared


def packed(prepared: Prepared, seq_len: int) -> Prepared:
    """`prepared` with its train rows packed into sequences of at most seq_len tokens (see `prepare`)."""
    from trl.data_utils import pack_dataset

    # Rows are ≤ seq_len already (truncated in `prepare`), so "bfd" never cuts one.
    train = pack_dataset(prepared.train, seq_len, strategy="bfd", map_kwargs={"keep_in_memory": True})
    return dataclasses.replace(prepared, train=train, mean_tokens=_mean_length(train),
                               packed_rows=len(prepared.train))


def settle_batching(plan, cfg, prepared: Prepared) -> tuple[Prepared, list[str]]:
    """With the data in hand: padding-free batches for short rows only, and where "auto" chose
    packing to fold gradient accumulation (`kit.planning.speed.settle_batching`), the rows packed
    and the accumulation folded. Returns the data to train on and the notes for the log."""
    from kit.planning import adapt

    notes = adapt.settle_batching(plan, cfg, prepared.mean_tokens)
    if plan.batching != "packed" or prepared.packed_rows is not None:
        return prepared, notes
    rows = packed(prepared, cfg.seq_len)
    note = adapt.fold_batch(plan, cfg, prepared.mean_tokens, rows.packed_rows / len(rows.train))
    if note is None:  # no fold keeps the rows per step: padding-free batches of the rows as they were
        return prepared, notes
    return rows, [*notes, note, rows.summary()]


def _mean_length(ds) -> float:
    import pyarrow.compute as pc

    # From the Arrow column: no Python list per row, so cheap on a large dataset too.
    return pc.mean(pc.list_value_length(ds.data.column("input_ids"))).as_py() or 0.0

