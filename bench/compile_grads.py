"""Where kit's `compile=on` moves the loss curve: each LoRA gradient of the first steps, eager against compiled.

    python bench/compile_grads.py --out bench/results/compile_grads_h200.json     # the H200: Qwen3-8B QLoRA
    python bench/compile_grads.py --dry-run --out /tmp/compile_grads.json         # the CPU: checks the bench

On the H200 the loss with torch.compile of the decoder layers sits below the eager one from the
second step on (0.78 % on average with Liger, 3.95 % at most alone; bench/results/
speed_h200_cold_caches_summary.json) while the first step's loss is the same, so the first update
differs. On the CPU, with and without a 4-bit base, the two agree to 1e-5 (tests/test_modeling.py).

This runs kit's own script (bench/speed.py's fill rows and shape) for --steps steps: `compile=off`
twice (the spread of the GPU's own nondeterminism) and `compile=on`, with gradient checkpointing on
and off (where checkpointing's recompute meets the compiled graph), each a fresh process with cold
compile caches. Before each optimizer step it records every trainable tensor's gradient norm,
exact zeros and dtype (bench/patched_run.py `grads`; after clipping to max_grad_norm, so the log's
grad_norm, from before it, is kept too), and it compares the first step's gradients tensor by
tensor: cosine and sign agreement per projection (Adam's first step moves each weight by the
learning rate in its gradient's sign). Also per step: the tensors whose gradient norms differ most
and the all-zero tensors in each run (all zero in one run only would be a path cut). On the CPU the
planner runs compile=on eagerly, so a dry run checks the plumbing only.

Result (bench/results/compile_grads_h200.json): checkpointing on or off changes nothing;
the first step's LoRA B gradients agree (cosine ≥ 0.9996, signs 98.5-99.8 %), yet the second loss
is 12.02 against 12.48, so the compiled forward differed once the adapters were non-zero: inductor
kept fused intermediates (the LoRA sums) in fp32 where eager rounds to bf16. Rounding as eager does
(kit.train.modeling.compile_layers) brings the curves within 0.04 % (speed_h200_fill_compile_eager_rounding.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import ROOT, TOKENIZER, common_overrides, make_long_text, make_random_model, render  # noqa: E402
from bench.speed import BATCH, losses  # noqa: E402
from bench.throughput import run  # noqa: E402

GRAD_NORM = re.compile(r"['\"]grad_norm['\"]:\s*['\"]?([0-9.eE+-]+)")


def one(name: str, extra: list[str], a, model: Path, data: Path, work: Path, gc: bool) -> dict:
    out, grads = work / name, work / f"{name}_grads.json"
    seq = 1024 if a.dry_run else 2048
    overrides = common_overrides(model, data, out, method="lora" if a.dry_run else "qlora", seq=seq, batch=BATCH,
                                 gc=gc, steps=a.steps)
    overrides += ["kernels=none", "optimizer=adamw_torch", "batching=padded", "activation_offloading=off", *extra]
    if a.dry_run:
        overrides = [o for o in overrides if o != "precision=bf16"] + ["precision=fp32"]
    script = work / f"kit_{name}.py"
    render(overrides, script, gpus="cpu" if a.dry_run else "1xH200")
    log = work / f"{name}.log"
    tensors = work / f"{name}_first_grads.pt"
    # The run's environment is this one's (gpu_common.bench_env).
    os.environ.update(KIT_GRADS_OUT=str(grads), KIT_GRADS_TENSORS=str(tensors))
    run([sys.executable, str(ROOT / "bench" / "patched_run.py"), "grads", str(script)], log, a.timeout)
    text = log.read_text(errors="replace")
    return {"losses": losses(log), "grad_norms": [float(x) for x in GRAD_NORM.findall(text)],
            "steps": json.loads(grads.read_text())["steps"], "tensors": tensors}


def first_step_agreement(first: Path, second: Path) -> dict:
    """The first step's gradients, eager against compiled, by projection (q_proj, …, lora_A/lora_B):
    cosine similarity, and the share of elements whose signs agree (Adam's first step moves each
    weight by the learning rate in its gradient's sign, so that share is what the first update shares)."""
    import torch

    e, c = torch.load(first), torch.load(second)
    groups: dict[str, list] = {}
    for name in sorted(set(e) & set(c)):
        parts = name.split(".")
        kind = ".".join(p for p in parts if p.endswith("_proj") or p in ("lora_A", "lora_B")) or name
        a, b = e[name].flatten(), c[name].flatten()
        both = (a != 0) | (b != 0)
        groups.setdefault(kind, []).append((torch.nn.functional.cosine_similarity(a, b, dim=0).item()
                                            if a.norm() > 0 and b.norm() > 0 else None,
                                            ((a.sign() == b.sign()) & both).sum().item(), both.sum().item()))
    out = {}
    for kind, vals in groups.items():
        cos = [v[0] for v in vals if v[0] is not None]
        out[kind] = {"tensors": len(vals), "cosine_min": round(min(cos), 4) if cos else None,
                     "cosine_mean": round(sum(cos) / len(cos), 4) if cos else None,
                     "sign_agreement": round(sum(v[1] for v in vals) / nonzero, 4)
                     if (nonzero := sum(v[2] for v in vals)) else None}  # None: all zero in both (lora_A at step 1)
    return out


def compare(first: dict, second: dict, top: int = 12) -> list[dict]:
    """Step by step, two runs' gradient records (`one`): first's figures under "eager", second's under "compiled"."""
    out = []
    for i, (e, c) in enumerate(zip(first["steps"], second["steps"])):
        rel = sorted(((abs(e[n][0] - c[n][0]) / (e[n][0] or 1e-30), n) for n in e if n in c), reverse=True)
        out.append({"step": i + 1,
                    "tensors": len(e), "only_in_one": sorted(set(e) ^ set(c)),
                    "zeros_eager": sum(v[1] for v in e.values()), "zeros_compiled": sum(v[1] for v in c.values()),
                    "all_zero_eager": sum(v[1] == v[2] for v in e.values()),
                    "all_zero_compiled": sum(v[1] == v[2] for v in c.values()),
                    "norm_eager": sum(v[0] ** 2 for v in e.values()) ** 0.5,
                    "norm_compiled": sum(v[0] ** 2 for v in c.values()) ** 0.5,
                    "dtypes": sorted({v[3] for v in e.values()}),
                    "most_apart": [{"tensor": n, "rel_norm_diff": round(r, 4), "eager": e[n][0], "compiled": c[n][0]}
                                   for r, n in rel[:top]]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpointing", default="on,off", help="gradient checkpointing settings to compare under")
    p.add_argument("--dry-run", action="store_true", help="on the CPU: the tiny model, LoRA in fp32")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kit-compile-grads-"))
    model = TOKENIZER if a.dry_run else make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b")
    data = make_long_text(Path(a.models) / "long.jsonl")
    result = {"what": __doc__.split("\n\n")[1].replace("\n", " ")}
    for gc in [c == "on" for c in a.checkpointing.split(",")]:
        tag = "checkpointing_" + ("on" if gc else "off")
        runs = {name: one(f"{name}_{tag}", [f"compile={'on' if name == 'compiled' else 'off'}"], a, model, data, work, gc)
                for name in ("eager", "eager_again", "compiled")}
        result[tag] = {
            "losses": {k: r["losses"] for k, r in runs.items()},
            "grad_norms_before_clipping": {k: r["grad_norms"] for k, r in runs.items()},
            # The same eager run twice: how far GPU kernels' own nondeterminism moves the gradients.
            **{f"{x}_vs_{y}": {"steps": compare(runs[x], runs[y]),
                               "first_step_by_projection": first_step_agreement(runs[x]["tensors"], runs[y]["tensors"])}
               for x, y in (("eager", "eager_again"), ("eager", "compiled"))}}
        for pair in ("eager_vs_eager_again", "eager_vs_compiled"):
            for s in result[tag][pair]["steps"]:
                print(f"[bench] {tag} {pair} step {s['step']}: norm {s['norm_eager']:.4g} vs {s['norm_compiled']:.4g}; "
                      f"all-zero tensors {s['all_zero_eager']} vs {s['all_zero_compiled']}; most apart "
                      f"{s['most_apart'][0] if s['most_apart'] else None}")
            for kind, agreement in result[tag][pair]["first_step_by_projection"].items():
                print(f"[bench] {tag} {pair} first step {kind}: {agreement}")
        print(f"[bench] {tag} losses {result[tag]['losses']}; grad_norm {result[tag]['grad_norms_before_clipping']}")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")  # after each setting: a cut run keeps it
    return 0


if __name__ == "__main__":
    sys.exit(main())
