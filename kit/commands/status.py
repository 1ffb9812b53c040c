"""`kit status`: what a job's store holds, how far the job is, its sessions and its lease.

    kit status --config configs/default.yaml store=hf://me/ha-ckpts
    kit status --config configs/default.yaml --json
    kit status --config configs/default.yaml --plot progress.png
"""

from __future__ import annotations

import json

from kit.errors import shown
from kit.planning import config


def add_arguments(parser) -> None:
    config.add_config_arguments(parser, config.default_config())
    parser.add_argument("--json", action="store_true", help="print one JSON object: latest_step (newest verified), verified, max_steps, "
                        "complete, checkpoints, sessions, lease, store, losses, rewards (trainer grpo: the mean "
                        "reward of each logged step, and each reward function's)")
    parser.add_argument("--plot", metavar="PNG",
                        help="also draw train and eval loss (trainer grpo: the rewards) against step, progress "
                        "across sessions and "
                        "goodput per session into PNG (a .png name in an existing folder; a file there is "
                        "replaced only if it is a PNG)")


def run(args) -> int:
    from kit.checkpoints import status

    cfg = config.from_args(args)
    if args.plot:  # a bad target fails here, before the store is read
        from kit.report import plots

        plots.check_target(args.plot)
    facts = status.gather(cfg, steps_given=config.given(args.overrides, "max_steps"))
    if args.plot:
        facts["plot"] = str(plots.job_plot(facts["log_history"], facts["sessions"], args.plot, facts["max_steps"],
                                           facts["goodput"], facts["rewards"]))
    history = facts.pop("log_history")
    if args.json:
        facts["losses"] = [{k: h[k] for k in ("step", "loss", "eval_loss") if k in h} for h in history
                           if "loss" in h or "eval_loss" in h]
        print(json.dumps(facts, indent=2))
    else:
        print(status.format_text(facts))
        if args.plot:
            print(f"{'plot':<12} {shown(facts['plot'])}")
    return 0
