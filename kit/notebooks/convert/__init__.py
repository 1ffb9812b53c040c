"""`kit convert`: turn a training notebook into a rank-aware script for torchrun.

The code cells are kept in order, magics handled (`kit.notebooks.convert.cells`), refusals checked
(`kit.notebooks.convert.refusals`); then, with libcst so comments and layout survive:

- a rank block goes on top: LOCAL_RANK/RANK/WORLD_SIZE, `set_device`, `init_process_group`, the
  Hub token check when the notebook talks to the Hub (before any work), seeds for unseeded
  `random`/numpy data prep, and `wait_for_all()`;
- setup that torchrun and the Trainer do themselves is removed, with the reason
  (`kit.notebooks.convert.setup`); big data literals stay out of the trees (`kit.notebooks.convert.literals`);
- calls are fixed where the fix is mechanical (`kit.notebooks.convert.calls`): devices follow the rank,
  platform secrets become environment lookups, logins go, TrainingArguments get what DDP needs,
  unseeded shuffles and splits get the notebook's seed;
- who runs what follows one rule (`kit.notebooks.convert.ranks`): every rank up to the last statement that
  needs them all, with side effects on rank 0 and barriers after writes that are read back;
  rank 0 alone after it;
- all of it runs inside `try/finally`, so teardown happens even when an import fails.

`--dry-run` (`kit.notebooks.convert.dryrun`) swaps Hub models and data for kit's tiny local ones.
Cell numbers are 1-based positions among all of the notebook's cells, markdown included.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kit.notebooks.convert.calls import CellRewriter
from kit.notebooks.convert.kinds import uses_every_parameter
from kit.notebooks.convert.cells import is_comment_only, parse_cell, read_cells, read_code_cells, without_launch
from kit.notebooks.convert.dryrun import DryRun
from kit.notebooks.convert.facts import Facts, gather, rebound_modules
from kit.notebooks.convert.ports import Ports
from kit.notebooks.convert.ranks import (Guard, barrier_statement, rank0_block, shown_result, side_effect,
                                         split_statements, writes_file)
from kit.notebooks.convert.refusals import check_convertible, check_launched, check_written_script
from kit.notebooks.convert.rewards import defined_cells
from kit.machine.command import launch_command, shell_word
from kit.notebooks.convert.script import (DOCSTRING, DRY_NOTE, OWN_TOKEN, RANK_BLOCK, TOKEN_CHECK, TRY_TEMPLATE,
                                          BlankLines, docstring, dropped_note, is_future_import, merge_main_blocks,
                                          split_dropped, training_end)
from kit.notebooks.convert import literal_secrets, literals
from kit.notebooks.convert.shell_after import port_after
from kit.notebooks.convert.syntax import Change, call_name, clip, code, comments
from kit.notebooks.convert.vllm_off import HELPERS as VLLM_HELPERS, VllmOff, doc_note
from kit.errors import KitError, UsageError

PRECISION_CHOICES = ("auto", "fp16", "bf16", "fp32")
RANDOM_CALLS = {"shuffle", "sample", "choice", "choices", "randint", "random", "permutation", "rand", "randn"}

__all__ = ["Change", "Conversion", "PRECISION_CHOICES", "convert_notebook", "format_changes"]


@dataclass
class Conversion:
    """The script's text and every change made, in cell order."""

    source: str
    changes: list[Change] = field(default_factory=list)


