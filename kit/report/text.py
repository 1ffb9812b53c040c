"""Facts and verdicts in words: aligned text for a terminal, an HTML table for a notebook, JSON.

Rendering only: every decision is already in the `Facts` (kit.machine.probe) and `Verdicts` (kit.machine.verdicts).
"""

from __future__ import annotations

import html
import json
import sys

from kit.errors import shown
from kit.files import GIB


def to_json(facts, verdicts=None, next_steps: list[str] | None = None, plan=None, wrote: str | None = None) -> str:
    """One JSON object: the facts, plus `verdicts`, `plan`, `wrote` and `next` when given."""
    d = facts.to_dict()
    if plan is not None:
        d["plan"] = plan_json(plan)
    if wrote is not None:
        d["wrote"] = wrote
    if verdicts is not None:
        d["verdicts"] = verdicts.to_dict()
    if next_steps is not None:
        d["next"] = next_steps
    return json.dumps(d, indent=2)


def plan_json(plan) -> dict:
    """The plan as `--json` prints it: `Plan.to_dict()`, each reason with its words beside its code and figures."""
    from kit.report.reasons import as_json

    return {**plan.to_dict(), "reasons": as_json(plan.reasons)}


def to_text(facts, verdicts=None, next_steps: list[str] | None = None, do_this: bool = True) -> str:
    """Aligned plain text: the machine, a GPU table, unknowns, then the verdict and next steps.

    `do_this=False` leaves out the verdict's advice: a written plan's next step replaces it.
    """
    lines = [f"{k:<10} {v}" for k, v in _machine_rows(facts)]
    lines += ["", *_align(_gpu_table(facts, verdicts))]
    lines += [f"unknown    {k}: {v}" for k, v in facts.unknown.items()]
    if verdicts is not None:
        lines += ["", f"{'verdict':<10} {verdicts.summary}"]
        lines += [f"{'warning':<10} {w}" for w in verdicts.warnings]
        if do_this and not verdicts.ok and verdicts.action not in verdicts.summary:
            lines.append(f"{'do this':<10} {verdicts.action}")
    lines += [f"{'next':<10} {s}" for s in next_steps or []]
    return "\n".join(lines).rstrip() + "\n"


def to_html(facts, verdicts=None, next_steps: list[str] | None = None, do_this: bool = True) -> str:
    """A self-contained HTML fragment (two tables and the verdict) for a notebook cell's output."""
    def e(text) -> str:  # a bidi override or a zero-width character is shown escaped in HTML too
        return html.escape(shown(str(text), limit=None))

    cell = "style='text-align:left;padding:2px 10px'"
    machine = "".join(f"<tr><th {cell}>{e(k)}</th><td {cell}>{e(str(v))}</td></tr>" for k, v in _machine_rows(facts))
    header, *rows = _gpu_table(facts, verdicts)
    gpu = f"<tr>{''.join(f'<th {cell}>{e(h)}</th>' for h in header)}</tr>"
    gpu += "".join(f"<tr>{''.join(f'<td {cell}>{e(c)}</td>' for c in row)}</tr>" for row in rows)
    parts = [f"<table>{machine}</table>", f"<table>{gpu}</table>"]
    parts += [f"<p><i>unknown</i> {e(k)}: {e(v)}</p>" for k, v in facts.unknown.items()]
    if verdicts is not None:
        color = "green" if verdicts.ok else "#b00"
        parts.append(f"<p style='color:{color}'><b>{e(verdicts.summary)}</b></p>")
        parts += [f"<p>⚠ {e(w)}</p>" for w in verdicts.warnings]
        if do_this and not verdicts.ok and verdicts.action not in verdicts.summary:
            parts.append(f"<p><b>Do this:</b> {e(verdicts.action)}</p>")
    parts += [f"<p><b>Next:</b> <code>{e(s)}</code></p>" for s in next_steps or []]
    return "<div class='kit-report'>" + "".join(parts) + "</div>"


