"""Where kit's `compile=on` moves the loss curve: each LoRA gradient of the first steps, eager against compiled.

    python bench/compile_grads.py --out bench/results/compile_grads_h200.json     # the H200: Qwen3-8B QLoRA
    python bench/compile_grads.py --dry-run --out /tmp/compile_grads.json         # the CPU: checks the bench

On the H200 the loss with torch.compile of the decoder layers sits below the eager one from the
second step on (0.78 % on average with Liger, 3.95 % at most alone; bench/results/
speed_h200_session9_summary.json) while the first step's loss is the same, so the first update
differs. On the CPU, with and without a 4-bit base, the two agree to 1e-5 (tests/test_modeling.py).
This runs kit's own script (bench/speed.py's fill rows and shape) for --steps steps, with
`compile=off` and `compile=on`, each a fresh process with cold compile caches, and records before
each optimizer step every trainable tensor's gradient norm, exact zeros and dtype
(bench/patched_run.py `grads`; after clipping to max_grad_norm, so the log's grad_norm, before it,
is kept too), and compares the first step's gradients tensor by tensor: cosine and sign agreement
per projection (Adam's first step moves each weight by the learning rate in its gradient's sign). Reported per step: the losses, the tensors whose gradient norms
differ most, and the zeros in each run (a gradient that is all zero in one run and not the other
would be a path cut in one of them). On the CPU the planner runs compile=on eagerly, so a dry run
checks the plumbing only.
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

GRAD_NORM = re.compile(r"['\"]grad_norm['\"]:\s*['\"]?([0-9.eE+-]+)")
from bench.throughput import run  # noqa: E402


def one(name: str, extra: list[str], a, model: Path, data: Path, work: Path) -> dict:
    out, grads = work / name, work / f"{name}_grads.json"
    seq = 1024 if a.dry_run else 2048
    overrides = common_overrides(model, data, out, method="lora" if a.dry_run else "qlora", seq=seq, batch=BATCH,
                                 gc=True, steps=a.steps)
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


def first_step_agreement(eager: Path, compiled: Path) -> dict:
    """The first step's gradients, eager against compiled, by projection (q_proj, …, lora_A/lora_B):
    cosine similarity, and the share of elements whose signs agree (Adam's first step moves each
    weight by the learning rate in its gradient's sign, so that share is what the first update shares)."""
    import torch

    e, c = torch.load(eager), torch.load(compiled)
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


def compare(eager: dict, compiled: dict, top: int = 12) -> list[dict]:
    out = []
    for i, (e, c) in enumerate(zip(eager["steps"], compiled["steps"])):
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
    p.add_argument("--dry-run", action="store_true", help="on the CPU: the tiny model, LoRA in fp32")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kit-compile-grads-"))
    model = TOKENIZER if a.dry_run else make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b")
    data = make_long_text(Path(a.models) / "long.jsonl")
    eager = one("eager", ["compile=off"], a, model, data, work)
    compiled = one("compiled", ["compile=on"], a, model, data, work)
    result = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "losses": {"eager": eager["losses"],
              "compiled": compiled["losses"]},
              "grad_norms_before_clipping": {"eager": eager["grad_norms"], "compiled": compiled["grad_norms"]},
              "steps": compare(eager, compiled),
              "first_step_by_projection": first_step_agreement(eager["tensors"], compiled["tensors"])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for s in result["steps"]:
        print(f"[bench] step {s['step']}: norm {s['norm_eager']:.4g} vs {s['norm_compiled']:.4g}; all-zero tensors "
              f"{s['all_zero_eager']} vs {s['all_zero_compiled']}; zeros {s['zeros_eager']} vs {s['zeros_compiled']}; "
              f"most apart {s['most_apart'][0] if s['most_apart'] else None}")
    print(f"[bench] losses eager {eager['losses']} compiled {compiled['losses']}")
    print(f"[bench] grad_norm eager {eager['grad_norms']} compiled {compiled['grad_norms']}")
    for kind, agreement in result["first_step_by_projection"].items():
        print(f"[bench] first step {kind}: {agreement}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
