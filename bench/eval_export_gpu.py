"""What the finished job costs on the 8B shape: baseline + final evaluation against the training, and export.

    python bench/eval_export_gpu.py --models /tmp/kit-models --out bench/results/eval_export_h200.json

1. The generated script on the Qwen3-8B shape (random weights), as configs/qwen3-8b-qlora-kaggle-t4x2.yaml
   trains it: QLoRA nf4, LoRA r16 all-linear, the HA chat data, seq_len 512, global batch 16,
   `--steps` steps. The job evaluates before the first step and after the last (43 held-out rows:
   loss, exact match by greedy generation, 5 samples) and writes final/. From its records: the
   median step time and both evaluation times; extrapolated to a 1000-step job:
   fraction = (baseline + final) / (1000 × step + baseline + final). Random weights never emit an
   end token, so every answer runs to its token limit: an upper bound on the evaluation time.
2. `kit export` on the CPU, as on Kaggle (a T4 cannot hold 8B in 16-bit), of a random LoRA r16
   all-linear adapter of the same shape as the job's (written directly, so the export runs beside
   the job instead of after it: device minutes are few): time per phase and the peak resident
   memory of the export process (ru_maxrss of its own interpreter), against Kaggle's ~29 GB.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import ROOT, bench_env, make_random_model, render, session_record, tail  # noqa: E402

KAGGLE_RAM_GB = 29.0


def run(argv: list[str], log: Path, timeout: float) -> float:
    started = time.monotonic()
    with open(log, "w") as f:
        done = subprocess.run(argv, cwd=ROOT, env=bench_env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({done.returncode}):\n{tail(log)}")
    return time.monotonic() - started


def random_adapter(model: Path, out: Path, r: int = 16) -> Path:
    """A LoRA r16 all-linear adapter for `model` with random A and B (B != 0, so the merge changes weights)."""
    import torch
    from safetensors.torch import save_file

    from bench.gpu_common import TOKENIZER, TOKENIZER_FILES

    c = json.loads((model / "config.json").read_text())
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
              "self_attn.o_proj": (q, h), "mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter),
              "mlp.down_proj": (inter, h)}
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(c["num_hidden_layers"]):
        for name, (n_in, n_out) in shapes.items():
            key = f"base_model.model.model.layers.{i}.{name}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(r, n_in, generator=g) / n_in**0.5).to(torch.float32)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(n_out, r, generator=g) * 1e-3).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model), "r": r,
        "lora_alpha": 2 * r, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": sorted({n.split(".")[1] for n in shapes}), "inference_mode": True}))
    for name in TOKENIZER_FILES:
        if (TOKENIZER / name).exists():
            (out / name).write_bytes((TOKENIZER / name).read_bytes())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--work", default="/tmp/kit-eval-export")
    p.add_argument("--out", default="bench/results/eval_export_h200.json")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--method", default="qlora", help="lora: a CPU dry run of this script on a tiny model")
    p.add_argument("--skip-export", action="store_true")
    p.add_argument("--export-only", action="store_true", help="part 2 alone (the export on the CPU)")
    a = p.parse_args()
    work, out_json = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"what": __doc__.splitlines()[0], "machine": platform.node(), "steps": a.steps}

    def save():
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(result, indent=1))

    import torch

    result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    started = time.monotonic()
    model = make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b")
    result["make_model_s"] = round(time.monotonic() - started, 1)
    job = work / "job"
    overrides = [f"model={model}", f"method={a.method}", "backend=transformers", "seq_len=512", "global_batch=16", f"max_steps={a.steps}",
                 "warmup_steps=0", "logging_steps=1", "eval_steps=null", f"save_steps={10 * a.steps}",
                 f"output_dir={job}", "precision=" + ("bf16" if a.method == "qlora" else "auto")]
    export_proc = None
    if not a.skip_export:
        adapter = random_adapter(model, work / "adapter")
        merged = work / "merged"
        # Its own interpreter, so ru_maxrss is the export's alone; CPU only, as on Kaggle.
        probe = ("import resource, sys, time; t = time.monotonic(); from kit.cli import main; rc = main(sys.argv[1:]); "
                 "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
                 "'WALL_S', round(time.monotonic() - t, 1)); sys.exit(rc)")
        export_proc = subprocess.Popen(
            [sys.executable, "-c", probe, "export", "--adapter", str(adapter), "-o", str(merged), "--json"],
            cwd=ROOT, env=bench_env(CUDA_VISIBLE_DEVICES=""), stdout=open(work / "export.log", "w"),
            stderr=subprocess.STDOUT)
    if a.export_only:
        result["job"] = "not run (--export-only)"
    script = work / "train.py"
    if not a.export_only:
        render(["method=qlora", "seq_len=512", "global_batch=16"], script)
    if not a.export_only:
        result["job_wall_s"] = round(run([sys.executable, str(script), *overrides], work / "job.log", 420), 1)
        session = session_record(job)
        evals = json.loads((job / "final" / "eval_results.json").read_text())
        b, f = evals["baseline"]["result"]["seconds"], evals["final"]["result"]["seconds"]
        step = session["step_s"]
        result["train"] = {k: session.get(k) for k in ("step_s", "tokens_per_s", "steps_timed", "peak_allocated_bytes")}
        result["eval"] = {"baseline_s": b, "final_s": f, "rows": evals["final"]["result"]["rows"],
                          "metric": evals["final"]["result"]["metric"], "samples": len(evals["final"]["result"]["samples"])}
        result["fraction_of_1000_step_job"] = round((b + f) / (1000 * step + b + f), 4)
        result["log_tail"] = [ln for ln in (work / "job.log").read_text().splitlines() if ln.startswith("[kit]")][-12:]
        save()
        print(json.dumps(result, indent=1), flush=True)
    if export_proc is None:
        return
    try:
        export_proc.wait(timeout=540)
    except subprocess.TimeoutExpired:
        export_proc.kill()
        raise SystemExit(f"export ran over 540 s:\n{tail(work / 'export.log')}") from None
    text = (work / "export.log").read_text(errors="replace")
    if "PEAK_RSS_KIB" not in text:  # it died before the probe could print (killed, out of memory)
        raise SystemExit(f"export failed ({export_proc.returncode}):\n{tail(work / 'export.log')}")
    peak_kib, wall = int(text.split("PEAK_RSS_KIB")[1].split()[0]), float(text.split("WALL_S")[1].split()[0])
    # A refused merge (its verification) has still loaded, merged, saved and reloaded: its time and
    # peak memory are the export's; the refusal is recorded beside them instead of losing both.
    error = next((ln for ln in text.splitlines() if ln.startswith("error:")), None)
    report = (json.loads(text[text.index("{\n"):text.index("PEAK_RSS_KIB")])
              if export_proc.returncode == 0 else {"exit_code": export_proc.returncode, "error": error})
    shards = sorted(p.name for p in merged.glob("*.safetensors"))
    result["export"] = {"wall_s": round(wall, 1), "peak_rss_gib": round(peak_kib / 2**20, 2),
                        "fits_kaggle_29gb": peak_kib * 1024 / 1e9 < KAGGLE_RAM_GB,
                        "shards": len(shards), "merged_bytes": sum(p.stat().st_size for p in merged.glob("*.safetensors")),
                        **{k: report.get(k) for k in ("load_s", "merge_save_s", "verify_s", "max_abs_logit_diff",
                                                      "tolerance", "top1_agreement", "positions", "exit_code", "error",
                                                      "rms_logit_error", "rms_noise_16bit_unmerged", "error_vs_noise",
                                                      "max_abs_noise_16bit_unmerged", "max_abs_logit",
                                                      "top1_positions_counted", "rule")
                           if k in report}}
    save()
    print(json.dumps(result["export"], indent=1))


if __name__ == "__main__":
    main()
