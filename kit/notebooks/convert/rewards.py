"""A GRPO notebook's own reward functions, checked when it is converted.

TRL calls every reward function by keyword with `prompts`, `completions`, `completion_ids`,
`trainer_state`, `log_extra`, `log_metric` and each dataset column, so one without `**kwargs` (or
with a positional-only parameter) fails at the first step, after the model has loaded, on every
rank. The rule is kit's own for `trainer: grpo` (`kit.train.rewards.signature_problem`), applied
here to the notebook's `def`s and lambdas; a name in `reward_funcs` that no cell defines or imports
is a NameError at the same place. Either is refused at conversion: one line naming the cell.
"""

from __future__ import annotations

import ast
import builtins

from kit.train.rewards import signature_problem

Problem = tuple[int, int, str]  # (cell, line, why)


def reward_functions(trees: list[tuple[int, ast.Module]]) -> list[tuple[int, ast.Call, ast.expr]]:
    """(cell, the call, one element) for each entry of a `reward_funcs=` keyword in the notebook."""
    out = []
    for cell, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for k in node.keywords:
                    if k.arg == "reward_funcs":
                        elts = k.value.elts if isinstance(k.value, (ast.List, ast.Tuple)) else [k.value]
                        out += [(cell, node, e) for e in elts]
    return out


def defined_cells(trees: list[tuple[int, ast.Module]]) -> dict[str, tuple[int, ast.FunctionDef]]:
    """Function name -> (cell, its last `def`): the one a later call gets."""
    out: dict[str, tuple[int, ast.FunctionDef]] = {}
    for cell, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = (cell, node)
    return out


def reward_problem(trees: list[tuple[int, ast.Module]]) -> Problem | None:
    """The first reward function TRL could not call, or a name no cell binds; None when all are fine."""
    defs = defined_cells(trees)
    bound = _bound_names(trees)
    for cell, call, entry in reward_functions(trees):
        trainer = ast.unparse(call.func).rsplit(".", 1)[-1]
        if isinstance(entry, ast.Name) and entry.id in defs:
            where, fn = defs[entry.id]
            problem = _problem(fn.args)
            if problem:
                return (where, fn.lineno, f"the reward function `{entry.id}` (given to {trainer} in cell {cell}) "
                                          f"cannot be called by TRL: {problem}")
        elif isinstance(entry, ast.Name) and entry.id not in bound:
            return (cell, call.lineno, f"{trainer}'s reward_funcs names `{entry.id}`, which no cell defines or "
                                       "imports: the script would stop there with a NameError, after the model loads")
        elif isinstance(entry, ast.Lambda) and (problem := _problem(entry.args)):
            return (cell, entry.lineno, f"a lambda in {trainer}'s reward_funcs cannot be called by TRL: {problem}")
    return None


def _problem(args: ast.arguments) -> str | None:
    """`signature_problem` for a parameter list read from the notebook (defaults and annotations left
    out: they may name what only the notebook's run defines)."""
    plain = ast.arguments(
        posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs], args=[ast.arg(a.arg) for a in args.args],
        vararg=ast.arg(args.vararg.arg) if args.vararg else None, kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs],
        kw_defaults=[None if d is None else ast.Constant(None) for d in args.kw_defaults],
        kwarg=ast.arg(args.kwarg.arg) if args.kwarg else None, defaults=[ast.Constant(None) for _ in args.defaults])
    namespace: dict = {}
    exec(f"def reward({ast.unparse(plain)}): pass", namespace)  # parameters only: no notebook code runs
    return signature_problem(namespace["reward"])


def _bound_names(trees: list[tuple[int, ast.Module]]) -> set[str]:
    names = set(dir(builtins))
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any(a.name == "*" for a in node.names):
                    return names | {"*"} | _everything(trees)  # a star import may bind anything
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _everything(trees: list[tuple[int, ast.Module]]) -> set[str]:
    return {n.id for _, t in trees for n in ast.walk(t) if isinstance(n, ast.Name)}
