"""`kit bootstrap`: probe the machine (or read `--facts FILE`), judge it, show the next step.

In a notebook, `%run kit bootstrap` leaves `facts` and `verdicts` in the notebook's namespace:
`run` returns a `Result` (also carried by the CannotTrain it raises after the report), the CLI
hands it back as `kit.cli.run(argv).result`, and the `kit.py` launcher copies it into its own
globals, which `%run` hands to the notebook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kit.machine import gpu_table, probe
from kit.report import text as report
from kit.errors import CannotTrain, KitError, UsageError
from kit.machine.verdicts import judge



@dataclass
class Result:
    """What one `kit bootstrap` found and decided."""

    facts: object
    verdicts: object
    next: list[str] = field(default_factory=list)
    plan: object | None = None
    cpu_only: bool = False
    wrote: str | None = None  # "wrote train_ddp.py …" when a script was written
    exit_code: int = 0


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print facts, verdicts and next steps as one JSON object")
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--facts", metavar="FILE", help="judge another machine's `kit probe --json` output instead of this one")
    machine.add_argument("--gpus", metavar="NxNAME", help="judge an assumed machine instead of this one, as kit plan "
                         "does, e.g. 2xT4 (Kaggle), T4 (Colab), 1xA100-80, cpu")
    parser.add_argument("--config", metavar="PATH", default=None, help="run config (YAML) to plan for")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. lora.r=8")
    parser.add_argument("-o", "--output", default="train_ddp.py",
                        help="with --config: where to write the training script (default: train_ddp.py)")


CPU_NOTE = "CPU: slow, fine for the tiny default"


def run(args) -> Result:
    """Judge the machine, and with `--config` plan and write train_ddp.py; show the next step.

    Returns:
        the Result, exit code 0, when training can run: on a GPU, or with `--config` on the CPU
        when the plan trains there (the tiny default does). Raises CannotTrain (exit 3) otherwise,
        after the full report, with the Result as its `result`.
    """
    if args.overrides and not args.config:  # they would change nothing: say so rather than ignore them
        from kit.planning.config import DEFAULT_CONFIG

        raise UsageError(f"{args.overrides[0]}: config overrides need --config (bootstrap plans and writes a "
                         f"script only for a config), e.g. --config {DEFAULT_CONFIG}")
    if args.config:  # before probing or planning: a refused -o must cost nothing and touch nothing
        from kit.commands.render import check_output

        check_output(args.output, args.config)  # the text as given: `newdir/` names a folder
    try:
        return _judge(args)
    except KitError as e:
        if args.config:  # the script at -o must not be launched as if it were the asked job's
            _stand_down(args, e)
        raise


def _stand_down(args, error: KitError) -> None:
    """After a failed bootstrap for a config: a note beside the script at -o stops it from training,
    unless it is that config's own job (`kit.script.failed_bootstrap`)."""
    from kit.auth import redact
    from kit.planning import config
    from kit.script import failed_bootstrap

    try:
        asked = config.to_dict(config.from_args(args))
    except KitError:  # the config itself is what failed: whatever is at -o is not it
        asked = None
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    why = redact(f"`kit bootstrap --config {args.config}` failed (exit {error.exit_code}: {first_line})")
    note = failed_bootstrap.leave_note(Path(args.output), asked, why)
    if note is not None:
        print(f"{args.output} is another job's script: it now refuses to run ({note.name} beside it says why; "
              "the next script kit writes there removes that note)", flush=True)


def _judge(args) -> Result:
    facts = (probe.load_facts(args.facts) if args.facts else
             probe.Facts.from_dict(gpu_table.synthesize(args.gpus)) if getattr(args, "gpus", None) else probe.gather())
    verdicts = judge(facts)
    cpu_only = not facts.gpus and bool(facts.torch.get("installed"))
    plan, written, refusal = None, None, None
    if args.config and (verdicts.ok or cpu_only):
        plan, written, refusal = _plan_and_write(args, facts)
    steps = _next_steps(facts, verdicts, plan, written, args.output)
    result = Result(facts=facts, verdicts=verdicts, next=steps, plan=plan, cpu_only=cpu_only, wrote=written)
    report.show(facts, verdicts, steps, as_json=args.json, plan=plan, wrote=written)
    if refusal is not None:
        refusal.result = result
        raise refusal
    if written or verdicts.ok or (cpu_only and not args.config):
        # A plan that trains here, GPU or CPU (its script written), a usable GPU, or no GPU and no config
        # asked for: the one next line names the config that trains here.
        return result
    error = CannotTrain(f"{verdicts.summary} Do this: {verdicts.action}" if args.json
                        else "this machine cannot train on a GPU (see above)")
    error.result = result
    raise error


def _plan_and_write(args, facts):
    """(plan, words about the written script, a CannotTrain to raise after the report or None)."""
    from kit.planning import config
    from kit.script import render
    from kit.commands.render import render_for

    cfg = config.from_args(args)
    try:
        text, plan = render_for(cfg, args.config, facts.to_dict(), args=args, output=args.output)
    except CannotTrain as e:
        return getattr(e, "plan", None), None, e
    out = Path(args.output)
    backup = render.write(text, out)
    return plan, f"wrote {out}{render.kept_words(backup)}", None


def _next_steps(facts, verdicts, plan, written, script: str) -> list[str]:
    """The one command to run next (a list, for JSON readers); `script` is where train_ddp.py was written.

    Only the command: what was written is said on its own line before it (`wrote`), so the
    output has exactly one line that says what to do next.
    """
    if plan is not None and written:
        from kit.commands.render import launch_for

        return [launch_for(plan, Path(script)) + (f"  ({CPU_NOTE})" if plan.device == "cpu" else "")]
    if verdicts.ok:
        return [verdicts.action]
    if not facts.gpus and facts.torch.get("installed"):
        return [f"{_default_bootstrap()}  # writes train_ddp.py for this machine ({CPU_NOTE})"]
    return []


def _default_bootstrap() -> str:
    """The command that writes the default job's script: here, or in the kit checkout the default config is in."""
    import shlex

    import kit
    from kit.planning.config import DEFAULT_CONFIG, default_config

    command = f"kit bootstrap --config {DEFAULT_CONFIG}"
    return command if default_config() else f"cd {shlex.quote(kit.CHECKOUT)} && {command}"
