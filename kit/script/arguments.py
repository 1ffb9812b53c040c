"""The generated script's command line: its flags, its settings, and the plan they are trained with.

    args = arguments.parse(argv, CONFIG_PATH)
    cfg, plan, notes = arguments.settings(SETTINGS, PLAN, args)

Without `--config` the script trains the SETTINGS and PLAN written into it, with `key=value`
overrides on top. `--config FILE` replaces both: that config's settings, planned again by the
planner for this machine and the number of processes started, so an 8B config never inherits the
tiny model's micro-batch or checkpointing choice.
"""

from __future__ import annotations

import argparse

from kit.parser import Parser
from kit.planning import config
from kit.planning.plan import Plan
from kit.planning.reasons import Reason, why


def parse(argv: list[str], config_path: str) -> argparse.Namespace:
    import os
    import sys

    from kit.script import failed_bootstrap

    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if script:  # a bootstrap for another job failed since this script was written: it must not train instead
        failed_bootstrap.check(script)

    name = os.path.basename(script) if script else "train_ddp.py"  # `-o t8b.py` wrote t8b.py: its --help says so
    parser = Parser(prog=name, description=f"Train as configured in {config_path}.")
    config.add_config_arguments(parser)
    parser.set_defaults(config=None)
    parser.add_argument("--smoke", action="store_true", help="one optimizer step, then check that training works")
    parser.add_argument("--force", action="store_true",
                        help="resume even if the checkpoint's config fingerprint differs from this config")
    return parser.parse_args(argv)


def settings(embedded: dict, embedded_plan: dict, args: argparse.Namespace) -> tuple[config.RunConfig, Plan, list]:
    """(config, plan, notes): the embedded ones with overrides, or `--config FILE` planned for this
    machine (the note, a Reason, says so).

    Checked here, before any model loads: the settings' values, the embedded plan's keys, and the
    tracker report_to names (installed here; rank 0: its key, kit.train.tracking).
    """
    if not args.config:
        cfg = config.from_dict(embedded, source="train_ddp.py SETTINGS")
        for key, value in config.parse_overrides(args.overrides or ()):
            config.set_value(cfg, key, value, source="command line")
        same_trainer(cfg, embedded)
        plan, notes = Plan.from_dict(embedded_plan), []
    else:
        cfg = config.load(args.config, args.overrides or ())
        same_trainer(cfg, embedded)
        plan, note = replan(cfg, args.config)
        notes = [note]
    _settle_tracker(cfg)
    return cfg, plan, notes


def _settle_tracker(cfg: config.RunConfig) -> None:
    from kit.train import tracking
    from kit.train.dist import env_int

    tracking.settle(cfg, env_int("RANK", 0))


def same_trainer(cfg: config.RunConfig, embedded: dict) -> None:
    """The script builds the trainer it was rendered for (SFTTrainer, DPOTrainer…): another one is refused."""
    from kit.errors import UsageError

    rendered = embedded.get("trainer", "sft")
    if cfg.trainer != rendered:
        raise UsageError(f"this script was rendered for trainer={rendered}, and the settings ask for "
                         f"trainer={cfg.trainer}: render a script for it (python -m kit render --config FILE "
                         f"trainer={cfg.trainer} -o train_{cfg.trainer}.py)")


def steps_given(args: argparse.Namespace) -> bool:
    """max_steps=N among the arguments: then N is the target, also of a job extended past it."""
    return config.given(args.overrides or (), "max_steps")


def replan(cfg: config.RunConfig, source: str) -> tuple[Plan, Reason]:
    """The planner's plan for `cfg` on this machine (probed without CUDA), and the note that says so.

    Raises the planner's errors: CannotTrain (exit 3) when this machine cannot train `cfg`.
    """
    from kit.machine import probe
    from kit.planning.plan import make_plan

    from kit.train.dist import env_int

    world = env_int("WORLD_SIZE", 1)
    local = env_int("LOCAL_WORLD_SIZE", world)  # this node's processes; the world spans every node
    facts = probe.gather()
    # Under torchrun the plan is for the processes started; one process may plan every GPU (model parallel).
    # CPU ranks plan as one world: the CPU planner has no nodes.
    gpus = facts["gpus"] if isinstance(facts, dict) else facts.gpus  # a Facts, or its dict
    nodes = world // local if gpus and 0 < local < world and world % local == 0 else 1
    per_node = world // nodes
    plan = make_plan(facts, cfg, nproc=per_node if world > 1 else None, nodes=nodes)
    note = why("replanned", source=source, nodes=nodes, nproc=plan.nproc, gpu=plan.gpu, device=plan.device,
               strategy=plan.strategy, precision=plan.precision, per_device_batch=plan.per_device_batch,
               grad_accum=plan.grad_accum, gradient_checkpointing=plan.gradient_checkpointing)
    return plan, note
