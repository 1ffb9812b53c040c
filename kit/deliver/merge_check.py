"""How `kit export` merges a LoRA into 16-bit weights, and how it knows the merge is right.

The merge is PEFT's `merge_and_unload`. It rounds the update to 16 bits and then adds it in 16
bits (rounding twice); forming W + update in fp32 and rounding once was measured no closer to the
exact model (0.6B shape: RMS logit error 0.01018 both ways, bench/results/export_error_*.json).

The check (`judge`). A merged 16-bit model cannot equal base + adapter bit for bit: rounding the
merged weights to 16 bits is an error of the same kind as computing base + adapter in 16 bits at
all, and on a deep model both grow far past any fixed share of the largest logit (measured on
random-weight Qwen3 shapes: bench/results/export_error_*.json). So the reference is base + adapter
unmerged computed in fp32 arithmetic from the same stored weights (`fp32_compute`: each linear
layer's weight upcast while it runs, so the 8B still needs only its 16-bit size in RAM), and the
yardstick is the error of base + adapter unmerged in 16 bits against that reference: the noise
that 16-bit inference has anyway. The merged model passes when its RMS logit error is within
`NOISE_FACTOR` × that noise. A wrong merge (adapter dropped, scaled twice, a module type left out,
merged into 4-bit weights) is off by the adapter's own effect or by 4-bit rounding. What no logit
check can see is a wrong merge whose effect is itself within 16-bit noise: with the small random
adapter of bench/export_error.py, leaving down_proj out moved the logits by 1.07× the noise on the
8B shape (1.15× on the 0.6B), so it passes there; such a model is as close to base + adapter as
16-bit inference of base + adapter itself is.

Greedy agreement is counted only at positions where the reference's top-1 token leads the
runner-up by more than the largest 16-bit noise seen at any position: at a near-tie the 16-bit
unmerged model flips too, so a flip there says nothing about the merge.
"""

from __future__ import annotations

import contextlib

# Measured (bench/export_error.py, random-weight shapes, random LoRA r16 all-linear, bf16): a correct
# merge's RMS error is 1.01× the noise on the 8B shape, 1.03× on the 0.6B; the same adapter dropped
# is 1.85× (8B) and 3.07× (0.6B), scaled 2× 1.90× and 3.10×. 1.25 lies between, nearer the correct
# side: a merge adds the rounding of W + update to the noise, and that rounding is at most 0.75× the noise.
NOISE_FACTOR = 1.25
NOISE_FLOOR = 1e-4  # × RMS of the reference logits: an fp32 export's "noise" is ~0, its merge still rounds in fp32
MIN_TOP1_AGREEMENT = 0.95  # at the positions that are not near-ties


@contextlib.contextmanager
def fp32_compute(model):
    """Run `model` (16-bit weights) in fp32 arithmetic: activations fp32, each weight upcast as it is used.

    Transient memory: one layer's weight in fp32 (the 8B's largest, lm_head, 2.5 GB)."""
    import torch
    import torch.nn.functional as F

    original = torch.nn.Linear.forward

    def forward(self, x):
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias)

    hook = model.get_input_embeddings().register_forward_hook(lambda _m, _i, out: out.float())
    torch.nn.Linear.forward = forward
    try:
        from peft.helpers import disable_input_dtype_casting

        with disable_input_dtype_casting(model):  # PEFT would cast the LoRA input back to the adapter's dtype
            yield model
    finally:
        torch.nn.Linear.forward = original
        hook.remove()


def logits(model, prompts) -> list:
    import torch

    with torch.no_grad():
        return [model(input_ids=torch.tensor([p])).logits[0].float() for p in prompts]


def rms(xs, ys) -> float:
    total = sum(float(((x - y) ** 2).sum()) for x, y in zip(xs, ys))
    return (total / sum(x.numel() for x in xs)) ** 0.5


def judge(got, fp32_ref, sixteen_ref) -> dict:
    """Figures of merged logits `got` against the fp32 reference, with 16-bit unmerged as the noise yardstick."""
    noise = rms(sixteen_ref, fp32_ref)
    error = rms(got, fp32_ref)
    scale = (sum(float((r ** 2).sum()) for r in fp32_ref) / sum(r.numel() for r in fp32_ref)) ** 0.5
    tolerance = NOISE_FACTOR * noise + NOISE_FLOOR * scale
    noise_max = max(float((s - r).abs().max()) for s, r in zip(sixteen_ref, fp32_ref))
    agree = counted = 0
    for g, r in zip(got, fp32_ref):
        top2 = r.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > noise_max
        counted += int(clear.sum())
        agree += int(((g.argmax(-1) == r.argmax(-1)) & clear).sum())
    return {"rms_logit_error": error, "rms_noise_16bit_unmerged": noise, "tolerance": tolerance,
            "error_vs_noise": error / noise if noise else None,
            "max_abs_logit_diff": max(float((g - r).abs().max()) for g, r in zip(got, fp32_ref)),
            "max_abs_noise_16bit_unmerged": noise_max,
            "max_abs_logit": max(float(r.abs().max()) for r in fp32_ref),
            "top1_agreement": agree / counted if counted else None, "top1_positions_counted": counted,
            "positions": sum(r.shape[0] for r in fp32_ref),
            "passed": error <= tolerance and (not counted or agree / counted >= MIN_TOP1_AGREEMENT),
            "rule": f"RMS logit error against base + adapter in fp32 ≤ {NOISE_FACTOR:g} × that of base + adapter "
                    f"unmerged in 16 bits; greedy agreement ≥ {100 * MIN_TOP1_AGREEMENT:.0f} % where the "
                    "reference's top-1 margin exceeds the largest 16-bit noise"}
