"""`kit plan`: precision, strategy, batch and memory for a config on this or another machine.

    kit plan --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml --gpus 2xT4
    kit plan --facts probe.json lora.r=8 --json
    kit plan --config C --gpus 8xH100 --nodes 2 --rdzv-endpoint 10.0.0.1:29500

Exit 0 when a plan exists, 3 when the job does not fit or the hardware cannot run it (the plan,
with strategy "none" and the reasons, is still printed), 2 for a bad config or flags.
"""

from __future__ import annotations

import json

from kit import config
from kit.errors import CannotTrain, UsageError
from kit.report import plan_to_text

GIB = 2**30


def add_arguments(parser) -> None:
    config.add_config_arguments(parser)
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
    from kit import plan as planner

    from kit import nodes

    nodes.check_nodes(args.nodes, args.node_rank)
    if args.rdzv_endpoint is not None:
        nodes.check_endpoint(args.rdzv_endpoint)
    cfg = config.from_args(args)
    facts = _facts(args)
    try:
        plan = planner.make_plan(facts, cfg, nproc=args.nproc, nodes=args.nodes, rdzv_endpoint=args.rdzv_endpoint)
    except CannotTrain as e:
        if getattr(e, "plan", None) is not None:
            print(_render(e.plan, args.json))
        raise
    if args.node_rank is not None and plan.node_launch:
        print(plan.node_launch[args.node_rank])  # for a node's own start-up script
        return 0
    print(_render(plan, args.json))
    return 0


def _facts(args):
    from kit import hardware

    if args.gpus:
        return hardware.synthesize(args.gpus)
    if args.facts:
        try:
            with open(args.facts, encoding="utf-8") as fh:
                return json.load(fh)
        except OSError as e:
            raise UsageError(f"cannot read facts {args.facts}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"facts {args.facts} is not JSON (line {e.lineno}): {e.msg}") from None
    from kit import probe

    return probe.gather()


def _render(plan, as_json: bool) -> str:
    return json.dumps(plan.to_dict(), indent=2) if as_json else plan_to_text(plan)
