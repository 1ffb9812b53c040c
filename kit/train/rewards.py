"""GRPO's reward functions, from a Python file the user names: `rewards: my_rewards.py:correct,format`.

Checked before any model loads, each problem one `error:` line (exit 2) naming the file or the
function: a spec without a file or names, a file that is not .py, a name given twice, a missing
file (or a folder), a file that fails to import (a syntax error, a missing package, an exception,
sys.exit or os._exit at import), a missing name, a class or something else not callable, two
names for one function (TRL logs each by its name), a signature TRL cannot call (TRL calls every
reward function with the keywords `prompts`, `completions`, `completion_ids`, `trainer_state`,
`log_extra`, `log_metric` and each dataset column, so it must take `completions` and `**kwargs`),
and a first dry call with two rows that raises, exits, changes its arguments in place, or returns
other than what TRL turns into one float per completion.

What a reward may return is what TRL 1.16's GRPOTrainer accepts: any sequence or iterable (a list,
a generator, a NumPy array, a 1-d tensor) of one value per completion, each a number, a bool, a
0-d tensor or NumPy scalar, or None (TRL reads None, like NaN, as "not applicable": that reward
is left out of the row's sum and of its mean). An infinite value is refused: TRL's group
advantages would be NaN. `async def` rewards are awaited, as TRL awaits them.

What the user's code prints, at import, in the dry call and at every step (`checked`), shows a token
as ***, as everything kit prints does. The import, each dry call and each call in training are bounded
(grpo.reward_timeout): a file or a function that never returns is one line and exit 2 from a
watchdog, not a hang (the process cannot be unwound from inside the user's code, so the watchdog ends
it; under torchrun, torchrun then stops the other ranks). The user's code runs in the main thread, as
under TRL (a reward that sets signal handlers, as math-verify's timeouts do, works the same). A
reward that raises, exits or returns something unusable at a step stops the job with one line naming
it and the step.

TRL runs the reward functions on every rank, each on that rank's own completions.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from kit.errors import EXIT_USAGE, UsageError, exit_words
from kit.redaction import redacted_output

DRY_ROWS = 2
CALL_SECONDS = 300.0  # grpo.reward_timeout's default: the file's import, each dry call, each call in training


class BadValues(ValueError):
    """What a reward function returned that TRL cannot use, in words (`values`)."""


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """`file.py:name1,name2` → ("file.py", ["name1", "name2"])."""
    text = str(spec or "").strip()
    path, sep, names = text.rpartition(":")
    wanted = [n.strip() for n in names.split(",")] if sep else []
    if not sep or not path.strip() or not wanted or any(not n.isidentifier() for n in wanted):
        raise UsageError(f"rewards: {text!r} is not FILE.py:NAME[,NAME...] (e.g. rewards: my_rewards.py:correct,format)")
    path = path.strip()
    if not path.endswith(".py"):
        raise UsageError(f"rewards: {path!r} is not a .py file: name the Python file that defines the functions "
                         "(e.g. rewards: my_rewards.py:correct,format)")
    twice = next((n for i, n in enumerate(wanted) if n in wanted[:i]), None)
    if twice:
        raise UsageError(f"rewards: {twice!r} is named twice in {text!r}: TRL logs each function by its name "
                         f"(rewards/{twice}/mean) and would sum it twice; name it once")
    return path, wanted


def reward_name(func) -> str:
    """The name TRL logs a reward function by (`rewards/NAME/mean`): a partial's function's, else the callable's
    own, else its class's (TRL 1.16's get_callable_name)."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def is_async(func) -> bool:
    """Whether TRL awaits `func` (TRL 1.16's is_async_callable: an async def, a partial of one, or an instance
    whose __call__ is one)."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


class ProcessExit(BaseException):
    """os._exit called by the user's code while kit runs it: turned into this, then into one line."""

    def __init__(self, code):
        super().__init__(f"os._exit({code})")


_REAL_EXIT = os._exit
_GUARD = threading.Lock()
_GUARDED: dict[int, int] = {}  # thread id -> how many `bounded` blocks it is in