def in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel), where HTML output renders."""
    ipython = sys.modules.get("IPython")  # never import IPython just to ask: it is slow
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def show(facts, verdicts=None, next_steps: list[str] | None = None, as_json: bool = False, plan=None,
         wrote: str | None = None) -> None:
    """Print the report in the form that suits where it runs: JSON, HTML in a notebook, else text.

    With a plan (bootstrap --config), the plan comes between the machine and the next steps;
    `wrote` (what bootstrap wrote) gets its own line just before the one `Next:` line, and the
    verdict's own advice is left out whenever there is a next step: that step replaces it.
    """
    # The verdict's own advice only when there is no next step: a next step (a written plan's launch,
    # the bootstrap that writes one) replaces it, so no two lines say what to do.
    do_this = not next_steps
    if as_json:
        print(to_json(facts, verdicts, next_steps, plan, wrote))
    elif in_notebook_kernel():
        from IPython.display import HTML, display

        from kit.redaction import redact

        # HTML goes to the notebook through display(), not stdout: scrub it here too.
        display(HTML(redact(to_html(facts, verdicts, None if plan is not None else next_steps, do_this))))
        # Also as text, so papermill's output notebooks and logs read without rendering HTML.
        if verdicts is not None:
            repeat = not do_this or verdicts.ok or verdicts.action in verdicts.summary
            print(verdicts.summary if repeat else f"{verdicts.summary}\nDo this: {verdicts.action}")
        if plan is not None:
            print(plan_to_text(plan, launch=False))  # the one next step follows
        _print_next(wrote, next_steps)
    elif plan is not None:
        print(to_text(facts, verdicts, None, do_this), end="")
        print(plan_to_text(plan, launch=not next_steps))
        _print_next(wrote, next_steps)
    else:
        print(to_text(facts, verdicts, next_steps, do_this), end="")


def _print_next(wrote: str | None, next_steps: list[str] | None) -> None:
    if wrote:
        print(shown(wrote[:1].upper() + wrote[1:], limit=None))  # it names the -o path
    for step in next_steps or []:
        print(f"Next: {step}")


def _machine_rows(facts) -> list[tuple[str, str]]:
    t = facts.torch
    if t.get("installed"):
        backend = f"CUDA {t['cuda']}" if t.get("cuda") else f"ROCm/HIP {t['hip']}" if t.get("hip") else "CPU only"
        arch = " ".join(t["arch_list"]) if t.get("arch_list") is not None else "unknown"
        torch = f"{t.get('version')} ({backend}; arch list: {arch or 'none'})"
    else:
        torch = "not installed"
    packages = ", ".join(f"{k} {v}" for k, v in facts.packages.items() if v) or "none of kit's"
    missing = [k for k, v in facts.packages.items() if not v]
    return [
        ("platform", f"{facts.platform} ({facts.platform_detected_by})"),
        ("python", facts.python),
        ("torch", torch),
        ("driver", f"{facts.driver or 'none'}" + (f" (GPUs via {facts.gpu_source})" if facts.gpu_source else "")),
        ("machine", f"{facts.cpu_count or '?'} CPUs, {_gib(facts.ram_bytes)} RAM, {_gib(facts.disk_free_bytes)} free disk here"),
        ("packages", packages + (f"; not installed: {', '.join(missing)}" if missing else "")),
        ("HF token", "available" if facts.hf_token_available else "not found"),
    ]


def _gpu_table(facts, verdicts) -> list[list[str]]:
    header = ["GPU", "name", "arch", "memory", "free"]
    by_index = {}
    if verdicts is not None:
        header += ["runs this torch", "bf16"]
        by_index = {g["index"]: g for g in verdicts.gpus}
    rows = [header]
    for g in facts.gpus:
        cap = g.get("capability") or "?"
        arch = f"sm_{cap.replace('.', '')} ({cap})" if g.get("vendor") == "nvidia" and cap != "?" else cap
        row = [str(g["index"]), g["name"], arch, _gib(g["memory_total_bytes"]), _gib(g.get("memory_free_bytes"))]
        if verdicts is not None:
            v = by_index.get(g["index"], {})
            row += [{True: "yes", False: "NO", None: "unchecked"}[v.get("arch_supported")],
                    "yes" if v.get("bf16") else "no (fp16)"]
        rows.append(row)
    if len(rows) == 1:
        rows.append(["-", "no GPU", "", "", ""] + (["", ""] if verdicts is not None else []))
    return rows


def _align(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


# The trainers other than sft, named in the plan's table (sft, the default, adds no row).
_TRAINER_CLASS = {"dpo": "DPOTrainer", "kto": "KTOTrainer", "grpo": "GRPOTrainer"}


def plan_to_text(plan, launch: bool = True) -> str:
    """The plan as aligned text: what, where, memory term by term, reasons, each node's command (several
    nodes), and (`launch`) the next command."""
    from kit.report.reasons import sentence, things

    nodes = getattr(plan, "nodes", 1) or 1
    cpu = plan.device == "cpu"
    where = plan_where(plan)
    world = plan.nproc * nodes
    rows = [("strategy", f"{plan.strategy} ({_strategy_words(plan, world)})")]
    if plan.strategy != "none":
        per = "process" if cpu else "step" if plan.strategy == "model_parallel" else "GPU"
        ranks = things(world, "process", "processes") + (f" ({nodes} nodes × {plan.nproc})" if nodes > 1 else "")
        rows += [("device", where), ("precision", plan.precision), ("quantization", plan.quantization or "-"),
                 ("backend", plan.backend), ("optimizer", plan.optimizer),
                 *([("trainer", f"{plan.trainer} (TRL's {_TRAINER_CLASS[plan.trainer]})")]
                   if plan.trainer in _TRAINER_CLASS else []),
                 ("gradient checkpointing", "on" if plan.gradient_checkpointing else "off"),
                 ("batch", f"{plan.per_device_batch} per {per} × {things(plan.grad_accum, 'accumulation step')} × "
                           f"{ranks} = {plan.global_batch}")]
    lines = [f"plan for {plan.model} on {where}"]
    lines += [f"  {k:<24}{v}" for k, v in rows]
    terms = plan.memory.get("terms") or {}
    if terms:
        unit = "process" if cpu else "GPU"
        lines.append(f"{'memory per ' + unit + ' (estimate)':<38}{'GiB':>10}")
        lines += [f"  {name:<36}{b / GIB:>10.2f}" for name, b in terms.items()]
        lines.append(f"  {'total':<36}{plan.memory['per_gpu_bytes'] / GIB:>10.2f}"
                     f"  of {plan.memory['budget_bytes'] / GIB:.2f}")
        lines += [f"  ({note})" for note in plan.memory.get("notes", [])]
    lines.append("reasons")
    lines += [f"  - {sentence(r)}" for r in plan.reasons]
    if getattr(plan, "node_launch", None):
        # Each node's own command is part of the plan: without them a job over several nodes cannot start.
        lines.append(("next, on" if launch else "on") + " each node (node 0 hosts the rendezvous; "
                     "`kit plan … --node-rank R` prints node R's alone):")
        lines += [f"  node {i}: {c}" for i, c in enumerate(plan.node_launch)]
        for name, text in plan.snippets.items():
            lines.append(f"or as a {'SLURM batch script' if name == 'slurm' else 'SkyPilot task'}:")
            lines += [f"  {line}" for line in text.splitlines()]
    elif plan.launch and launch:
        lines.append(f"next: {plan.launch}")
    return "\n".join(lines)


def plan_where(plan) -> str:
    """What a plan runs on: "2× Tesla T4", "2 nodes × 8× NVIDIA H100 80GB HBM3", "the CPU"."""
    if plan.device == "cpu":
        where = "the CPU"
    elif " + " in (plan.gpu or ""):  # a machine of mixed GPUs, refused: its mix
        where = plan.gpu
    elif plan.gpu:
        where = f"{plan.gpus or plan.nproc}× {plan.gpu}"
    else:
        where = "this machine"
    nodes = getattr(plan, "nodes", 1) or 1
    return f"{nodes} nodes × {where}" if nodes > 1 else where


def plan_summary(plan) -> str:
    """One line: "ddp over 2× Tesla T4 (a replica on each of 2 GPUs, one process each), fp16"."""
    world = plan.nproc * (getattr(plan, "nodes", 1) or 1)
    on = "on" if plan.device == "cpu" else "over"
    return f"{plan.strategy} {on} {plan_where(plan)} ({_strategy_words(plan, world)}), {plan.precision}"


def _strategy_words(plan, world: int) -> str:
    if plan.strategy == "none":
        return "no plan: the error line says why"
    if plan.device == "cpu":
        return ("one process" if world == 1 else
                f"{world} processes over gloo" + (", FSDP-sharded" if plan.strategy == "fsdp" else ""))
    return {"single": "one GPU, one process",
            "ddp": f"a replica on each of {world} GPUs, one process each",
            "fsdp": f"the model sharded over {world} GPUs, one process each",
            "model_parallel": f"the layers split over {plan.gpus} GPUs, one process"}.get(plan.strategy, "")
