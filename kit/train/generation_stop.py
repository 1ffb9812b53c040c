"""A stop asked for while a GRPO step generates: the step is given up, not waited for.

A GRPO step spends most of its time generating (97 % with transformers generation, measured in
issue terms on an H100; minutes a step on a T4). A stop request (SIGTERM, SIGHUP, Ctrl-C; the
session's deadline found too close) used to wait for the step's end: the whole generation, then
its scoring and training. A platform that sends SIGTERM and kills a few seconds later (a
container's stop: 10 s; a preempted VM: 30 s) took the process before that step's checkpoint.

`GenerationStop` (trainer grpo, installed by `Job.stop_generation_on_request`):
- during training, each generation carries one more stopping criterion: the stop was asked for on
  this rank. It ends the decoding loop at the next token.
- after each generation pass every rank agrees, with one tiny all-reduce (TRL calls `_generate`
  once per generation batch on every rank, so the ranks meet there), whether any of them was asked
  to stop. If so, no rank scores or trains on completions cut short: the step is given up. The
  weights, optimizer and scheduler are still those of the last finished step (generation changes
  none of them), so that step is saved as it would have been at its end — its checkpoint's RNG
  state the one taken at that step's end — unless it is saved already; the job then pauses at
  that step like any other stop. Resumed, it redoes the given-up step exactly as an uninterrupted
  run does.
- a rank that was not asked (a signal sent to one rank alone) finishes its generation and then
  learns the decision at the all-reduce: no rank is left waiting in training for another.

A stop that comes after the generation pass (during scoring or the step's backward) is taken at
the step's end, as for every trainer (`kit.train.callbacks.Control`).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TrainerCallback

from kit.train import dist
from kit.train.callbacks import StepGivenUp


class _Asked(StoppingCriteria):
    """Every sequence is done once `asked()` says why: the decoding loop ends at the next token."""

    def __init__(self, asked):
        self.asked = asked

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.asked() is not None, dtype=torch.bool, device=input_ids.device)


def rng_states() -> dict:
    """The generators' states as Trainer saves them in a checkpoint (`rng_state_{rank}.pth`)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


class GenerationStop(TrainerCallback):
    """See the module's docstring. `control`: the job's `Control` (its stop_reason says how the job ended)."""

    def __init__(self, ctx, control, signals, deadline, save_cost_s, say=None, halt=None):
        self.ctx, self.control, self.signals, self.deadline, self.save_cost_s = ctx, control, signals, deadline, save_cost_s
        self.halt = halt or (lambda: None)  # a reason to stop without saving (the store's lease was lost), or None
        self.say = say or (lambda words: None)
        self.trainer = None
        self.active = False
        self._at_step_end: tuple[int, dict] | None = None  # (step, RNG states) taken at the last step's end
        self.given_up_at: int | None = None  # the step given up (global_step + 1), once it was

    def asked(self) -> str | None:
        """Why this rank should stop now: the lease lost, the signal's reason, or the deadline too close for more
        than a save."""
        halt = self.halt()
        if halt is not None:
            return halt
        if self.signals.reason is not None:
            return self.signals.reason
        if self.deadline.near(self.save_cost_s()):
            return f"deadline ({self.deadline.source})"
        return None

    def attach(self, trainer) -> None:
        """Wrap the trainer's generation pass (`_generate`) and its model's `generate`, for training only."""
        self.trainer = trainer
        trainer.add_callback(self)
        generate_pass = trainer._generate
        model = trainer.model
        model_generate = model.generate

        def generate(*args, **kwargs):
            if self.active:
                kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []),
                                                                    _Asked(self.asked)])
            return model_generate(*args, **kwargs)

        def generation_pass(*args, **kwargs):
            out = generate_pass(*args, **kwargs)
            if self.active:
                asked = self.asked()
                stop, halted = dist.any_true([asked is not None, self.halt() is not None], self.ctx.device)
                if stop:
                    self._give_up(asked, halted)
            return out

        model.generate = generate
        trainer._generate = generation_pass

    def on_train_begin(self, args, state, control, **kwargs):
        self.active = True

    def on_step_end(self, args, state, control, **kwargs):
        self._at_step_end = (state.global_step, rng_states())

    def on_train_end(self, args, state, control, **kwargs):
        self.active = False

    def _give_up(self, asked: str | None, halted: bool) -> None:
        trainer = self.trainer
        self.active = False
        step = trainer.state.global_step
        self.given_up_at = step + 1
        if halted:  # another session owns the store: nothing more is written (Control's halt, sooner)
            self.control.halted = True
            self.control.stop_reason = self.halt() or "the store's lease was lost (rank 0)"
            self.say(f"step {step + 1} given up during its generation ({self.control.stop_reason}): nothing saved")
            raise StepGivenUp(f"step {step + 1} given up during its generation: {self.control.stop_reason}")
        self.control.stop_reason = self.signals.reason or (asked if asked else f"deadline ({self.deadline.source})")
        saved = os.path.isdir(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))
        self.say(f"step {step + 1} given up during its generation ({self.control.stop_reason}): "
                 + ("nothing trained yet" if step == 0 else f"step {step} saved now" if not saved
                    else f"step {step} is saved"))
        if step > 0 and not saved:
            # The state at the last step's end, as that step's own save would have written it.
            if self._at_step_end is not None and self._at_step_end[0] == step:
                set_rng_states(self._at_step_end[1])
            trainer._save_checkpoint(trainer.model, trial=None)
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        raise StepGivenUp(f"step {step + 1} given up during its generation: {self.control.stop_reason}")
