"""Write `train_ddp.py`: the template in kit/script/templates filled with a config and its plan.

The output is deterministic (no dates, no machine-specific paths), so re-rendering the same
config for the same machine gives the same bytes, and a diff shows only what changed.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from kit import __version__
from kit.machine.command import launch_command, shell_word
from kit.planning import config, config_values
from kit.planning.plan import Plan
from kit.script import failed_bootstrap
from kit.errors import UsageError, shown
from kit.files import check_output, same_content, write_atomic

TEMPLATE = Path(__file__).parent / "templates" / "train_ddp.py.tmpl"
# The trainer seam: each trainer is its TRL config and trainer classes, the config's own arguments
# (templates/trainer_args/<name>.py.tmpl, spliced into the one SFTConfig/DPOConfig/… call of the
# template), any line after the trainer is built, and any constructor arguments of its own. A new
# trainer is one row and one arguments file.
_REFERENCE_IS_BASE = ("        modeling.reference_is_base(trainer.model)  # the base, adapter off: no copy of the fresh "
                      "adapter\n")
TRAINERS = {
    "sft": ("SFTConfig", "SFTTrainer", "",
            "            # Packed sequences as rows, each under its own block-diagonal mask, where the plan packs them\n"
            "            # (kit.train.collate); None: TRL's own collator, padded or padding-free as the config says.\n"
            "            data_collator=collate.collator(plan, tokenizer),\n"),
    "dpo": ("DPOConfig", "DPOTrainer", _REFERENCE_IS_BASE, ""),
    "kto": ("KTOConfig", "KTOTrainer", _REFERENCE_IS_BASE, ""),
    "grpo": ("GRPOConfig", "GRPOTrainer",
             _REFERENCE_IS_BASE +
             "        # CUDA: a static KV cache and compiled one-token decoding (CUDA graphs) for TRL's generation pass;\n"
             "        # eager decoding elsewhere. See kit/train/generation.py.\n"
             "        from kit.train import generation\n\n"
             "        job.log(generation.speed_up_generation(trainer, max_prompt_tokens=cfg.seq_len).reason)\n"
             "        # A stop (a signal, the deadline) while a step generates gives that step up at the next token on\n"
             "        # every rank: the last finished step is saved and the job pauses there (kit/train/generation_stop.py).\n"
             "        job.stop_generation_on_request(trainer)\n",
             "            # The reward functions of grpo.rewards, imported from the config's folder and dry-called on two\n"
             "            # prompts by Job.start (kit/train/rewards.py). TRL runs them on every rank, each on that rank's\n"
             "            # own completions, with every data column as a keyword argument.\n"
             "            reward_funcs=job.reward_funcs,\n"),
}
# The kit.train modules every script uses; `collate` only where the trainer's own lines call it (sft).
TRAIN_MODULES = ("callbacks", "data", "disk", "dist", "last_word", "modeling", "output_dir", "sharding", "tracking")
METHOD_WORDS = {"lora": "LoRA", "qlora": "QLoRA (4-bit nf4 base + LoRA)", "full": "full fine-tuning"}


def _literal(value, indent: int = 0) -> str:
    """A Python literal of `value`, one key (or item) per line for dicts, lists and tuples that don't fit on one."""
    flat = repr(value)
    if not isinstance(value, (dict, list, tuple)) or not value or len(flat) + indent < 80:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = "".join(f"{pad}{k!r}: {_literal(v, indent + 4)},\n" for k, v in value.items())
        return "{\n" + items + " " * indent + "}"
    items = "".join(f"{pad}{_literal(v, indent + 4)},\n" for v in value)
    opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    return opening + "\n" + items + " " * indent + closing


def _strategy_words(plan: dict) -> str:
    n, device = plan.get("nproc", 1), plan.get("device", "cuda")
    where = "CPU processes (gloo)" if device == "cpu" else f"GPUs ({plan.get('gpu') or 'GPU'})"
    if plan.get("strategy") == "ddp":
        return f"DDP over {n} {where}, {plan.get('precision')}"
    if plan.get("strategy") == "fsdp":
        return f"FSDP over {n} {where}, {plan.get('precision')}"
    if plan.get("strategy") == "model_parallel":
        return f"model parallel over the {where} of one process, {plan.get('precision')}"
    if plan.get("strategy") == "single":
        one = "process on the CPU" if device == "cpu" else f"GPU ({plan.get('gpu') or 'GPU'})"
        return f"single {one}, {plan.get('precision')}"
    return f"{plan.get('strategy')} on {n} {where}, {plan.get('precision')}"


def _launch_line(plan: dict, script: str = "train_ddp.py") -> str:
    """The plan's command, as `kit.machine.command` writes it (one process drives all GPUs for model parallel)."""
    strategy, n = plan.get("strategy"), plan.get("nproc", 1)
    if strategy == "model_parallel":
        return launch_command(1, script=script)
    return launch_command(n, torchrun=strategy == "fsdp" or n > 1, script=script)


def rerender_command(config_path: str, machine_args=(), overrides=(), output: str = "train_ddp.py") -> str:
    """The `kit render` command that writes this same file again: same config, machine, overrides, -o."""
    args = ["--config", Path(config_path).as_posix(), *machine_args, *overrides, "-o", Path(output).as_posix(),
            "--force"]
    # The value after a path flag is a path: `./-x.yaml`, never read as an option.
    words = [shell_word(a, path=i > 0 and args[i - 1] in ("--config", "-o", "--facts")) for i, a in enumerate(args)]
    return "python -m kit render " + " ".join(words)


