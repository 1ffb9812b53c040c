"""`kit plan`: precision, strategy, batch and memory for a config on this or another machine.

    kit plan --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml --gpus 2xT4
    kit plan --facts probe.json lora.r=8 --json

Exit 0 when a plan exists, 3 when the job does not fit or the hardware cannot run it (the plan,
with strategy "none" and the reasons, is still printed), 2 for a bad config or flags.
"""

from __future__ import annotations

import json

from kit import config
from kit.errors import CannotTrain, UsageError

GIB = 2**30


def add_arguments(parser) -> None:
    config.add_config_arguments(parser)
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--facts", metavar="FILE", help="plan for the machine in this `kit probe --json` output")
    machine.add_argument("--gpus", metavar="NxNAME",
                         help="plan for a machine from kit's GPU table, e.g. 2xT4, 1xA100-80, MI300X, cpu")
    parser.add_argument("--nproc", type=int, default=None, help="use at most this many GPUs (default: all usable)")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def run(args) -> int:
    from kit import plan as planner

    cfg = config.from_args(args)
    facts = _facts(args)
    try:
        plan = planner.make_plan(facts, cfg, nproc=args.nproc)
    except CannotTrain as e:
        if getattr(e, "plan", None) is not None:
            print(_render(e.plan, args.json))
        raise
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
    if as_json:
        return json.dumps(plan.to_dict(), indent=2)
    where = f"{plan.nproc}× {plan.gpu}" if plan.device == "cuda" and plan.gpu else plan.gpu or plan.device
    rows = [("strategy", plan.strategy)]
    if plan.strategy != "none":
        rows += [("device", where), ("precision", plan.precision), ("quantization", plan.quantization or "-"),
                 ("backend", plan.backend), ("optimizer", plan.optimizer),
                 ("gradient checkpointing", "on" if plan.gradient_checkpointing else "off"),
                 ("batch", f"{plan.per_device_batch} per device × {plan.grad_accum} accumulation × "
                           f"{plan.nproc} process(es) = {plan.global_batch}")]
    lines = [f"plan for {plan.model} on {where}"]
    lines += [f"  {k:<24}{v}" for k, v in rows]
    terms = plan.memory.get("terms") or {}
    if terms:
        unit = "GPU" if plan.device == "cuda" else "process"
        lines.append(f"{'memory per ' + unit + ' (estimate)':<38}{'GiB':>10}")
        lines += [f"  {name:<36}{b / GIB:>10.2f}" for name, b in terms.items()]
        lines.append(f"  {'total':<36}{plan.memory['per_gpu_bytes'] / GIB:>10.2f}"
                     f"  of {plan.memory['budget_bytes'] / GIB:.2f}")
        lines += [f"  ({note})" for note in plan.memory.get("notes", [])]
    lines.append("reasons")
    lines += [f"  - {r}" for r in plan.reasons]
    if plan.launch:
        lines.append(f"next: {plan.launch}")
    return "\n".join(lines)
