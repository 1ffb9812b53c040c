"""Bad training data, caught before it reaches the tokenizer: each error names the file, the line or
row, and the shape that was expected.

- `scan_json_lines(path)`: every line of a JSONL file is a JSON object (or the line is named).
- `scan_csv_rows(path)`: every CSV row has the header's number of fields (or the row is named).
- `scan_parquet_rows(path)`: no parquet row is over the row limit.
Each scan also refuses a row over `kit.train.data_limits.row_limit(seq_len)` bytes, reading no more of it.
- `explain_mixed_types(path, lines)`: which line's fields have another type than the first row's,
  when Arrow cannot build one table from the file.
- `row_problem(row, fmt, names)`: what is wrong with one row for its format, or None.
- `as_messages(turns)`: ShareGPT turns (`{"from": "human", "value": ...}`) as `{role, content}`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kit.errors import UsageError
from kit.files import read_text, regular_file
from kit.train.data_limits import row_limit, row_too_long

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's speaker names (FastChat, axolotl's sharegpt loader) onto chat-template roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}
MESSAGES_SHAPE = ('a list of {"role": "user"|"assistant"|"system", "content": "..."} '
                  '(or ShareGPT {"from": "human"|"gpt", "value": "..."})')


def _unusable(e: Exception) -> str:
    """Why JSON that parses in principle cannot be read: nested past Python's limit, or a number too long."""
    if isinstance(e, RecursionError):
        return "JSON nested too deep to read (thousands of levels); each line must be one flat JSON object"
    return f"a value kit cannot read ({str(e).splitlines()[0][:100]})"


def scan_json_lines(path: Path, seq_len: int | None = None) -> list[int] | None:
    """The 1-based line number of each row of a JSON Lines file; UsageError naming the first bad line.

    A `.json` file that holds one JSON array (not lines) is checked as a whole and gets None. Lines
    are read one at a time and split at "\\n" only, as Arrow's reader splits them: a multi-GB file is
    never held whole, and a U+2028 or U+0085 inside a JSON string (valid, and common in scraped text
    written with ensure_ascii=False) does not cut its row in two.
    """
    limit = row_limit(seq_len)
    if path.suffix == ".json" and first_char(path) == "[":
        text = read_text(path, "data file", max_bytes=None).removeprefix("\ufeff")  # size checked against memory first
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"data file {path} line {e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
        except (ValueError, RecursionError) as e:
            raise UsageError(f"data file {path}: {_unusable(e)}") from None
        if not rows:
            raise UsageError(f"data file {path} holds an empty JSON array: no examples to train on")
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            raise UsageError(f"data file {path}: item {bad + 1} of its JSON array is a {type(rows[bad]).__name__}, "
                             "not an object of named fields")
        if len(text) > limit:  # else no row can be over it
            for i, row in enumerate(rows):
                size = len(json.dumps(row, ensure_ascii=False).encode("utf-8"))
                if size > limit:
                    raise row_too_long(f"data file {path} item {i + 1} of its JSON array", size, limit, seq_len)
        return None
    lines, seen = [], {}
    for n, line in _text_lines(path, limit, seq_len):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"data file {path} line {n}: not valid JSON ({e.msg}, column {e.colno}); "
                             "each line must be one JSON object") from None
        except (ValueError, RecursionError) as e:
            raise UsageError(f"data file {path} line {n}: {_unusable(e)}") from None
        if not isinstance(row, dict):
            raise UsageError(f"data file {path} line {n}: a JSON {type(row).__name__}, not an object of named "
                             "fields; each line must be one JSON object")
        if not row:
            raise UsageError(f"data file {path} line {n}: an empty JSON object; each line must hold the example's "
                             "fields (messages, or prompt and completion, …)")
        # Arrow needs one type per field: given mixed ones it fails, or worse, silently converts
        # (a JSON string read as an object). Say which line differs, before it gets the chance.
        for field, kind in _shape(row).items():
            first = seen.setdefault(field, (kind, n))
            if first[0] != kind:
                raise UsageError(f"data file {path} line {n}: {field} is a JSON {kind} where line {first[1]} has a "
                                 f"{first[0]}; every row needs the same shape")
        lines.append(n)
    return lines


