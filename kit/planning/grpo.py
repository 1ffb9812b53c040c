"""GRPO's batch rule, planned: every prompt's completions in one generation batch.

TRL's GRPOTrainer draws each prompt `num_generations` times and compares its completions with one
another, so one generation batch (per_device_train_batch_size × ranks × steps_per_generation,
steps_per_generation being the gradient accumulation steps unless set) must hold whole groups:
it must be divisible by num_generations. per_device_train_batch_size counts completions, not
prompts (TRL 1.15, 1.16: its RepeatSampler hands each rank per_device completions a micro-batch).
TRL checks this when GRPOConfig is built, on every rank after the model may already be loading;
kit checks it when it plans, and names the nearest global batches that satisfy it.

    chosen_batch(cfg, per_device, world)      # global_batch null: (per_device, accumulation, global) kit picks
    check_batch(cfg, per_device, world, accum)  # the user's: one error line naming the nearest valid ones
    accumulation(cfg, per_device, world)      # the accumulation alone, for the memory estimate (never raises)

With `global_batch` null the global batch is the smallest multiple of per_device × ranks that holds
whole groups (lcm(per_device × ranks, num_generations)), made up by accumulation steps; with
`global_batch` (or both) set by the user, a value that breaks the rule is one `error:` line.
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


def accumulation(cfg, per_device_batch: int, world_size: int) -> int:
    """Accumulation steps (TRL's steps_per_generation) for this micro-batch and world size."""
    step = per_device_batch * world_size
    if cfg.global_batch:
        return max(1, cfg.global_batch // step)
    g = max(1, cfg.grpo.num_generations)
    return g // gcd(step, g)


def chosen_batch(cfg, per_device_batch: int, world_size: int) -> tuple[int, int, int]:
    """(per_device, accumulation, global) where the user left global_batch null: the smallest global
    batch of per_device x ranks x accumulation that holds whole groups."""
    from kit.errors import UsageError

    g = cfg.grpo.num_generations
    if g < 2:
        raise UsageError(batch_problem(per_device_batch=per_device_batch, world_size=world_size, accumulation=1,
                                       num_generations=g))
    accum = accumulation(cfg, per_device_batch, world_size)
    return per_device_batch, accum, per_device_batch * world_size * accum


def check_batch(cfg, per_device_batch: int, world_size: int, accum: int) -> None:
    """UsageError (exit 2) naming the nearest valid global batches when the user's breaks the rule."""
    from kit.errors import UsageError

    g = cfg.grpo.num_generations
    problem = batch_problem(per_device_batch=per_device_batch, world_size=world_size, accumulation=accum,
                            num_generations=g)
    if problem and cfg.per_device_batch is None and g >= 2:
        # The micro-batch is kit's to pick: any multiple of both the ranks and num_generations will do.
        unit = world_size * g // gcd(world_size, g)
        total = per_device_batch * world_size * accum
        lower = total // unit * unit
        choices = [b for b in (lower, lower + unit) if b > 0]
        problem = (f"global_batch {total} is not divisible by num_generations={g} (each generation batch holds "
                   f"whole groups of a prompt's completions); TRL would refuse it at step 0. Use global_batch="
                   f"{' or '.join(str(b) for b in choices)}, or leave it null and kit picks one")
    if problem:
        raise UsageError(problem)


def prompts_problem(n_prompts: int, global_batch: int, num_generations: int) -> str | None:
    """None when `n_prompts` training prompts fill one generation batch, else the words why not: TRL's
    RepeatSampler hands out whole batches of global_batch / num_generations prompts and drops the rest, so
    fewer prompts than one batch holds is a sampler with nothing in it (no step trains)."""
    per_batch = max(1, global_batch // max(1, num_generations))
    if n_prompts >= per_batch:
        return None
    return (f"{n_prompts} training prompt{'s' if n_prompts != 1 else ''}, fewer than the {per_batch} one generation "
            f"batch holds (global batch {global_batch} / num_generations {num_generations}): TRL's sampler hands out "
            f"whole batches of prompts only, so no step would train; add prompts, or lower global_batch (at most "
            f"{max(n_prompts, 1) * num_generations} completions for {n_prompts} prompt{'s' if n_prompts != 1 else ''})")


def batch_words(cfg, per_device_batch: int, world_size: int) -> str:
    """The batch the plan chose, in GRPO's terms (completions, prompts, generation batch)."""
    accum = accumulation(cfg, per_device_batch, world_size)
    g = cfg.grpo.num_generations
    total = per_device_batch * world_size * accum
    ranks = f"{world_size} ranks, each generating its own share" if world_size > 1 else "1 rank"
    return (f"grpo: {per_device_batch} completions per micro-batch x {accum} accumulation step"
            f"{'s' if accum != 1 else ''} x {ranks} = one generation batch of {total} completions "
            f"({total // max(1, g)} prompt{'s' if total // max(1, g) != 1 else ''} x num_generations {g}), generated at the start of each optimizer step")
