"""Large data literals, set aside while a cell is converted, so conversion time grows with the code,
not with the data a notebook embeds.

A cell may hold megabytes of data as a literal (`ROWS = [{"q": …, "a": …}, …]`, a base64 string).
kit has nothing to rewrite inside one, yet every pass over the cell (libcst's tree, each `ast` walk)
pays for every element: about 20 s and 2 GB per MB. So before the trees are built, each literal of
pure data (constants, and lists, tuples, sets and dicts of them) longer than `BIG` characters is
replaced by a placeholder `(_kit_literal_N)` that keeps its line count (line numbers in messages stay
the notebook's), and the script's text gets the literal back, as written, at the end.

The placeholders live in `Literals`, one per conversion (`with literals.kept() as table:`).
"""

from __future__ import annotations

import ast
import contextlib
import re
import secrets

BIG = 4096  # characters: smaller literals are settings (model ids, prompts), which the rewrites read
DATA = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict)
_ACTIVE: list[Literals] = []


class Literals:
    """Placeholder -> original text, for one conversion."""

    def __init__(self):
        self.text: dict[str, str] = {}
        self.tag = secrets.token_hex(4)  # a notebook cannot hold the same name by chance

    def restore(self, script: str) -> str:
        """`script` with each placeholder (however its lines were re-indented) replaced by its literal."""
        if not self.text:
            return script
        return re.sub(rf"\(\s*(_kit_literal_{self.tag}_\d+)\s*\)", lambda m: self.text[m.group(1)], script)

    def shown(self, text: str) -> str:
        """A change-list text with each placeholder as a short note of what it stands for."""
        return re.sub(rf"\(\s*(_kit_literal_{self.tag}_\d+)\s*\)",
                      lambda m: f"<literal of {len(self.text[m.group(1)])} characters>", text)


@contextlib.contextmanager
def kept():
    """A `Literals` table that `set_aside` fills while the block runs."""
    table = Literals()
    _ACTIVE.append(table)
    try:
        yield table
    finally:
        _ACTIVE.remove(table)


def _pure(tree: ast.AST) -> set[int]:
    """ids of the nodes that are pure data, found bottom-up in one pass."""
    pure: set[int] = set()
    order, stack = [], [tree]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(ast.iter_child_nodes(node))
    for node in reversed(order):  # children before parents
        if isinstance(node, ast.Constant):
            pure.add(id(node))
        elif isinstance(node, DATA) and all(id(c) in pure for c in ast.iter_child_nodes(node) if
                                            not isinstance(c, ast.expr_context)):
            pure.add(id(node))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and id(node.operand) in pure:
            pure.add(id(node))
    return pure


def set_aside(source: str, tree: ast.Module) -> str:
    """`source` with its big data literals replaced by placeholders (as it is without a `kept()` table)."""
    if not _ACTIVE or len(source) < BIG:
        return source
    table = _ACTIVE[-1]
    pure = _pure(tree)
    spans, stack = [], [tree]
    while stack:
        node = stack.pop()
        if id(node) in pure and isinstance(node, ast.expr) and not isinstance(node, ast.UnaryOp):
            if node.end_lineno is not None and (node.end_lineno - node.lineno > 0 or
                                                node.end_col_offset - node.col_offset >= BIG):
                spans.append(node)
                continue
        if not isinstance(node, ast.JoinedStr):  # an f-string's parts have no positions of their own
            stack.extend(ast.iter_child_nodes(node))
    if not spans:
        return source
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    out, end = [], len(source)
    for node in sorted(spans, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        a, b = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        if b - a < BIG:
            continue
        name = f"_kit_literal_{table.tag}_{len(table.text)}"
        table.text[name] = source[a:b]
        out += [source[b:end], f"({name}{chr(10) * source.count(chr(10), a, b)})"]
        end = a
    out.append(source[:end])
    return "".join(reversed(out))