def _text_lines(path: Path, limit: int | None = None, seq_len: int | None = None):
    """(line number, text) of each "\\n"-ended line, decoded one at a time; UsageError naming the
    file, or the line that is not UTF-8, or one longer than `limit` bytes (of which no more is read)."""
    if regular_file(path, f"cannot read data file {path}") is None:
        raise UsageError(f"cannot read data file {path}: no such file")
    try:
        with open(path, "rb") as f:
            n = 0
            while raw := (f.readline() if limit is None else f.readline(limit + 1)):
                n += 1
                if limit is not None and len(raw.rstrip(b"\r\n")) > limit:
                    raise row_too_long(f"data file {path} line {n}", None, limit, seq_len)
                try:
                    line = raw.decode("utf-8")
                    # A byte-order mark (Windows Notepad's "UTF-8" saves one) starts the file: Arrow reads past it.
                    yield n, line.removeprefix("\ufeff") if n == 1 else line
                except UnicodeDecodeError as e:
                    raise UsageError(f"data file {path} line {n} is not UTF-8 text (byte {e.start} of the line): "
                                     "save it as UTF-8") from None
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from None


def first_char(path: Path) -> str:
    """The first character that is not whitespace, read from the file's start ("" when there is none);
    read a block at a time, so a file of one long line is not read whole."""
    if regular_file(path, f"cannot read data file {path}") is None:
        raise UsageError(f"cannot read data file {path}: no such file")
    try:
        with open(path, "rb") as f:
            start = f.read(3)
            if start != b"\xef\xbb\xbf":  # a UTF-8 byte-order mark is no character of the data
                f.seek(0)
            while block := f.read(1 << 16):
                text = block.lstrip()
                if text:
                    return chr(text[0]) if text[0] < 128 else text[:4].decode("utf-8", "replace")[0]
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from None
    return ""


def _shape(row: dict) -> dict[str, str]:
    """{field path: JSON type} of a row, one level into lists of objects (`messages[].content`)."""
    out = {}
    for key, value in row.items():
        if value is None:
            continue
        out[key] = _json_name(type(value).__name__)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    for k, v in item.items():
                        if v is not None:
                            out.setdefault(f"{key}[].{k}", _json_name(type(v).__name__))
                elif item is not None:
                    out.setdefault(f"{key}[]", _json_name(type(item).__name__))
    return out


def scan_csv_rows(path: Path, seq_len: int | None = None) -> None:
    """UsageError naming the first CSV row whose field count differs from the header's: `datasets`
    would read a longer row's first field as an index and shift every column by one, silently."""
    import csv

    # Streamed (a quoted field may hold newlines, so rows, not lines, are counted); never held whole.
    # csv's field limit is the row limit, so a longer field is never read whole.
    if regular_file(path, f"cannot read data file {path}") is None:
        raise UsageError(f"cannot read data file {path}: no such file")
    most = row_limit(seq_len)
    limit = csv.field_size_limit(most)
    rows, done = None, 0  # done: the rows read whole, the header included
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = csv.reader(f)
            header = next(rows, None)
            done = 1
            if not header:
                raise UsageError(f"data file {path} has no header row (the column names, e.g. prompt,completion)")
            count = 0
            for n, row in enumerate(rows, 2):
                done = n
                if row and len(row) != len(header):
                    raise UsageError(f"data file {path} row {n}: {len(row)} fields, the header has {len(header)} "
                                     f"({','.join(header)}); quote fields that hold a comma")
                chars = sum(map(len, row))
                if chars * 4 > most and (size := sum(len(v.encode("utf-8")) for v in row)) > most:
                    raise row_too_long(f"data file {path} row {n}", size, most, seq_len)
                count += bool(row)
            if not count:
                raise UsageError(f"data file {path} has a header ({','.join(header)}) but no rows under it")
    except UnicodeDecodeError:  # decoded in blocks, so the reader's place is not the line: find it
        for _ in _text_lines(path, most, seq_len):  # raises, naming the first line that is not UTF-8
            pass
        raise UsageError(f"data file {path} is not UTF-8 text: save it as UTF-8") from None
    except csv.Error as e:  # a NUL byte, say, or a field over the row limit
        if "field larger than field limit" in str(e):
            raise row_too_long(f"data file {path} row {done + 1}", None, most, seq_len) from None
        raise UsageError(f"data file {path} line {rows.line_num if rows else 1}: not readable as CSV ({e})") from None
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from None
    finally:
        csv.field_size_limit(limit)


