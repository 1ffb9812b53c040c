"""`kit render`: write train_ddp.py for a config, planned for this machine or an assumed one."""

from __future__ import annotations

import sys
from pathlib import Path

from kit.planning import config
from kit.script import render
from kit.errors import UsageError, shown

RENDERABLE = ("single", "ddp", "fsdp", "model_parallel")  # the strategies the template runs (kit.train.sharding)


def add_arguments(parser) -> None:
    config.add_config_arguments(parser, config.default_config())
    parser.add_argument("-o", "--output", default="train_ddp.py", help="where to write the script (default: "
                        "train_ddp.py; - prints it, as --stdout)")
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--facts", metavar="FILE", help="plan for the machine of this `kit probe --json` file")
    machine.add_argument("--gpus", metavar="NxNAME", help="plan for an assumed machine, e.g. 2xT4, 1xA100-80, cpu")
    parser.add_argument("--force", action="store_true", help="accepted for older commands: an existing, different "
                        "file is always replaced and kept as a numbered backup (.prev, .prev.2, …)")
    parser.add_argument("--stdout", action="store_true", help="print the script instead of writing it")


def machine_facts(args) -> dict:
    """Facts of the machine to plan for: --facts FILE, --gpus SPEC, or this one."""
    from kit.machine import gpu_table, probe

    if getattr(args, "facts", None):
        return probe.load_facts(args.facts).to_dict()
    if getattr(args, "gpus", None):
        return gpu_table.synthesize(args.gpus)
    return probe.gather().to_dict()


def machine_words(facts: dict, gpus_spec: str | None = None) -> str:
    gpus = facts.get("gpus") or []
    where = f"assumed: --gpus {gpus_spec}" if gpus_spec else facts.get("platform") or "this machine"
    if not gpus:
        return f"a CPU-only machine ({where})"
    names = sorted({g["name"] for g in gpus})
    return f"{len(gpus)} × {', '.join(names)} ({where})"


def machine_args(args) -> list[str]:
    """The flags that name the machine planned for, as given: --facts FILE, --gpus SPEC, or none."""
    if getattr(args, "facts", None):
        return ["--facts", args.facts]
    if getattr(args, "gpus", None):
        return ["--gpus", args.gpus]
    return []


def check_files(cfg, config_path: str | None) -> None:
    """The files the script will import beside the config, read now (not run): GRPO's reward file. A wrong one is
    one `error:` line from `kit plan`, `kit render` and `kit bootstrap`, before any plan is printed or written."""
    if cfg.trainer == "grpo":
        from kit.train.rewards import check_file

        check_file(cfg.grpo.rewards, base=Path(config_path).parent if config_path else Path("."))


def render_for(cfg, config_path: str, facts: dict, gpus_spec: str | None = None, *, args=None,
               output: str = "train_ddp.py") -> tuple[str, object]:
    """(script text, plan) for `cfg` on the machine `facts` describes.

    `args` (the command's, when given) supplies the machine flags and overrides for the re-render
    command written into the script, so that command reproduces the file exactly.
    """
    from kit.planning.plan import make_plan

    check_files(cfg, config_path)
    plan = make_plan(facts, cfg)
    assert plan.strategy in RENDERABLE, plan.strategy
    rerender = render.rerender_command(config_path, machine_args(args) if args is not None else
                                       (["--gpus", gpus_spec] if gpus_spec else []),
                                       getattr(args, "overrides", None) or (), output)
    return render.render(cfg, plan, config_path, machine_words(facts, gpus_spec), rerender, output), plan


def run(args) -> int:
    if args.config is None:
        raise UsageError(f"kit render needs --config PATH: there is no {config.DEFAULT_CONFIG} in this folder to "
                         "use by default (run it in the kit checkout, or name your config)")
    cfg = config.from_args(args)
    if args.output == "-":  # the Unix convention for standard output
        args.stdout, args.output = True, "train_ddp.py"
    out = Path(args.output)
    if not args.stdout:  # checked before planning, so a refused run touches nothing
        check_output(args.output, args.config)  # the text as given: `newdir/` names a folder
    text, plan = render_for(cfg, args.config, machine_facts(args), args.gpus, args=args, output=args.output)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    backup = render.write(text, out)
    from kit.report.text import plan_summary

    print(f"wrote {shown(out, limit=None)}{render.kept_words(backup)}: {plan_summary(plan)}")
    print(f"next: {launch_for(plan, out)}")
    return 0


def check_output(out: Path | str, config_path: str | None = None) -> None:
    """Refuse an -o that cannot take a script (a folder, a FIFO or device, a missing or unwritable
    folder) or that is the config itself, before any work."""
    import os

    from kit.files import check_output as check

    check(out, "-o", "train_ddp.py")
    if config_path and os.path.exists(out) and os.path.exists(config_path) and os.path.samefile(out, config_path):
        raise UsageError(f"-o {out} is the config {config_path} itself: writing the script there would lose it; "
                         "choose another -o")


def launch_for(plan, script: Path) -> str:
    """The plan's launch command for the script written at `script` (not always ./train_ddp.py)."""
    from kit.machine.command import shell_word

    return plan.launch.replace("train_ddp.py", shell_word(Path(script).as_posix(), path=True))