def _code_cells(path, changes: list[Change]):
    """Parsed code cells; a `%%writefile` script the notebook launches takes the launch cell's place."""
    cells = read_cells(path, changes)
    parsed = [(cell, *parse_cell(src, cell), is_comment_only(src)) for cell, src in cells.code]
    facts = gather([(c, t) for c, t, _, _ in parsed])
    if facts.last_train is not None:
        return parsed, facts, cells.dropped
    launched = {script: (cell, line) for cell, line, script in cells.launches}
    for name, (wcell, body) in cells.written.items():
        if not name.endswith(".py"):
            continue
        tree, module = parse_cell(body, wcell)
        if gather([(wcell, tree)]).last_train is None:
            if name in launched:
                check_written_script(name, wcell, launched[name], tree)
            continue
        at = launched.get(name, (wcell, ""))[0]
        how = f"cell {at} launches it with `{launched[name][1][:50]}`" if name in launched else "nothing launches it"
        changes.append(Change(wcell, f"the notebook writes its training script {name} ({how}): kit converted "
                                     f"{name}'s code in its place, so this one script is the whole job"))
        before = [p for p in parsed if p[0] < at]
        after = [p for p in parsed if p[0] >= at]
        parsed = [*before, (wcell, tree, module, False), *after]
        dropped = without_launch(cells.dropped, launched.get(name))
        if len(dropped) < len(cells.dropped):
            changes.append(Change(at, f"`{clip(launched[name][1], 60)}` is replaced by this script: run the script "
                                      "instead (the command is at the top), not that line"))
        return parsed, gather([(c, t) for c, t, _, _ in parsed]), dropped
    check_launched(cells.launches, cells.written)  # no cell trains, nor a script the notebook wrote
    return parsed, facts, cells.dropped


def convert_notebook(path: str | Path, precision: str = "auto", script_name: str = "train_ddp.py",
                     keep_global_batch: bool = False, dry_run: bool = False, dry_run_model: Path | None = None,
                     dry_run_data: Path | None = None, dry_run_push: bool = False) -> Conversion:
    """Convert a notebook to a rank-aware script.

    Args:
        path: the .ipynb file.
        precision: "auto" keeps the notebook's fp16/bf16 (flagging a hard-coded bf16=True);
            "fp16", "bf16", "fp32" set both keywords on the TrainingArguments-like call.
        script_name: the output's file name, quoted in the script's docstring.
        keep_global_batch: divide gradient accumulation by the number of GPUs.
        dry_run: swap Hub models and datasets for kit's tiny local ones (see `kit.notebooks.convert.dryrun`).
        dry_run_push: let the dry run's Hub writes through (to a test Hub), instead of skipping them.

    Raises:
        UsageError: unreadable notebook, a cell that is not Python, something that cannot run
            under torchrun, or no training code.
    """
    if precision not in PRECISION_CHOICES:
        raise UsageError(f"--precision {precision!r}: choose one of {', '.join(PRECISION_CHOICES)}")
    with literals.kept() as table:  # big data literals stay out of the trees (kit.notebooks.convert.literals)
        conversion = _convert(path, precision, script_name, keep_global_batch, dry_run, dry_run_model, dry_run_data,
                              dry_run_push)
        source = table.restore(conversion.source)
        literal_secrets.refuse(source, read_code_cells(path), parsed=conversion.source)  # a key never lands in it
        return Conversion(source, [Change(c.cell, table.shown(c.text), c.review) for c in conversion.changes])


