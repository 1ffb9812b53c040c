"""Trainer callbacks: when to save and stop, and what happens to a saved checkpoint.

Every decision that changes what ranks do next (save now, stop now) is agreed with one tiny
all-reduce per optimizer step: if rank 0 stopped while rank 1 went on, rank 1 would wait in the
next gradient all-reduce forever.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from kit.train import dist, divergence
from kit.train.signals import StopSignals
from kit.checkpoints import manifest, rotation
from kit.planning import save_cadence
from kit.errors import StoreError
from kit.files import GIB


class AtTarget(Exception):
    """Raised before a step past max_steps. Trainer resumed mid-epoch from a checkpoint already at
    max_steps trains one step more (its stop check comes after a step): a job cut in its wrap-up
    would end "step 5 of 4". `at_target_only_wrap_up` turns it into no step trained."""


class StepGivenUp(Exception):
    """Raised on every rank when a stop came during a GRPO step's generation: the last finished step is
    saved and the job pauses there (`kit.train.generation_stop`)."""


@contextlib.contextmanager
def at_target_only_wrap_up():
    """Around `trainer.train(...)`: a run resumed at its target trains nothing and goes on to the wrap-up;
    a step given up during its generation ends training there, and the job pauses."""
    try:
        yield
    except (AtTarget, StepGivenUp):
        pass  # every rank stops here, before any collective: the model holds the checkpoint's weights


class Control(TrainerCallback):
    """Save by wall time, always save the last step, and stop before the deadline or on a signal."""

    def __init__(self, ctx, deadline, save_every_minutes: float | str, signals: StopSignals, save_cost_s,
                 say=None, halt=None, room=None):
        self.ctx, self.deadline, self.signals = ctx, deadline, signals
        self.room = room  # kit.train.disk.Room: what the next checkpoint needs on this rank's disk
        self.auto = save_every_minutes == "auto"  # from the measured save cost (kit.planning.save_cadence)
        self.save_every_s = save_cadence.CEILING_S if self.auto else save_every_minutes * 60
        self.say = say
        self.halt = halt  # callable: a reason to stop at once without saving (the lease was lost), or None
        self._said_every_s: float | None = None
        self.save_cost_s = save_cost_s  # callable: measured seconds a save + upload takes
        self.last_save = time.monotonic()
        self.last_step_end = None
        self.step_s = 0.0
        self.stop_reason: str | None = None
        self.halted = False
        self.diverged = False  # the weights, gradients or loss went NaN/inf: stopped, nothing more saved
        self.watch = divergence.Watch()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_save = self.last_step_end = time.monotonic()
        # A resumed Trainer reloads the checkpoint's state, max_steps included, while it trains to
        # this run's max_steps: record the current target, so checkpoints never say "100 of 60".
        if args.max_steps and args.max_steps > 0:
            state.max_steps = args.max_steps

    def on_step_begin(self, args, state, control, **kwargs):
        if state.max_steps and state.global_step >= state.max_steps:
            raise AtTarget(f"step {state.global_step} of {state.max_steps}")

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        took = now - self.last_step_end
        self.step_s = took if self.step_s == 0 else max(took, 0.8 * self.step_s + 0.2 * took)
        self.last_step_end = now
        near = self.deadline.near(self.step_s + self.save_cost_s())
        halt = self.halt() if self.halt else None
        diverged = self.watch.reason(kwargs["model"], state.global_step, fp16=bool(args.fp16))
        stop, save, halted, any_diverged = dist.any_true(
            [near or self.signals.reason is not None, now - self.last_save >= self._every_s(), halt is not None,
             diverged is not None],
            self.ctx.device)
        if any_diverged:  # before this step's save: no checkpoint holds NaN weights
            return self._diverge(control, diverged or f"training diverged at step {state.global_step} on another "
                                 f"rank (NaN or inf weights or gradients); {divergence.ADVICE}")
        if halted:  # another session owns the store now: writing more checkpoints would fight it
            control.should_training_stop, control.should_save = True, False
            self.stop_reason = halt or "the store's lease was lost (rank 0)"
            self.halted = True
            return control
        if state.global_step >= state.max_steps:
            control.should_save = True  # the final checkpoint always exists, so the store shows "complete"
        if save:
            control.should_save = True
        if stop and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
            self.stop_reason = self.signals.reason or f"deadline ({self.deadline.source})"
        if control.should_save and self.room is not None:  # every rank knows should_save alike: one more reduce
            short = self.room.short(args.output_dir)
            if dist.any_true([short is not None], self.ctx.device)[0]:  # before a byte of it is written
                raise StoreError(short or "another process's disk has no room for the next checkpoint (its line "
                                 "says where): the checkpoints saved so far are kept")
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.watch.after_backward(kwargs["model"])

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The logged loss is the same on every rank (Trainer gathers it), so they all stop together.
        reason = self.watch.logged(logs or {}, state.global_step, bool(args.fp16), args.logging_steps)
        return self._diverge(control, reason) if reason else control

    def _diverge(self, control, reason: str):
        control.should_training_stop, control.should_save = True, False
        self.stop_reason, self.diverged = reason, True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()

    def _every_s(self) -> float:
        if not self.auto:
            return self.save_every_s
        cost = self.save_cost_s()
        self.save_every_s = save_cadence.interval_s(cost)
        said = self._said_every_s
        if cost and self.say and (said is None or abs(self.save_every_s - said) > 0.25 * said):
            self._said_every_s = self.save_every_s  # said again only when it moved by a quarter
            self.say(save_cadence.words(self.save_every_s, cost))
        return self.save_every_s


class ResumedBatch(TrainerCallback):
    """Says, before transformers does, that a resumed run's micro-batch differs from the checkpoint's.

    After a change of processes (2 → 1) kit keeps the global batch by changing the micro-batch and
    the accumulation (and packing may fold them again), and transformers then warns, unexplained,
    "per_device_train_batch_size: 4 (from args) != 8 (from trainer_state.json)". This note comes first.
    """

    def __init__(self, checkpoint: str | None, say):
        self.checkpoint, self.say = checkpoint, say

    def on_train_begin(self, args, state, control, **kwargs):
        import json

        if not self.checkpoint:
            return
        try:
            saved = json.loads((Path(self.checkpoint) / "trainer_state.json").read_text()).get("train_batch_size")
        except (OSError, ValueError, AttributeError):
            return  # resume itself reports an unreadable checkpoint
        if not isinstance(saved, int) or saved // max(1, args.n_gpu) == args.per_device_train_batch_size:
            return
        self.say(f"micro-batch {args.per_device_train_batch_size} × accumulation {args.gradient_accumulation_steps} "
                 f"per process now, {saved // max(1, args.n_gpu)} when the checkpoint was written (another number of "
                 "processes, or rows packed into fuller sequences): the global batch is kept, so transformers' warning "
                 "that per_device_train_batch_size does not match trainer_state.json is expected")


class Checkpoints(TrainerCallback):
    """Seal each checkpoint with a manifest, then hand it to the background uploader (rank 0)."""

    def __init__(self, ctx, fingerprint: dict, sync=None, extra: dict | None = None, keep: int = 0, room=None):
        self.ctx, self.fingerprint, self.sync = ctx, fingerprint, sync
        self.room = room  # told each checkpoint's size on this rank's disk (kit.train.disk.Room)
        self.keep = keep  # local checkpoint-<step> folders kept (kit.checkpoints.rotation); 0: all
        self.extra = extra  # run id and base revision, kept in each manifest
        self.last_seal_s = 0.0

    def on_save(self, args, state, control, **kwargs):
        # Every rank has written its rng_state_{rank}.pth once all are here; one barrier per save.
        dist.barrier()
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.room is not None:
            self.room.saved(path)
        if not self.ctx.is_main:
            return
        started = time.monotonic()
        manifest.write_manifest(path, state.global_step, self.ctx.world_size, self.fingerprint, self.extra)
        self.last_seal_s = time.monotonic() - started
        if self.sync is not None:
            self.sync.submit(path, state.global_step)  # staged first: rotating the original is safe
        rotation.rotate(args.output_dir, self.keep, path)


class Meter(TrainerCallback):
    """This session's step time, tokens per second and peak GPU memory of this rank.

    The first WARMUP_STEPS steps are left out of the timing (allocator warm-up, kernel autotuning);
    the median of the rest keeps one slow step (a save, an evaluation) from skewing it. Peak memory
    counts from the start of training, so it is the loaded model plus the training steps.
    """

    WARMUP_STEPS = 2

    def __init__(self, device, tokens_per_step: float, on_step=None):
        self.device, self.tokens_per_step = device, tokens_per_step
        self.on_step = on_step  # called with the global step at the start and after each step
        self.step_ends: list[float] = []
        self.first_step = None
        self.began_at: float | None = None  # wall clock: the end of this session's setup

    def on_train_begin(self, args, state, control, **kwargs):
        self.began_at = time.time()
        if self.on_step is not None:
            self.on_step(state.global_step)
        self.step_ends = [time.perf_counter()]
        self.first_step = state.global_step + 1
        if self.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())
        if self.on_step is not None:
            self.on_step(state.global_step)

    def summary(self) -> dict:
        durations = [b - a for a, b in zip(self.step_ends, self.step_ends[1:])]
        timed = durations[self.WARMUP_STEPS:] or durations
        # All steps, warm-up included: with rows of unequal length the median step says little, and
        # trained tokens per second is a whole run's tokens over its time (bench/speed.py).
        out: dict = {"steps_timed": len(timed), "steps_run": len(durations), "total_step_s": round(sum(durations), 3)}
        if timed:
            step_s = statistics.median(timed)
            out.update(step_s=round(step_s, 4), tokens_per_s=round(self.tokens_per_step / step_s, 1),
                       timed_from_step=self.first_step + len(durations) - len(timed))
        if self.device.type == "cuda":
            import torch

            out.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                       peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device))
        else:
            rss = peak_rss_bytes()
            if rss is not None:
                out["peak_rss_bytes"] = rss
        return out


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory (host RAM) since it started; None where unknown."""
    try:
        import resource
    except ImportError:  # Windows: no getrusage
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes; Linux: KiB


def meter_words(m: dict) -> str | None:
    """One line for the log, e.g. "speed: 1.16 s/step, ~7,080 tokens/s (median of steps 3-24); peak GPU memory …"."""
    parts = []
    if "step_s" in m:
        last = m["timed_from_step"] + m["steps_timed"] - 1
        parts.append(f"speed: {m['step_s']:.3g} s/step, ~{m['tokens_per_s']:,.0f} tokens/s "
                     f"(median of steps {m['timed_from_step']}-{last})")
    if "peak_allocated_bytes" in m:
        parts.append(f"peak GPU memory of rank 0: {m['peak_allocated_bytes'] / GIB:.2f} GiB allocated, "
                     f"{m['peak_reserved_bytes'] / GIB:.2f} GiB reserved")
    elif "peak_rss_bytes" in m:
        parts.append(f"peak host RAM of rank 0: {m['peak_rss_bytes'] / GIB:.2f} GiB (CPU run: no GPU memory)")
    return "; ".join(parts) or None
