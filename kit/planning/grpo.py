"""GRPO's batch rule, planned: every prompt's completions in one generation batch.

TRL's GRPOTrainer draws each prompt `num_generations` times and compares its completions with one
another, so one generation batch (per_device_train_batch_size × ranks × steps_per_generation,
steps_per_generation being the gradient accumulation steps unless set) must hold whole groups:
it must be divisible by num_generations. TRL checks this when GRPOConfig is built, on every rank
after the model may already be loading; kit checks it when it plans, and names the nearest global
batches that satisfy it.
"""

from __future__ import annotations

from math import gcd


def batch_problem(*, per_device_batch: int, world_size: int, accumulation: int, num_generations: int) -> str | None:
    """None when the global batch holds whole groups of num_generations completions, else the words why not."""
    if num_generations < 2:
        return (f"num_generations={num_generations}: GRPO compares the completions of one prompt with each other; "
                "it needs at least 2")
    step = per_device_batch * world_size
    global_batch = step * accumulation
    if global_batch % num_generations == 0:
        return None
    unit = step * num_generations // gcd(step, num_generations)  # the smallest valid global batch
    lower = global_batch // unit * unit
    choices = [b for b in (lower, lower + unit) if b > 0]
    return (f"global batch {global_batch} ({per_device_batch} per GPU x {world_size} GPU"
            f"{'s' if world_size != 1 else ''} x {accumulation} accumulation steps) is not divisible by "
            f"num_generations={num_generations}; TRL would refuse it at step 0. "
            f"Use global_batch={' or '.join(str(b) for b in choices)}")
