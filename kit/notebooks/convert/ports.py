"""Ports: a notebook's calls to transformers, TRL, datasets and PEFT APIs that the installed
versions removed or renamed, rewritten to a spelling that works on transformers 5.17 to 5.24 and
TRL 1.15 to 1.16 (each change listed with the version that made it), or named in one REVIEW line
where the new spelling is not mechanical.

The tables below were read from those libraries' own sources (the fields of `TrainingArguments`
and of TRL's configs, the trainers' `__init__` signatures, the packages' exports) against
transformers 4.45, 5.0, TRL 0.11 and 0.19 and datasets 2.21; tests/test_convert_ports.py checks
every new spelling against the installed libraries. A target spelling exists in every supported
version: `activation_checkpointing` (new in 5.24) becomes the `gradient_checkpointing` both accept.
"""

from __future__ import annotations

import ast
import builtins

import libcst as cst

from kit.notebooks.convert.kinds import UNSLOTH_LOADERS, is_model_loader, is_training_args
from kit.notebooks.convert.syntax import call_name, code, drop_kwarg, kwarg, set_kwarg, short_name

T5 = "transformers 5.0"
T5X = "transformers 5.x after 5.0 (absent from 5.17)"
# TrainingArguments (and TRL's configs, its subclasses): old keyword -> (new keyword, why). A new
# keyword of None drops the old one; a value maps through VALUE_PORTS.
TRAINING_ARGS: dict[str, tuple[str | None, str]] = {
    "evaluation_strategy": ("eval_strategy", f"renamed, the old name removed in {T5}"),
    "no_cuda": ("use_cpu", f"renamed, the old name removed in {T5}"),
    "per_gpu_train_batch_size": ("per_device_train_batch_size", f"renamed, removed in {T5}"),
    "per_gpu_eval_batch_size": ("per_device_eval_batch_size", f"renamed, removed in {T5}"),
    "push_to_hub_token": ("hub_token", f"renamed, removed in {T5}"),
    "include_inputs_for_metrics": ("include_for_metrics", f"include_for_metrics=['inputs'] since {T5}"),
    "group_by_length": ("train_sampling_strategy", f"train_sampling_strategy='group_by_length' in {T5X}"),
    "warmup_ratio": ("warmup_steps", f"warmup_steps takes a ratio (a float below 1) in {T5X}"),
    "adafactor": ("optim", f"optim='adafactor' since {T5}"),
    "activation_checkpointing": ("gradient_checkpointing", "the name transformers 5.17 knows (5.24 accepts both)"),
    "activation_checkpointing_kwargs": ("gradient_checkpointing_kwargs",
                                        "the name transformers 5.17 knows (5.24 accepts both)"),
    "logging_dir": (None, f"removed in {T5X}: TensorBoard reads the TENSORBOARD_LOGGING_DIR environment variable"),
    "overwrite_output_dir": (None, f"removed in {T5}: Trainer never emptied output_dir"),
    "save_safetensors": (None, f"removed in {T5}: checkpoints are always safetensors"),
    "fp16_backend": (None, f"removed in {T5}"),
    "half_precision_backend": (None, f"removed in {T5}"),
    "use_mps_device": (None, f"removed in {T5}: Apple GPUs are used when present"),
    "include_tokens_per_second": (None, f"removed in {T5}"),
    "tpu_num_cores": (None, f"removed in {T5}"),
    "tpu_metrics_debug": (None, f"removed in {T5}"),
    "jit_mode_eval": (None, f"removed in {T5}"),
    "use_ipex": (None, f"removed in {T5}"),
    "use_legacy_prediction_loop": (None, f"removed in {T5}"),
    "ray_scope": (None, f"removed in {T5}"),
    "mp_parameters": (None, f"removed in {T5}"),
}
# Removed keywords whose meaning has no mechanical new spelling: dropped, with a REVIEW line.
TRAINING_ARGS_REVIEW = {
    "dispatch_batches": f"removed in {T5}: accelerator_config={{'dispatch_batches': …}} instead",
    "split_batches": f"removed in {T5}: accelerator_config={{'split_batches': …}} instead",
    "push_to_hub_model_id": f"removed in {T5}: hub_model_id='user/name' instead",
    "push_to_hub_organization": f"removed in {T5}: hub_model_id='org/name' instead",
    "fsdp_min_num_params": f"removed in {T5}: fsdp_config={{'min_num_params': …}} instead",
    "fsdp_transformer_layer_cls_to_wrap": f"removed in {T5}: fsdp_config={{'transformer_layer_cls_to_wrap': …}}",
    "torchdynamo": f"removed in {T5}: torch_compile_backend instead",
    "past_index": f"removed in {T5}",
    "fp16_opt_level": f"removed in {T5} (apex)",
}
# TRL configs: keywords TRL 1.x no longer has, per config (`max_seq_length` is SFTConfig's max_length).
CONFIG_RENAMES = {"SFTConfig": {"max_seq_length": "max_length"}}
CONFIG_REVIEW = {
    "DPOConfig": {"max_prompt_length", "max_completion_length", "max_target_length", "padding_value",
                  "label_pad_token_id", "is_encoder_decoder", "generate_during_eval", "reference_free",
                  "force_use_ref_model", "rpo_alpha", "use_logits_to_keep", "ref_model_init_kwargs"},
    "KTOConfig": {"max_prompt_length", "max_completion_length", "padding_value", "label_pad_token_id",
                  "is_encoder_decoder", "generate_during_eval", "truncation_mode", "ref_model_init_kwargs"},
    "GRPOConfig": {"max_prompt_length", "vllm_guided_decoding_regex", "wandb_log_unique_prompts"},
    "ORPOConfig": {"max_prompt_length", "label_pad_token_id", "truncation_mode"},  # in trl.experimental.orpo
    "CPOConfig": {"max_prompt_length", "label_pad_token_id", "truncation_mode", "padding_value"},
}
TRL1 = "TRL 1.x"
# Trainer keywords TRL moved to its config: trainer -> (config, {old keyword: config keyword or None}).
TRAINER_MOVES = {
    "SFTTrainer": ("SFTConfig", {"dataset_text_field": "dataset_text_field", "packing": "packing",
                                 "max_seq_length": "max_length", "dataset_num_proc": "dataset_num_proc",
                                 "neftune_noise_alpha": "neftune_noise_alpha", "model_init_kwargs": "model_init_kwargs",
                                 "dataset_kwargs": "dataset_kwargs", "eval_packing": "eval_packing",
                                 "dataset_batch_size": None, "infinite": None, "num_of_sequences": None,
                                 "chars_per_token": None}),
    "DPOTrainer": ("DPOConfig", {"beta": "beta", "label_smoothing": "label_smoothing", "loss_type": "loss_type",
                                 "max_length": "max_length", "truncation_mode": "truncation_mode",
                                 "disable_dropout": "disable_dropout", "dataset_num_proc": "dataset_num_proc",
                                 "precompute_ref_log_probs": "precompute_ref_log_probs",
                                 "model_init_kwargs": "model_init_kwargs"}),
    "RewardTrainer": ("RewardConfig", {"max_length": "max_length"}),
}
# Functions and imports that went away.
REMOVED_IMPORTS = {
    ("trl", "setup_chat_format"): f"removed in {TRL1}: trl.clone_chat_template(model, tokenizer, source_model_id) "
                                  "copies a chat template from another model, or set tokenizer.chat_template",
    ("trl", "DataCollatorForCompletionOnlyLM"): f"removed in {TRL1}: SFTConfig(completion_only_loss=True) on "
                                                 "prompt/completion data, or assistant_only_loss=True on chats",
    ("datasets", "load_metric"): "removed in datasets 3.0",
    ("peft", "prepare_model_for_int8_training"): "removed in PEFT 0.10",
}
# Trainers TRL 1.x moved out of its top level into trl.experimental (name -> its module there).
EXPERIMENTAL = {"ORPOConfig": "orpo", "ORPOTrainer": "orpo", "CPOConfig": "cpo", "CPOTrainer": "cpo",
                "OnlineDPOConfig": "online_dpo", "OnlineDPOTrainer": "online_dpo", "GKDConfig": "gkd",
                "GKDTrainer": "gkd"}
