"""`kit render`: write train_ddp.py for a config, planned for this machine or an assumed one."""

from __future__ import annotations

import sys
from pathlib import Path

from kit import config, render
from kit.errors import UsageError

RENDERABLE = ("single", "ddp", "fsdp", "model_parallel")  # the strategies the template runs (kit.sharding)


def add_arguments(parser) -> None:
    config.add_config_arguments(parser)
    parser.add_argument("-o", "--output", default="train_ddp.py", help="where to write the script (default: train_ddp.py)")
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--facts", metavar="FILE", help="plan for the machine of this `kit probe --json` file")
    machine.add_argument("--gpus", metavar="NxNAME", help="plan for an assumed machine, e.g. 2xT4, 1xA100-80, cpu")
    parser.add_argument("--force", action="store_true", help="overwrite an existing, different file")
    parser.add_argument("--stdout", action="store_true", help="print the script instead of writing it")


def machine_facts(args) -> dict:
    """Facts of the machine to plan for: --facts FILE, --gpus SPEC, or this one."""
    from kit import hardware, probe

    if getattr(args, "facts", None):
        return probe.load_facts(args.facts).to_dict()
    if getattr(args, "gpus", None):
        return hardware.synthesize(args.gpus)
    return probe.gather().to_dict()


def machine_words(facts: dict, gpus_spec: str | None = None) -> str:
    gpus = facts.get("gpus") or []
    where = f"assumed: --gpus {gpus_spec}" if gpus_spec else facts.get("platform") or "this machine"
    if not gpus:
        return f"a CPU-only machine ({where})"
    names = sorted({g["name"] for g in gpus})
    return f"{len(gpus)} × {', '.join(names)} ({where})"


def render_for(cfg, config_path: str, facts: dict, gpus_spec: str | None = None) -> tuple[str, object]:
    """(script text, plan) for `cfg` on the machine `facts` describes."""
    from kit.plan import make_plan

    plan = make_plan(facts, cfg)
    assert plan.strategy in RENDERABLE, plan.strategy
    planned = plan.to_dict()
    planned["gpu_name"] = plan.gpu
    return render.render(cfg, planned, config_path, machine_words(facts, gpus_spec)), plan


def run(args) -> int:
    if args.config is None:
        raise UsageError("kit render needs --config PATH (start from configs/default.yaml)")
    cfg = config.from_args(args)
    text, plan = render_for(cfg, args.config, machine_facts(args), args.gpus)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    render.write(text, Path(args.output), args.force)
    print(f"wrote {args.output}: {plan.strategy} over {plan.nproc} × {plan.device}, {plan.precision}")
    print(f"next: {plan.launch}")
    return 0
