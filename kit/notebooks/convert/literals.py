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
NEWLINES = re.compile(r"\r\n?|\n")
NEWLINE_LINES = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+\Z")


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


def _is_data(node: ast.AST) -> bool:
    """Constants, and lists, tuples, sets and dicts of them (negative numbers too), all the way down."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = type(n)
        if kind is ast.Constant:
            continue
        if kind in (ast.List, ast.Tuple, ast.Set):
            stack.extend(n.elts)
        elif kind is ast.Dict:
            if None in n.keys:  # `{**other}`
                return False
            stack.extend(n.keys)
            stack.extend(n.values)
        elif kind is ast.UnaryOp and isinstance(n.op, (ast.USub, ast.UAdd)):
            stack.append(n.operand)
        else:
            return False
    return True


def set_aside(source: str, tree: ast.Module) -> str:
    """`source` with its big data literals replaced by placeholders (as it is without a `kept()` table)."""
    if not _ACTIVE or len(source) < BIG:
        return source
    table = _ACTIVE[-1]
    lines = NEWLINE_LINES.findall(source)  # ast's lines: only \n, \r\n and \r end one (not \x0c or \u2028)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    spans, stack = [], [tree]
    while stack:  # top-down: the outermost big literal of pure data, and nothing inside it is walked
        node = stack.pop()
        if isinstance(node, DATA):
            a, b = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
            if b - a >= BIG and _is_data(node):
                spans.append((a, b))
                continue
        if not isinstance(node, ast.JoinedStr):  # an f-string's parts have no positions of their own
            stack.extend(ast.iter_child_nodes(node))
    if not spans:
        return source
    out, end = [], len(source)
    for a, b in sorted(spans, reverse=True):
        name = f"_kit_literal_{table.tag}_{len(table.text)}"
        table.text[name] = source[a:b]
        out += [source[b:end], f"({name}{chr(10) * len(NEWLINES.findall(source, a, b))})"]
        end = a
    out.append(source[:end])
    return "".join(reversed(out))
