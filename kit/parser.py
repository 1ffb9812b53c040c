"""kit's argument parser: one-line errors with exit 2, `key=value` overrides among the flags.

Shared by the `kit` command line (kit/cli.py) and the generated script's (kit/script/arguments.py).
"""

from __future__ import annotations

import argparse
import re
import sys

from kit.errors import EXIT_USAGE, KitError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2, like every other kit error.

    `key=value` overrides may sit anywhere among the flags (`train_ddp.py lora.r=8 --force
    output_dir=X`): plain argparse stops filling a `nargs="*"` positional at the first flag and
    calls the rest "unrecognized arguments", so a parser without subcommands parses intermixed.
    """

    _intermixed = False  # set while parse_known_intermixed_args calls back into parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixed:  # the inner passes: argv stays the whole command line, for error()
            return super().parse_known_args(args, namespace)
        self._argv = list(sys.argv[1:] if args is None else args)  # for error(): the value it refused
        if any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions()):
            return self._no_empty(super().parse_known_args(args, namespace))
        self._intermixed = True
        try:
            return self._no_empty(self.parse_known_intermixed_args(args, namespace))
        finally:
            self._intermixed = False

    def _no_empty(self, parsed):
        """An option given an empty value (`-o ""`, `--plot ""`) was taken as not given: refuse it."""
        for action in self._actions:
            given = [o for o in action.option_strings if o in self._argv or f"{o}=" in self._argv]
            if given and getattr(parsed[0], action.dest, None) == "":
                self.error(f"argument {given[0]}: an empty value: give one, or leave {given[0]} out")
        return parsed

    def error(self, message):
        # argparse takes a value that starts with "-" (`--gpus -1xT4`) for an option and says only
        # "expected one argument": name the value, and how to pass it.
        missing = re.fullmatch(r"argument (\S+): expected one argument", message)
        argv = getattr(self, "_argv", [])
        for opt in (missing.group(1).split("/") if missing else ()):
            if opt in argv and argv.index(opt) + 1 < len(argv):
                value = argv[argv.index(opt) + 1]
                message = (f"argument {opt}: expected a value, got {value!r}, which reads as an option "
                           f"(to pass a value that starts with '-', write {opt}={value})")
                break
        raise KitError(f"{self.prog}: {message} (see `{self.prog} --help`)", EXIT_USAGE)

