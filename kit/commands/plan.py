"""`kit plan`: precision, strategy, batch and memory for a config on this or another machine.

    kit plan --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml --gpus 2xT4
    kit plan --facts probe.json lora.r=8 --json
    kit plan --config C --gpus 8xH100 --nodes 2 --rdzv-endpoint 10.0.0.1:29500

Exit 0 when a plan exists, 3 when the job does not fit or the hardware cannot run it (the plan,
with strategy "none" and the reasons, is still printed), 2 for a bad config or flags.
"""

from __future__ import annotations

import json
from dataclasses import replace

from kit.planning import config
from kit.errors import CannotTrain
from kit.report.text import plan_json, plan_to_text


def add_arguments(parser) -> None:
    config.add_config_arguments(parser, config.default_config())
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--facts", metavar="FILE", help="plan for the machine in this `kit probe --json` output")
    machine.add_argument("--gpus", metavar="NxNAME",
                         help="plan for a machine from kit's GPU table, e.g. 2xT4, 1xA100-80, MI300X, cpu")
    parser.add_argument("--nproc", type=int, default=None, help="use at most this many GPUs (default: all usable)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="machines like this one (--gpus is per node); prints each node's torchrun command")
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT", default=None,
                        help="node 0's address and a free port for torchrun's c10d rendezvous (default $MASTER_ADDR:29500)")
    parser.add_argument("--node-rank", type=int, default=None, help="with --nodes: print only this node's command")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def run(args) -> int:
    from kit.planning import plan as planner

    from kit.planning import nodes

    nodes.check_nodes(args.nodes, args.node_rank, args.rdzv_endpoint)
    if args.rdzv_endpoint is not None:
        nodes.check_endpoint(args.rdzv_endpoint)
    cfg = config.from_args(args)
    from kit.commands.render import check_files

    check_files(cfg, args.config)  # before any plan is printed: a wrong reward file is the one line
    facts = _facts(args)
    try:
        plan = planner.make_plan(facts, cfg, nproc=args.nproc, nodes=args.nodes, rdzv_endpoint=args.rdzv_endpoint)
    except CannotTrain as e:
        if getattr(e, "plan", None) is not None:
            # The refusal is the error line below; the plan's reasons show it only in JSON, so it
            # is printed once.
            print(_render(e.plan, args.json, refusal=str(e)))
        raise
    if args.node_rank is not None and plan.node_launch:
        print(plan.node_launch[args.node_rank])  # for a node's own start-up script
        return 0
    print(_render(plan, args.json))
    if not args.json and plan.launch:
        # Several nodes: each starts its own command (listed above), not node 0's.
        shown = replace(plan, launch="each node's command above, on that node") if plan.node_launch else plan
        print(f"next: {_next(args, cfg, facts, shown)}")
    return 0


def _next(args, cfg, facts, plan) -> str:
    """The launch command, when ./train_ddp.py is this config's script for this machine; else render first."""
    from pathlib import Path

    from kit.commands.render import machine_args, render_for
    from kit.files import same_content
    from kit.script.render import rerender_command

    script = Path("train_ddp.py")
    render_it = rerender_command(args.config or "CONFIG.yaml", machine_args(args), args.overrides or ())
    if args.config is None:  # built-in defaults: there is no config file to render from
        return f"{render_it}  (with your config: it writes the script), then: {plan.launch}"
    try:
        text, _ = render_for(cfg, args.config, facts, args.gpus, args=args)
    except CannotTrain:  # a plan the script template cannot run yet (e.g. sharded): no script to name
        return plan.launch
    if script.is_file() and same_content(script, text, "the script"):
        return plan.launch
    state = "is another config's or machine's script" if script.exists() else "does not exist yet"
    return f"{render_it}  (./train_ddp.py {state}), then: {plan.launch}"


def _facts(args):
    from kit.commands.render import machine_facts

    # One loader for plan, render and bootstrap: the same checks and the same one-line errors.
    return machine_facts(args)


def _render(plan, as_json: bool, refusal: str | None = None) -> str:
    if as_json:
        return json.dumps(plan_json(plan), indent=2)
    if refusal is not None:
        plan = replace(plan, reasons=tuple(r for r in plan.reasons if r.code != "refused"))
    return plan_to_text(plan, launch=False)
