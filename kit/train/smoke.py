"""Smoke mode: one optimizer step, then a ladder of checks, each proving one thing.

    loss finite and non-zero      the data reached the model and the loss is computed
    grad norm > 0 at step 1       gradients flow back to the trainable weights
    LoRA weights changed          the optimizer stepped them
    frozen base weights unchanged nothing that should stay frozen moved
    device                        which device each rank trained on

The first failing rung names itself; the script then exits non-zero.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile

import torch
from transformers import TrainerCallback

from kit.train import dist


class Folder:
    """The fresh folder a smoke run trains in: never output_dir, its checkpoints or the store."""

    def __init__(self, ctx, cfg):
        self.path = dist.broadcast(tempfile.mkdtemp(prefix="kit-smoke-") if ctx.is_main else None)
        self._owned = ctx.is_main
        if self._owned:  # removed in finish(); atexit covers a smoke run that fails
            atexit.register(self.remove)
        cfg.output_dir, cfg.logging_steps, cfg.save_steps = self.path, 1, 10**9
        cfg.save_every_minutes = 10**9
        cfg.eval_steps = None
        cfg.warmup_steps = 0  # a warmup would make the one step's learning rate 0

    def remove(self) -> None:
        # Only rank 0 writes into it (Trainer saves on the main process), so it can go now.
        if self._owned:
            self._owned = False
            shutil.rmtree(self.path, ignore_errors=True)  # a temp folder: what cannot go, the OS tmp cleaner takes

SAMPLE_FROZEN = 4  # frozen tensors to compare: enough to catch a leak, cheap on an 8B model


def _snapshot(params) -> dict[str, torch.Tensor]:
    return {name: p.detach().to("cpu", copy=True) for name, p in params}


class Smoke(TrainerCallback):
    def __init__(self, model, method: str):
        self.method, self.model = method, model
        self.trainable: dict[str, torch.Tensor] = {}
        self.frozen: dict[str, torch.Tensor] = {}
        self.logs: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        # The weights training starts from: after the trainer and kit have set them up (TRL casts
        # QLoRA adapters to bf16, kit back to fp32 under fp16), so a cast never counts as a step.
        named = list(self.model.named_parameters())
        self.trainable = _snapshot((n, p) for n, p in named if p.requires_grad)
        frozen = [(n, p) for n, p in named if not p.requires_grad]
        step = max(1, len(frozen) // SAMPLE_FROZEN)
        self.frozen = _snapshot(frozen[::step][:SAMPLE_FROZEN])

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))

    def rungs(self) -> list[tuple[str, bool, str]]:
        """(rung, passed, detail) in ladder order; a failed rung's detail says what went wrong."""
        out = []
        losses = [log["loss"] for log in self.logs if "loss" in log]
        loss = losses[0] if losses else float("nan")
        out.append(("loss finite and non-zero", math.isfinite(loss) and loss != 0, f"loss {loss:.4f}"))
        norms = [log["grad_norm"] for log in self.logs if "grad_norm" in log]
        norm = float(norms[0]) if norms else float("nan")
        out.append(("grad norm > 0 at step 1", math.isfinite(norm) and norm > 0, f"grad norm {norm:.3e}"))
        now = dict(self.model.named_parameters())
        changed = sum(not torch.equal(now[n].detach().cpu(), before) for n, before in self.trainable.items())
        what = "trainable weights" if self.method == "full" else "LoRA weights"
        out.append((f"{what} changed", changed > 0,
                    f"{changed} of {len(self.trainable)} tensors changed" if changed else
                    f"{what} unchanged after one step (learning rate 0? no gradient reached them?)"))
        moved = [n for n, before in self.frozen.items() if not torch.equal(now[n].detach().cpu(), before)]
        if self.method != "full":
            out.append(("frozen base weights unchanged", not moved,
                        f"{len(self.frozen) - len(moved)} of {len(self.frozen)} sampled tensors unchanged"
                        + (f"; moved: {moved[0]}" if moved else "")))
        return out

    def report(self, ctx) -> tuple[bool, list[str]]:
        """Every rank checks; rank 0 gets the lines. Returns (all passed, lines)."""
        rungs = self.rungs()
        device = next(self.model.parameters()).device
        devices = dist.gather(f"rank {ctx.rank}: {device}")
        results = dist.gather([passed for _, passed, _ in rungs])
        lines, ok = [], True
        for i, (name, _, detail) in enumerate(rungs):
            everywhere = all(r[i] for r in results)
            ok = ok and everywhere
            lines.append(f"  [{'ok' if everywhere else 'FAIL'}] {name}: {detail}")
        lines.append(f"  [ok] device: {', '.join(devices)}")
        if not ok:
            name, _, detail = next(r for i, r in enumerate(rungs) if not all(res[i] for res in results))
            lines.append(f"smoke FAILED at rung '{name}': {detail}")
        else:
            lines.append("smoke passed")
        return ok, lines