def scan_parquet_rows(path: Path, seq_len: int | None = None) -> None:
    """UsageError naming the first parquet row over the row limit. The file's metadata gives each row
    group's uncompressed size: a group within the limit holds no such row and is not read; one whose rows
    average over it holds one and is not read either; the rest are read a few rows at a time."""
    import pyarrow.parquet as pq

    most = row_limit(seq_len)
    try:
        pf = pq.ParquetFile(path)
        first = 0
        for g in range(pf.metadata.num_row_groups):
            group = pf.metadata.row_group(g)
            rows, size = group.num_rows, group.total_byte_size
            if rows and size > most:
                if size / rows > most:
                    where = f"row {first + 1}" if rows == 1 else f"a row among rows {first + 1}-{first + rows}"
                    raise row_too_long(f"data file {path} {where}", size if rows == 1 else None, most, seq_len)
                at = first
                for batch in pf.iter_batches(batch_size=16, row_groups=[g]):
                    if batch.nbytes > most:
                        for i in range(batch.num_rows):
                            row_size = batch.slice(i, 1).nbytes
                            if row_size > most:
                                raise row_too_long(f"data file {path} row {at + i + 1}", row_size, most, seq_len)
                    at += batch.num_rows
            first += rows
    except (OSError, ValueError) as e:  # not parquet, damaged: the load's own error says it (data_source)
        if getattr(e, "errno", None) is not None:
            raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from None


def parquet_bytes(path: Path) -> int:
    """The uncompressed size of a parquet file's data (its file size where the footer cannot be read)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        return sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    except (OSError, ValueError):
        return Path(path).stat().st_size


def explain_mixed_types(path: Path, lines: list[int] | None) -> str | None:
    """The first line whose fields have another JSON type than the same fields of the first row."""
    if not lines:
        return None
    rows = [json.loads(line) for _, line in _text_lines(path) if line.strip()]
    first = {k: type(v).__name__ for k, v in rows[0].items() if v is not None}
    for row, n in zip(rows[1:], lines[1:]):
        for key, value in row.items():
            kind = type(value).__name__
            if value is not None and key in first and kind != first[key]:
                return (f"line {n}: field {key!r} is a JSON {_json_name(kind)} where line {lines[0]} has a "
                        f"{_json_name(first[key])}; every row needs the same shape")
    return None


def _json_name(kind: str) -> str:
    return {"str": "string", "list": "list", "dict": "object", "int": "number", "float": "number",
            "bool": "boolean"}.get(kind, kind)  # int and float are one JSON number: Arrow widens them


def as_messages(turns):
    """`turns` as chat messages: {role, content} kept, ShareGPT's {from, value} converted; else as given."""
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return turns
    # Arrow gives every turn of a column all keys seen in it, so a missing one reads as None.
    if not any(t.get("from") is not None and t.get("role") is None for t in turns):
        return turns
    out = []
    for t in turns:
        speaker = str(t.get("from") if t.get("from") is not None else t.get("role")).lower()
        content = t.get("value") if t.get("value") is not None else t.get("content")
        out.append({"role": SHAREGPT_ROLES.get(speaker, speaker), "content": content})
    return out


