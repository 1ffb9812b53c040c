"""What each speed-up of kit's plain backend buys, through the script `kit render` writes.

    python bench/speed.py --part fill --out bench/results/speed_h200_fill.json
    python bench/speed.py --part chat --out bench/results/speed_h200_chat.json
    python bench/speed.py --part chat --rows 320 --probe --repeat 3 --only unsloth_padding_free,unsloth_direct \
        --out bench/results/speed_h200_chat_pairs.json    # then: bench/ratios.py FILE --to unsloth_direct --from-step 2

Qwen3-8B shape (random weights), QLoRA nf4, LoRA r16 all-linear, seq_len 2048, micro-batch 4,
gradient checkpointing, one GPU, each configuration a fresh process, alone on the GPU.

- `fill`: every row longer than seq_len (8,192 trained tokens a step, bench/throughput.py's rows):
  plain bf16 (today's kit), + Liger kernels, + fused AdamW, and fp16 with loss scaling (the T4
  path, measured here as a proxy: the H200 runs fp16 and bf16 matmuls at the same rate, so this
  shows the cost of loss scaling and fp32 adapters, not a T4's speed).
- `chat`: one epoch over synthetic chat rows with LMSYS-Chat-1M's lengths (bench/chat_lengths.py),
  loss on the assistant turns only: padded (today's kit), grouped, padding_free, packed, and
  padding_free + Liger. Trained tokens/s = the epoch's loss-carrying tokens / the sum of all step
  times (warm-up steps included, the same for every row); padding fraction = pad tokens / tokens
  computed, from the batches that sampler forms over the same rows.

`liger_offload` is Liger with `activation_offloading=on` (TRL's activation offloading, which kit's
"auto" now picks where measured); `liger_offload_compile_on` adds kit's `compile=on` (torch.compile
of each decoder layer, Liger's RMSNorm left to inductor); `plain_compile_on` is compile alone.
(The `_casts` rows, in speed_h200_fill_compile_eager_rounding.json, were these two under
TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1, before kit's `compile` rounded as eager does itself.) A
candidate kit does not choose runs through bench/patched_run.py (fill: `liger_compile` and
`liger_offload_compile`, torch.compile of each decoder layer with Liger's RMSNorm kept).

Losses: the per-step training losses of each run are kept; padded and padding_free see the same
batches, so their curves are compared step by step; the others by their epoch mean.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import chat_lengths  # noqa: E402
from bench.gpu_common import (GIB, ROOT, TOKENIZER, common_overrides, make_long_text,  # noqa: E402
                              make_random_model, package_version, render, session_record)
from bench.throughput import run  # noqa: E402

SEQ, BATCH = 2048, 4  # the dry run: 1024, the tiny model's limit
LOSS = re.compile(r"['\"]loss['\"]:\s*['\"]?([0-9.]+)")


def losses(log: Path) -> list[float]:
    return [float(x) for x in LOSS.findall(log.read_text(errors="replace"))]


def probe_end(log: Path) -> dict | None:
    """The `[probe] end` record of a run under --probe (bench/trainer_probe.py), None without one."""
    ends = [line.split("[probe] end ", 1)[1] for line in log.read_text(errors="replace").splitlines()
            if "[probe] end " in line]  # after a progress bar's carriage return, on the same line
    return json.loads(ends[-1]) if ends else None


def padding_fraction(lengths: list[int], batching: str, seed: int = 42) -> float:
    """Pad tokens / tokens computed over one epoch of the batches this sampler forms."""
    import torch

    if batching in ("padding_free", "packed"):
        return 0.0
    g = torch.Generator().manual_seed(seed)
    if batching == "grouped":
        from transformers.trainer_pt_utils import get_length_grouped_indices

        order = get_length_grouped_indices(lengths, BATCH, generator=g)
    else:
        order = torch.randperm(len(lengths), generator=g).tolist()
    batches = [[lengths[i] for i in order[k:k + BATCH]] for k in range(0, len(order), BATCH)]
    computed = sum(max(b) * len(b) for b in batches)
    return round(1 - sum(lengths) / computed, 3)


# Rows that measure a speed-up through bench/patched_run.py before the planner may choose it.
PATCHED = {"liger_compile": "compile", "liger_offload_compile": "compile"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("fill", "chat"), required=True)
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--only", default="", help="comma-separated row names (default: all of the part)")
    p.add_argument("--steps", type=int, default=12, help="fill: steps per run")
    p.add_argument("--rows", type=int, default=256, help="chat: rows in the epoch")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no further configuration after this many seconds (a lent GPU's time limit)")
    p.add_argument("--out", required=True)
    p.add_argument("--probe", action="store_true",
                   help="print what each run's trainer settled and every step's time (bench/trainer_probe.py)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the rows this many times, every second pass in reverse order (rows `NAME@2`, ...): "
                        "whichever runs first in a fresh machine compiles kernels from cold caches")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU: the tiny model, LoRA in fp32, only the rows that need no GPU (checks the bench)")
    a = p.parse_args()

    import torch

    global SEQ
    if a.dry_run:
        SEQ = 1024
    work = Path(tempfile.mkdtemp(prefix="kit-speed-"))
    model = TOKENIZER if a.dry_run else make_random_model("Qwen/Qwen3-8B", Path(a.models) / "qwen3-8b")
    if a.part == "fill":
        data = make_long_text(Path(a.models) / "long.jsonl")
        base = common_overrides(model, data, work / "x", method="qlora", seq=SEQ, batch=BATCH, gc=True, steps=a.steps)
        configs = {"plain": [], "liger": ["kernels=liger"], "fused_adamw": ["optimizer=adamw_torch_fused"],
                   "fp16": ["precision=fp16"], "fp16_liger": ["precision=fp16", "kernels=liger"],
                   "unsloth": ["backend=unsloth"], "unsloth_direct": [],
                   "liger_offload": ["kernels=liger", "activation_offloading=on"], "liger_compile": ["kernels=liger"],
                   "liger_offload_compile": ["kernels=liger", "activation_offloading=on"],
                   "liger_offload_compile_on": ["kernels=liger", "activation_offloading=on", "compile=on"],
                   "plain_compile_on": ["compile=on"]}
        chat = None
    else:
        from transformers import AutoTokenizer

        from kit.train import data as kit_data

        tok = AutoTokenizer.from_pretrained(TOKENIZER)
        data = chat_lengths.write(Path(a.models) / f"chat-{a.rows}.jsonl", a.rows, tok)
        rows = [kit_data.tokenize_row(json.loads(line), "messages", {"messages": "messages"}, tok, SEQ)
                for line in open(data)]
        lengths = [len(r["input_ids"]) for r in rows]
        chat = chat_lengths.stats(lengths, [sum(r["completion_mask"]) for r in rows])
        base = common_overrides(model, data, work / "x", method="qlora", seq=SEQ, batch=BATCH, gc=True, steps=1)
        # One epoch, no checkpoint saves inside it (reference_unsloth.py saves none either).
        base = [o for o in base if not o.startswith(("max_steps=", "data.format=", "save_steps="))] + [
            "max_steps=null", "epochs=1", "data.format=messages", "save_steps=100000"]
        configs = {"padded": ["batching=padded"], "grouped": ["batching=grouped"],
                   "padding_free": ["batching=padding_free"], "packed": ["batching=packed"],
                   "padding_free_liger": ["batching=padding_free", "kernels=liger"],
                   "packed_liger": ["batching=packed", "kernels=liger"],
                   "padding_free_liger_compile_on": ["batching=padding_free", "kernels=liger", "compile=on"],
                   "unsloth": ["backend=unsloth", "batching=padded"],
                   "unsloth_padding_free": ["backend=unsloth", "batching=padding_free"],
                   "unsloth_packed": ["backend=unsloth", "batching=packed"], "unsloth_direct": []}
    if a.dry_run:
        base = [o for o in base if o not in ("method=qlora", "precision=bf16", "gradient_checkpointing=on")] + [
            "method=lora", "precision=fp32", "gradient_checkpointing=off"]
        configs = {k: v for k, v in configs.items() if not any("liger" in o or "fp16" in o or "fused" in o for o in v)}
    wanted = [n for n in (a.only.split(",") if a.only else configs)]
    unknown = [n for n in wanted if n not in configs]
    if unknown:
        raise SystemExit(f"no row {unknown[0]!r} in --part {a.part}: it has {', '.join(configs)}")
    runs = [(n, k) for k in range(1, a.repeat + 1) for n in (wanted if k % 2 else wanted[::-1])]
    base_fixed = ["kernels=none", "optimizer=adamw_torch", "batching=padded", "activation_offloading=off", "compile=off"]
    rows_out = []
    started = time.monotonic()
    for config, k in runs:
        name = config if k == 1 else f"{config}@{k}"
        if a.budget_s and time.monotonic() - started > a.budget_s - 60:
            print(f"[bench] {name} skipped: less than a run's time left of --budget-s {a.budget_s:.0f}", flush=True)
            continue
        out = work / name.replace("@", "_pass")
        if config == "unsloth_direct":
            rows_out.append(direct_row(a, model, data, work, chat, name))
            write(a, chat, rows_out, torch)
            continue
        overrides = [o if not o.startswith("output_dir=") else f"output_dir={out}" for o in base]
        overrides += base_fixed + configs[config]
        if any(o.startswith("precision=") for o in configs[config]):
            overrides = [o for o in overrides if o != "precision=bf16"]
        script = work / f"kit_{out.name}.py"  # never unsloth.py: the script's folder comes first on sys.path
        plan = render(overrides, script, gpus="cpu" if a.dry_run else "1xH200")
        log = work / f"{out.name}.log"
        patch = PATCHED.get(config) or ("probe" if a.probe else None)  # bench/patched_run.py
        argv = [sys.executable, str(script)] if patch is None else [
            sys.executable, str(ROOT / "bench" / "patched_run.py"), patch, str(script)]
        try:
            run(argv, log, a.timeout)
        except SystemExit as e:  # one configuration failing (a kernel that does not load) is a result too
            rows_out.append({"name": name, "overrides": configs[config], "error": str(e)[-1500:]})
            print(f"[bench] {name} failed: {str(e)[-1500:]}", flush=True)
            write(a, chat, rows_out, torch)
            continue
        rec = session_record(out)
        r = {"name": name, "overrides": configs[config], "step_s_median": rec.get("step_s"),
             "steps_run": rec.get("steps_run"), "total_step_s": rec.get("total_step_s"),
             "peak_allocated_gib": round(rec.get("peak_allocated_bytes", 0) / GIB, 2),
             "peak_reserved_gib": round(rec.get("peak_reserved_bytes", 0) / GIB, 2),
             "estimate_allocated_gib": round(plan["memory"]["allocated_bytes"] / GIB, 2),
             "losses": losses(log), "probe": probe_end(log)}
        if a.part == "fill":
            r["tokens_per_s"] = rec["tokens_per_s"]
        else:
            r["trained_tokens_per_s"] = round(chat["trained_tokens"] / rec["total_step_s"], 1)
            r["padding_fraction"] = padding_fraction(lengths, next(
                o.split("=")[1] for o in configs[config] if o.startswith("batching=")))
        rows_out.append(r)
        print(f"[bench] {json.dumps({k: v for k, v in r.items() if k not in ('losses', 'probe')})}", flush=True)
        write(a, chat, rows_out, torch)  # after every row: a run cut off at its time limit keeps what it had
    return 0


def direct_row(a, model, data, work: Path, chat: dict | None, name: str = "unsloth_direct") -> dict:
    """Unsloth driven directly (bench/reference_unsloth.py) on the same model and rows."""
    slug = name.replace("@", "_pass")
    result = work / f"{slug}.json"
    argv = [sys.executable, str(ROOT / "bench" / "reference_unsloth.py"), "--model", str(model), "--data", str(data),
            "--seq-len", str(SEQ), "--batch", str(BATCH), "--steps", str(a.steps), "--out", str(result)]
    try:
        flags = (["--chat"] if chat else []) + (["--probe"] if a.probe else [])
        run(argv + flags, work / f"{slug}.log", a.timeout)
    except SystemExit as e:
        print(f"[bench] {name} failed: {str(e)[-1500:]}", flush=True)
        return {"name": name, "overrides": [], "error": str(e)[-1500:]}
    rec = json.loads(result.read_text())
    r = {"name": name, "overrides": [], "driver": "bench/reference_unsloth.py" + (" --chat" if chat else ""),
         "step_s_median": rec["step_s"], "steps_run": rec["steps_run"], "total_step_s": rec["total_step_s"],
         "peak_allocated_gib": round(rec["peak_allocated_bytes"] / GIB, 2),
         "peak_reserved_gib": round(rec["peak_reserved_bytes"] / GIB, 2), "estimate_allocated_gib": None,
         "padding_free": rec.get("padding_free"), "losses": rec.get("losses"),
         "probe": probe_end(work / f"{slug}.log")}
    if chat:
        # kit's count of trained tokens over the same rows, so the ratio to kit's rows is like for like;
        # the driver's own count (Unsloth's response masking of the chat template's text) beside it.
        r["trained_tokens_per_s"] = round(chat["trained_tokens"] / rec["total_step_s"], 1)
        r["driver_trained_tokens"] = rec.get("trained_tokens")
        r["driver_trained_tokens_per_s"] = rec.get("trained_tokens_per_s")
    else:
        r["tokens_per_s"] = rec["tokens_per_s"]
    print(f"[bench] {json.dumps({k: v for k, v in r.items() if k not in ('losses', 'probe')})}", flush=True)
    return r


def write(a, chat, rows_out, torch) -> None:
    key = "tokens_per_s" if a.part == "fill" else "trained_tokens_per_s"
    done = [r for r in rows_out if "error" not in r]
    first = done[0] if done else None
    for r in done:
        r["vs_" + first["name"]] = round(r[key] / first[key], 3)
        if r["losses"] and first["losses"]:
            n = min(len(r["losses"]), len(first["losses"]))
            r["loss_mean"] = round(statistics.mean(r["losses"]), 4)
            if r["steps_run"] == first["steps_run"]:
                r["loss_max_abs_diff_per_step_vs_" + first["name"]] = round(
                    max(abs(x - y) for x, y in zip(r["losses"][:n], first["losses"][:n])), 4)
    result = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "part": a.part, "data": chat,
              "data_source": chat_lengths.SOURCE if chat else "text rows longer than seq_len",
              "machine": platform.node(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
              "versions": {m: package_version(m) for m in ("transformers", "trl", "peft", "bitsandbytes", "liger_kernel")},
              "rows": rows_out}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for r in done:
        print(f"[bench] {r['name']:<22} {r[key]:>9,.0f} {key}  {r['peak_allocated_gib']:6.2f} GiB "
              f"(estimate {r['estimate_allocated_gib'] or 0:.2f})  {r['vs_' + first['name']]:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