RENAMED_FUNCTIONS = {"load_metric": ("evaluate.load", "import evaluate", "datasets 3.0 removed load_metric: "
                                     "the evaluate package's load (pip install evaluate)"),
                     "prepare_model_for_int8_training": ("prepare_model_for_kbit_training",
                                                         "from peft import prepare_model_for_kbit_training",
                                                         "PEFT 0.10 removed it for prepare_model_for_kbit_training")}
LOADER_KWARGS = {"use_auth_token": ("token", f"removed in {T5}"),
                 "torch_dtype": ("dtype", f"deprecated in {T5}, a warning on every load")}
# `apply_chat_template(…)` tokenizing (tokenize=True, the default) returned the token ids until 5.0 (a list,
# a list of lists for a batch, a tensor with return_tensors); 5.0 made return_dict=True the default, so it
# returns a BatchEncoding (a dict) that the notebook's indexing, len() or batched map read as those ids.
CHAT_TEMPLATE = (f"{T5} returns a BatchEncoding (a dict) by default where it returned the token ids the "
                 "notebook reads (len(), indexing, a batched map's column)")


def _trainer_kind(short: str) -> str | None:
    return short if short in TRAINER_MOVES else None


def _config_kind(call: cst.Call) -> str:
    return call_name(call).rsplit(".", 1)[-1]


