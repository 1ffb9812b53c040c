"""One config value, checked: its type, its range or choices, and the words when a key is unknown.

Every error is a one-line `UsageError` (exit 2) naming the key, the value and where it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

from kit.errors import UsageError, shown
from kit.planning import names, tracking

METHODS = ("lora", "qlora", "full")
BACKENDS = ("auto", "transformers", "unsloth")
FORMATS = ("auto", "messages", "alpaca", "prompt_completion", "text", "preference", "unpaired_preference", "prompts")
OPTIMIZERS = ("auto", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit")
BATCHINGS = ("auto", "padded", "grouped", "padding_free", "packed")
KERNELS = ("auto", "liger", "none")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
CHECKPOINTING = ("auto", "on", "off")
STRATEGIES = ("auto", "ddp", "fsdp", "model_parallel")
EVAL_METRICS = ("auto", "exact_match", "none")
TRAINERS = ("sft", "dpo", "kto", "grpo")
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "robust", "sigmoid_norm")
GRPO_LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo")

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
MAX_NAMES = 256  # module names in lora.target_modules, renamed columns in data.columns
INT_MAX = 2**31 - 1  # a C int: what torch, tokenizers and the Trainer's step counters hold
MAX_EPOCHS = 10**6


# (type accepted, allows None). bool is an int subclass, so it is refused for int/float fields.
# learning_rate may be 0: a smoke run with it must be able to show "LoRA weights unchanged".
_POSITIVE = {"seq_len", "per_device_batch", "global_batch", "epochs", "max_steps",
             "save_steps", "save_every_minutes", "keep_checkpoints", "lease_heartbeat_seconds", "time_budget_minutes",
             "logging_steps", "eval_steps", "lora.r", "lora.alpha", "eval.subset", "eval.min_rows",
             "eval.max_new_tokens", "dpo.beta", "kto.beta", "grpo.num_generations",
             "grpo.max_completion_length", "grpo.temperature", "grpo.reward_timeout"}
_NON_EMPTY = {"model", "output_dir", "data.path", "data.split", "store", "revision", "resume", "grpo.rewards",
              "grpo.system_prompt"}
# Free text, not a name, path or column: lines and tabs are part of it (the script holds it as an escaped literal).
_TEXT = {"grpo.system_prompt"}
_TEXT_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NON_NEGATIVE = {"warmup_steps", "weight_decay", "max_grad_norm", "learning_rate", "eval.samples", "squash_history_every",
                 "kto.desirable_weight", "kto.undesirable_weight", "grpo.beta"}
_CHOICES = {"method": METHODS, "backend": BACKENDS, "data.format": FORMATS, "optimizer": OPTIMIZERS,
            "precision": PRECISIONS, "lr_scheduler": SCHEDULERS, "gradient_checkpointing": CHECKPOINTING,
            "batching": BATCHINGS, "kernels": KERNELS, "strategy": STRATEGIES, "eval.metric": EVAL_METRICS,
            "activation_offloading": CHECKPOINTING, "compile": CHECKPOINTING, "report_to": tracking.CHOICES,
            "trainer": TRAINERS, "dpo.loss_type": DPO_LOSSES, "dpo.precompute_ref_log_probs": CHECKPOINTING,
            "kto.precompute_ref_log_probs": CHECKPOINTING, "grpo.loss_type": GRPO_LOSSES}
# Names people bring from other tools (HF TrainingArguments, TRL, axolotl).
_ALIASES = {"lr": "learning_rate", "batch_size": "per_device_batch", "max_seq_length": "seq_len",
            "max_length": "seq_len", "model_name": "model", "num_train_epochs": "epochs",
            "gradient_accumulation_steps": "global_batch", "bf16": "precision", "fp16": "precision",
            "rank": "r", "lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "targets": "target_modules",
            "dataset": "path", "data_path": "path", "torch_compile": "compile", "tracker": "report_to",
            "logger": "report_to"}


# Keys that name something kit decides itself, with where that decision is made.
_PLANNED = {"strategy": "kit plans the strategy itself (single, ddp, fsdp, model_parallel) from the model and the "
                        "GPUs: see `kit plan`", "deepspeed": "kit does not use DeepSpeed; it plans DDP or FSDP: "
                        "see `kit plan`", "zero_stage": "kit does not use DeepSpeed ZeRO; it plans DDP or FSDP: "
                        "see `kit plan`"}


# Keys that name local files or folders (a store or resume may also be hf://… or a keyword).
PATH_KEYS = {"output_dir", "store", "resume", "data.path", "model"}


def unknown_key(key: str, known, prefix: str, source: str, value=None) -> UsageError:
    leaf = key.split(".")[-1]
    where = f" in {source}" if source else ""
    if leaf in _PLANNED and not prefix:
        return UsageError(f"unknown config key {shown(key, quote=True)}{where}: {_PLANNED[leaf]}")
    alias = _ALIASES.get(leaf)
    # A value that is one of a key's choices (`dtype=bf16`) points at that key better than the spelling.
    by_value = [k for k, choices in _CHOICES.items() if isinstance(value, str) and value in choices
                and k.startswith(prefix) and k[len(prefix):] in known]
    if alias in known:
        close = [prefix + alias]
    elif by_value:
        close = [f"{by_value[0]}={value}"]
    else:
        close = [prefix + c for c in difflib.get_close_matches(leaf, list(known), n=1)]
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
    return UsageError(f"unknown config key {shown(key, quote=True)}{where}{hint}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _refuse_controls(key: str, value, where: str) -> None:
    """A newline, NUL, ESC, DEL or C1 control in a string setting (a path, a name, a module, a column)
    breaks every file and command it goes into: refused by name. (Bidi and zero-width characters are
    allowed: the script holds them as escaped literals and kit prints them escaped.)"""
    strings = value if isinstance(value, list) else [*value.keys(), *value.values()] if isinstance(value, dict) \
        else [value]
    control = _TEXT_CONTROL if key in _TEXT else _CONTROL
    if any(isinstance(v, str) and control.search(v) for v in strings):
        kinds = "NUL, ESC, a carriage return" if key in _TEXT else "newline, tab, NUL, ESC"
        raise UsageError(f"config key {shown(key, quote=True)}{where} holds a control character ({kinds}): "
                         f"{shown(value, quote=True)}")


def check_value(key: str, f: dataclasses.Field, value, source: str):
    """Return `value` converted to the field's type, or raise UsageError naming key and value."""
    where = f" in {source}" if source else ""
    name = shown(key, quote=True)  # as every message names it: escaped, at most 200 characters
    ann = str(f.type)
    optional = "None" in ann
    if value is None:
        if optional:
            return None
        raise UsageError(f"config key {name}{where} must not be null")
    _refuse_controls(key, value, where)
    if isinstance(value, (list, dict)) and len(value) > MAX_NAMES:  # each is matched against every module or column
        raise UsageError(f"config key {name}{where} lists {len(value):,} names; a real one has "
                         f"a few (at most {MAX_NAMES:,})")
    if key in ("gradient_checkpointing", "activation_offloading", "compile", "dpo.precompute_ref_log_probs",
               "kto.precompute_ref_log_probs"):
        # PyYAML reads on/off/yes/no/true/false as booleans: accept them all.
        if isinstance(value, bool):
            return "on" if value else "off"
        value = str(value).lower()
        value = {"true": "on", "false": "off", "yes": "on", "no": "off"}.get(value, value)
    elif key == "save_every_minutes" and isinstance(value, str) and not _is_number(value):
        if value.strip().lower() != "auto":
            raise UsageError(f"config key {name}{where} must be a number of minutes or auto, got {shown(value, quote=True)}")
        return "auto"
    elif key == "lora.target_modules":
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
            return list(value)
        raise UsageError(f"config key {name}{where} must be 'all-linear' or a list of module names, got {shown(value, quote=True)}")
    elif ann.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise UsageError(f"config key {name}{where} must be an integer, got {shown(value, quote=True)}")
    elif ann.startswith("float"):
        if isinstance(value, str):  # PyYAML reads 2e-4 (no dot) as a string: YAML 1.1 wants 2.0e-4
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"config key {name}{where} must be a number, got {shown(value, quote=True)}")
        try:
            value = float(value)
        except OverflowError:  # an integer of 400 digits: no float holds it (it was "a bug in kit")
            raise UsageError(f"config key {name}{where} must be a finite number, got "
                             f"{shown(value, quote=True)}") from None
        if not math.isfinite(value):  # YAML's .nan/.inf: a NaN learning rate trains nothing, silently
            raise UsageError(f"config key {name}{where} must be a finite number, got {shown(value, quote=True)}")
    elif ann.startswith("bool"):
        if not isinstance(value, bool):
            raise UsageError(f"config key {name}{where} must be true or false, got {shown(value, quote=True)}")
    elif ann.startswith("dict"):
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in value.items()):
            raise UsageError(f"config key {name}{where} must be a mapping of column names, got {shown(value, quote=True)}")
    elif ann.startswith("str"):
        if isinstance(value, (dict, list, bool)):
            raise UsageError(f"config key {name}{where} must be a string, got {shown(value, quote=True)}")
        value = str(value)
        if not value.strip() and key in _NON_EMPTY:
            raise UsageError(f"config key {name}{where} must not be empty")
        if key in PATH_KEYS:  # first: a 5,000-character model name was an OSError from stat()
            names.check_name_lengths(value, key, where)
        if key == "model":
            value = names.check_model(value, key, where)
        elif key == "store":
            value = names.check_store(value, key, where)
    if key in _CHOICES and value not in _CHOICES[key]:
        close = difflib.get_close_matches(str(value).lower(), _CHOICES[key], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"config key {name}{where} is {shown(value, quote=True)}; expected one of {'|'.join(_CHOICES[key])}{hint}")
    if key in _POSITIVE and value <= 0:
        raise UsageError(f"config key {name}{where} must be > 0, got {shown(value, quote=True)}")
    if key in _NON_NEGATIVE and value < 0:
        raise UsageError(f"config key {name}{where} must be >= 0, got {shown(value, quote=True)}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX and key != "seed":
        # 10**21 steps "trained forever"; the libraries keep counts, lengths and ranks in C ints
        raise UsageError(f"config key {name}{where} must be at most {INT_MAX:,}, got {shown(value, quote=True)}")
    if key == "epochs" and value > MAX_EPOCHS:  # epochs × rows becomes a step count
        raise UsageError(f"config key {name}{where} must be at most {MAX_EPOCHS:,}, got {shown(value, quote=True)}")
    if key == "seed" and not 0 <= value < 2**32:  # numpy's and CUDA's generators take 32-bit seeds
        raise UsageError(f"config key {name}{where} must be in [0, 2**32), got {shown(value, quote=True)}")
    if key == "learning_rate" and value > 1:  # 1e300 overflowed the optimizer at step 1; real ones are < 1e-2
        raise UsageError(f"config key {name}{where} must be at most 1 (LoRA uses about 2e-4), got {shown(value, quote=True)}")
    if key == "lora.dropout" and not 0 <= value < 1:
        raise UsageError(f"config key {name}{where} must be in [0, 1), got {shown(value, quote=True)}")
    if key in ("data.eval_fraction", "data.max_duplicate_fraction") and not 0 <= value < 1:
        raise UsageError(f"config key {name}{where} must be in [0, 1), got {shown(value, quote=True)}")
    return value


