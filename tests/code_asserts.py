"""Assert on generated code by its structure (calls, their arguments, assignments, what rank 0 alone runs,
line order) and on `kit convert`'s changes by cell, review flag and short key fragments — not by whole
lines of text, so a reworded comment or message changes only tests/test_golden_output.py."""

from __future__ import annotations

import ast


def _name(node: ast.AST) -> str:
    return ast.unparse(node)


def _matches(name: str, func: str) -> bool:
    return name == func or name.endswith("." + func)


def calls(source: str, func: str) -> list[dict]:
    """Every call to `func` (`SFTConfig`, or the tail of a dotted name: `init_process_group`), in source
    order, each as {0: first positional argument's source, …, keyword: its value's source, "**": a
    `**mapping`'s source, "line": n}."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _matches(_name(node.func), func):
            args: dict = {i: ast.unparse(a) for i, a in enumerate(node.args)}
            args.update({k.arg or "**": ast.unparse(k.value) for k in node.keywords})
            args["line"] = node.lineno
            found.append(args)
    return sorted(found, key=lambda a: a["line"])


def call(source: str, func: str) -> dict:
    """The first call to `func` (see `calls`); fails the test when there is none."""
    found = calls(source, func)
    assert found, f"no call to {func}"
    return found[0]


def line_of(source: str, func: str, holding: str = "") -> int:
    """The line of the first call to `func` whose code holds `holding`: for asserting what runs before what."""
    found = sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                   and _matches(_name(node.func), func) and holding in ast.unparse(node))
    assert found, f"no call to {func} holding {holding!r}"
    return found[0]


def assigns(source: str) -> list[tuple[str, str]]:
    """Every `target = value` (and augmented/annotated assignment) as (target source, value source), in order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            found += [(ast.unparse(t), ast.unparse(node.value), node.lineno) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            found.append((ast.unparse(node.target), ast.unparse(node.value), node.lineno))
    return [(t, v) for t, v, _ in sorted(found, key=lambda f: f[2])]


def guarded(source: str) -> list[str]:
    """The source of every statement directly under an `if is_main:` block (rank 0 alone runs them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "is_main":
            found += [ast.unparse(s) for s in node.body]
    return found


def statements(source: str) -> list[str]:
    """The source of every simple statement (no blocks), normalised by ast.unparse, in order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            found.append((node.lineno, ast.unparse(node)))
    return [s for _, s in sorted(found)]


def changed(conversion, cell: int | None, *fragments: str, review: bool | None = None) -> list:
    """The changes at `cell` (any cell for None) whose text holds every fragment (and whose review flag is
    `review`, unless None)."""
    return [c for c in conversion.changes if (cell is None or c.cell == cell)
            and (review is None or c.review == review) and all(f in c.text for f in fragments)]


def words_in(text: str, *words: str) -> bool:
    """`words` appear one after another, separated by whitespace, somewhere in `text` (a command line
    checked word by word)."""
    have = text.split()
    return any(have[i:i + len(words)] == list(words) for i in range(len(have) - len(words) + 1))


def squeeze(code: str) -> str:
    """`code` without its spaces and line breaks: for comparing a fragment of generated code, whatever its layout."""
    return "".join(code.split())


def ifexp(code: str) -> tuple[str, str, str]:
    """`a if test else b` as (a, test, b), each as source."""
    node = ast.parse(code, mode="eval").body
    assert isinstance(node, ast.IfExp), code
    return ast.unparse(node.body), ast.unparse(node.test), ast.unparse(node.orelse)


def mapping(code: str) -> dict[str, str]:
    """`{'k': v, …}` or `dict(k=v, …)` as {k: v's source}."""
    node = ast.parse(code, mode="eval").body
    if isinstance(node, ast.Dict):
        return {ast.literal_eval(k): ast.unparse(v) for k, v in zip(node.keys, node.values)}
    assert isinstance(node, ast.Call) and ast.unparse(node.func) == "dict" and not node.args, code
    return {k.arg: ast.unparse(k.value) for k in node.keywords}
