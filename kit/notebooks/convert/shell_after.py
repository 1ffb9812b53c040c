"""Shell lines that ran after training: run them there, on rank 0, as the notebook did.

Before training a `!` line is setup (`!nvidia-smi`, `!git clone …`): every rank would run it, so it
is listed to run before torchrun. After training the Python below it often needs what it made
(`!wget URL` then `whisper("file.flac")`, `!git clone …` then `%cd repo`): dropped, that Python fails
on rank 0, maybe before the notebook's own save. So a one-line `!cmd` there becomes
`subprocess.run("cmd", shell=True)` in place, run where the code after training runs: on rank 0
alone. Like IPython it does not stop on a failing command. Left out, and flagged as before:
installs, `%` magics, lines continued with `\\`, lines inside a block (already a REVIEW), IPython's
`{var}`/`$var` expansion, and any line holding a token.
"""

from __future__ import annotations

from kit.redaction import redact
from kit.notebooks.convert.cells import is_install, parse_cell, read_code_cells, strip_magics
from kit.notebooks.convert.syntax import Change, clip


def portable(text: str) -> bool:
    return (text.startswith("!") and not is_install(text) and not text.endswith("\\")
            and not any(c in text for c in "{}$") and redact(text) == text and bool(text[1:].strip()))


def port_after(path, parsed: list, dropped: list, end: tuple[int, int] | None, changes: list[Change]):
    """(parsed cells, dropped lines) with the portable lines after `end` (training's last line) run in place."""
    if end is None:
        return parsed, dropped
    ported = {(c, n): t for c, n, t in dropped if (c, n) >= end and portable(t)}
    if not ported:
        return parsed, dropped
    sources = dict(read_code_cells(path))
    cells = {c: {n for c2, n in ported if c2 == c} for c, _ in ported}
    out = []
    for cell, tree, module, comment_only in parsed:
        if cell in cells and cell in sources:
            code = strip_magics(sources[cell], cell, [], None, port=cells[cell])
            tree, module = parse_cell(code, cell)
            lines = ", ".join(f"`{clip(t, 50)}`" for (c, _), t in ported.items() if c == cell)
            changes.append(Change(cell, f"{lines}: ran after training in the notebook, and the code after it may "
                                        "need what it made: it runs there, on rank 0, through subprocess.run"))
        out.append((cell, tree, module, comment_only))
    return out, [d for d in dropped if (d[0], d[1]) not in ported]
