"""Reading a notebook's code cells as Python: magics out, `%%writefile` bodies kept aside.

Lines starting with `!` or `%` are shell and IPython, not Python: they are dropped (and listed in
the script's docstring so the user can run them first), except those whose effect the code
below depends on, which become their Python equivalents: `%env K=V` → `os.environ["K"] = "V"`,
`%cd DIR` → `os.chdir("DIR")`, `%time STMT` (and `%timeit`, `%prun`, `%memit`, `%debug`) → `STMT`,
and `files = !ls` → `files = subprocess.getoutput('ls').splitlines()`. Capturing any other magic's
result (`x = %who_ls`), or a shell command with IPython's `{var}`/`$var` expansion, is refused by
line: a script has no equivalent. A cell under a non-Python cell magic is dropped whole; a
`%%writefile NAME` cell is kept aside as a written file, since a notebook may write its training
script that way and launch it with `!accelerate launch NAME`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kit.notebooks.convert.literals import NEWLINE_LINES, set_aside
from kit.notebooks.convert.magics import (PYTHON_ARG_MAGICS, PYTHON_BODY_MAGICS, captured, python_for,
                                         shell_line_python)
from kit.notebooks.convert.syntax import Change, clip
from kit.errors import UsageError
from kit.redaction import redact
from kit.files import json_problem, parse_json, read_text, regular_file

# IPython's `lhs = !cmd` / `lhs = %magic args` (its assign_from_system/assign_from_magic transforms).
ASSIGNED = re.compile(r"(?P<lhs>[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*(?P<rhs>[!%].*)")
CHUNKED = 64_000  # characters: a cell this big is given to libcst one statement at a time (`_cst_module`)
INSTALLERS = {"pip", "pip3", "apt", "apt-get", "conda", "mamba", "micromamba"}
# Training programs with a CLI of their own: the subcommands that train.
TRAINING_CLIS = {"axolotl": ("train",), "llamafactory-cli": ("train",), "tune": ("run",), "autotrain": ("llm", "train"),
                 "trl": ("sft", "dpo", "grpo", "kto", "reward", "ppo", "orpo"), "litgpt": ("finetune", "finetune_lora",
                                                                                        "pretrain")}
TRAINING_WORDS = re.compile(r"(?i)train|sft|dpo|orpo|grpo|fine.?tun|run_")
LAUNCHERS = ("accelerate launch", "torchrun", "python -m torch.distributed.run", "python", "python3",
             "deepspeed")


@dataclass
class Cells:
    """What a notebook holds, as the converter needs it."""

    code: list[tuple[int, str]] = field(default_factory=list)  # (cell number, Python source)
    written: dict[str, tuple[int, str]] = field(default_factory=dict)  # file name -> (cell, body)
    launches: list[tuple[int, str, str]] = field(default_factory=list)  # (cell, shell line, script)
    dropped: list[tuple[int, int, str]] = field(default_factory=list)  # (cell, line, text) of shell/magic lines


def read_code_cells(path: str | Path) -> list[tuple[int, str]]:
    """(cell number, source) of each code cell; UsageError if `path` is not a readable notebook."""
    p = Path(path)
    if regular_file(p, f"notebook {p}") is None:  # a folder, FIFO or device is refused by name
        raise UsageError(f"{p}: no such notebook file: give the path of an .ipynb file")
    try:
        raw = parse_json(read_text(p, "notebook"))
    except ValueError as e:
        raise UsageError(f"{p}: {json_problem(e)}: is this really an .ipynb notebook?") from None
    # nbformat 3 keeps its cells under "worksheets"; nbformat.reads upgrades it to 4.
    if not isinstance(raw, dict) or "nbformat" not in raw or not (
            isinstance(raw.get("cells"), list) or isinstance(raw.get("worksheets"), list)):
        raise UsageError(f"{p}: JSON, but not a Jupyter notebook (no 'cells'/'nbformat'): give an .ipynb file")
    if "cells" in raw:
        check_cells(raw["cells"], p)
    nb = _nbformat_reads(raw, p)
    check_cells(nb.cells, p)  # nbformat 3's cells, once upgraded
    return [(i, c.source) for i, c in enumerate(nb.cells, 1) if c.cell_type == "code"]


def _nbformat_reads(raw: dict, p: Path):
    """nbformat's version-4 notebook, without its warning about cell ids: kit never writes the notebook back."""
    import nbformat  # only `kit convert` needs it
    from nbformat.warnings import MissingIDFieldWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=MissingIDFieldWarning)
        try:
            return nbformat.reads(json.dumps(raw), as_version=4)
        except (ValueError, KeyError, TypeError, AttributeError, nbformat.ValidationError) as e:
            raise UsageError(f"{p}: nbformat cannot read this notebook ({clip(str(e))}): re-save it from "
                             "Jupyter") from None