class Ports(cst.CSTTransformer):
    """Rewrites one statement's old API calls; `notes` (review?, text) say what changed, `imports`
    the lines the script's top needs for them."""

    def __init__(self, trees: list[ast.Module]):
        super().__init__()
        self.notes: list[tuple[bool, str]] = []
        self.imports: list[str] = []
        self.moves = _plan_moves(trees)  # config variable -> (config class, {keyword: value source})
        self.moved_names = set(self.moves)
        self.renamed: set[str] = set()  # functions imported under a removed name, called by the new one

    def note(self, text: str, review: bool = False) -> None:
        if (review, text) not in self.notes:  # one line per construct and statement
            self.notes.append((review, text))

    def need(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    # --- imports ----------------------------------------------------------------------------------

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        if updated.module is None or isinstance(updated.names, cst.ImportStar):
            return updated
        module = code(updated.module).split(".")[0]
        kept = []
        for alias in updated.names:
            name = code(alias.name)
            if code(updated.module) == "trl" and name in EXPERIMENTAL:
                line = f"from trl.experimental.{EXPERIMENTAL[name]} import {name}" + (
                    f" as {code(alias.asname.name)}" if alias.asname else "")
                self.need(line)
                self.note(f"`from trl import {name}` → `{line}` ({TRL1} moved it to trl.experimental)")
                continue
            if (module, name) not in REMOVED_IMPORTS:
                kept.append(alias)
                continue
            if name in RENAMED_FUNCTIONS and alias.asname is None:
                new, line, why = RENAMED_FUNCTIONS[name]
                self.need(line)
                self.renamed.add(name)
                self.note(f"`from {module} import {name}` → `{line}`: {why}")
            else:
                self.note(f"`from {module} import {name}`: {REMOVED_IMPORTS[(module, name)]}: kit kept the line, "
                          "which fails on the installed version; rewrite that part by hand", review=True)
                kept.append(alias)
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)

    # --- assignments of configs whose trainer passes them old keywords -------------------------

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        if len(updated.targets) != 1 or not isinstance(updated.targets[0].target, cst.Name):
            return updated
        name = updated.targets[0].target.value
        if name not in self.moves or not isinstance(updated.value, cst.Call) or not is_training_args(updated.value):
            return updated
        config, values = self.moves[name]
        return updated.with_changes(value=self._into_config(updated.value, config, values, name))

    def _into_config(self, call: cst.Call, config: str, values: dict[str, str], where: str) -> cst.Call:
        if _config_kind(call) != config:  # TrainingArguments(...) has none of TRL's keywords
            self.need(f"from trl import {config}")
            self.note(f"{call_name(call)}(…) → {config}(…) ({where}): its trainer's keywords "
                      f"{', '.join(values)} are {config}'s since TRL 0.12 (a subclass of TrainingArguments)")
            call = call.with_changes(func=cst.Name(config))
        for key, value in values.items():
            if kwarg(call, key) is None:
                call = set_kwarg(call, key, value)
        return call

    # --- calls ------------------------------------------------------------------------------------

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, short = call_name(updated), short_name(updated)
        if name in self.renamed:
            return updated.with_changes(func=cst.parse_expression(RENAMED_FUNCTIONS[name][0]))
        if name in ("datasets.load_metric",):
            new, line, why = RENAMED_FUNCTIONS["load_metric"]
            self.need(line)
            self.note(f"{name}(…) → {new}(…): {why}")
            return updated.with_changes(func=cst.parse_expression(new))
        if short.endswith("Trainer") and kwarg(updated, "tokenizer") is not None:
            updated = _rename(updated, "tokenizer", "processing_class")
            self.note(f"{short}: tokenizer= → processing_class= (transformers 5.0 and TRL 0.12 removed tokenizer=)")
        if short in TRAINER_MOVES:
            updated = self._trainer_moves(updated, short)
        if is_training_args(updated):
            updated = self._training_args(updated, _config_kind(updated))
        if short == "from_pretrained" and is_model_loader(name.rsplit(".", 1)[0]) \
                and name.rsplit(".", 1)[0].rsplit(".", 1)[-1] not in UNSLOTH_LOADERS:
            updated = self._loader(updated, name)
        elif short == "from_pretrained" or name in ("load_dataset", "datasets.load_dataset"):
            if kwarg(updated, "use_auth_token") is not None:
                updated = _rename(updated, "use_auth_token", "token")
                self.note(f"{name}: use_auth_token= → token= (removed in {T5} and datasets 3.0)")
        if short == "apply_chat_template":
            updated = self._chat_template(updated, name)
        if name in ("load_dataset", "datasets.load_dataset") and (a := kwarg(updated, "trust_remote_code")) is not None:
            updated = drop_kwarg(updated, "trust_remote_code")
            self.note(f"{name}: trust_remote_code dropped: datasets 4.0 runs no dataset scripts (it only logs an "
                      "error); a dataset that needs one no longer loads", review=code(a.value) != "False")
        return updated

    def _chat_template(self, call: cst.Call, name: str) -> cst.Call:
        """return_dict=False where the call tokenizes and says nothing of return_dict: the ids, as before 5.0."""
        tokenize = kwarg(call, "tokenize")
        if tokenize is not None and code(tokenize.value) == "False" or kwarg(call, "return_dict") is not None \
                or kwarg(call, "return_assistant_tokens_mask") is not None \
                or sum(a.keyword is None and not a.star for a in call.args) > 6:  # tokenize given by position
            return call
        if any(a.star == "**" for a in call.args):  # return_dict may be in the dict: adding it could clash
            self.note(f"{name}(…, **…): {CHAT_TEMPLATE}: where it tokenizes, pass return_dict=False for the ids",
                      review=True)
            return call
        self.note(f"{name}: return_dict=False ({CHAT_TEMPLATE})")
        return set_kwarg(call, "return_dict", "False")

    def _loader(self, call: cst.Call, name: str) -> cst.Call:
        for old, (new, why) in LOADER_KWARGS.items():
            if kwarg(call, old) is not None and kwarg(call, new) is None:
                call = _rename(call, old, new)
                self.note(f"{name}: {old}= → {new}= ({why})")
        bits = [k for k in ("load_in_4bit", "load_in_8bit") if kwarg(call, k) is not None]
        if bits and kwarg(call, "quantization_config") is not None:
            for k in bits:
                call = drop_kwarg(call, k)
            self.note(f"{name}: {', '.join(bits)} dropped: quantization_config says how to load, and "
                      f"from_pretrained's own load_in_* were removed in {T5}")
        elif bits and all(code(kwarg(call, k).value) == "False" for k in bits):
            for k in bits:
                call = drop_kwarg(call, k)
            self.note(f"{name}: {', '.join(f'{k}=False' for k in bits)} dropped (from_pretrained's own load_in_* "
                      f"were removed in {T5}; off is the default)")
        elif bits:
            spelled = ", ".join(f"{k}={code(kwarg(call, k).value)}" for k in bits)
            for k in bits:
                call = drop_kwarg(call, k)
            call = set_kwarg(call, "quantization_config", f"BitsAndBytesConfig({spelled})")
            self.need("from transformers import BitsAndBytesConfig")
            self.note(f"{name}: {spelled} → quantization_config=BitsAndBytesConfig({spelled}) "
                      f"(from_pretrained's own load_in_* were removed in {T5})")
        return call

    def _training_args(self, call: cst.Call, config: str) -> cst.Call:
        for old, (new, why) in TRAINING_ARGS.items():
            a = kwarg(call, old)
            if a is None:
                continue
            value = code(a.value)
            call = drop_kwarg(call, old)
            if new is None:
                self.note(f"{config}: {old}={value} dropped ({why})")
                continue
            if kwarg(call, new) is not None:
                self.note(f"{config}: {old}={value} dropped: {new} is set too ({why})", review=True)
                continue
            new_value = _value(old, value)
            if new_value is not None:
                call = set_kwarg(call, new, new_value)
                self.note(f"{config}: {old}={value} → {new}={new_value} ({why})")
            else:
                self.note(f"{config}: {old}={value} dropped ({why})")
        for old, why in TRAINING_ARGS_REVIEW.items():
            if (a := kwarg(call, old)) is not None:
                call = drop_kwarg(call, old)
                self.note(f"{config}: {old}={code(a.value)} dropped: {why}", review=True)
        for old, new in CONFIG_RENAMES.get(config, {}).items():
            if kwarg(call, old) is not None and kwarg(call, new) is None:
                call = _rename(call, old, new)
                self.note(f"{config}: {old}= → {new}= ({TRL1} has no {old})")
        for old in sorted(CONFIG_REVIEW.get(config, ())):
            if (a := kwarg(call, old)) is not None:
                call = drop_kwarg(call, old)
                self.note(f"{config}: {old}={code(a.value)} dropped: {TRL1} has no {old} (max_length bounds the "
                          "whole sequence)", review=True)
        return call

    def _trainer_moves(self, call: cst.Call, short: str) -> cst.Call:
        config, table = TRAINER_MOVES[short]
        for old in sorted(CONFIG_REVIEW.get(config, ())):  # its trainer's keyword until TRL 0.11, in no config now
            if old not in table and (a := kwarg(call, old)) is not None:
                call = drop_kwarg(call, old)
                self.note(f"{short}: {old}={code(a.value)} dropped: {TRL1} has no {old} (max_length bounds the "
                          "whole sequence)", review=True)
        found = {k: kwarg(call, k) for k in table if kwarg(call, k) is not None}
        if not found:
            return call
        for k in found:
            call = drop_kwarg(call, k)
        values = {table[k]: code(a.value) for k, a in found.items() if table[k] is not None}
        gone = [k for k in found if table[k] is None]
        if gone:
            self.note(f"{short}: {', '.join(gone)} dropped ({TRL1} has no such option)")
        if not values:
            return call
        shown = ", ".join(f"{k}=" for k in found if table[k] is not None)
        args = kwarg(call, "args")
        if args is not None and isinstance(args.value, cst.Call) and is_training_args(args.value):
            call = set_kwarg(call, "args", code(self._into_config(args.value, config, values, "its args=")))
        elif args is None:
            self.need(f"from trl import {config}")
            spelled = ", ".join(f"{k}={v}" for k, v in values.items())
            call = set_kwarg(call, "args", f"{config}({spelled})")
        elif isinstance(args.value, cst.Name) and args.value.value in self.moved_names:
            pass  # moved into that config's assignment (leave_Assign)
        else:
            self.note(f"{short}: {shown} dropped: they are {config}'s keywords in {TRL1}, and kit could not "
                      f"follow args={code(args.value)} to one config call: set them there", review=True)
            return call
        self.note(f"{short}: {shown} moved into {config} (SFTTrainer/DPOTrainer keywords until TRL 0.11; "
                  f"{'max_seq_length is max_length; ' if 'max_seq_length' in found else ''}the trainers take "
                  "them from their config since)")
        return call


