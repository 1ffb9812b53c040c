"""How far a 16-bit LoRA merge is from exact, against how far 16-bit inference is anyway; and wrong merges.

    python bench/export_error.py --shape Qwen/Qwen3-0.6B --out bench/results/export_error_0.6b_cpu.json

A random-weight model of `--shape` (kit's table, bf16) and a random LoRA r16 all-linear adapter
(bench/eval_export_gpu.py's), on the CPU. The reference: base + adapter unmerged in fp32 arithmetic
from the same stored weights (kit.deliver.merge_check.fp32_compute). Against it, RMS and max |Δ| of
the logits on kit export's prompts for:
- `unmerged_bf16`: base + adapter unmerged in bf16 (what 16-bit inference costs anyway: the noise);
- `peft_merge_bf16`: PEFT's merge_and_unload (update rounded to bf16, then added in bf16);
- `merge_once_bf16`: the alternative (W + update formed in fp32, rounded once);
- wrong merges: adapter dropped, update scaled 2×, one module type (down_proj) not merged, and the
  merge rounded to 4 bits (NF4, blocks of 64, simulated in torch: bitsandbytes' CPU path is not
  needed to know the size of 4-bit rounding).
Each row also carries kit's verdict (kit.deliver.merge_check.judge). Logits of the merged variants
are computed in memory (the saved-and-reloaded folder holds the same bf16 tensors).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]


def nf4_round(w, block: int = 64):
    import torch

    flat = w.float().reshape(-1, block)
    scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    levels = torch.tensor(NF4)
    idx = ((flat / scale).unsqueeze(-1) - levels).abs().argmin(-1)
    return (levels[idx] * scale).reshape(w.shape).to(w.dtype)


def merge_once(peft_model):
    """Each LoRA module merged as round16(W + scaling · B·A), the sum formed in fp32: one rounding."""
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    for module in list(peft_model.modules()):
        if isinstance(module, LoraLinear):
            weight = module.get_base_layer().weight
            delta = torch.zeros(weight.shape, dtype=torch.float32)
            for name in module.active_adapters:
                update = module.lora_B[name].weight.float() @ module.lora_A[name].weight.float()
                delta += (update.T if module.fan_in_fan_out else update) * module.scaling[name]
            weight.data = (weight.data.float() + delta).to(weight.dtype)
    return peft_model.unload()


def variant(peft_model, how: str):
    """A merged copy of `peft_model` (deep copy: the original stays for the next variant)."""
    m = copy.deepcopy(peft_model)
    if how == "peft_merge_bf16":
        return m.merge_and_unload()
    if how == "merge_once_bf16":
        return merge_once(m)
    if how == "adapter_dropped":
        return m.unload()
    for name, module in m.named_modules():
        if hasattr(module, "scaling") and hasattr(module, "lora_A"):
            for k in module.scaling:
                if how == "scaling_2x":
                    module.scaling[k] *= 2
                if how == "down_proj_missing" and name.endswith("down_proj"):
                    module.scaling[k] = 0.0
    merged = m.merge_and_unload()  # PEFT's merge of the altered adapter: what a wrong merge would save
    if how == "merged_4bit":
        for name, p in merged.named_parameters():
            if p.dim() == 2 and ".layers." in name:
                p.data = nf4_round(p.data)
    return merged


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="Qwen/Qwen3-0.6B")
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="peft_merge_bf16,merge_once_bf16,adapter_dropped,scaling_2x,"
                                         "down_proj_missing,merged_4bit")
    a = p.parse_args()

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.eval_export_gpu import random_adapter
    from bench.gpu_common import make_random_model
    from kit.deliver import merge_check
    from kit.deliver.export import prompts_for

    torch.manual_seed(0)
    started = time.monotonic()
    model_dir = make_random_model(a.shape, Path(a.models) / a.shape.split("/")[-1].lower())
    adapter = random_adapter(model_dir, Path(tempfile.mkdtemp(prefix="kit-adapter-")))
    tok = AutoTokenizer.from_pretrained(adapter)
    prompts = prompts_for(adapter, tok)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    sixteen = merge_check.logits(peft_model, prompts)
    with merge_check.fp32_compute(peft_model):
        ref = merge_check.logits(peft_model, prompts)
    rows = {"unmerged_bf16": merge_check.judge(sixteen, ref, sixteen)}
    for how in a.variants.split(","):
        t = time.monotonic()
        merged = variant(peft_model, how)
        rows[how] = {**merge_check.judge(merge_check.logits(merged, prompts), ref, sixteen),
                     "seconds": round(time.monotonic() - t, 1)}
        del merged
        print(f"[bench] {how}: {json.dumps(rows[how])}", flush=True)
    result = {"what": __doc__.splitlines()[0], "shape": a.shape, "machine": platform.node(),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "prompts": len(prompts),
              "adapter": "bench/eval_export_gpu.py random_adapter: LoRA r16 alpha 32 all-linear, A ~ N(0, 1/n_in), "
                         "B ~ N(0, 1e-6)", "rows": rows, "wall_s": round(time.monotonic() - started, 1),
              "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, r in rows.items():
        print(f"[bench] {name:<18} rms {r['rms_logit_error']:.4g}  ×noise {r['error_vs_noise'] or 0:.2f}  "
              f"max {r['max_abs_logit_diff']:.3g}  top1 {r['top1_agreement']}  passed {r['passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