def _convert(path, precision, script_name, keep_global_batch, dry_run, dry_run_model, dry_run_data,
             dry_run_push) -> Conversion:
    """`convert_notebook`, with big literals as placeholders in the script it returns."""
    changes: list[Change] = []
    parsed, facts, dropped = _code_cells(path, changes)
    trees = [(c, t) for c, t, _, _ in parsed]
    check_convertible(trees, facts)
    parsed, dropped = port_after(path, parsed, dropped, training_end(trees, facts), changes, facts.uses_hub)
    trees = [(c, t) for c, t, _, _ in parsed]
    facts = gather(trees)
    dropped_before, dropped_after = split_dropped(dropped, trees, facts, changes)
    peft = any(isinstance(n, (ast.Import, ast.ImportFrom)) and "peft" in ast.unparse(n) or
               (isinstance(n, ast.Name) and n.id in ("peft_config", "LoraConfig", "get_peft_model"))
               or (isinstance(n, ast.Attribute) and n.attr == "get_peft_model") for _, t in trees for n in ast.walk(t))
    called = {ast.unparse(n.func) for _, t in trees for n in ast.walk(t) if isinstance(n, ast.Call)}
    rewriter = CellRewriter(precision, facts.seed, keep_global_batch, peft=peft, secret_names=facts.secret_names,
                            rebound=rebound_modules(trees), accelerators=frozenset(
                                t.id for _, tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                and isinstance(n.value, ast.Call) and ast.unparse(n.value.func).endswith("Accelerator")
                                for t in n.targets if isinstance(t, ast.Name)),
                            dense=uses_every_parameter(called, peft), true_names=frozenset(
                                t.id for _, tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                and isinstance(n.value, ast.Constant) and n.value.value is True
                                for t in n.targets if isinstance(t, ast.Name)))
    ports = Ports([t for _, t in trees])
    vllm = VllmOff([t for _, t in trees])
    dry = None
    if dry_run:
        extra = {k: v for k, v in (("model", dry_run_model), ("data", dry_run_data)) if v is not None}
        dry = DryRun([t for _, t in trees], push=dry_run_push, reward_cells={
            name: cell for name, (cell, _) in defined_cells(trees).items()}, **extra)

    items, pending, found_args = [], [], False
    split_at = None
    for cell, _tree, module, comment_only in parsed:
        stmts = _rewrite_cell(cell, module, facts, rewriter, dry, changes, ports, vllm)
        if stmts and split_at is None and any(facts.after_training((cell, i)) for i in range(len(module.body))):
            split_at = cell
        found_args |= rewriter.found_training_args
        marker = cst.EmptyLine(comment=cst.Comment(f"# --- notebook cell {cell} ---"))
        if stmts:
            lead = (*pending, cst.EmptyLine(), marker, *module.header, *stmts[0].leading_lines)
            stmts[0] = stmts[0].with_changes(leading_lines=lead)
            items.extend((cell, s) for s in stmts)
            pending = list(module.footer)
        elif comment_only:  # a note the user left in a cell of its own
            pending = [*pending, cst.EmptyLine(), marker, *module.header, *module.footer]
    if not found_args:
        changes.append(Change(items[-1][0], "no TrainingArguments/SFTConfig call found: set "
                                            "ddp_find_unused_parameters=False and the precision by hand", True))
    if split_at is not None:
        changes.append(Change(split_at, "from here on rank 0 alone runs the notebook (everything after the last "
                                        "train/evaluate call): the other ranks leave the process group first, so "
                                        "saves, pushes, exports, generation and prints run exactly once"))

    dropped_before = [*dropped_before, *(f"!{c}" for c in dict.fromkeys(rewriter.installs))]
    future = [s for _, s in items if is_future_import(s)]
    items = [(c, s) for c, s in items if not is_future_import(s)]
    first_cell, last_cell = items[0][0], items[-1][0]
    changes.insert(0, Change(first_cell, "rank block added above the notebook code: LOCAL_RANK/RANK/WORLD_SIZE "
                                         "from the environment, set_device on CUDA, init_process_group when "
                                         "WORLD_SIZE > 1"))
    changes.append(Change(first_cell, f"cells {first_cell}-{last_cell} wrapped in try/finally, imports included: "
                                      "barrier after success, destroy_process_group() always"))
    imports, seeds = _rank_block_parts(trees, facts, rewriter, dry, changes, first_cell)
    imports += "".join(f"{line}  # kit: port\n" for line in ports.imports)
    if vllm.helpers:
        imports += "\n\n" + VLLM_HELPERS

    done = cst.parse_statement("training_ok = True  # reached only when every cell above ran\n")
    done = done.with_changes(leading_lines=(*pending, cst.EmptyLine()))
    try_stmt = cst.parse_statement(TRY_TEMPLATE)
    try_stmt = try_stmt.with_changes(body=try_stmt.body.with_changes(body=[s for _, s in items] + [done]))
    flag = cst.parse_statement("training_ok = False\n")
    body = cst.Module(body=[flag, try_stmt]).visit(BlankLines()).code
    flags = "".join([f" --precision {precision}" if precision != "auto" else "",
                     " --keep-global-batch" if keep_global_batch else "", " --dry-run" if dry_run else ""])
    # shell words in the commands shown (launch_command quotes the script itself)
    notebook, script = shell_word(Path(path).name, path=True), shell_word(script_name, path=True)
    head = docstring(DOCSTRING.format(notebook=notebook, script=script, flags=flags,
                                      multi=launch_command(2, script=script_name),
                                      single=launch_command(1, script=script_name),
                                      dry=DRY_NOTE if dry_run else "",
                                      dropped=doc_note(vllm.found, vllm.helpers)
                                      + dropped_note(dropped_before, dropped_after)))
    if future:
        head += "\n" + "".join(cst.Module(body=[]).code_for_node(s).lstrip("\n") for s in future)
    rank_block = RANK_BLOCK.format(imports=imports, seeds=seeds,
                                   token=OWN_TOKEN if rewriter.own_token else TOKEN_CHECK if facts.uses_hub and (dry_run_push or not dry_run) else "")
    source = f"{head}\n{rank_block}{body}"
    try:  # compile, not just parse: `await` or `return` where Python refuses them fails here too
        compile(source, script_name, "exec", dont_inherit=True)
    except SyntaxError as e:  # a bug in kit, not in the notebook
        raise KitError(f"kit convert produced invalid Python (line {e.lineno}: {e.msg}); please report it "
                       "with the notebook") from None
    changes.sort(key=lambda c: c.cell)  # stable: keeps each cell's changes in the order they were made
    seen = set()
    changes = [c for c in changes if (c.cell, c.text, c.review) not in seen and not seen.add((c.cell, c.text, c.review))]
    return Conversion(source, changes)


