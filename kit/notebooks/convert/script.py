"""The fixed parts of a converted script (its docstring, the rank block, the try/finally) and the
libcst helpers that lay the converted statements into them."""

from __future__ import annotations

import ast
import warnings

import libcst as cst

from kit.redaction import redact
from kit.notebooks.convert.cells import is_install
from kit.notebooks.convert.syntax import Change

TRIPLE = '"' * 3  # would end the script's docstring early

DOCSTRING = '''\
Rank-aware training script made by `kit convert` from {notebook}.

One process per GPU on this machine (2 for Kaggle's T4 x2; use your GPU count):

    {multi}

or one process, on one GPU or the CPU:

    {single}

{dry}{dropped}Lines marked `# kit:` were changed by kit; `# kit: REVIEW` marks what a person should check.
Every rank runs the notebook's code up to its last train/evaluate call, with saves, pushes, prints and
other side effects on rank 0 alone; after it, the other ranks leave and rank 0 runs the rest alone.
Made again with: kit convert {notebook} -o {script} --force{flags}
'''

DRY_NOTE = '''\
DRY RUN: Hub models and datasets, and data files that are not on this machine, are swapped for kit's
tiny local stand-ins (`kit_dry_run`, decided at run time on the values the notebook passes), training
stops after a few steps, 4/8-bit loading, flash attention, GPU-only queries, 8-bit optimizers and
trackers are off, and nothing is written to the Hub (pushes print that they were skipped, so code
reading the notebook's own repo back fails there). Convert again without --dry-run for the real run.

'''

RANK_BLOCK = '''\
# kit: rank block. torchrun starts one copy of this script per GPU and tells each its place in the
# environment; under plain `python` the defaults make it the only process (rank 0 of 1).
import os
import sys

import torch
import torch.distributed as dist
{imports}
# kit's own code below and at the end uses these names, which the notebook's code cannot rebind
# (`torch = None`, a variable called `dist` or `world_size`)
_kit_os, _kit_sys, _kit_torch, _kit_dist = os, sys, torch, dist
local_rank = int(os.environ.get("LOCAL_RANK", 0))
rank = int(os.environ.get("RANK", 0))
world_size = int(os.environ.get("WORLD_SIZE", 1))
is_main = rank == 0  # rank 0 alone saves, pushes and prints results
{token}if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)  # before any CUDA work, so no rank lands on cuda:0 by accident
    rank_device = local_rank
else:
    rank_device = "cpu"
if world_size > 1 and not dist.is_initialized():
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
{seeds}_kit_local_rank, _kit_world_size, _kit_is_main = local_rank, world_size, is_main


def wait_for_all():
    """Every rank waits here until all have arrived (nothing to wait for in one process)."""
    if _kit_dist.is_initialized():
        _kit_dist.barrier(device_ids=[_kit_local_rank] if _kit_torch.cuda.is_available() else None)

'''

TOKEN_CHECK = '''\
# kit: the notebook talks to the Hugging Face Hub: check for a token now, not after hours of training.
# huggingface_hub finds HF_TOKEN in the environment or a saved `hf auth login` token.
if huggingface_hub.get_token() is None:
    raise SystemExit("No Hugging Face token: set HF_TOKEN (from your Kaggle/Colab secret) or run "
                     "`hf auth login`, then launch again")
'''

OWN_TOKEN = '''\
def set_hub_token(token):
    """The notebook's login(token=...): its token for the Hub client in this process. login() itself
    would prompt when the token is empty, and nobody can answer a prompt under torchrun."""
    if token:
        _kit_os.environ["HF_TOKEN"] = token

'''

TRY_TEMPLATE = '''\
try:
    pass
finally:
    # Always tear down, so no rank exits with a live process group (that is how NCCL hangs start).
    # The barrier runs only after success: after a failure the other ranks may never arrive.
    if _kit_dist.is_initialized():
        if training_ok:
            wait_for_all()
        _kit_dist.destroy_process_group()
    if training_ok and _kit_world_size > 1 and not _kit_is_main:
        # Done (its group may have been left earlier, where rank 0's tail begins): end here, without
        # the interpreter's teardown, which can abort a rank whose process group is gone
        # (pytorch/pytorch#75097). Rank 0 exits normally, so an upload it left running still finishes.
        _kit_sys.stdout.flush()
        _kit_sys.stderr.flush()
        _kit_os._exit(0)
'''