def _guarded_exit(code=0):
    """os._exit while the user's code runs: ProcessExit in a thread running it, the real exit elsewhere."""
    if _GUARDED.get(threading.get_ident()):
        raise ProcessExit(code)
    _REAL_EXIT(code)


@contextlib.contextmanager
def bounded(what: str, why: str = "", seconds: float | None = None):
    """Run the user's code of the block in this thread, with os._exit turned into ProcessExit and a watchdog
    that, after `seconds` (CALL_SECONDS), prints one `error:` line naming `what` and ends the process with exit 2
    (the user's code cannot be unwound from outside; under torchrun, torchrun then stops the other ranks).
    Blocks may nest and interleave (TRL awaits async rewards together on one thread)."""
    seconds = CALL_SECONDS if seconds is None else seconds
    done, me = threading.Event(), threading.get_ident()

    def watch():
        if done.wait(seconds):
            return
        err = UsageError(f"rewards: {what} did not finish within {seconds:g} s (grpo.reward_timeout){why}: make "
                         "it return, or bound its own waits")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        print(f"error: {err}{exit_words(EXIT_USAGE)}", file=sys.__stderr__, flush=True)
        _REAL_EXIT(EXIT_USAGE)

    threading.Thread(target=watch, name="kit-rewards-watchdog", daemon=True).start()
    with _GUARD:
        _GUARDED[me] = _GUARDED.get(me, 0) + 1
        os._exit = _guarded_exit
    try:
        with redacted_output():  # what the user's code prints shows a token as ***
            yield
    finally:
        done.set()
        with _GUARD:
            _GUARDED[me] -= 1
            if not _GUARDED[me]:
                del _GUARDED[me]
            if not _GUARDED:
                os._exit = _REAL_EXIT


# What the user's code may raise that kit turns into one line: any exception, sys.exit, and os._exit (ProcessExit).
USER_FAILURES = (Exception, SystemExit, ProcessExit)


def failure(exc: BaseException) -> str:
    """What the user's code did, in words: `raised Type: first line`, or `called os._exit(code)`."""
    if isinstance(exc, ProcessExit):
        return f"called {exc}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"raised {type(exc).__name__}: {first}" if first else f"raised {type(exc).__name__}"


def located(spec: str, base: Path) -> tuple[Path, list[str]]:
    """(the file `spec` names, found from `base` (the config's folder) unless absolute, the names): the file must
    exist and be a file."""
    file, names = parse_spec(spec)
    path = Path(file) if Path(file).is_absolute() else Path(base) / file
    _check_is_file(path)
    return path, names


def _check_is_file(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"rewards: {path} is a folder, not a Python file")
    if not path.is_file():
        raise UsageError(f"rewards: {path} not found (grpo.rewards names a file beside the config)")


def import_file(path: Path, seconds: float | None = None):
    """The module at `path`, imported under a private name (the user's file may share a stdlib name)."""
    _check_is_file(path)
    name = f"kit_rewards_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: a dataclass or a pickled object in the file looks itself up there
    sys.path.insert(0, str(path.parent))  # the file may import its neighbours
    try:
        with bounded(f"importing {path.name}", seconds=seconds):
            spec.loader.exec_module(module)
    except USER_FAILURES as exc:  # the user's code: any failure is theirs, in one line
        sys.modules.pop(name, None)
        raise UsageError(f"rewards: {path} failed to import: {failure(exc).removeprefix('raised ')}"[:400]) from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    return module


NO_KWARGS = "it takes no **kwargs (TRL passes prompts, completion_ids, trainer_state and every dataset column)"


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
        return NO_KWARGS
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


