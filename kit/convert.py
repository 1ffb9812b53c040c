"""`kit convert`: turn a training notebook into a rank-aware script for torchrun.

The code cells are kept in order. Lines starting with `!` or `%` are dropped before parsing
(they are shell and IPython, not Python), and so are whole cells under a non-Python cell magic
(`%%bash`, `%%writefile`, …). Then, with libcst so comments and layout survive:

- a rank block goes on top (LOCAL_RANK/RANK/WORLD_SIZE, `set_device`, `init_process_group`);
- model loads are pinned to the rank (`device_map={"": rank_device}`);
- TrainingArguments/SFTConfig/… get `ddp_find_unused_parameters=False`, the `--precision`, and
  non-reentrant gradient checkpointing;
- top-level saves, pushes, prints and plots go under `if is_main:`;
- a blocking `notebook_login()` becomes a check for a token from HF_TOKEN;
- the work (from the first statement that is not an import, def or literal setting) is wrapped in
  `try/finally`: barrier after success only, `destroy_process_group()` always.

What it cannot convert safely it either refuses or flags:

- Refused (`UsageError`, exit 2, nothing written), because the script would hang or mean
  something else: `ipywidgets`, `input()`, IPython's interactive state (`_`, `__`, `_5`, `Out[…]`,
  `In[…]`, `get_ipython()`), no `trainer.train()` call, a cell that is not Python after magics.
- Flagged as `# kit: REVIEW (cell N): …` above the statement and in the change list, because the
  script runs but a person should look: hard-coded `bf16=True` under `--precision auto`,
  `torch.cuda.is_bf16_supported()`, `display()`, `.generate()` on every rank, a `"cuda:0"`
  literal, a `notebook_login()` nested in a block, `wandb.login()`, Colab's `drive.mount()` and
  `userdata.get()`, a dropped `%env`/`%cd`, no TrainingArguments-like call.

Cell numbers are 1-based positions among all of the notebook's cells, markdown included.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kit.convert_rules import Change, is_setup, loaded_paths, rewrite_cell
from kit.errors import KitError, UsageError

PRECISION_CHOICES = ("auto", "fp16", "bf16", "fp32")
# Cell magics whose body is still Python; the body of any other (%%bash, %%writefile…) is not.
PYTHON_BODY_MAGICS = {"capture", "time", "timeit", "prun", "memit", "debug"}
TRIPLE = '"' * 3  # would end the script's docstring early
IPYTHON_NAMES = {"get_ipython", "Out", "In", "_oh", "_ih", "_dh", "_", "__", "___", "_i", "_ii", "_iii"}

DOCSTRING = '''\
{raw}"""Rank-aware training script made by `kit convert` from {notebook}.

