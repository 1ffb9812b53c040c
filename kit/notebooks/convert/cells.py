"""Reading a notebook's code cells as Python: magics out, `%%writefile` bodies kept aside.

Lines starting with `!` or `%` are shell and IPython, not Python: they are dropped (and listed in
the script's docstring so the user can run them first), except the two whose effect the code
below depends on, which become their Python equivalents: `%env K=V` → `os.environ["K"] = "V"`,
`%cd DIR` → `os.chdir("DIR")`. A cell under a non-Python cell magic is dropped whole; a
`%%writefile NAME` cell is kept aside as a written file, since a notebook may write its training
script that way and launch it with `!accelerate launch NAME`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kit.notebooks.convert.syntax import Change
from kit.errors import UsageError

# Cell magics whose body is still Python; the body of any other (%%bash, %%writefile…) is not.
PYTHON_BODY_MAGICS = {"capture", "time", "timeit", "prun", "memit", "debug"}
LAUNCHERS = ("accelerate launch", "torchrun", "python -m torch.distributed.run", "python", "python3",
             "deepspeed")


@dataclass
class Cells:
    """What a notebook holds, as the converter needs it."""

    code: list[tuple[int, str]] = field(default_factory=list)  # (cell number, Python source)
    written: dict[str, tuple[int, str]] = field(default_factory=dict)  # file name -> (cell, body)
    launches: list[tuple[int, str, str]] = field(default_factory=list)  # (cell, shell line, script)
    dropped: list[str] = field(default_factory=list)  # shell/magic lines, for the docstring


def read_code_cells(path: str | Path) -> list[tuple[int, str]]:
    """(cell number, source) of each code cell; UsageError if `path` is not a readable notebook."""
    import nbformat  # only `kit convert` needs it

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such notebook file: give the path of an .ipynb file")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{p}: not valid JSON ({e}): is this really an .ipynb notebook?") from None
    # nbformat 3 keeps its cells under "worksheets"; nbformat.reads upgrades it to 4.
    if not isinstance(raw, dict) or "nbformat" not in raw or not (
            isinstance(raw.get("cells"), list) or isinstance(raw.get("worksheets"), list)):
        raise UsageError(f"{p}: JSON, but not a Jupyter notebook (no 'cells'/'nbformat'): give an .ipynb file")
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{p}: nbformat cannot read this notebook ({e}): re-save it from Jupyter") from None
    return [(i, c.source) for i, c in enumerate(nb.cells, 1) if c.cell_type == "code"]


def read_cells(path: str | Path, changes: list[Change]) -> Cells:
    """The notebook's code cells with magics handled (see the module docstring)."""
    cells = Cells()
    for cell, source in read_code_cells(path):
        code = strip_magics(source, cell, changes, cells)
        if code is not None:
            cells.code.append((cell, code))
    return cells


def _python_for(line: str) -> str | None:
    """`%env K=V` / `%set_env K V` / `%cd DIR` as Python, so the code below sees the same state."""
    word, _, rest = line.partition(" ")
    rest = rest.strip()
    if word in ("%env", "%set_env") and rest:
        key, _, value = rest.partition("=") if "=" in rest else rest.partition(" ")
        if key.strip():
            return f"os.environ[{key.strip()!r}] = {value.strip()!r}"
    if word == "%cd" and rest:
        return f"os.chdir({rest.strip(chr(34) + chr(39))!r})"
    return None


def _launched_script(line: str) -> str | None:
    """The .py file a shell line launches (`!accelerate launch --multi_gpu train.py`), if any."""
    body = line.lstrip("!%").strip()
    if not any(body.startswith(launcher) for launcher in LAUNCHERS):
        return None
    try:
        words = shlex.split(body)
    except ValueError:
        return None
    return next((w for w in words if w.endswith(".py")), None)


def strip_magics(source: str, cell: int, changes: list[Change], cells: Cells | None = None) -> str | None:
    """Drop `!`/`%` lines (or the whole cell under a non-Python cell magic: None).

    A dropped line becomes an empty line (or `pass` inside a block), so line numbers in parse
    errors still match the notebook.
    """
    cells = Cells() if cells is None else cells
    lines = source.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    magic = first[2:].split(maxsplit=1)[0] if first.startswith("%%") and first[2:].strip() else None
    if magic is not None and magic not in PYTHON_BODY_MAGICS:
        if magic == "writefile":
            words = first.split()
            name = words[-1] if len(words) > 1 and words[-1] != "-a" else ""
            body = "\n".join(lines[lines.index(next(x for x in lines if x.strip() == first)) + 1:]) + "\n"
            cells.written[name] = (cell, body)
            changes.append(Change(cell, f"`{first[:60]}`: the file it writes is kept aside, not run as "
                                        "notebook code"))
        else:
            changes.append(Change(cell, f"dropped the whole cell: `{first[:60]}` runs its body as something "
                                        "other than Python"))
        return None
    kept, here, continued = [], [], False
    for line in lines:
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if continued or stripped.startswith(("!", "%")):
            python = None if continued else _python_for(stripped)
            if python is not None:
                kept.append(indent + python)
                changes.append(Change(cell, f"`{stripped[:60]}` became `{python}`: the code below depends on it"))
                continue
            here.append(stripped)
            if not continued and (script := _launched_script(stripped)):
                cells.launches.append((cell, stripped, script))
            kept.append(f"{indent}pass" if indent and not continued else "")
            continued = stripped.endswith("\\")  # `!pip install a \` goes on on the next line
        else:
            kept.append(line)
    if here:
        cells.dropped.extend(here)
        shown = ", ".join(f"`{d[:50]}`" for d in here)
        changes.append(Change(cell, f"dropped {shown}: shell commands and IPython magics are not Python; "
                                    "run them before torchrun"))
    return "\n".join(kept) + "\n"


def parse_cell(source: str, cell: int) -> tuple[ast.Module, cst.Module]:
    """Both trees of a cell (ast for checks, libcst for rewrites); UsageError with the line if invalid."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        text = (e.text or "").strip()
        raise UsageError(f"cell {cell}, line {e.lineno}: {e.msg} in {text!r} (after removing magics): "
                         "fix that line in the notebook and convert again") from None
    try:
        return tree, cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise UsageError(f"cell {cell}, line {e.raw_line}: libcst cannot parse this cell ({e.message}): "
                         "simplify that line and convert again") from None


def is_comment_only(source: str) -> bool:
    """A cell of comments alone (a note the user left): kept in the script as comments."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return bool(lines) and all(re.match(r"#", line) for line in lines)
