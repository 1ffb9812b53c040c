"""What a training run settled and where its step time goes, printed as `[probe]` lines.

bench/speed.py --probe runs kit's rows through bench/patched_run.py's `probe` and Unsloth direct
(bench/reference_unsloth.py --probe) with this installed, so the two can be compared where their
speeds differ (issue #17: kit's Unsloth backend against Unsloth direct on chat rows):

- once, at the start of training: the trainer's class, the batching flags it ended with
  (padding_free, packing, remove_unused_columns, max_length, gradient_checkpointing), the collator
  and whether Unsloth wrapped it with packed-sequence lengths, the attention implementation, and
  whether anything was `gc.freeze()`-n;
- after each step: its duration, the time Python's garbage collector ran during it, and the shape of
  each micro-batch's input_ids the model saw (a forward pre-hook; shapes only, so no device sync):
  two runs whose shapes match step by step trained on the same batches;
- at the end: every step's duration and shapes, the collector's total time and its generation-2 passes.

It changes nothing the run does: a TrainerCallback added to every Trainer, and a gc callback.
"""

from __future__ import annotations

import gc
import json
import time

PREFIX = "[probe]"


class _GcClock:
    def __init__(self):
        self.total_s, self.full_passes, self._began = 0.0, 0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.total_s += time.perf_counter() - self._began
            self.full_passes += info.get("generation") == 2
            self._began = None


def _facts(args, model, dataloader) -> dict:
    collator = getattr(dataloader, "collate_fn", None)
    config = getattr(model, "config", None)
    return {"padding_free": getattr(args, "padding_free", None), "packing": getattr(args, "packing", None),
            "remove_unused_columns": getattr(args, "remove_unused_columns", None),
            "max_length": getattr(args, "max_length", None),
            "gradient_checkpointing": getattr(args, "gradient_checkpointing", None),
            "collator": type(collator).__name__,
            "collator_padding_free": getattr(collator, "padding_free", None),
            "unsloth_lengths_wrapped": getattr(collator, "_unsloth_padding_free_lengths_wrapped", False),
            "attn_implementation": getattr(config, "_attn_implementation", None),
            "gc_frozen_objects": gc.get_freeze_count(), "model": type(model).__name__}


def install() -> None:
    """Add the probe to every Trainer built from now on (through its CallbackHandler)."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    clock = _GcClock()

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
            print(PREFIX, "trainer", json.dumps(_facts(args, model, train_dataloader)), flush=True)
            gc.callbacks.append(clock)
            self.steps, self.shapes, self.seen = [], [], []
            if model is not None:
                model.register_forward_pre_hook(self._saw, with_kwargs=True)
            self.gc_at, self.t = clock.total_s, time.perf_counter()

        def _saw(self, module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and module.training:
                self.seen.append(list(ids.shape))

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            took, gc_s = now - self.t, clock.total_s - self.gc_at
            self.steps.append(round(took, 4))
            self.shapes.append(self.seen)
            print(PREFIX, f"step {state.global_step} {took:.3f} s (gc {gc_s:.3f} s) input_ids {self.seen}", flush=True)
            self.seen = []
            self.t, self.gc_at = now, clock.total_s

        def on_train_end(self, args, state, control, **kwargs):
            if clock in gc.callbacks:
                gc.callbacks.remove(clock)
            print(PREFIX, "end", json.dumps({"step_s": self.steps, "shapes": self.shapes, "gc_s": round(clock.total_s, 3),
                                              "gc_full_passes": clock.full_passes}), flush=True)

    init = CallbackHandler.__init__

    def probed_init(self, callbacks, *args, **kwargs):
        init(self, [*callbacks, Probe()], *args, **kwargs)

    CallbackHandler.__init__ = probed_init
