"""Small libcst helpers the conversion rules share, and the `Change` record they produce.

libcst rather than `ast` for every rewrite, because it keeps the user's comments, strings and
layout: the script should still read like their notebook.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node


@dataclass
class Change:
    """One thing `kit convert` did or wants a human to check, at a notebook cell (1-based)."""

    cell: int
    text: str
    review: bool = False

    def __str__(self) -> str:
        return f"cell {self.cell}: {'REVIEW: ' if self.review else ''}{self.text}"


def call_name(call: cst.Call) -> str:
    """`trainer.save_model` for `trainer.save_model(...)`; '' for calls on expressions."""
    return get_full_name_for_node(call.func) or ""


def short_name(call: cst.Call) -> str:
    """The last part of the called name: `save_model` for `trainer.save_model(...)`."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return call_name(call).rsplit(".", 1)[-1]


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def normal(source: str) -> str:
    """Source text in one canonical spelling, so `"a"` and `'a'` compare equal."""
    try:
        return ast.unparse(ast.parse(source.strip(), mode="eval"))
    except SyntaxError:
        return source.strip()


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def drop_kwarg(call: cst.Call, name: str) -> cst.Call:
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    if args and len(args) < len(call.args) and call.args[-1].keyword is not None \
            and call.args[-1].keyword.value == name:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)  # keep the call's closing layout
    return call.with_changes(args=args)


def set_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    """Set keyword `name=value` on a call, replacing it or appending it in the call's own layout."""
    expr = cst.parse_expression(value)
    old = kwarg(call, name)
    if old is not None:
        return call.with_changes(args=[a.with_changes(value=expr) if a is old else a for a in call.args])
    args = list(call.args)
    new = cst.Arg(keyword=cst.Name(name), value=expr,
                  equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    # One argument per line? Then the new one goes on its own line, at the arguments' indentation.
    between = args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) \
        else call.whitespace_before_args
    if not isinstance(between, cst.ParenthesizedWhitespace):
        between = cst.SimpleWhitespace(" ")
    else:
        between = between.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
    if isinstance(last.comma, cst.Comma) and isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace) \
            and isinstance(between, cst.ParenthesizedWhitespace):
        # The old last argument keeps its trailing comment and the comment lines under it; the new
        # argument follows them, and the line break before ")" moves to it.
        closing = last.comma.whitespace_after
        args[-1] = last.with_changes(comma=last.comma.with_changes(
            whitespace_after=closing.with_changes(last_line=between.last_line)))
        new = new.with_changes(comma=cst.Comma(whitespace_after=closing.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[])))
    else:
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between),
                                     whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new])


def comments(text: str, first: str) -> list[cst.EmptyLine]:
    """`# kit: …` comment lines, wrapped at 100 columns so the script stays readable."""
    lines = textwrap.wrap(text, 96, initial_indent=first, subsequent_indent="    ")
    return [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in lines]


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call inside `node`, outermost first."""
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call):
            found.append(call)

    node.visit(_Calls())
    return found


def ast_calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(dotted name, call) for every call in an `ast` tree."""
    return [(ast.unparse(n.func), n) for n in ast.walk(tree) if isinstance(n, ast.Call)]


def clip(text: str, limit: int = 80) -> str:
    """`text` cut to about `limit` characters, for echoing a user's source in a one-line error."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
