"""Module edges a change relies on: the session record's file is named by the one module that writes and
reads it (kit.checkpoints.session_records), and no module reads a private attribute of a training Job
(the end of a job uses Job's public surface). Reads the code only."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _modules() -> tuple[tuple[str, ast.Module], ...]:
    """(path, syntax tree) of every module of kit, parsed once for this file's tests (about 1 s each time)."""
    return tuple((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
                 for path in sorted((ROOT / "kit").rglob("*.py")))


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_the_session_records_file_is_named_in_one_module():
    from kit.checkpoints import session_records

    assert session_records.LOCAL == "kit_sessions.jsonl" and session_records.IN_STORE == "sessions.jsonl"
    spelled = set()
    for rel, tree in _modules():
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and "kit_sessions.jsonl" in node.value):
                spelled.add(rel)
    assert spelled == {"kit/checkpoints/session_records.py"}


def test_no_module_reads_a_private_attribute_of_a_job():
    reached = []
    for rel, tree in _modules():
        if rel == "kit/train/job.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "job"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                reached.append(f"{rel}:{node.lineno} job.{node.attr}")
    assert reached == []