def _rename(call: cst.Call, old: str, new: str) -> cst.Call:
    return call.with_changes(args=[a.with_changes(keyword=cst.Name(new)) if a.keyword is not None
                                   and a.keyword.value == old else a for a in call.args])


def _value(old: str, value: str) -> str | None:
    """The new keyword's value for the old one's, or None to drop a boolean that was off."""
    literal = {"group_by_length": '"group_by_length"', "adafactor": '"adafactor"', "include_inputs_for_metrics":
               '["inputs"]'}
    if value == "True" and old in literal:
        return literal[old]
    if old == "group_by_length":
        return None if value == "False" else f'"group_by_length" if {value} else "random"'
    if old == "adafactor":
        return None if value == "False" else f'"adafactor" if {value} else "adamw_torch"'
    if old == "include_inputs_for_metrics":
        return None if value == "False" else f'["inputs"] if {value} else []'
    return value


def _plan_moves(trees: list[ast.Module]) -> dict[str, tuple[str, dict[str, str]]]:
    """Config variable -> (config class, {config keyword: value source}) for each TRL trainer that passes
    moved keywords with `args=NAME`, where NAME is assigned once from a config call and every name the
    moved values use is defined by then."""
    assigned: dict[str, list[int]] = {}
    defined: dict[str, int] = {}
    configs: dict[str, int] = {}
    at = 0
    for tree in trees:
        for stmt in tree.body:
            at += 1
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    defined.setdefault(node.id, at)
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    defined.setdefault(node.name, at)
                elif isinstance(node, ast.alias):
                    defined.setdefault((node.asname or node.name).split(".")[0], at)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                assigned.setdefault(stmt.targets[0].id, []).append(at)
                if isinstance(stmt.value, ast.Call):
                    configs[stmt.targets[0].id] = at
    moves: dict[str, tuple[str, dict[str, str]]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            short = ast.unparse(node.func).rsplit(".", 1)[-1]
            if short not in TRAINER_MOVES:
                continue
            config, table = TRAINER_MOVES[short]
            args = next((k.value for k in node.keywords if k.arg == "args"), None)
            values = {table[k.arg]: k.value for k in node.keywords if k.arg in table and table[k.arg]}
            if not values or not isinstance(args, ast.Name) or len(assigned.get(args.id, [])) != 1 \
                    or args.id not in configs:
                continue
            when = configs[args.id]
            names = {n.id for v in values.values() for n in ast.walk(v) if isinstance(n, ast.Name)}
            if all(defined.get(n, 0) < when or hasattr(builtins, n) for n in names):
                moves[args.id] = (config, {k: ast.unparse(v) for k, v in values.items()})
    return moves
