"""The `kit` command line: one registry of subcommands, each a module in `kit/commands/`.

Each command module exposes `add_arguments(parser)` and `run(args) -> int`; its one-line help
lives here. Modules are imported only when their command runs, so `kit bootstrap` never pays for
torch or for the other commands.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kit.errors import EXIT_USAGE, KitError

COMMANDS = {
    "probe": ("kit.commands.probe", "facts about this machine: GPUs, torch build, packages"),
    "bootstrap": ("kit.commands.bootstrap", "check this machine, plan, write train_ddp.py, print the next command"),
    "plan": ("kit.commands.plan", "plan precision, strategy, batch and memory for a config on a machine"),
    "render": ("kit.commands.render", "write train_ddp.py for a config"),
    "status": ("kit.commands.status", "what a run's checkpoint store holds and how far the job is"),
    "schedule": ("kit.commands.schedule", "resume a job unattended with papermill until it is complete"),
    "convert": ("kit.commands.convert", "turn a training notebook into a rank-aware torchrun script"),
}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2, like every other kit error."""

    def error(self, message):
        raise KitError(f"{self.prog}: {message} (see `{self.prog} --help`)", EXIT_USAGE)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="kit", description="Fine-tune LLMs on notebook GPUs and survive the cutoff.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:  # only the command being run is imported
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        if command is None and argv and not argv[0].startswith("-"):
            raise KitError(f"kit: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", EXIT_USAGE)
        parser = build_parser(command)
        args = parser.parse_args(argv)
        if command is None:
            parser.print_help()
            return EXIT_USAGE if not argv else 0
        return int(args._run(args) or 0)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