def render(cfg: config.RunConfig, plan: Plan, config_path: str, machine: str, rerender: str | None = None,
           script: str = "train_ddp.py") -> str:
    """The text of train_ddp.py for `cfg` planned as `plan` on `machine` (words); the plan is written
    whole, as its PLAN, which `Plan.from_dict` reads back equal.

    `rerender` is the command printed at the top that reproduces the file; by default the one for
    this machine, no overrides, `-o train_ddp.py`. `script` is where the file goes (`-o` as given):
    the commands its docstring shows run that file.
    """
    import shlex

    script = shlex.quote(_in_docstring(Path(script).as_posix()))
    kept = plan.to_dict()
    backend = kept.get("backend")
    unsloth_import = ("    import unsloth  # noqa: F401  (first: Unsloth patches transformers and trl on import)\n\n"
                      if backend == "unsloth" else "")
    config_class, trainer_class, after, trainer_kwargs = TRAINERS[cfg.trainer]
    trainer_args = (TEMPLATE.parent / "trainer_args" / f"{cfg.trainer}.py.tmpl").read_text()
    uses_collate = "collate." in trainer_kwargs + trainer_args
    train_modules = ", ".join(sorted((*TRAIN_MODULES, "collate") if uses_collate else TRAIN_MODULES))
    words = {  # text from the user (paths, names, overrides) that lands in the docstring and comments
        "model": cfg.model, "method_words": METHOD_WORDS[cfg.method], "config_path": Path(config_path).as_posix(),
        "strategy_words": _strategy_words(kept), "plan_machine": machine,
        "rerender": rerender or rerender_command(config_path),
    }
    return Template(TEMPLATE.read_text()).substitute(
        {k: _in_docstring(v) for k, v in words.items()},
        config_path_literal=repr(Path(config_path).as_posix()),
        nproc=kept.get("nproc", 1),
        launch=f"{_launch_line(kept, script):<52} ",
        launch_bare=_launch_line(kept, script),
        run_one=f"{'python ' + script:<52} ",
        run_smoke=f"{'python ' + script + ' --smoke':<52} ",
        run_config=f"{'python ' + script + ' --config other.yaml':<52} ",
        unsloth_import=unsloth_import,
        config_class=config_class, trainer_class=trainer_class, trainer_after=after, trainer_kwargs=trainer_kwargs,
        trainer_args=trainer_args, train_modules=train_modules,
        report_to=cfg.report_to,
        kit_version=__version__,
        settings=_literal(_settings(cfg)),
        plan=_literal(kept),
    )


def _settings(cfg) -> dict:
    """The config as the script's SETTINGS: the sections of other trainers (their defaults) left out."""
    out = config.to_dict(cfg)
    for name in config_values.TRAINERS:
        if name != cfg.trainer:
            out.pop(name, None)
    return out


def _in_docstring(text: str) -> str:
    """`text` as it may stand in the script's docstring or a comment: a backslash, a quote, a newline
    or a bidi override in a path (`we"ird\\N.yaml`) shown escaped (`kit.errors.shown`), so the script
    still parses, no line of it is forged, and its source and its docstring read the same."""
    return shown(str(text), limit=None).replace("\\", "\\\\").replace('"', '\\"')


def write(text: str, out: Path, force: bool = False) -> Path | None:
    """Write `text` to `out` atomically; an existing different file is kept as a numbered backup.

    The one rule of `kit render` and `kit bootstrap`: nothing a user may have edited is lost, and
    no flag is needed to replace it. Returns the backup's path (`train_ddp.py.prev`, else `.prev.2`,
    `.prev.3`, … — never an earlier backup overwritten), or None when nothing was replaced. `force`
    is accepted for older commands and changes nothing.
    """
    from kit.auth import refuse_token

    out = Path(out)
    # The last gate before disk: whatever put it there (a setting, a --config path), no token is written.
    refuse_token(text, f"the script for {out}")
    check_output(out, "-o", "train_ddp.py")
    backup = None
    if same_content(out, text, "-o") is False:
        backup = free_backup_name(out)
        out.replace(backup)
    try:
        write_atomic(out, text, mode=0o644)
    except OSError as e:
        if backup is not None:  # put the user's script back: a failed write must lose nothing
            backup.replace(out)
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None
    failed_bootstrap.clear(out)  # the script there now is the one asked for
    return backup


def free_backup_name(out: Path) -> Path:
    """`train_ddp.py.prev`, else `.prev.2`, `.prev.3`, …: the first name not taken."""
    import os

    candidate, n = out.with_name(out.name + ".prev"), 1
    while os.path.lexists(candidate):  # a dangling symlink is taken too: replacing it would lose it
        n += 1
        candidate = out.with_name(f"{out.name}.prev.{n}")
    return candidate


def kept_words(backup: Path | None) -> str:
    """What the output says about a replaced file: ` (the previous one is now train_ddp.py.prev)`."""
    return f" (the previous one is now {backup.name})" if backup is not None else ""
