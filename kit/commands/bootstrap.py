"""`kit bootstrap`: probe the machine (or read `--facts FILE`), judge it, show the next step.

In a notebook, `%run kit bootstrap` leaves `facts` and `verdicts` in the notebook's namespace:
this module keeps the last result in `LAST`, and the `kit.py` launcher copies it into its own
globals, which `%run` hands to the notebook.
"""

from __future__ import annotations

from pathlib import Path

from kit import probe, report
from kit.errors import CannotTrain
from kit.verdicts import judge

LAST: dict = {}  # {"facts": Facts, "verdicts": Verdicts, "next": [str]} of the latest run


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print facts, verdicts and next steps as one JSON object")
    parser.add_argument("--facts", metavar="FILE", help="judge another machine's `kit probe --json` output instead of this one")
    parser.add_argument("--config", metavar="PATH", default=None, help="run config (YAML) to plan for")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. lora.r=8")
    parser.add_argument("-o", "--output", default="train_ddp.py",
                        help="with --config: where to write the training script (default: train_ddp.py)")


def run(args) -> int:
    """Judge the machine, and with `--config` plan and write train_ddp.py; show the next step.

    Returns:
        0 when training can run on a GPU; raises CannotTrain (exit 3) otherwise, CPU-only included,
        after the full report has been shown (and, CPU-only, after the script was written).
    """
    LAST.clear()  # a run that fails on bad input must not leave the previous run's facts behind
    facts = probe.load_facts(args.facts) if args.facts else probe.gather()
    verdicts = judge(facts)
    cpu_only = not facts.gpus and bool(facts.torch.get("installed"))
    plan, written, refusal = None, None, None
    if args.config and (verdicts.ok or cpu_only):
        plan, written, refusal = _plan_and_write(args, facts)
    steps = _next_steps(facts, verdicts, plan, written, args.output)
    LAST.update(facts=facts, verdicts=verdicts, next=steps, plan=plan, cpu_only=cpu_only)
    report.show(facts, verdicts, steps, as_json=args.json, plan=plan)
    if refusal is not None:
        raise refusal
    if not verdicts.ok:
        if args.json:
            raise CannotTrain(f"{verdicts.summary} Do this: {verdicts.action}")
        raise CannotTrain("no usable GPU: only the tiny default can train here, on the CPU (see above)" if cpu_only
                          else "this machine cannot train on a GPU (see above)")
    return 0


def _plan_and_write(args, facts):
    """(plan, words about the written script, a CannotTrain to raise after the report or None)."""
    from kit import config, render
    from kit.commands.render import render_for

    cfg = config.from_args(args)
    try:
        text, plan = render_for(cfg, args.config, facts.to_dict())
    except CannotTrain as e:
        return getattr(e, "plan", None), None, e
    out = Path(args.output)
    note = f"wrote {out}"
    if out.exists() and out.read_text() != text:
        # Never lose a script the user may have edited: keep the previous one beside it.
        backup = out.with_name(out.name + ".prev")
        out.replace(backup)
        note += f" (the previous one is now {backup.name})"
    render.write(text, out, force=True)
    return plan, note, None


def _next_steps(facts, verdicts, plan, written, script: str) -> list[str]:
    """The commands to run next, most important first; `script` is where train_ddp.py was written."""
    if plan is not None and written:
        steps = [f"{written}; next: {plan.launch.replace('train_ddp.py', script)}"]
        if plan.device == "cpu":
            steps.append("CPU only: fine for the tiny default model, CPU-slow for anything bigger")
        return steps
    if verdicts.ok:
        return [verdicts.action]
    if not facts.gpus and facts.torch.get("installed"):
        return ["python train_ddp.py  # CPU only: fit for the tiny default model, CPU-slow"]
    return []
