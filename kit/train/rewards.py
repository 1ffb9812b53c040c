"""GRPO's reward functions, from a Python file the user names: `rewards: my_rewards.py:correct,format`.

Checked before any model loads, each problem one `error:` line (exit 2) naming the file or the
function: a spec without a file or names, a missing file, a file that fails to import, a missing
name, something not callable, a signature TRL cannot call (TRL calls every reward function with
the keywords `prompts`, `completions`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`
and each dataset column, so it must take `completions` and `**kwargs`), and a first dry call with
two rows that raises or returns other than one number (or None) per completion.

TRL runs the reward functions on every rank, each on that rank's own completions.
"""

from __future__ import annotations

import importlib.util
import inspect
import numbers
import sys
from pathlib import Path

from kit.errors import UsageError

DRY_ROWS = 2


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """`file.py:name1,name2` → ("file.py", ["name1", "name2"])."""
    text = str(spec or "").strip()
    path, sep, names = text.rpartition(":")
    wanted = [n.strip() for n in names.split(",")] if sep else []
    if not sep or not path.strip() or not wanted or any(not n.isidentifier() for n in wanted):
        raise UsageError(f"rewards: {text!r} is not FILE.py:NAME[,NAME...] (e.g. rewards: my_rewards.py:correct,format)")
    return path.strip(), wanted


def import_file(path: Path):
    """The module at `path`, imported under a private name (the user's file may share a stdlib name)."""
    if not path.is_file():
        raise UsageError(f"rewards: {path} not found")
    name = f"kit_rewards_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any failure is theirs to fix, reported in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"rewards: {path} failed to import: {type(exc).__name__}: {first}"[:400]) from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def signature_problem(func, columns: set | None = None) -> str | None:
    """Why TRL could not call `func` with completions and keyword columns, or None.

    `columns`: the dataset's columns, which TRL passes by name; None when unknown (then a required
    parameter that is not one of TRL's own is taken to be a column)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "its signature cannot be read"
    params = sig.parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return "it takes no **kwargs (TRL passes prompts, completion_ids, trainer_state and every dataset column)"
    known = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    known |= set(columns or ()) - {"prompt", "completion", "completion_ids"}
    for p in params:
        if p.kind is p.VAR_POSITIONAL or p.kind is p.VAR_KEYWORD or p.default is not p.empty:
            continue
        if p.kind is p.POSITIONAL_ONLY:
            return f"its parameter {p.name!r} is positional-only; TRL passes everything by name"
        if p.name not in known and columns is not None:
            return f"its parameter {p.name!r} has no default and is not a column of the data"
    return None


def dry_call(func, name: str, rows: dict) -> None:
    """Call `func` as TRL would on `rows` (DRY_ROWS prompts, each answered by its own text)."""
    prompts = rows["prompt"][:DRY_ROWS]
    completions = [_stand_in(p) for p in prompts]
    columns = {k: list(v[:DRY_ROWS]) for k, v in rows.items() if k not in ("prompt", "completion", "completion_ids")}
    try:
        out = func(prompts=prompts, completions=completions, completion_ids=[[0, 1]] * len(prompts),
                   trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
    except Exception as exc:  # the user's code: reported in one line, naming the function
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"rewards: {name} raised {type(exc).__name__}: {first} (a dry call with "
                         f"{len(prompts)} rows)"[:400]) from None
    try:
        values = list(out)
    except TypeError:
        raise UsageError(f"rewards: {name} returned {type(out).__name__}, not a list of {len(prompts)} numbers "
                         f"(a dry call with {len(prompts)} rows)") from None
    if len(values) != len(prompts):
        raise UsageError(f"rewards: {name} returned {len(values)} values for {len(prompts)} completions "
                         f"(a dry call with {len(prompts)} rows)")
    bad = [v for v in values if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real))]
    if bad:
        raise UsageError(f"rewards: {name} returned {type(bad[0]).__name__} values; each must be a number or None")


def check_file(spec: str, *, base: Path) -> None:
    """The file `spec` names, read without running it (no import: a planner or a notebook kernel must not run the
    user's code nor what it imports): it exists, parses, and binds each name at its top level, a `def` taking
    **kwargs where it is one. Planning, rendering and bootstrap call it, so a wrong file is one line there rather
    than a script that stops at launch; the launch still imports and dry-calls the functions (load_rewards)."""
    import ast

    file, names = parse_spec(spec)
    path = Path(file) if Path(file).is_absolute() else Path(base) / file
    if not path.is_file():
        raise UsageError(f"rewards: {path} not found (grpo.rewards names a file beside the config: {spec})")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise UsageError(f"rewards: {path} cannot be read as Python{where}: {type(exc).__name__}: "
                         f"{getattr(exc, 'msg', exc)}"[:400]) from None
    bound, star = {}, False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            star = star or any(a.name == "*" for a in node.names)
            bound.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update({n.id: node for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
        else:  # if/try blocks and the like: any name they bind counts (the launch checks what it is)
            bound.update({n.name: n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
            bound.update({n.id: n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
    for name in names:
        node = bound.get(name)
        if node is None and not star:
            defined = sorted(n for n, v in bound.items() if isinstance(v, (ast.FunctionDef, ast.AsyncFunctionDef)))
            raise UsageError(f"rewards: {path.name} has no function {name!r} (it defines: "
                             f"{', '.join(defined) or 'no functions'})")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.kwarg is None:
            raise UsageError(f"rewards: {path.name}:{name} cannot be called by TRL: it takes no **kwargs (TRL passes "
                             "prompts, completion_ids, trainer_state and every dataset column)")


def load_rewards(spec: str, *, base: Path, rows: dict | None = None) -> list:
    """The reward functions `spec` names, checked; `rows` (column → values) for the dry call, if given.

    Relative files are found from `base` (the config's folder)."""
    file, names = parse_spec(spec)
    path = Path(file) if Path(file).is_absolute() else Path(base) / file
    module = import_file(path)
    funcs = []
    for name in names:
        func = getattr(module, name, None)
        if func is None:
            raise UsageError(f"rewards: {path.name} has no function {name!r}")
        if not callable(func):
            raise UsageError(f"rewards: {path.name}:{name} is a {type(func).__name__}, not a function")
        problem = signature_problem(func, set(rows) if rows is not None else None)
        if problem:
            raise UsageError(f"rewards: {path.name}:{name} cannot be called by TRL: {problem}")
        if rows is not None:
            dry_call(func, f"{path.name}:{name}", rows)
        funcs.append(func)
    return funcs


def _stand_in(prompt):
    """A completion shaped like the prompt: text for text prompts, one assistant message for chats."""
    if isinstance(prompt, list):
        return [{"role": "assistant", "content": "stand-in completion"}]
    return " stand-in completion"
