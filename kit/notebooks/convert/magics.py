"""IPython line magics as the Python a script runs: `%env`, `%cd` (with IPython's `{expr}`, `$name`
and `~` expansion), `%time`-like magics' statements, and `x = !cmd` / `x = %magic` captures."""

from __future__ import annotations

import ast
import re

from kit.errors import UsageError
from kit.notebooks.convert.syntax import clip

# Cell magics whose body is still Python; the body of any other (%%bash, %%writefile…) is not.
PYTHON_BODY_MAGICS = {"capture", "time", "timeit", "prun", "memit", "debug"}
# Their line forms run the Python statement after the options: `%timeit -n 1 f()` runs `f()`.
PYTHON_ARG_MAGICS = {"%" + m for m in PYTHON_BODY_MAGICS - {"capture"}}
VALUE_OPTIONS = {"-n", "-r", "-s", "-l", "-T", "-D", "-p", "-b"}  # options of those magics that take a value


def shell_line_python(text: str) -> str:
    """A one-line `!cmd` as the Python that runs it as IPython did: through the shell, not stopping on failure."""
    return f"import subprocess; subprocess.run({text[1:].strip()!r}, shell=True)  # kit: was `{clip(text, 60)}`"


def python_for(line: str) -> str | None:
    """`%env K=V` / `%set_env K V` / `%cd DIR` as Python, so the code below sees the same state."""
    word, _, rest = line.partition(" ")
    rest = rest.strip()
    if word in ("%env", "%set_env") and rest:
        key, _, value = rest.partition("=") if "=" in rest else rest.partition(" ")
        if key.strip():
            return f"os.environ[{key.strip()!r}] = {value.strip()!r}"
    if word == "%cd" and rest:
        return _chdir(rest.strip(chr(34) + chr(39)))
    if word in PYTHON_ARG_MAGICS:
        return _statement(rest)
    return None


def _chdir(target: str) -> str:
    """`%cd DIR` as os.chdir, with what IPython expands first: `{expr}` and `$name` (an f-string), `~`."""
    path = repr(target)
    if "{" in target or "$" in target:
        path = "f" + repr(re.sub(r"\$(\w+)", r"{\1}", target))  # IPython's `$name` is `{name}`
        try:
            ast.parse(path, mode="eval")
        except SyntaxError:
            path = repr(target)  # not an expansion after all (a literal brace in a folder name)
    return f"os.chdir(os.path.expanduser({path}))" if "~" in target else f"os.chdir({path})"


def _statement(rest: str) -> str | None:
    """The Python statement after a `%time`-like magic's options (`-n 1 -r 1 f()` → `f()`)."""
    words = rest.split(" ")
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option in VALUE_OPTIONS and words:
            words.pop(0)
        while words and not words[0]:
            words.pop(0)
    return " ".join(words).strip() or None


def captured(lhs: str, rhs: str, where: str) -> str:
    """`lhs = !cmd` or `lhs = %time expr` as Python; UsageError for what has no equivalent."""
    word, _, rest = rhs.partition(" ")
    if rhs.startswith("!") or word in ("%sx", "%system"):
        command = (rhs[1:] if rhs.startswith("!") else rest).strip()
        if any(c in command for c in "{}$"):
            raise UsageError(f"{where}: `{clip(lhs + ' = ' + rhs, 60)}` captures a shell command with IPython's "
                             f"{{var}}/$var expansion, which a script cannot do: write `{lhs} = "
                             "subprocess.getoutput(f\"...\").splitlines()` and convert again")
        return f"import subprocess; {lhs} = subprocess.getoutput({command!r}).splitlines()"
    statement = _statement(rest) if word in ("%time", "%debug", "%memit") else None
    if statement is None:
        raise UsageError(f"{where}: `{clip(lhs + ' = ' + rhs, 60)}` captures the result of IPython's "
                         f"`{word}` magic, which a script cannot run: compute {lhs} in Python and convert again")
    return f"{lhs} = {statement}"