One process per GPU on this machine (2 for Kaggle's T4 x2; use your GPU count):

    torchrun --standalone --nproc_per_node=2 {script}

or one process, on one GPU or the CPU:

    python {script}

{dropped}Lines marked `# kit:` were changed by kit; `# kit: REVIEW` marks what a person should check.
Made again with: kit convert {notebook} -o {script} --force --precision {precision}
"""
'''

RANK_BLOCK = '''\
# kit: rank block. torchrun starts one copy of this script per GPU and tells each its place in the
# environment; under plain `python` the defaults make it the only process (rank 0 of 1).
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ.get("LOCAL_RANK", 0))
rank = int(os.environ.get("RANK", 0))
world_size = int(os.environ.get("WORLD_SIZE", 1))
is_main = rank == 0  # rank 0 alone saves, pushes and prints results
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)  # before any CUDA work, so no rank lands on cuda:0 by accident
    rank_device = local_rank
else:
    rank_device = "cpu"
if world_size > 1 and not dist.is_initialized():
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
'''

TRY_TEMPLATE = '''\
try:
    pass
finally:
    # Always tear down, so no rank exits with a live process group (that is how NCCL hangs start).
    # The barrier runs only after success: after a failure the other ranks may never arrive.
    if dist.is_initialized():
        if training_ok:
            dist.barrier(device_ids=[local_rank] if torch.cuda.is_available() else None)
        dist.destroy_process_group()
'''


@dataclass
class Conversion:
    """The script's text and every change made, in cell order."""

    source: str
    changes: list[Change] = field(default_factory=list)


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


def strip_magics(source: str, cell: int, changes: list[Change], dropped: list[str] | None = None) -> str | None:
    """Drop `!`/`%` lines, or the whole cell under a non-Python cell magic (None).

    A dropped line becomes an empty line (or `pass` inside a block), so line numbers in parse
    errors still match the notebook. Dropped shell lines are appended to `dropped`.
    """
    dropped = [] if dropped is None else dropped
    lines = source.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    magic = first[2:].split(maxsplit=1)[0] if first.startswith("%%") and first[2:].strip() else None
    if magic is not None and magic not in PYTHON_BODY_MAGICS:
        changes.append(Change(cell, f"dropped the whole cell: `{first[:60]}` runs its body as something "
                                    "other than Python"))
        return None
    kept, here, continued = [], [], False
    for line in lines:
        stripped = line.lstrip()
        if continued or stripped.startswith(("!", "%")):
            here.append(stripped)
            indent = line[: len(line) - len(stripped)]
            kept.append(f"{indent}pass" if indent and not continued else "")
            continued = stripped.endswith("\\")  # `!pip install a \` goes on on the next line
        else:
            kept.append(line)
    if here:
        dropped.extend(here)
        shown = ", ".join(f"`{d[:50]}`" for d in here)
        changes.append(Change(cell, f"dropped {shown}: shell commands and IPython magics are not Python; "
                                    "run them before torchrun"))
    # These change the state the code below runs in; dropping them silently would change its meaning.
    for line in here:
        if line.split(maxsplit=1)[0] in ("%env", "%set_env", "%cd"):
            changes.append(Change(cell, f"`{line[:60]}` was dropped but the code may depend on it: set the "
                                        "variable or folder before launching, or in Python (os.environ, os.chdir)",
                                  review=True))
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


def _refusal(cell: int, node: ast.AST, what: str) -> tuple[int, int, str]:
    return cell, getattr(node, "lineno", 0), what


def check_convertible(trees: list[tuple[int, ast.Module]]) -> None:
    """Refuse what cannot run unattended under torchrun; refuse a notebook that does not train."""
    nodes = [n for _, t in trees for n in ast.walk(t)]
    stored = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    stored |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    problems, trainers, trains = [], set(), False
    for cell, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if any(m.split(".")[0] == "ipywidgets" for m in mods):
                    problems.append(_refusal(cell, node, "ipywidgets need a notebook front end, and under "
                                                         "torchrun nobody can click them: use constants or flags"))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in stored and (
                    node.id in IPYTHON_NAMES or (node.id[:1] == "_" and node.id.lstrip("_i").isdigit())):
                problems.append(_refusal(cell, node, f"`{node.id}` is IPython's interactive state, which a "
                                                     "script does not have: assign the value to a name"))
            elif isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func == "input":
                    problems.append(_refusal(cell, node, "input() waits for keyboard input that no torchrun rank "
                                                         "can get: use a constant or os.environ"))
                elif func == "unsloth_train" or (func.endswith(".train") and (
                        "trainer" in func.lower() or func[:-6] in trainers)):
                    trains = True
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if ast.unparse(node.value.func).endswith("Trainer"):
                    trainers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    if problems:
        cell, line, what = min(problems)
        raise UsageError(f"cell {cell}, line {line}: {what}; then convert again")
    if not trains:
        raise UsageError("no training code found: kit convert needs a Trainer's `trainer.train()` call "
                         "(a hand-written loop needs DistributedDataParallel, which kit does not add)")


def convert_notebook(path: str | Path, precision: str = "auto", script_name: str = "train_ddp.py") -> Conversion:
    """Convert a notebook to a rank-aware script.

    Args:
        path: the .ipynb file.
        precision: "auto" keeps the notebook's fp16/bf16 (flagging a hard-coded bf16=True);
            "fp16", "bf16", "fp32" set both keywords on the TrainingArguments-like call.
        script_name: the output's file name, quoted in the script's docstring.

    Returns:
        The script text and the list of changes.

    Raises:
        UsageError: unreadable notebook, a cell that is not Python, something that cannot run
            under torchrun, or no training code.
    """
    if precision not in PRECISION_CHOICES:
        raise UsageError(f"--precision {precision!r}: choose one of {', '.join(PRECISION_CHOICES)}")
    changes: list[Change] = []
    parsed, dropped = [], []
    for cell, source in read_code_cells(path):
        code = strip_magics(source, cell, changes, dropped)
        if code is not None:
            parsed.append((cell, *parse_cell(code, cell)))
    check_convertible([(cell, tree) for cell, tree, _ in parsed])

    items: list[tuple[int, cst.BaseStatement]] = []
    pending: list[cst.EmptyLine] = []  # comments that trailed the previous cell
    found_args = False
    reloaded = frozenset(loaded_paths([tree for _, tree, _ in parsed]))
    for cell, _, module in parsed:
        stmts, found = rewrite_cell(module, cell, precision, changes, reloaded)
        found_args |= found
        if stmts:
            marker = cst.EmptyLine(comment=cst.Comment(f"# --- notebook cell {cell} ---"))
            lead = (*pending, cst.EmptyLine(), marker, *module.header, *stmts[0].leading_lines)
            stmts[0] = stmts[0].with_changes(leading_lines=lead)
            items.extend((cell, s) for s in stmts)
            pending = list(module.footer)
    if not found_args:
        changes.append(Change(items[-1][0], "no TrainingArguments/SFTConfig call found: set "
                                            "ddp_find_unused_parameters=False and the precision by hand", True))

    future = [s for _, s in items if _is_future_import(s)]
    items = [(c, s) for c, s in items if not _is_future_import(s)]
    start = next(i for i, (_, s) in enumerate(items) if not is_setup(s))
    first_cell, try_cell, last_cell = items[0][0], items[start][0], items[-1][0]
    changes.insert(0, Change(first_cell, "rank block added above the notebook code: LOCAL_RANK/RANK/WORLD_SIZE "
                                         "from the environment, set_device on CUDA, init_process_group when "
                                         "WORLD_SIZE > 1"))
    changes.append(Change(try_cell, f"cells {try_cell}-{last_cell} wrapped in try/finally: barrier after "
                                    "success, destroy_process_group() always"))

    done = cst.parse_statement("training_ok = True  # reached only when every cell above ran\n")
    done = done.with_changes(leading_lines=(*pending, cst.EmptyLine()))
    try_stmt = cst.parse_statement(TRY_TEMPLATE)
    try_stmt = try_stmt.with_changes(body=try_stmt.body.with_changes(body=[s for _, s in items[start:]] + [done]))
    flag = cst.parse_statement("training_ok = False\n").with_changes(leading_lines=(cst.EmptyLine(),))
    body = cst.Module(body=[*(s for _, s in items[:start]), flag, try_stmt]).visit(_BlankLines()).code
    head = DOCSTRING.format(notebook=Path(path).name, script=script_name, precision=precision,
                            dropped=_dropped_note(dropped), raw="r" if any("\\" in d for d in dropped) else "")
    if future:
        head += "\n" + "".join(cst.Module(body=[]).code_for_node(s).lstrip("\n") for s in future)
    source = f"{head}\n{RANK_BLOCK}{body}"
    try:
        ast.parse(source)
    except SyntaxError as e:  # a bug in kit, not in the notebook
        raise KitError(f"kit convert produced invalid Python (line {e.lineno}: {e.msg}); please report it "
                       "with the notebook") from None
    changes.sort(key=lambda c: c.cell)  # stable: keeps each cell's changes in the order they were made
    return Conversion(source, changes)


def _dropped_note(dropped: list[str]) -> str:
    """The docstring's list of the shell/magic lines kit dropped, so the user can run them first."""
    shell = [d.replace(TRIPLE, "'" * 3) for d in dropped if not d.startswith("%%")]
    if not shell:
        return ""
    shown = "".join(f"    {d}\n" for d in shell[:12]) + ("    ...\n" if len(shell) > 12 else "")
    return f"kit dropped these shell and magic lines; run what you need before launching:\n\n{shown}\n"


class _BlankLines(cst.CSTTransformer):
    """Blank lines without indentation: moving code into the try block must not add trailing spaces."""

    def leave_EmptyLine(self, original, updated):
        if updated.comment:
            return updated
        return updated.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))


def _is_future_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in stmt.body)


def format_changes(conversion: Conversion, notebook: str, script: str) -> str:
    """The change list printed by `kit convert`: a summary line, then one `cell N: …` line each."""
    reviews = sum(c.review for c in conversion.changes)
    lines = [f"kit convert: {notebook} -> {script}: {len(conversion.changes)} changes, {reviews} to review"]
    lines += [f"  {c}" for c in conversion.changes]
    if reviews:
        lines.append(f"Search {script} for '# kit: REVIEW' before running it.")
    return "\n".join(lines)
