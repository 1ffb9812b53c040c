"""Who runs which statement: the rule that makes the whole script a correct DDP program.

The rule, in one sentence: **after the last statement that needs every rank (a Trainer's
train/evaluate/predict, directly or through a function the notebook defines) the process group
is torn down and rank 0 alone runs everything that follows, whatever it calls; before that,
every rank runs the code, except known side effects — saves, pushes, exports, file writes,
prints, plots, trackers, bare generation — which go under `if is_main:` at any nesting depth,
with a barrier after each top-level statement that wrote something that later code reads.**

Tearing the group down before rank 0's tail (instead of making the others wait at a barrier)
means an hour of GGUF export or evaluation cannot time out a waiting rank, the other GPUs are
freed, and a vLLM engine started there finds no process group to join.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst

from kit.notebooks.convert.facts import TRACKERS, rank_dependent
from kit.notebooks.convert.syntax import call_name, calls_in, code, comments, short_name

WRITE_METHODS = {"save_model", "save_pretrained", "save_pretrained_merged", "save_pretrained_gguf", "save_lora",
                 "push_to_hub", "push_to_hub_merged", "push_to_hub_gguf", "to_json", "to_csv", "to_parquet",
                 "save_to_disk", "savefig", "upload_file", "upload_folder", "create_repo", "write", "writelines",
                 "save_state", "create_model_card"}
WRITE_FUNCTIONS = {"torch.save", "json.dump", "pickle.dump", "np.save", "shutil.copy", "shutil.copy2", "shutil.copyfile",
                   "shutil.copytree", "shutil.make_archive", "shutil.move",
                   # deletes too: every rank removing one folder races (FileNotFoundError), and may remove
                   # what rank 0 is still writing
                   "shutil.rmtree", "os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace"}
SHOW_FUNCTIONS = {"print", "pprint", "pprint.pprint", "display"}
SHOW_METHODS = {"show", "print_trainable_parameters"}
# A cell's last expression is shown by the notebook; after training these become print(...) on rank 0.
SHOWN_RESULTS = {"compute", "batch_decode", "decode", "evaluate", "predict", "head", "describe", "to_pandas"}
# Calls made for their effect (None, or the object itself, which a notebook line is not run to show).
EFFECT_METHODS = {"empty_cache", "set_format", "set_seed", "manual_seed", "seed", "collect", "finish", "close", "sleep",
                  "append", "extend", "update", "clear", "remove", "to", "cuda", "cpu", "eval", "train", "half",
                  "float", "set_device", "synchronize", "reset_peak_memory_stats", "set_verbosity",
                  "disable_progress_bar", "enable_progress_bar", "filterwarnings", "mkdir", "makedirs", "chdir"}
EFFECT_MODULES = ("os.", "gc.", "warnings.", "logging.", "shutil.", "time.", "random.", "torch.cuda.", "subprocess.")
PLOT_MODULES = ("plt.", "sns.", "matplotlib.", "seaborn.", "px.")
GENERATION = {"generate", "fast_generate"}
WRITE_MODES = ("w", "a", "x")

SPLIT = '''\
# kit: training is over on every rank. From here rank 0 alone runs the rest of the notebook:
# the others leave the process group now, so a long export or evaluation cannot time them out.
if _kit_dist.is_initialized():
    wait_for_all()
    _kit_dist.destroy_process_group()
'''
BARRIER = "wait_for_all()  # kit: later code reads what rank 0 wrote above; the other ranks wait for it\n"


def _value_call(small: cst.BaseSmallStatement) -> cst.Call | None:
    value = getattr(small, "value", None) if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) else None
    return value if isinstance(value, cst.Call) else None


def side_effect(stmt: cst.BaseStatement, trackers: tuple[str, ...] = TRACKERS) -> str | None:
    """'write' or 'show' for a line rank 0 alone should run, else None. `trackers`: the prefixes of
    tracker calls (`wandb.`, and `run.` where the notebook set `run = wandb.init()`)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    kinds = set()
    for small in stmt.body:
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
            [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else []
        if any(code(t).startswith(trackers) for t in targets):  # `wandb.run.summary["acc"] = acc`
            kinds.add("show")
        call = _value_call(small)
        if call is None:
            continue
        name, short = call_name(call), short_name(call)
        is_expr = isinstance(small, cst.Expr) or (
            isinstance(small, cst.Assign) and all(isinstance(t.target, cst.Name) and t.target.value == "_"
                                                  for t in small.targets))
        if (short in WRITE_METHODS and isinstance(call.func, cst.Attribute)) or name in WRITE_FUNCTIONS:
            kinds.add("write")
        elif name.startswith(trackers):
            kinds.add("show")
        elif is_expr and (name in SHOW_FUNCTIONS or name.startswith(PLOT_MODULES) or
                          (short in SHOW_METHODS | GENERATION and isinstance(call.func, cst.Attribute))):
            kinds.add("show")
    return "write" if "write" in kinds else ("show" if kinds else None)


def writes_file(stmt: cst.BaseStatement) -> bool:
    """`with open(path, "w") as f:` — the whole block writes one file: rank 0's job."""
    if not isinstance(stmt, cst.With):
        return False
    for item in stmt.items:
        call = item.item
        if isinstance(call, cst.Call) and call_name(call) == "open" and len(call.args) > 1:
            mode = call.args[1].value
            if isinstance(mode, cst.SimpleString) and mode.evaluated_value.startswith(WRITE_MODES):
                return True
    return False


class Guard:
    """Puts rank-0 side effects under `if is_main:` inside one top-level statement, at any depth.

    A side effect whose arguments make a collective call (`print(trainer.evaluate())`) has that call
    hoisted out first, into `kit_result = trainer.evaluate()` that every rank runs: under `if is_main:`
    rank 0 would wait in evaluate()'s gather for ranks that never come (an NCCL hang).
    """

    def __init__(self, collective: Callable[[cst.Call], bool] = lambda call: False,
                 barrier_funcs: frozenset[str] = frozenset(), read_back: bool = False,
                 trackers: tuple[str, ...] = TRACKERS):
        self.guarded: list[str] = []  # what went under `if is_main:`, for the change list
        self.hoisted: list[str] = []  # collective calls taken out of a guarded line, for the change list
        self.wrote = False  # rank 0 wrote when the statement ran, and no barrier inside it waits for that
        self.collective = collective
        self.barrier_funcs = barrier_funcs  # the notebook's functions every rank calls together
        self.read_back = read_back  # the notebook reads files or Hub repos back somewhere
        self.barriers_in: list[str] = []  # where a barrier went inside the statement, for the change list
        self.trackers = trackers

    def body(self, stmts: Sequence[cst.BaseStatement], reach: str | None = "", live: bool = True,
             top: bool = True) -> list[cst.BaseStatement]:
        """`stmts` with their side effects under `if is_main:`.

        reach: where every rank arrives together (a function every rank calls, a loop at the top level):
            a barrier may go right after rank 0's writes there; None where a rank might not arrive.
        live: the block runs when the top-level statement does (not the body of a def or class).
        top: the top-level statement itself, whose barrier the caller places after it.
        """
        out: list[cst.BaseStatement] = []
        group: list[cst.BaseStatement] = []
        wrote = False

        def flush():
            nonlocal wrote
            if group:
                lead = group[0].leading_lines
                block = [group[0].with_changes(leading_lines=()), *group[1:]]
                out.append(cst.If(test=cst.Name("is_main"), body=cst.IndentedBlock(body=block), leading_lines=lead))
                group.clear()
                if wrote and not top and reach is not None and self.read_back:
                    out.append(barrier_statement())  # where the write happens, and every rank gets here
                    self.barriers_in.append(reach)
                elif wrote and live:
                    self.wrote = True
                wrote = False

        for stmt in stmts:
            kind = side_effect(stmt, self.trackers) or ("write" if writes_file(stmt) else None) or \
                _one_line_block(stmt, self.trackers)
            found = [c for c in calls_in(stmt) if self.collective(c)] if kind is not None else []
            if found and not isinstance(stmt, cst.SimpleStatementLine):
                kind = None  # a block around the collective: every rank runs it (and prints, twice at worst)
            elif found:
                flush()
                hoisted, stmt = self._hoist(stmt, found)
                out.extend(hoisted)
            if kind is not None:
                wrote |= kind == "write"
                self.guarded.extend(self._names(stmt))
                group.append(stmt)
                continue
            flush()
            out.append(self.compound(stmt, reach, live, top))
        flush()
        return out

    def compound(self, stmt: cst.BaseStatement, reach: str | None = "", live: bool = True,
                 top: bool = True) -> cst.BaseStatement:
        """Recurse into the blocks of if/for/while/with/try/def/class; other statements as they are."""
        if isinstance(stmt, cst.If) and _is_main_test(stmt):
            return stmt  # already guarded
        if not isinstance(stmt, (cst.If, cst.For, cst.While, cst.With, cst.FunctionDef, cst.ClassDef, cst.Try,
                                 cst.Else, cst.ExceptHandler, cst.Finally)):
            return stmt
        inner = reach
        if isinstance(stmt, cst.FunctionDef):
            # Inside a function every rank calls together, barriers go where its writes are; in a method
            # (a TrainerCallback's, which the Trainer calls) or a function called elsewhere, none can.
            name = stmt.name.value
            inner, live = (f"def {name}" if top and name in self.barrier_funcs else None), False
        elif isinstance(stmt, cst.ClassDef):
            inner, live = None, False
        elif isinstance(stmt, (cst.While, cst.ExceptHandler, cst.Finally)):
            inner = None  # a loop whose passes may differ between ranks; an exception one rank alone may see
        elif isinstance(stmt, cst.If) and rank_dependent(code(stmt.test)):
            inner = None  # `if trainer.is_world_process_zero():` — the other ranks never arrive
        elif top and inner is not None:
            inner = {cst.For: "the loop", cst.With: "the with block", cst.If: "the if block",
                     cst.Try: "the try block", cst.Else: "the block"}.get(type(stmt), "the block")
        changes = {}
        if isinstance(stmt.body, cst.IndentedBlock):
            changes["body"] = stmt.body.with_changes(body=self.body(stmt.body.body, inner, live, top=False))
        for part in ("orelse", "finalbody"):
            child = getattr(stmt, part, None)
            if child is not None:
                changes[part] = self.compound(child, None if part == "finalbody" else inner, live, top=False)
        if isinstance(stmt, cst.Try):
            changes["handlers"] = [self.compound(h, None, live, top=False) for h in stmt.handlers]
        return stmt.with_changes(**changes)

    def _hoist(self, stmt: cst.SimpleStatementLine, found: list[cst.Call]):
        """(`kit_result = <call>` for each outermost collective call, `stmt` reading kit_result instead)."""
        inner = {id(c) for outer in found for c in calls_in(outer) if c is not outer}
        outer = [c for c in found if id(c) not in inner]
        names = {id(c): "kit_result" if len(outer) == 1 else f"kit_result{i}" for i, c in enumerate(outer, 1)}

        class _Swap(cst.CSTTransformer):
            def leave_Call(self, original, updated):
                return cst.Name(names[id(original)]) if id(original) in names else updated

        hoisted = []
        for c in outer:
            line = cst.parse_statement(f"{names[id(c)]} = {code(c)}\n")
            self.hoisted.append(f"{call_name(c)}()")
            hoisted.append(line.with_changes(leading_lines=[] if hoisted else [
                *stmt.leading_lines, *comments(f"every rank runs {call_name(c)}() (it needs them all); rank 0 "
                                              "shows the result", "kit: ")]))
        return hoisted, stmt.with_changes(leading_lines=()).visit(_Swap())

    @staticmethod
    def _names(stmt: cst.BaseStatement) -> list[str]:
        if isinstance(stmt, cst.With):
            return ["open(…, 'w')"]
        body = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else getattr(stmt.body, "body", ())
        return [f"{call_name(c)}()" for s in body if (c := _value_call(s)) is not None and call_name(c)]


def _one_line_block(stmt: cst.BaseStatement, trackers: tuple[str, ...] = TRACKERS) -> str | None:
    """`if False: model.save_pretrained_merged(…)` on one line: guard the whole statement."""
    body = getattr(stmt, "body", None)
    if isinstance(stmt, (cst.If, cst.For, cst.While, cst.With)) and isinstance(body, cst.SimpleStatementSuite):
        return side_effect(cst.SimpleStatementLine(body=body.body), trackers)
    return None


def _is_main_test(stmt: cst.If) -> bool:
    return isinstance(stmt.test, cst.Name) and stmt.test.value == "is_main"


def rank0_block(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """A post-training cell, all of it under `if is_main:`. Its definitions too: a `def` evaluates
    its defaults and decorators, a `class` its bases, and those may name a value this block sets
    (`def generate(n=max_new_tokens)`), which a rank that skipped the block never had (NameError).
    No other rank needs them: the group is gone, rank 0 alone runs the rest."""
    if not stmts:
        return []
    lead = stmts[0].leading_lines
    block = [stmts[0].with_changes(leading_lines=()), *stmts[1:]]
    return [cst.If(test=cst.Name("is_main"), body=cst.IndentedBlock(body=block), leading_lines=lead)]


def shown_result(stmt: cst.BaseStatement, after_training: bool = False) -> cst.BaseStatement | None:
    """`metric.compute(...)` or `results` as a cell's last line, as `print(...)`: the notebook showed
    the value, a script shows nothing. None for anything else (a call run for its effect, a string,
    a line ending in `;`, which IPython does not show either).

    After training, where rank 0 runs alone, any other call's value is shown as IPython shows it,
    unless it is None: `if (shown := classifier(text)) is not None: print(shown)`.
    """
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return None
    value = stmt.body[0].value
    if isinstance(stmt.body[0].semicolon, cst.Semicolon):
        return None
    if isinstance(value, cst.Call):
        if not (isinstance(value.func, cst.Attribute) and value.func.attr.value in SHOWN_RESULTS):
            if not after_training or side_effect(stmt) is not None or short_name(value) in SHOW_METHODS | EFFECT_METHODS \
                    or call_name(value).startswith(EFFECT_MODULES):
                return None
            return cst.parse_statement(f"if (shown := {code(value)}) is not None:\n    print(shown)\n").with_changes(
                leading_lines=stmt.leading_lines)
    elif not isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.BinaryOperation)):
        return None
    return stmt.with_changes(body=[cst.Expr(cst.Call(func=cst.Name("print"), args=[cst.Arg(value)]))])


def split_statements() -> list[cst.BaseStatement]:
    return list(cst.parse_module(SPLIT).body)


def barrier_statement() -> cst.BaseStatement:
    return cst.parse_statement(BARRIER)