def as_turns(value, role: str) -> list:
    """Messages as `as_messages` gives them; a plain string as one turn of `role`."""
    return [{"role": role, "content": value}] if isinstance(value, str) else as_messages(value)


def row_problem(row: dict, fmt: str, names: dict) -> str | None:
    """What is wrong with `row` for `fmt` (columns mapped by `names`), in words; None when it is fine."""
    if fmt == "messages":
        return _messages_problem(row[names["messages"]], names["messages"])
    fields = {"text": ("text",), "alpaca": ("instruction", "output"), "prompt_completion": ("prompt", "completion")}[fmt]
    for key in fields:
        value = row[names[key]]
        if fmt == "prompt_completion" and isinstance(value, list):  # conversational (the other may be text)
            problem = _messages_problem(value, names[key], allow_empty=False)
            if problem:
                return problem
            continue
        if not isinstance(value, str):
            return f"field {names[key]!r} is {_shown(value)}, expected a string"
    if fmt == "alpaca" and row.get(names["input"]) is not None and not isinstance(row.get(names["input"]), str):
        return f"field {names['input']!r} is {_shown(row.get(names['input']))}, expected a string or null"
    return None


def _messages_problem(turns, column: str, allow_empty: bool = False) -> str | None:
    turns = as_messages(turns)
    if not isinstance(turns, list):
        return f"field {column!r} is {_shown(turns)}, expected {MESSAGES_SHAPE}"
    if not turns and not allow_empty:
        return f"field {column!r} is an empty list, expected {MESSAGES_SHAPE}"
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"{column}[{i}] is {_shown(turn)}, expected {MESSAGES_SHAPE}"
        if turn.get("role") not in ROLES:
            return f"{column}[{i}] has role {turn.get('role')!r}; expected one of {', '.join(ROLES)}"
        if not isinstance(turn.get("content"), str):
            return f"{column}[{i}].content is {_shown(turn.get('content'))}, expected a string"
    return None


def _shown(value) -> str:
    kind = {str: "a string", list: "a list", dict: "an object", type(None): "null", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text[:40]}{'…' if len(text) > 40 else ''})"


def split_held_out(ds, cfg, unit: str = "rows"):
    """(train, eval or None, eval `unit` duplicating a train one): `data.eval_fraction` of `ds` held out,
    seeded, with the duplicate check. `ds` carries a `row_hash` column, which neither part keeps.

    One rule for every trainer's data (kit.train.data, kit.train.preference_data).
    """
    train, evald, dups = ds, None, 0
    if cfg.data.eval_fraction > 0 and len(ds) >= 2:
        held = math.ceil(cfg.data.eval_fraction * len(ds))  # as datasets' train_test_split counts it
        if held >= len(ds):
            raise UsageError(f"data.eval_fraction={cfg.data.eval_fraction} holds out {held} of the {len(ds)} "
                             f"{unit} and leaves none to train on: lower it (or set it to 0)")
        split = ds.train_test_split(test_size=cfg.data.eval_fraction, seed=cfg.seed, shuffle=True)
        train, evald = split["train"], split["test"]
        seen = set(train["row_hash"])
        dups = sum(h in seen for h in evald["row_hash"])
        if dups > cfg.data.max_duplicate_fraction * len(evald) and not cfg.data.allow_duplicates:
            noun = unit.split()[-1]
            raise UsageError(f"{dups} of {len(evald)} eval {noun} are exact duplicates of train {noun} "
                             f"(limit data.max_duplicate_fraction={cfg.data.max_duplicate_fraction}); "
                             "deduplicate the data or set data.allow_duplicates=true")
        evald = evald.remove_columns("row_hash")
    return train.remove_columns("row_hash"), evald, dups
