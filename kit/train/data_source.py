"""Where training data comes from: a local file (JSONL, JSON, CSV, parquet), a folder of one type, or a
Hub dataset id, loaded with `datasets` after kit's own checks (`kit.train.data_checks`), each row
locatable by the user's own words ("data.jsonl line 7")."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from kit.errors import UsageError
from kit.files import regular_file
from kit.planning.names import LOCAL_TYPES  # the planner checks data.path with them too
from kit.train import data_limits
from kit.train.data_checks import (explain_mixed_types, first_char, parquet_bytes, scan_csv_rows, scan_json_lines,
                                   scan_parquet_rows)


def load_rows(data_cfg, seq_len: int | None = None):
    """The raw dataset named by `data.path`: a local file or folder, or a Hub dataset id."""
    return load_located(data_cfg, seq_len)[0]


def _scan(files: list[Path], what: str, data_cfg, seq_len: int | None) -> list[int] | None:
    """kit's own checks of local files, before `datasets` reads them: the memory loading them takes, then
    every line or row (its JSON, its fields, its size). Returns the JSONL line numbers of a single file."""
    sizes = {}
    for f in files:
        kind = LOCAL_TYPES[f.suffix]
        size = parquet_bytes(f) if kind == "parquet" else f.stat().st_size
        sizes[f] = (size, "json_array" if f.suffix == ".json" and first_char(f) == "[" else "rows")
    data_limits.check_memory(what, sizes, data_cfg.split)
    lines = None
    for f in files:  # a bad line or row is named here, not deep inside Arrow (or shifted silently)
        kind = LOCAL_TYPES[f.suffix]
        if kind == "json":
            lines = scan_json_lines(f, seq_len)
        elif kind == "csv":
            scan_csv_rows(f, seq_len)
        else:
            scan_parquet_rows(f, seq_len)
    return lines


def _cache_words(e: OSError, source) -> str:
    """A file error while `datasets` reads `source` and builds its Arrow cache: the cache's fault (HF_HOME
    or HF_DATASETS_CACHE a file, full or read-only) only when the error has a file name or an errno;
    Arrow's own errors about the data (a damaged parquet file) are OSErrors without either."""
    import datasets

    if e.errno is None and e.filename is None:
        return f"data {source} could not be read: {' '.join(str(e).split())[:200]}"
    return (f"cannot write the datasets cache: {e.strerror or e}: {e.filename} (HF_DATASETS_CACHE, or HF_HOME, "
            f"is {datasets.config.HF_DATASETS_CACHE}: point it at a writable folder)")


@contextlib.contextmanager
def _quiet_datasets():
    """datasets logs "Failed to read file …" before raising; kit says it once, in its own error line."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_located(data_cfg, seq_len: int | None = None):
    """(dataset, locate): `locate(i)` names row i where a user finds it ("data.jsonl line 7").

    `seq_len`: rows are refused over `kit.train.data_limits.row_limit(seq_len)` bytes (None: its cap).
    """
    import datasets

    datasets.disable_progress_bars()  # one summary line instead of a bar per map, per rank

    path = Path(data_cfg.path)
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.suffix in LOCAL_TYPES)
        if not files:
            raise UsageError(f"data folder {path} holds no {'/'.join(LOCAL_TYPES)} files")
        kinds = {LOCAL_TYPES[Path(f).suffix] for f in files}
        if len(kinds) > 1:
            raise UsageError(f"data folder {path} mixes file types {sorted(kinds)}; keep one type")
        _scan([Path(f) for f in files], f"data folder {path}", data_cfg, seq_len)
        try:
            with _quiet_datasets():
                ds = datasets.load_dataset(kinds.pop(), data_files=files, split=_local_split(data_cfg))
        except OSError as e:
            raise UsageError(_cache_words(e, f"folder {path}")) from None
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            why = _columns_differ(files) or str(e).splitlines()[0]
            raise UsageError(f"data folder {path} could not be read: {why}") from e
        locate = lambda i: f"data folder {path} row {i + 1}"  # noqa: E731
    elif path.suffix in LOCAL_TYPES or path.exists():
        if regular_file(path, f"data file {path} (data.path)") is None:
            raise UsageError(f"data file {path} does not exist (data.path)")
        if path.suffix not in LOCAL_TYPES:
            raise UsageError(f"data file {path}: unknown type {path.suffix!r}; use {', '.join(LOCAL_TYPES)}")
        if path.stat().st_size == 0:
            raise UsageError(f"data file {path} is empty")
        lines = _scan([path], f"data file {path}", data_cfg, seq_len)
        try:
            with _quiet_datasets():
                ds = datasets.load_dataset(LOCAL_TYPES[path.suffix], data_files=str(path),
                                           split=_local_split(data_cfg))
        except OSError as e:
            raise UsageError(_cache_words(e, f"file {path}")) from None
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            why = explain_mixed_types(path, lines) or str(e).splitlines()[0]
            raise UsageError(f"data file {path} could not be read: {why}") from e
        locate = (lambda i: f"data file {path} line {lines[i]}") if lines else (lambda i: f"data file {path} row {i + 1}")
    else:
        try:
            ds = datasets.load_dataset(data_cfg.path, split=data_cfg.split)
        except (FileNotFoundError, ConnectionError, ValueError,
                datasets.exceptions.DatasetNotFoundError) as e:
            raise UsageError(f"dataset {data_cfg.path!r} is neither a local file nor a reachable Hub dataset: "
                             f"{str(e).splitlines()[0]}") from e
        locate = lambda i: f"{data_cfg.path} row {i + 1}"  # noqa: E731
    if len(ds) == 0:
        raise UsageError(f"dataset {data_cfg.path} has no rows")
    return ds, locate


def _local_split(data_cfg) -> str:
    """Local files are one split, "train"; its first rows (train[:1000], train[:10%]) are datasets' own
    slice, and keep the rows' line numbers (a slice from elsewhere would shift every "line N")."""
    split = data_cfg.split.strip()
    if split == "train" or split.startswith("train[:") and split.endswith("]"):
        return split
    raise UsageError(f"data.split={data_cfg.split!r}: a local file or folder is one split, 'train', or its first "
                     "rows, such as train[:1000] or train[:10%]; other names are splits of a Hub dataset")


def _columns_differ(files: list[str]) -> str | None:
    """"a.csv has columns […] where b.csv has […]" for a folder whose files disagree, else None."""
    import json

    def columns(f: str) -> list[str]:
        kind = LOCAL_TYPES[Path(f).suffix]
        if kind == "parquet":
            import pyarrow.parquet

            return list(pyarrow.parquet.read_schema(f).names)
        with open(f, encoding="utf-8-sig", newline="") as fh:  # -sig: past a byte-order mark
            if kind == "csv":
                import csv

                return next(csv.reader(fh), [])
            text = fh.read() if f.endswith(".json") else next((line for line in fh if line.strip()), "{}")
        first = json.loads(text)
        first = first[0] if isinstance(first, list) and first else first
        return sorted(first) if isinstance(first, dict) else []

    try:
        seen = [(Path(f).name, columns(f)) for f in files]
    except (OSError, ValueError, RecursionError, StopIteration):  # the load's own error says more
        return None
    odd = next(((name, cols) for name, cols in seen if sorted(cols) != sorted(seen[0][1])), None)
    if odd is None:
        return None
    return (f"{odd[0]} has columns {odd[1]} where {seen[0][0]} has {seen[0][1]}: every file of a folder needs the "
            "same columns")
