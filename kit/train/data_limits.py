"""How large a row and a data file may be, checked before `datasets` reads a byte of them.

A row is cut to seq_len tokens, but only after the tokenizer has read all of it: a 150 MB row grew
a process to 23.7 GB (its tokens, their offsets and Python's lists of them) until the kernel killed
it, 218 s later, with no word, leaving a 157 MB cache copy. So a row may hold at most
`row_limit(seq_len)` bytes — `BYTES_PER_TOKEN` per token of seq_len, a generous allowance for JSON
escapes and long tokens, never under `ROW_FLOOR` nor over `ROW_CAP` — and a file is refused when
what loading it takes (`memory_needed`) is more than this machine has available. The scans that
enforce the row limit read a bounded amount at a time (kit.train.data_checks), so a refusal never
costs the memory it protects.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kit.errors import UsageError
from kit.files import size_words

BYTES_PER_TOKEN = 64  # ~4 bytes of UTF-8 per token, ×16: escapes (\u00e9 is 6 bytes), long tokens, markup
ROW_FLOOR = 1 << 20  # 1 MiB: no row of a fine-tuning set is refused at a small seq_len for being a few pages
ROW_CAP = 8 << 20  # 8 MiB: tokenizing a row costs ~150× its size in memory (1.2 GB here) on each process
# Memory that loading takes, per byte of the file: its rows tokenized and kept in memory (token ids and
# loss mask, 8 bytes each per ~4 bytes of text); a JSON array is also parsed whole into Python objects.
MEMORY_PER_BYTE = {"rows": 4, "json_array": 12}


def row_limit(seq_len: int | None) -> int:
    """The most bytes one row may hold for `seq_len` (None: the cap)."""
    if not seq_len:
        return ROW_CAP
    return min(ROW_CAP, max(ROW_FLOOR, int(seq_len) * BYTES_PER_TOKEN))


def row_too_long(where: str, size: int | None, limit: int, seq_len: int | None) -> UsageError:
    """The one-line error for a row over `limit` bytes; `size` None: over it, read no further."""
    how = f"is {size_words(size)}, " if size is not None else "is "
    why = f"the limit for seq_len={seq_len}" if seq_len else "the limit"
    return UsageError(f"{where}: the row {how}over the {size_words(limit)} a row may hold ({why}: a row is cut to "
                      "seq_len tokens only after all of it is tokenized, which takes ~150× its size in memory); "
                      "split it into rows of about seq_len tokens")


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the kernel's MemAvailable, or a container's
    cgroup limit less its use when lower; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
        if m:
            found.append(int(m.group(1)) * 1024)
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            used = int(f.read().strip())
        if limit.isdigit():
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def memory_needed(sizes: dict[Path, tuple[int, str]]) -> int:
    """What loading these files takes in memory on one process: {path: (bytes, "rows" | "json_array")}."""
    return sum(size * MEMORY_PER_BYTE[kind] for size, kind in sizes.values())


def check_memory(what: str, sizes: dict[Path, tuple[int, str]], split: str, available: int | None = None) -> None:
    """Refuse data whose loading would take more memory than is available, on every process of this machine.

    `split`: only the whole split ("train") is checked; a slice (train[:1000]) bounds what is tokenized.
    """
    if split.strip() != "train":
        return
    available = available_memory() if available is None else available
    if available is None:
        return  # unknown: left to the load itself
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    each = memory_needed(sizes)
    if each * processes <= available:
        return
    total = sum(size for size, _ in sizes.values())
    on = f" on each of {processes} processes" if processes > 1 else ""
    raise UsageError(f"{what} is {size_words(total)}; loading and tokenizing it takes ~{size_words(each)} of memory"
                     f"{on}, and this machine has {size_words(available)} available: train on its first rows "
                     "(data.split=train[:10%]), split it, or use a machine with more memory")
