"""A run that diverged stops at once, instead of training on and "completing" with a NaN adapter.

Three signs, each checked where it is exact:

    weights    after every optimizer step, this rank's trainable weights are all finite (a huge
               weight_decay or learning rate overflows them; under bf16/fp32 a NaN gradient is
               applied as is). Checked before that step's save, so no checkpoint holds NaN.
    gradients  before every optimizer step (after clipping), and the pre-clip gradient norm
               Trainer logs (huge but finite gradients overflow the norm to inf; clipping then
               scales them all by 0 and the step trains nothing). Under bf16/fp32 one such step
               is the end. Under fp16 the loss scaler skips such steps and halves its scale,
               which is normal for a few steps: FP16_SKIPS steps in a row means no scale helps.
    loss       each logged training loss (the mean over the logging interval) is finite.

The logged values are the same on every rank (Trainer gathers them), so every rank decides alike.

Each check is one fused norm over a few hundred tensors (torch.nn.utils.get_total_norm); the
decision rides on the step's existing all-reduce of stop flags (kit.train.callbacks.Control).
"""

from __future__ import annotations

import math

import torch

ADVICE = "lower learning_rate, weight_decay or lora.alpha (or fix the data), then run again"
FP16_SKIPS = 25  # the scaler starts at 2**16: 25 halvings leave it below 2**-8


def finite(tensors: list[torch.Tensor]) -> bool:
    if not tensors:
        return True
    with torch.no_grad():
        tensors = [t.detach() for t in tensors]
        if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6: one fused norm over all of them
            total = torch.nn.utils.get_total_norm(tensors, norm_type=2.0)
        else:
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors]))
    return bool(torch.isfinite(total))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP-sharded tensor: this rank's shard


class Watch:
    """This rank's view: call `after_backward` before each optimizer step, `reason` after it."""

    def __init__(self):
        self._params: list[torch.Tensor] | None = None
        self.bad_grad_steps = 0  # consecutive optimizer steps whose gradients were not finite
        self.bad_norm_steps = 0  # steps covered by consecutive logs whose gradient norm was not finite

    def _trainable(self, model) -> list[torch.Tensor]:
        if self._params is None:
            self._params = [p for p in model.parameters() if p.requires_grad]
        return self._params

    def after_backward(self, model) -> None:
        grads = [_local(p.grad) for p in self._trainable(model) if p.grad is not None]
        self.bad_grad_steps = 0 if finite(grads) else self.bad_grad_steps + 1

    def reason(self, model, step: int, fp16: bool) -> str | None:
        """Why training must stop at `step` (NaN/inf weights or gradients), or None."""
        if not finite([_local(p) for p in self._trainable(model)]):
            return (f"training diverged at step {step}: the trained weights are no longer finite numbers (NaN or "
                    f"inf), so this step was not saved; {ADVICE}")
        limit = FP16_SKIPS if fp16 else 1
        if self.bad_grad_steps >= limit:
            what = (f"in {self.bad_grad_steps} steps in a row (fp16: the loss scaler skipped them all)" if fp16
                    else "(bf16/fp32 has no loss scaler: the step trained nothing)")
            return f"training diverged at step {step}: the gradients were NaN or inf {what}; {ADVICE}"
        return None

    def logged(self, logs: dict, step: int, fp16: bool, logging_steps: int) -> str | None:
        """Why training must stop, from one of Trainer's training logs (loss, grad_norm), or None."""
        loss, norm = logs.get("loss"), logs.get("grad_norm")
        if _non_finite(loss):
            return f"training diverged: the training loss is {loss} at step {step}; {ADVICE}"
        if not isinstance(norm, (int, float)):
            return None
        self.bad_norm_steps = self.bad_norm_steps + logging_steps if _non_finite(norm) else 0
        if self.bad_norm_steps and (not fp16 or self.bad_norm_steps >= FP16_SKIPS):
            what = (f"at every logged step for {self.bad_norm_steps} steps (fp16: the loss scaler skipped them)"
                    if fp16 else "(bf16/fp32 has no loss scaler: clipping zeroed the step)")
            return f"training diverged at step {step}: the gradient norm was {norm} {what}; {ADVICE}"
        return None


def _non_finite(x) -> bool:
    return isinstance(x, (int, float)) and not math.isfinite(x)
