"""`kit probe`: facts about this machine, nothing decided (`kit bootstrap` judges them)."""

from __future__ import annotations

from kit.machine import probe
from kit.report import text as report


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON object")


def run(args) -> int:
    """Print this machine's facts; always exit 0 (an unreadable fact is listed under `unknown`)."""
    report.show(probe.gather(), as_json=args.json)
    return 0