def _rewrite_cell(cell: int, module: cst.Module, facts: Facts, rewriter: CellRewriter, dry: DryRun | None,
                  changes: list[Change], ports: Ports, vllm: VllmOff) -> list[cst.BaseStatement]:
    """One cell's statements, rewritten and guarded by the rule in `kit.notebooks.convert.ranks`."""
    out: list[cst.BaseStatement] = []
    post: list[cst.BaseStatement] = []
    guarded: list[str] = []
    barrier_due = barrier_said = False
    rewriter.found_training_args = False
    for i, stmt in enumerate(module.body):
        ports.notes = []
        stmt = stmt.visit(ports)  # old library APIs first: the rules below read the new spellings
        if not isinstance(stmt, cst.BaseStatement):
            changes.extend(Change(cell, f"port: {t}", r) for r, t in ports.notes)
            continue
        vllm.notes = []
        stmt = stmt.visit(vllm)  # vLLM out, transformers generation in (kit.notebooks.convert.vllm_off)
        rewriter.notes = []
        rewriter.after_training = facts.after_training((cell, i))
        new = stmt.visit(rewriter)
        notes = [(r, f"port: {t}") for r, t in ports.notes] + vllm.notes + list(rewriter.notes)
        if dry is not None and isinstance(new, cst.CSTNode):
            dry.notes, dry.cell = [], cell
            new = new.visit(dry)
            notes += [(False, f"dry run: {n}") for n in dry.notes]
        notes = list(dict.fromkeys(notes))  # one construct used twice on a line: one note, one REVIEW line
        changes.extend(Change(cell, t, r) for r, t in notes)
        if not isinstance(new, cst.BaseStatement):
            continue  # removed (a platform import, a login, drive.mount)
        lines = [line for r, t in notes if r for line in comments(t, f"kit: REVIEW (cell {cell}): ")]
        if lines:
            new = new.with_changes(leading_lines=(*new.leading_lines, *lines))
        if i == len(module.body) - 1 and (shown := shown_result(new, rewriter.after_training)) is not None:
            changes.append(Change(cell, f"the cell's last line `{clip(code(new).strip(), 50)}` → print(...): "
                                        "the notebook showed its value, a script shows nothing"))
            new = shown
        if facts.after_training((cell, i)):
            post.append(new)
            continue
        whole = side_effect(new, facts.trackers) is not None or writes_file(new)
        if barrier_due and not whole:
            out.append(barrier_statement())
            barrier_due = False
        guard = Guard(lambda call: facts.is_collective(call_name(call), ast.parse(code(call), mode="eval").body),
                      barrier_funcs=facts.together, read_back=bool(facts.reads), trackers=facts.trackers)
        out.extend(guard.body([new]))
        if guard.barriers_in:
            changes.append(Change(cell, f"barrier (wait_for_all) inside {', '.join(dict.fromkeys(guard.barriers_in))}"
                                        ", right after rank 0's writes: every rank gets there together, and code "
                                        "after it may read back what was written"))
        guarded += guard.guarded
        if guard.hoisted:
            changes.append(Change(cell, f"{', '.join(dict.fromkeys(guard.hoisted))} taken out of the line that shows its result, "
                                        "into kit_result: every rank must make that call, and only rank 0 shows"))
        if guard.wrote and facts.read_after((cell, i)):
            barrier_due = True
            if not barrier_said:
                changes.append(Change(cell, "barrier (wait_for_all) after rank 0's writes here: later code reads "
                                            "files or Hub repos back, so the other ranks wait until they exist"))
                barrier_said = True
    if barrier_due:
        out.append(barrier_statement())
    if guarded:
        changes.append(Change(cell, f"under `if is_main:`: {', '.join(dict.fromkeys(guarded))}: rank 0 alone "
                                    "saves, pushes, exports, generates, logs and prints"))
    out = merge_main_blocks(out)
    if post:
        if _first_post_cell(facts) == cell:  # the first statement after the last train/evaluate
            out.extend(split_statements())
        out.extend(rank0_block(post))
    return out