def merge_main_blocks(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Adjacent `if is_main:` blocks become one."""
    out: list[cst.BaseStatement] = []
    for s in stmts:
        if out and is_main_if(s) and is_main_if(out[-1]) and not any(line.comment for line in s.leading_lines):
            prev = out[-1]
            out[-1] = prev.with_changes(body=prev.body.with_changes(body=[*prev.body.body, *s.body.body]))
        else:
            out.append(s)
    return out


def is_main_if(s) -> bool:
    return isinstance(s, cst.If) and isinstance(s.test, cst.Name) and s.test.value == "is_main" and s.orelse is None


def docstring(text: str) -> str:
    """`text` as the script's docstring: verbatim where Python allows, escaped where it must be.

    The text holds what the user typed (the notebook's and the script's names, shell lines): a `\\N`,
    three quotes, a carriage return or a trailing backslash there must not end the docstring early or
    break the script.
    """
    plain = all(c == "\n" or c.isprintable() for c in text)  # no control character to show as an escape
    for literal in (f"{TRIPLE}{text}{TRIPLE}", f"r{TRIPLE}{text}{TRIPLE}"):
        if plain and _reads_as(literal, text):
            return literal + "\n"
    return f"{TRIPLE}{''.join(map(_escape, text))}{TRIPLE}\n"


def _escape(char: str) -> str:
    """One character for a non-raw triple-quoted string: every quote escaped, so no run of three survives."""
    if char == "\\" or char == '"':
        return "\\" + char
    return char if char == "\n" or char.isprintable() else repr(char)[1:-1]


def _reads_as(literal: str, text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an invalid escape (`\\d`) warns now and fails in a later Python
        try:
            return ast.literal_eval(literal) == text
        except (SyntaxError, ValueError, Warning):
            return False


def training_end(trees, facts) -> tuple[int, int] | None:
    """(cell, line) where training's last collective statement ends; None without one."""
    if facts.last_collective is None:
        return None
    cell, index = facts.last_collective
    body = dict(trees)[cell].body
    return cell, body[index].end_lineno if index < len(body) else 0


def split_dropped(dropped: list[tuple[int, int, str]], trees, facts, changes: list[Change]) -> tuple[list, list]:
    """The dropped shell/magic lines, (before, after) the end of training, each said in the change list.

    Before: setup to run before torchrun (installs always count as setup). After: what the notebook
    ran on the finished model (`!zip -r out.zip out`, `!ls out`): flagged, to run once the script ends.
    """
    end = training_end(trees, facts)
    before = [d for d in dropped if end is None or d[:2] < end or is_install(d[2])]
    after = [d for d in dropped if d not in before]
    for group, words, review in ((before, "shell commands and IPython magics are not Python; run them before "
                                          "torchrun", False),
                                 (after, "they ran after training in the notebook: run them once the script has "
                                         "finished (or port them to subprocess.run on rank 0)", True)):
        for cell in dict.fromkeys(c for c, _, _ in group):
            shown = ", ".join(f"`{redact(t)[:50]}`" for c, _, t in group if c == cell)
            changes.append(Change(cell, f"dropped {shown}: {words}", review))
    return [t for _, _, t in before], [t for _, _, t in after]


def dropped_note(before: list[str], after: list[str] = ()) -> str:
    """The docstring's lists of the shell/magic lines kit dropped: to run first, and to run after."""
    out = ""
    for lines, when in ((before, "run what you need before launching"),
                        (after, "they ran after training in the notebook: run what you need once this script "
                                "has finished")):
        shell = [redact(d).replace(TRIPLE, "'" * 3) for d in lines if not d.startswith("%%")]  # `--token hf_…`
        if shell:
            shown = "".join(f"    {d}\n" for d in shell[:12]) + ("    ...\n" if len(shell) > 12 else "")
            out += f"kit dropped these shell and magic lines; {when}:\n\n{shown}\n"
    return out


class BlankLines(cst.CSTTransformer):
    """Blank lines without indentation: moving code into the try block must not add trailing spaces."""

    def leave_EmptyLine(self, original, updated):
        if updated.comment:
            return updated
        return updated.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))


def is_future_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in stmt.body)
