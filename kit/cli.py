"""The `kit` command line: one registry of subcommands, each a module in `kit/commands/`.

Each command module exposes `add_arguments(parser)` and `run(args) -> int`; its one-line help
lives here. Modules are imported only when their command runs, so `kit bootstrap` never pays for
torch or for the other commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass

from kit.errors import EXIT_USAGE, KitError
from kit.parser import Parser

COMMANDS = {
    "probe": ("kit.commands.probe", "facts about this machine: GPUs, torch build, packages"),
    "bootstrap": ("kit.commands.bootstrap", "check this machine, plan, write train_ddp.py, print the next command"),
    "plan": ("kit.commands.plan", "plan precision, strategy, batch and memory for a config on a machine"),
    "render": ("kit.commands.render", "write train_ddp.py for a config"),
    "status": ("kit.commands.status", "what a run's checkpoint store holds and how far the job is"),
    "schedule": ("kit.commands.schedule", "resume a job unattended with papermill until it is complete"),
    "convert": ("kit.commands.convert", "turn a training notebook into a rank-aware torchrun script"),
    "export": ("kit.commands.export", "merge the finished LoRA into 16-bit weights (sharded safetensors, GGUF)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="kit", description="Fine-tune LLMs on notebook GPUs and survive the cutoff.")
    parser.add_argument("--version", action="store_true", help="print kit's distribution name and version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:  # only the command being run is imported
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


@dataclass
class Outcome:
    """How a command ended: its exit code, and the result object it returned (bootstrap's facts,
    verdicts and plan), also when it failed after making one; None for commands that return a code."""

    code: int
    result: object | None = None


def main(argv: list[str] | None = None) -> int:
    return run(argv).code


def run(argv: list[str] | None = None) -> Outcome:
    from kit.redaction import redacted_output

    with redacted_output():  # whatever a command prints, a token in it is shown as ***
        return _main(argv)


def _main(argv: list[str] | None = None) -> Outcome:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        if command is None and argv and not argv[0].startswith("-"):
            raise KitError(f"kit: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", EXIT_USAGE)
        _check_utf8(argv)
        parser = build_parser(command)
        args = parser.parse_args(argv)
        if command is None and args.version:
            print(version_line())
            return Outcome(0)
        if command is None:
            parser.print_help()
            return Outcome(EXIT_USAGE if not argv else 0)
        value = args._run(args)
        if value is None or isinstance(value, int):
            return Outcome(int(value or 0))
        return Outcome(value.exit_code, value)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return Outcome(e.exit_code, getattr(e, "result", None))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return Outcome(130)
    except BrokenPipeError:
        # `kit probe --json | head`: the reader left. Point stdout at devnull so the interpreter's
        # own flush at exit does not raise again (the recipe in Python's signal docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Outcome(1)
    except (OSError, UnicodeError, MemoryError, RecursionError) as e:
        # What a command did not foresee about its input files (a folder where a file was expected,
        # a full disk, bytes that are not UTF-8, an input too big to hold): still one line, exit 2.
        return _unforeseen(e, EXIT_USAGE, "")
    except Exception as e:  # a bug in kit: one line (the traceback with KIT_DEBUG=1), never a token
        return _unforeseen(e, 1, " (a bug in kit: please report it with KIT_DEBUG=1's traceback)")


def version_line() -> str:
    """`kit-finetune 0.1.0`: the installed distribution's name and version, from its package metadata
    (PyPI's `kit` is another project); kit's own version when it runs from a checkout not installed."""
    from importlib import metadata

    import kit

    for dist in metadata.packages_distributions().get("kit", []):
        try:
            meta = metadata.metadata(dist)
        except metadata.PackageNotFoundError:
            continue
        return f"{meta['Name']} {meta['Version']} ({kit.CHECKOUT})"
    return f"kit {kit.__version__} ({kit.CHECKOUT}; not installed as a distribution)"


def _check_utf8(argv: list[str]) -> None:
    """Refuse an argument whose bytes are not UTF-8 (a file name from another system): kit writes
    paths into scripts, configs and commands as UTF-8, so it names the argument here instead."""
    for arg in argv:
        if any("\udc80" <= c <= "\udcff" for c in arg):  # how Python keeps an undecodable byte
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise KitError(f"{shown[:120]}: this argument holds bytes that are not UTF-8 (shown escaped), "
                           "and kit writes paths into scripts and commands as UTF-8: rename the file or "
                           "use another path", EXIT_USAGE)


def _unforeseen(e: BaseException, code: int, tail: str) -> Outcome:
    """Report an exception no command turned into a KitError: one redacted line, or with KIT_DEBUG=1
    the whole traceback (redacted too: stderr is redacting while a command runs)."""
    if os.environ.get("KIT_DEBUG"):
        import traceback

        traceback.print_exception(e)
    if isinstance(e, OSError) and e.strerror:
        where = f" {e.filename}" if e.filename is not None else ""
        what = f"{e.strerror}:{where}" if where else e.strerror
    elif isinstance(e, MemoryError):
        what = "out of memory reading the input: is a file or a value far larger than it should be?"
    else:
        what = f"{type(e).__name__}: {e}"
    from kit.errors import shown

    # An OSError's file name is the user's (or a file's) text: escaped and bounded, as in every message.
    print(f"error: {shown(what.splitlines()[0] if what else type(e).__name__, limit=1000)}{tail}", file=sys.stderr)
    return Outcome(code)


def finish_in_script(outcome: Outcome, namespace: dict) -> None:
    """End `%run kit …` / `%run -m kit …`: leave bootstrap's results in the notebook, then exit.

    `%run` copies the script's globals into the notebook, so `facts`, `verdicts` and `plan` go
    into `namespace`. A command that failed fails the notebook cell: `%run` shows any exception
    its script raises (SystemExit too) and then reports the cell as run, so "Run all" and papermill
    would go on to the next cell — `!torchrun … train_ddp.py` with a script that is not the one
    asked for. In a kernel the cell's result is marked failed instead (`_fail_cell`).
    """
    code, result = outcome.code, outcome.result
    for name in ("facts", "verdicts", "plan"):
        if getattr(result, name, None) is not None:
            namespace[name] = getattr(result, name)
    if not code:
        return
    words = " ".join(["kit", *sys.argv[1:]])  # as %run gave them
    if _fail_cell(CommandFailed(f"`{words}` failed with exit code {code} (its error is above): the notebook "
                                "stops here")):
        return
    raise SystemExit(code)


class CommandFailed(Exception):
    """What a notebook cell that ran a failing `%run kit …` reports as its error."""


def _fail_cell(error: Exception) -> bool:
    """In a Jupyter kernel, mark the running cell as failed with `error`, as if it had raised it: the
    kernel's reply says "error", so papermill, nbclient and "Run all" stop before the next cell. %run
    catches whatever its script raises, so raising cannot do this. False outside a kernel (or an
    IPython without a cell result to mark): then the caller raises SystemExit as a script does."""
    from kit.auth import redact
    from kit.report.text import in_notebook_kernel

    if not in_notebook_kernel():
        return False
    import IPython

    shell = IPython.get_ipython()
    cell = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    if cell is None or not hasattr(cell, "error_in_exec"):
        return False
    error = CommandFailed(redact(str(error)))
    try:  # shown as the cell's error (`CommandFailed: …`), and its traceback is what the reply carries
        raise error
    except CommandFailed:
        shell.showtraceback(exception_only=True)
    cell.error_in_exec = error
    return True