def check_cells(cells: list, p: Path) -> None:
    """Each cell a JSON object with a string `cell_type` and a `source` that is text or a list of lines."""
    for i, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise UsageError(f"{p}: cell {i} is a JSON {type(cell).__name__}, not an object: re-save the "
                             "notebook from Jupyter")
        if not isinstance(cell.get("cell_type"), str):
            raise UsageError(f"{p}: cell {i} has no cell_type string: re-save the notebook from Jupyter")
        source = cell.get("source")
        if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(x, str) for x in source)):
            raise UsageError(f"{p}: cell {i}'s source is {clip(json.dumps(source), 40)}, not text or a list of "
                             "lines: re-save the notebook from Jupyter")


def read_cells(path: str | Path, changes: list[Change]) -> Cells:
    """The notebook's code cells with magics handled (see the module docstring)."""
    cells = Cells()
    for cell, source in read_code_cells(path):
        code = strip_magics(source, cell, changes, cells)
        if code is not None:
            cells.code.append((cell, code))
    return cells


def is_install(line: str) -> bool:
    """`!pip install x`, `%pip install x`, `!apt-get install y`: setup that may run first, once."""
    words = line.lstrip("!%").split()
    if words[:2] in (["python", "-m"], ["python3", "-m"]):  # `python -m pip install x`
        words = words[2:]
    elif words[:2] == ["uv", "pip"]:
        words = words[1:]
    return bool(words) and words[0] in INSTALLERS


def _launched_script(line: str) -> str | None:
    """What a shell line launches, if any: the .py file (`!accelerate launch --multi_gpu train.py`), a
    training module (`-m axolotl.cli.train`, as `-m NAME`) or a training program's CLI (`axolotl train …`)."""
    body = re.sub(r"^(?:[A-Za-z_]\w*=\S*\s+)+", "", line.lstrip("!%").strip())  # `ACCELERATE_USE_FSDP=1 torchrun …`
    try:
        words = shlex.split(body)
    except ValueError:
        return None
    if len(words) > 1 and TRAINING_CLIS.get(words[0], ()) and words[1] in TRAINING_CLIS[words[0]]:
        return f"{words[0]} {words[1]}"
    if not any(body.startswith(launcher) for launcher in LAUNCHERS):
        return None
    script = next((w for w in words if w.endswith(".py")), None)
    module = next((b for a, b in zip(words, words[1:]) if a == "-m"), None)
    if script is None and module is not None and (not words[0].startswith("python") or TRAINING_WORDS.search(module)):
        return f"-m {module}"  # `python -m pip` is no launch; `accelerate launch -m …` and `python -m …train` are
    return script


