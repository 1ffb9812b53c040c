"""Secrets written into a notebook as literals: never carried into the script.

Hugging Face tokens are refused wherever they appear (kit.auth); a login line holding one is
dropped, and listed with the token as ***. A notebook also holds other
keys: `open_ai_key="sk-…"`, `wandb.login(key="0123…")`, `os.environ["WANDB_API_KEY"] = "…"`. A key
is found by its shape (the prefixes providers give their keys) or by its name: a string of 16+
letters and digits (both) given to a name with key, token, secret or password in it. Placeholders
(`"sk-xxxx"`, `"YOUR_API_KEY"`) are neither. The error names the cell and line, never the value.
"""

from __future__ import annotations

import ast
import re

from kit.redaction import TOKEN_RE
from kit.errors import UsageError

SHAPES = [(TOKEN_RE, "a Hugging Face token"),
          (re.compile(r"(?<![A-Za-z0-9])sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), "an OpenAI/Anthropic API key"),
          (re.compile(r"(?<![A-Za-z0-9])(?:ghp|gho|ghs)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"), "a GitHub token"),
          (re.compile(r"(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![A-Za-z0-9])"), "an AWS access key"),
          (re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}"), "a Google API key")]
SECRET_NAME = re.compile(r"(?i)key|token|secret|passw")
SECRET_VALUE = re.compile(r"(?=[^\s]*\d)(?=[^\s]*[A-Za-z])[A-Za-z0-9_.\-]{16,}")


def _named(tree: ast.AST):
    """(name, value, line) of each string literal given to a name: keyword, assignment, dict key, env."""
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.keyword) and node.arg:
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    pairs.append((t.id, node.value))
                elif isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
                    pairs.append((str(t.slice.value), node.value))
        elif isinstance(node, ast.Dict):
            pairs += [(k.value, v) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        for name, value in pairs:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield name, value.value, value.lineno


def _joined(tree: ast.AST):
    """String literals added together (`'hf_' + 'abc…'`), joined: a token split in two is still one.
    Each chain once, from its top: a chain of n parts is walked in n steps, not n²."""
    inner = {id(side) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
             for side in (node.left, node.right)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and id(node) not in inner:
            parts, todo = [], [node]
            while todo:
                n = todo.pop()
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
                    todo += [n.right, n.left]
                elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                    parts.append(n.value)
                else:
                    break
            else:
                yield "".join(parts), parts[-1]


def find(script: str, parsed: str | None = None) -> tuple[str, str] | None:
    """(value, what) of the first secret in the converted script's text; None without one.
    `parsed`: the same script with its big data literals set aside, to walk as a tree."""
    for shape, what in SHAPES[1:]:  # Hugging Face tokens: kit.auth.refuse_token, on every generated file
        if m := shape.search(script):
            return m.group(0), what
    tree = ast.parse(script if parsed is None else parsed)
    for joined, last in _joined(tree):
        for shape, what in SHAPES:
            if shape.search(joined):
                return last, what
    for name, value, _ in _named(tree):
        if SECRET_NAME.search(name) and SECRET_VALUE.fullmatch(value):
            return value, f"a secret ({name}=\"…\")"
    return None


def refuse(script: str, cells: list[tuple[int, str]], parsed: str | None = None) -> None:
    """UsageError naming the notebook's cell and line (never the value) when `script` holds a secret."""
    hit = find(script, parsed)
    if hit is None:
        return
    value, what = hit
    where = next((f"cell {cell}, line {text[:text.index(value)].count(chr(10)) + 1}" for cell, text in cells
                  if value in text), "a cell")
    raise UsageError(f"{where} holds what looks like {what}; kit never writes a secret into a script: read it "
                     "from the environment (os.environ[...]) or a Kaggle/Colab secret, and convert again")