def _first_post_cell(facts: Facts) -> int | None:
    return next((w[0] for w, _ in facts.statements if facts.after_training(w)), None)


def _rank_block_parts(trees, facts: Facts, rewriter: CellRewriter, dry: DryRun | None, changes: list[Change],
                      first_cell: int) -> tuple[str, str]:
    """(extra imports, seeding lines) for the rank block."""
    imports, seeds = [], []
    if facts.uses_hub or rewriter.needs_hub_import:
        imports.append("import huggingface_hub")
    if dry is not None:
        imports.append(dry.setup().rstrip("\n"))
    # `numpy.random.rand()` and `np.random.rand()` alike
    funcs = [re.sub(r"^numpy\.", "np.", ast.unparse(n.func)) for _, t in trees for n in ast.walk(t)
             if isinstance(n, ast.Call)]
    seed_note = f"the notebook's seed, from {facts.seed_from}" if facts.seed_from else "kit's choice: the notebook sets none"
    for module, alias, prefix in (("random", "random", "random."), ("numpy", "np", "np.random.")):
        used = [f for f in funcs if f.startswith(prefix) and f.rsplit(".", 1)[-1] in RANDOM_CALLS]
        if used and f"{prefix}seed" not in funcs:
            imports.append(f"import {module}" + (f" as {alias}" if alias != module else ""))
            seeds.append(f"{prefix}seed({facts.seed})  # kit: {', '.join(dict.fromkeys(used))}() are unseeded: "
                         "the same on every rank")
            changes.append(Change(first_cell, f"{prefix}seed({facts.seed}) in the rank block ({seed_note}): "
                                              f"{', '.join(dict.fromkeys(used))}() would differ between ranks"))
    return "".join(f"{i}\n" for i in imports), "".join(f"{s}\n" for s in seeds)


def format_changes(conversion: Conversion, notebook: str, script: str) -> str:
    """The change list printed by `kit convert`: a summary line, then one `cell N: …` line each."""
    reviews = sum(c.review for c in conversion.changes)
    lines = [f"kit convert: {notebook} -> {script}: {len(conversion.changes)} changes, {reviews} to review"]
    lines += [f"  {c}" for c in conversion.changes]
    if reviews:
        lines.append(f"Search {script} for '# kit: REVIEW' before running it.")
    return "\n".join(lines)