def strip_magics(source: str, cell: int, changes: list[Change], cells: Cells | None = None,
                 port: frozenset | set = frozenset()) -> str | None:
    """Drop `!`/`%` lines (or the whole cell under a non-Python cell magic: None).

    A dropped line becomes an empty line (or `pass` inside a block), so line numbers in parse
    errors still match the notebook. The lines numbered in `port` run in place instead, through
    subprocess.run (kit.notebooks.convert.shell_after).
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
    start = command = ""  # the shell command being read: its first line, and its lines joined
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if not continued and (assigned := ASSIGNED.fullmatch(stripped.rstrip())):
            python = captured(assigned["lhs"], assigned["rhs"], f"cell {cell}, line {number}")
            kept.append(indent + python)
            shell = python.startswith("import subprocess")
            changes.append(Change(cell, f"`{clip(stripped, 60)}` became `{clip(python, 80)}`: a script has no "
                                        "IPython" + ("; it runs on every rank, check that is harmless" if shell
                                                     else ""), review=shell))
            continue
        if number in port:
            kept.append(indent + shell_line_python(stripped))
            continue
        if continued or stripped.startswith(("!", "%")):
            python = None if continued else python_for(stripped)
            if python is not None:
                kept.append(indent + python)
                why = "the statement runs, its timing or profiling does not" \
                    if stripped.split(" ")[0] in PYTHON_ARG_MAGICS else "the code below depends on it"
                changes.append(Change(cell, f"`{stripped[:60]}` became `{python}`: {why}"))
                continue
            here.append((number, stripped))
            start, command = (start, command[:-1] + " " + stripped) if continued else (stripped, stripped)
            if not stripped.endswith("\\") and (script := _launched_script(command)):  # `\` lines joined
                cells.launches.append((cell, start, script))
            if indent and not continued and not is_install(stripped):
                # Inside a loop or a branch it ran there, maybe once per pass: nobody can run it "first".
                shown = redact(clip(stripped, 60))
                changes.append(Change(cell, f"`{shown}` dropped from inside a block, where the code around it "
                                            "depends on it: port it to subprocess.run, or run it by hand", True))
                kept.append(f"{indent}pass  # kit: REVIEW (cell {cell}): `{shown}` was dropped here: port it to "
                            "subprocess.run")
                continued = stripped.endswith("\\")
                continue
            kept.append(f"{indent}pass" if indent and not continued else "")
            continued = stripped.endswith("\\")  # `!pip install a \` goes on on the next line
        else:
            kept.append(line)
    cells.dropped.extend((cell, number, text) for number, text in here)  # said once training's place is known
    return "\n".join(kept) + "\n"


def parse_cell(source: str, cell: int) -> tuple[ast.Module, cst.Module]:
    """Both trees of a cell (ast for checks, libcst for rewrites); UsageError with the line if invalid."""
    if "\0" in source:
        line = source[:source.index("\0")].count("\n") + 1
        raise UsageError(f"cell {cell}, line {line}: contains a NUL byte, which Python source cannot hold: "
                         "remove it in the notebook and convert again")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise UsageError(f"cell {cell}{_where(e)}: {_reason(e)} (after removing magics): fix that line in the "
                         "notebook and convert again") from None
    reduced = set_aside(source, tree)  # big data literals: placeholders from here on (kit.notebooks.convert.literals)
    if reduced is not source:
        source, tree = reduced, ast.parse(reduced)
    try:  # what only the compiler checks: `await`, `return` or `break` where a script cannot have them
        compile(tree, f"cell {cell}", "exec", dont_inherit=True)
    except SyntaxError as e:
        msg = clip(e.msg or "invalid Python")
        if "await" in msg or "async" in msg:  # Jupyter runs top-level `await` in its own event loop
            raise UsageError(f"cell {cell}{_where(e)}: {msg}: a script has no event loop running, as Jupyter "
                             "has: put that code in `async def main(): ...`, call `asyncio.run(main())` and "
                             "convert again") from None
        raise UsageError(f"cell {cell}{_where(e)}: {msg}: fix that line in the notebook and convert again") from None
    try:
        return tree, _cst_module(source, tree)
    except (cst.ParserSyntaxError, RecursionError) as e:
        line = f", line {e.raw_line + getattr(e, 'kit_offset', 0)}" if isinstance(e, cst.ParserSyntaxError) else ""
        why = clip(e.message if isinstance(e, cst.ParserSyntaxError) else "nested too deeply")
        raise UsageError(f"cell {cell}{line}: libcst cannot parse this cell ({why}): simplify that line and "
                         "convert again") from None


def _cst_module(source: str, tree: ast.Module) -> cst.Module:
    """libcst's tree of a cell. libcst's parser takes time that grows faster than the cell's size (4× the
    statements, 8× the time), so a big cell is parsed one top-level statement at a time (each with the
    comment lines above it) and the statements put back together in one module."""
    if len(source) < CHUNKED or len(tree.body) < 2:
        return cst.parse_module(source)
    lines = NEWLINE_LINES.findall(source)
    cuts = [0] + [s.end_lineno for s in tree.body[:-1]] + [len(lines)]
    body, header, module, indent = [], [], None, None
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        try:
            part = cst.parse_module("".join(lines[a:b]))
        except cst.ParserSyntaxError as e:
            e.kit_offset = a  # the line in the cell, not in the part
            raise
        stmt = tree.body[i]
        if indent is None and getattr(stmt, "body", None) and isinstance(stmt.body, list) \
                and stmt.body[0].lineno > stmt.lineno:
            indent = part.default_indent  # libcst's default: the first indented block's indentation
        elif part.default_indent != indent and indent is not None:  # its blocks keep their own indentation
            part = part.visit(_OwnIndent(part.default_indent))
        if module is None:
            module, header = part, list(part.header)
        elif part.body:
            first = part.body[0]
            part = part.with_changes(body=[first.with_changes(leading_lines=[*part.header, *first.leading_lines]),
                                           *part.body[1:]])
        body.extend(part.body)
        footer = part.footer
    return module.with_changes(header=header, body=body, footer=footer, default_indent=indent or module.default_indent)


class _OwnIndent(cst.CSTTransformer):
    """Blocks that follow their module's default indentation, given it explicitly (for another module)."""

    def __init__(self, indent: str):
        super().__init__()
        self.indent = indent

    def leave_IndentedBlock(self, original, updated):
        return updated if updated.indent is not None else updated.with_changes(indent=self.indent)