def values(out, n: int) -> list[float]:
    """What TRL makes of a reward function's return for `n` completions: one float each, NaN for None (not
    applicable); BadValues in words (`returned ...`) where TRL would fail or train on NaN."""
    import torch

    if inspect.iscoroutine(out):  # a plain def returning a coroutine: TRL would not await it either
        out.close()
    if out is None or isinstance(out, (str, bytes, Mapping, set, frozenset)) or inspect.iscoroutine(out):
        raise BadValues(f"returned {type(out).__name__}, not a list of {n} numbers (one per completion)")
    try:
        got = list(out)
    except TypeError:
        raise BadValues(f"returned {type(out).__name__}, not a list of {n} numbers (one per completion)") from None
    if len(got) != n:
        raise BadValues(f"returned {len(got)} values for {n} completions")
    floats = []
    for v in got:  # as TRL: None is NaN, then torch.tensor(..., dtype=float32)
        if isinstance(v, (str, bytes)):
            raise BadValues(f"returned {type(v).__name__} values; each must be a number, or None for not applicable")
        try:
            t = torch.as_tensor(math.nan if v is None else v, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            if isinstance(v, numbers.Real):  # an int of 400 digits
                raise BadValues(f"returned {v!r:.40}…, past float32's range: clip it") from None
            raise BadValues(f"returned {type(v).__name__} values; each must be a number, or None for not "
                            "applicable") from None
        if t.dim() != 0:
            raise BadValues(f"returned a {type(v).__name__} of {t.numel()} values for one completion; each must be "
                            "one number")
        if torch.isinf(t):
            raise BadValues(f"returned {v!r:.40} (infinite, or past float32's range): TRL's group advantages would "
                            "be NaN; clip it, or return None for not applicable")
        floats.append(float(t))
    return floats


def call(func, kwargs: dict):
    """`func(**kwargs)` as TRL calls it: awaited when TRL would await it (`is_async`)."""
    out = func(**kwargs)
    if not is_async(func):
        return out
    import asyncio

    async def wait():
        return await out

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread (a script): the usual case
        return asyncio.run(wait())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # a loop already runs here (a notebook): a thread of its own
        return pool.submit(asyncio.run, wait()).result()


def dry_call(func, name: str, rows: dict, seconds: float | None = None) -> tuple[float, int]:
    """Call `func` as TRL would on `rows` (DRY_ROWS prompts, each answered by its own text): (seconds it took,
    values that were None or NaN). UsageError naming `name` for anything TRL could not use."""
    import torch  # noqa: F401  (imported here, not inside the bounded call: `values` uses it)

    prompts = rows["prompt"][:DRY_ROWS]
    n = len(prompts)
    completions = [_stand_in(p) for p in prompts]
    columns = {k: list(v[:DRY_ROWS]) for k, v in rows.items() if k not in ("prompt", "completion", "completion_ids")}
    given = {"prompts": prompts, "completions": completions, "completion_ids": [[0, 1] for _ in prompts], **columns}
    before = {k: repr(v) for k, v in given.items()}  # a snapshot: what the function gets must come back unchanged
    where = f"(a dry call with {n} rows)"
    started = time.monotonic()
    try:
        with bounded(f"{name} (a dry call with {n} rows)", "; TRL would wait on it at every step (with several "
                      "ranks, the others in their next collective)", seconds):
            out = call(func, {**given, "trainer_state": None, "log_extra": lambda *a, **k: None,
                              "log_metric": lambda *a, **k: None})
            floats = values(out, n)  # a generator's values come from the user's code too
    except BadValues as exc:
        raise UsageError(f"rewards: {name} {exc} {where}") from None
    except USER_FAILURES as exc:  # the user's code: reported in one line, naming the function
        raise UsageError(f"rewards: {name} {failure(exc)} {where}"[:400]) from None
    took = time.monotonic() - started
    changed = [k for k in given if repr(given[k]) != before[k]]
    if changed:
        raise UsageError(f"rewards: {name} changed its argument {changed[0]!r} in place {where}: TRL hands the same "
                         "lists to every reward function and keeps them for logging; copy before changing")
    return took, sum(1 for v in floats if v != v)


def check_file(spec: str, *, base: Path) -> None:
    """The file `spec` names, read without running it (no import: a planner or a notebook kernel must not run the
    user's code nor what it imports): it exists, parses, and binds each name at its top level, a `def` taking
    **kwargs where it is one. Planning, rendering and bootstrap call it, so a wrong file is one line there rather
    than a script that stops at launch; the launch still imports and dry-calls the functions (load_rewards)."""
    import ast

    path, names = located(spec, base)
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
            raise UsageError(f"rewards: {path.name}:{name} cannot be called by TRL: {NO_KWARGS}")


def load_rewards(spec: str, *, base: Path, rows: dict | None = None, notes: list | None = None,
                 seconds: float | None = None) -> list:
    """The reward functions `spec` names, checked; `rows` (column → values) for the dry call, if given;
    `notes`: what the dry call found, in words (its time, None values), appended; `seconds`: the bound on the
    import and each dry call (grpo.reward_timeout; CALL_SECONDS when not given).

    Relative files are found from `base` (the config's folder)."""
    path, names = located(spec, base)
    module = import_file(path, seconds)
    funcs, by_name = [], {}
    for name in names:
        func = getattr(module, name, None)
        if func is None:
            raise UsageError(f"rewards: {path.name} has no function {name!r}")
        if inspect.isclass(func):
            raise UsageError(f"rewards: {path.name}:{name} is a class, not a function: TRL would call the class and "
                             "get an instance; name a function, or an instance with a __call__")
        if not callable(func):
            raise UsageError(f"rewards: {path.name}:{name} is a {type(func).__name__}, not a function")
        logged = reward_name(func)
        if logged in by_name:
            raise UsageError(f"rewards: {path.name}:{name} and {path.name}:{by_name[logged]} have one name, "
                             f"{logged!r}, which TRL logs and sums them by (rewards/{logged}/mean): give each a def "
                             "of its own name, or name it once")
        by_name[logged] = name
        problem = signature_problem(func, set(rows) if rows is not None else None)
        if problem:
            raise UsageError(f"rewards: {path.name}:{name} cannot be called by TRL: {problem}")
        if rows is not None:
            took, none = dry_call(func, f"{path.name}:{name}", rows, seconds)
            if notes is not None:
                notes.append(f"{name} {took:.2f} s" + (f", None for {none} of {min(DRY_ROWS, len(rows['prompt']))} "
                                                          "(TRL: not applicable, left out of the sum)" if none else ""))
        funcs.append(func)
    return funcs


def checked(funcs: list, seconds: float | None = None) -> list:
    """Each reward function as TRL gets it, each call run as the dry call is: bounded by `seconds`
    (grpo.reward_timeout), os._exit and sys.exit caught, what it prints redacted, its return checked
    (`values`). One that hangs, raises, exits, or returns inf or the wrong count later (on completions the
    dry call did not see) stops the job with one `error:` line naming it and the step, where TRL hung,
    raised a traceback or trained on NaN advantages. The wrapper keeps the name TRL logs (`reward_name`),
    TRL's async reading (`is_async`), and the function itself as `__wrapped__`; it hands TRL the same
    floats TRL would have made."""
    return [_checked(f, seconds) for f in funcs]


def _checked(func, seconds: float | None):
    name = reward_name(func)

    def where(kwargs) -> str:
        state = kwargs.get("trainer_state")
        step = getattr(state, "global_step", None)
        return (f" at step {step + 1}" if step is not None else "") + f" (on {len(kwargs.get('completions') or ())} " \
            "completions; it passed the dry call)"

    @contextlib.contextmanager
    def one_line(kwargs):
        try:
            with bounded(f"{name}{where(kwargs)}", seconds=seconds):
                yield
        except BadValues as exc:
            raise UsageError(f"rewards: {name} {exc}{where(kwargs)}") from None
        except USER_FAILURES as exc:  # the user's code: one line naming it and the step
            raise UsageError(f"rewards: {name} {failure(exc)}{where(kwargs)}"[:600]) from None

    if is_async(func):
        async def wrapper(**kwargs):  # awaited on TRL's event loop, as the function itself was
            with one_line(kwargs):
                return values(await func(**kwargs), len(kwargs.get("completions") or ()))
    else:
        def wrapper(**kwargs):
            with one_line(kwargs):
                return values(func(**kwargs), len(kwargs.get("completions") or ()))
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__wrapped__ = func
    return wrapper


def _stand_in(prompt):
    """A completion shaped like the prompt: text for text prompts, one assistant message for chats."""
    if isinstance(prompt, list):
        return [{"role": "assistant", "content": "stand-in completion"}]
    return " stand-in completion"
