"""`kit bootstrap`: probe the machine (or read `--facts FILE`), judge it, show the next step.

In a notebook, `%run kit bootstrap` leaves `facts` and `verdicts` in the notebook's namespace:
this module keeps the last result in `LAST`, and the `kit.py` launcher copies it into its own
globals, which `%run` hands to the notebook.
"""

from __future__ import annotations

from kit import probe, report
from kit.errors import CannotTrain
from kit.verdicts import judge

LAST: dict = {}  # {"facts": Facts, "verdicts": Verdicts, "next": [str]} of the latest run


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print facts, verdicts and next steps as one JSON object")
    parser.add_argument("--facts", metavar="FILE", help="judge another machine's `kit probe --json` output instead of this one")
    parser.add_argument("--config", metavar="PATH", default=None, help="run config (YAML) to plan for")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. lora.r=8")


def run(args) -> int:
    """Judge the machine and show facts, verdicts and the next step.

    Returns:
        0 when training can run on a GPU; raises CannotTrain (exit 3) otherwise, CPU-only included,
        after the full report has been shown.
    """
    LAST.clear()  # a run that fails on bad input must not leave the previous run's facts behind
    facts = probe.load_facts(args.facts) if args.facts else probe.gather()
    verdicts = judge(facts)
    steps = _next_steps(args, facts, verdicts)
    LAST.update(facts=facts, verdicts=verdicts, next=steps)
    report.show(facts, verdicts, steps, as_json=args.json)
    if not verdicts.ok:
        raise CannotTrain(f"{verdicts.summary} Do this: {verdicts.action}" if args.json else "this machine cannot train on a GPU (see above)")
    return 0


def _next_steps(args, facts, verdicts) -> list[str]:
    """The commands to run next. The one hook where planning and rendering train_ddp.py will go.

    `args.config` and `args.overrides` are accepted and stored but not used yet.
    """
    if verdicts.ok:
        return [verdicts.action]
    if not facts.gpus and facts.torch.get("installed"):
        return ["python train_ddp.py  # CPU only: fit for the tiny default model, CPU-slow"]
    return []