def _where(e: Exception) -> str:
    return f", line {e.lineno}" if getattr(e, "lineno", None) else ""


def _reason(e: Exception) -> str:
    """Python's complaint, with the offending source line cut short (a generated line may be kilobytes)."""
    if isinstance(e, RecursionError):
        return "nested too deeply for Python's parser"
    if isinstance(e, MemoryError):
        return "too large or too deeply nested for Python's parser"
    msg = getattr(e, "msg", None) or str(e)
    hint = ""
    if msg.startswith("f-string") and sys.version_info < (3, 12):  # PEP 701: quotes nest in f-strings from 3.12
        hint = f" (valid from Python 3.12; kit runs on {sys.version_info[0]}.{sys.version_info[1]} here)"
    text = (getattr(e, "text", None) or "").strip()
    return f"{clip(msg)}{hint} in {clip(text)!r}" if text else clip(msg) + hint


def is_comment_only(source: str) -> bool:
    """A cell of comments alone (a note the user left): kept in the script as comments."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return bool(lines) and all(re.match(r"#", line) for line in lines)


def without_launch(dropped: list[tuple[int, int, str]], launch: tuple[int, str] | None) -> list:
    """The dropped shell lines less the launch of the script kit converted in its place (and the
    lines that launch continues on with `\\`): running it as well would train the job twice."""
    if launch is None:
        return dropped
    out, skipping = [], False
    for cell, number, text in dropped:
        if skipping and cell == launch[0]:
            skipping = text.endswith("\\")
            continue
        skipping = False
        if cell == launch[0] and text == launch[1]:
            skipping = text.endswith("\\")
            continue
        out.append((cell, number, text))
    return out
