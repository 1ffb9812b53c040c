"""`kit convert --dry-run`: the same script on kit's tiny local model and data, for a few steps.

Before spending GPU hours, a user (and kit's tests) can run the converted notebook top to bottom
on any machine, CPU included: Hub model ids become `models/tiny-qwen3`, Hub datasets become the
embedded `data/ha_commands.jsonl` reshaped into the columns the notebook reads, training stops
after `DRY_RUN_STEPS` steps, and what a tiny model on a CPU cannot do (4-/8-bit loading, 8-bit
optimizers, 16-bit weights, flash attention, trackers) is switched off. Nothing is written to the
Hub: `push_to_hub=True` becomes False and every Hub write (`push_to_hub*`, `upload_*`,
`create_repo`…) prints that it was skipped, so a dry run never replaces a user's real model with
a tiny one (`--dry-run-push` lets them through, to the Hub HF_ENDPOINT names: kit's tests run a
test Hub). Everything else — rank guards, barriers — is exactly what the real conversion does.
What the notebook itself writes and reads back (its output folders) is left alone.

The second half of this module runs inside the dry-run script: `dry_run_dataset` and
`device_properties`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import libcst as cst

import kit
from kit.errors import UsageError
from kit.notebooks.convert.kinds import is_model_loader, is_training_args
from kit.notebooks.convert.syntax import call_name, code, drop_kwarg, kwarg, normal, set_kwarg, short_name

ROOT = Path(kit.CHECKOUT)
TINY_MODEL = ROOT / "models" / "tiny-qwen3"
TINY_DATA = ROOT / "data" / "ha_commands.jsonl"
DRY_RUN_STEPS = 2
MAX_NEW_TOKENS = 8
TOKENIZERS = ("AutoTokenizer", "AutoProcessor", "PreTrainedTokenizerFast")
PRODUCERS = {"save_pretrained", "save_model", "push_to_hub", "save_pretrained_merged", "push_to_hub_merged"}
# Schemas by the column that gives them away, most specific first.
SCHEMAS = [("conversations", "sharegpt"), ("instruction", "alpaca"), ("question", "qa"), ("chosen", "preference"),
           ("completion", "prompt_completion"), ("messages", "messages"), ("text", "text")]
# A notebook that trains with one of these reads rows of its kind whatever columns it names (a DPO
# notebook passes `load_dataset("trl-lib/ultrafeedback_binarized")` straight to the trainer).
TRAINER_SCHEMAS = {"DPOTrainer": "preference", "ORPOTrainer": "preference", "CPOTrainer": "preference",
                   "KTOTrainer": "unpaired_preference"}


# Calls that write to the Hub: a dry run prints that it skipped them (by the method's name).
HUB_WRITES = {"push_to_hub", "push_to_hub_merged", "push_to_hub_gguf", "upload_folder", "upload_file",
              "upload_large_folder", "create_repo", "create_commit", "create_branch", "delete_repo", "delete_file",
              "delete_folder", "move_repo", "update_repo_settings", "add_space_secret"}
# Names a notebook subscripts that are no extra data column: another schema's columns (TRL would
# read the rows as that format), tokenizer outputs, chat-turn keys.
NOT_EXTRA = {c for c, _ in SCHEMAS} | {"input", "output", "answer", "prompt", "rejected", "label", "images", "image",
                                       "audio",
                                       "input_ids", "attention_mask", "labels", "token_type_ids", "role", "content",
                                       "from", "value", "train", "test", "validation", "completion_mask",
                                       "assistant_masks", "position_ids", "pixel_values"}
# Training arguments that need a GPU, off in a dry run (which runs on a CPU too).
GPU_ONLY_ARGS = {"use_liger_kernel": "Liger's Triton kernels need a GPU",
                 "activation_offloading": "it offloads to the CPU from a GPU", "tf32": "TF32 is an Ampere GPU's"}
QWEN3_HEADS = {"CausalLM", "SequenceClassification", "TokenClassification", "QuestionAnswering"}
BUILDERS = {"json", "csv", "parquet", "text", "arrow", "imagefolder", "audiofolder", "webdataset", "pandas"}


def _hub_id(value: object) -> bool:
    """`org/name` or a bare legacy id (`gpt2`); not a local path, not a datasets builder name."""
    return isinstance(value, str) and value.count("/") <= 1 and bool(value.strip()) \
        and not value.startswith((".", "/", "~")) and value not in BUILDERS and not Path(value).exists()


def _plan(trees: list[ast.Module]) -> tuple[set[str], dict[str, str], str, list[str]]:
    """(what the notebook produces, NAME -> literal for top-level string settings, dataset schema, the
    other columns it names: `row["quote"]` in a function given to .map/.filter, `remove_columns([...])`)."""
    produced, literals, columns, extra, mapped, trainers = set(), {}, set(), set(), [], []
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                literals |= {t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):  # `model_id, out = "a", "b"`
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and len(target.elts) == len(node.value.elts):
                        literals |= {t.id: v.value for t, v in zip(target.elts, node.value.elts)
                                     if isinstance(t, ast.Name) and isinstance(v, ast.Constant)
                                     and isinstance(v.value, str)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func.rsplit(".", 1)[-1] in TRAINER_SCHEMAS:
                    trainers.append(TRAINER_SCHEMAS[func.rsplit(".", 1)[-1]])
                if func.rsplit(".", 1)[-1] in PRODUCERS and node.args:
                    produced.add(normal(ast.unparse(node.args[0])))
                for k in node.keywords:
                    if k.arg in ("hub_model_id", "output_dir", "repo_id", "save_directory"):
                        produced.add(normal(ast.unparse(k.value)))
                    if k.arg == "dataset_text_field" and isinstance(k.value, ast.Constant):
                        columns.add(k.value.value)
                if func.endswith("remove_columns"):  # remove_columns(["a", "b"]): they must exist
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        extra |= {e.value for e in getattr(arg, "elts", [arg])
                                  if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if func.endswith((".map", ".filter")):  # its function reads rows' columns
                    mapped += [*node.args[:1], *(k.value for k in node.keywords if k.arg == "function")]
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str):
                columns.add(node.slice.value)
    schema = trainers[0] if trainers else next((s for col, s in SCHEMAS if col in columns), "messages")
    functions = {f.name: f for tree in trees for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    for fn in mapped:  # `lambda row: tok(row["quote"])` or `def fmt(example): …example["quote"]…`
        fn = functions.get(fn.id) if isinstance(fn, ast.Name) else fn
        if isinstance(fn, (ast.Lambda, ast.FunctionDef)) and fn.args.args:
            row = fn.args.args[0].arg
            extra |= {n.slice.value for n in ast.walk(fn) if isinstance(n, ast.Subscript)
                      and isinstance(n.value, ast.Name) and n.value.id == row and isinstance(n.slice, ast.Constant)
                      and isinstance(n.slice.value, str)}
    return produced, literals, schema, sorted(c for c in extra if c.isidentifier() and c not in NOT_EXTRA)


class DryRun(cst.CSTTransformer):
    """Rewrites one cell for a dry run; `notes` say what changed."""

    def __init__(self, trees: list[ast.Module], model: Path = TINY_MODEL, data: Path = TINY_DATA, push: bool = False):
        super().__init__()
        self.push = push  # --dry-run-push: Hub writes go through, to the Hub HF_ENDPOINT names (kit's tests)
        self.produced, self.literals, self.schema, self.extra = _plan(trees)
        self.model, self.data = str(model), str(data)
        self.notes: list[str] = []
        self.used_helpers = False

    def _swappable(self, arg: cst.BaseExpression) -> bool:
        if normal(code(arg)) in self.produced:
            return False
        if isinstance(arg, cst.SimpleString):
            return _hub_id(arg.evaluated_value)
        return isinstance(arg, cst.Name) and _hub_id(self.literals.get(arg.value))

    def _swap_model(self, call: cst.Call, name: str, positional: bool = True) -> cst.Call:
        args = list(call.args)
        for i, a in enumerate(args):
            if (positional and a.keyword is None and i == 0) or (a.keyword and a.keyword.value in (
                    "model_name", "pretrained_model_name_or_path", "model")):
                if self._swappable(a.value):
                    self._check_head(name)
                    self.notes.append(f"{name}: {code(a.value)} → the tiny local model")
                    args[i] = a.with_changes(value=cst.SimpleString(repr(self.model)))
                break
        return call.with_changes(args=args)

    def _check_head(self, name: str) -> None:
        """The stand-in is a Qwen3: a class it has no head for (a masked LM, seq2seq, speech, vision)
        fails inside the dry run with a transformers traceback; say so now, in one line."""
        head = re.search(r"For(\w+)$", name.rsplit(".", 1)[0])
        if head and head.group(1) not in QWEN3_HEADS and self.model == str(TINY_MODEL):
            raise UsageError(f"--dry-run: {name} needs a model with a {head.group(1)} head, and kit's stand-in "
                             f"({TINY_MODEL.name}) is a causal LM: give --dry-run-model a small local model of "
                             "that kind, or leave --dry-run out")

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, short = call_name(updated), short_name(updated)
        owner = name.rsplit(".", 1)[0]
        if short in HUB_WRITES and not self.push:
            self.notes.append(f"{name}(…) skipped: a dry run writes nothing to the Hub")
            return cst.parse_expression(f"print({f'[dry run] skipped {name}(…): nothing is written to the Hub'!r})")
        if (a := kwarg(updated, "push_to_hub")) is not None and code(a.value) != "False" and not self.push:
            updated = set_kwarg(updated, "push_to_hub", "False")
            self.notes.append(f"{short}: push_to_hub=False (a dry run writes nothing to the Hub)")
        if short == "from_pretrained" and (is_model_loader(owner) or owner.endswith(TOKENIZERS)):
            updated = self._swap_model(updated, name)
            for key in ("quantization_config", "attn_implementation"):
                if kwarg(updated, key) is not None:
                    updated = drop_kwarg(updated, key)
                    self.notes.append(f"{name}: {key} dropped (a tiny model on any device)")
            for key in ("load_in_4bit", "load_in_8bit"):
                if (a := kwarg(updated, key)) is not None and code(a.value) != "False":
                    updated = set_kwarg(updated, key, "False")
                    self.notes.append(f"{name}: {key}=False")
            for key in ("torch_dtype", "dtype"):
                if (a := kwarg(updated, key)) is not None and code(a.value) != "None":
                    updated = set_kwarg(updated, key, "torch.float32")
                    self.notes.append(f"{name}: {key} → torch.float32")
            return updated
        if short.endswith("Trainer") and kwarg(updated, "quantization_config") is not None:  # trainer loads it
            updated = drop_kwarg(updated, "quantization_config")
            self.notes.append(f"{name}: quantization_config dropped (a tiny model on any device)")
        if name in ("pipeline", "transformers.pipeline", "LLM", "vllm.LLM") or (
                short.endswith("Trainer") and (a := kwarg(updated, "model")) is not None
                and isinstance(a.value, (cst.SimpleString, cst.Name))):
            return self._swap_model(updated, name, positional=name in ("LLM", "vllm.LLM"))
        if name in ("load_dataset", "datasets.load_dataset") and updated.args and self._swappable(updated.args[0].value):
            split = kwarg(updated, "split")
            self.notes.append(f"{name}({code(updated.args[0].value)}) → the embedded data as {self.schema!r} rows")
            self.used_helpers = True
            extra = f", extra={self.extra!r}" if self.extra else ""  # the notebook's own columns, stand-in text
            return cst.parse_expression(f"dry_run_dataset({self.schema!r}, split={code(split.value) if split else None}"
                                        f", path={self.data!r}{extra})")
        if is_training_args(updated):
            updated = set_kwarg(updated, "max_steps", str(DRY_RUN_STEPS))
            updated = set_kwarg(updated, "report_to", '"none"')
            self.notes.append(f"{short}: max_steps={DRY_RUN_STEPS}, report_to='none'")
            if (a := kwarg(updated, "optim")) is not None and any(w in code(a.value) for w in ("8bit", "paged", "bnb")):
                updated = set_kwarg(updated, "optim", '"adamw_torch"')
                self.notes.append(f"{short}: optim {code(a.value)} → 'adamw_torch' (no bitsandbytes)")
            for key, why in GPU_ONLY_ARGS.items():
                if (a := kwarg(updated, key)) is not None and code(a.value) != "False":
                    updated = set_kwarg(updated, key, "False")
                    self.notes.append(f"{short}: {key}=False ({why})")
            for key, cap in (("max_completion_length", 16), ("max_new_tokens", MAX_NEW_TOKENS)):
                if kwarg(updated, key) is not None:
                    updated = set_kwarg(updated, key, str(cap))
            return updated
        if name == "huggingface_hub.get_token":  # no token check in a dry run: a missing token reads as ""
            return cst.parse_expression('(huggingface_hub.get_token() or "")')
        if name == "torch.cuda.get_device_properties":
            self.used_helpers = True
            return updated.with_changes(func=cst.Name("device_properties"))
        if short in ("generate", "fast_generate") and kwarg(updated, "max_new_tokens") is not None:
            return set_kwarg(updated, "max_new_tokens", str(MAX_NEW_TOKENS))
        return updated


# --- used by the dry-run script at run time --------------------------------------------------------

def _rows(path: str) -> list[tuple[str, str, str]]:
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = {t["role"]: t["content"] for t in json.loads(line)["messages"]}
        out.append((m.get("system", ""), m["user"], m["assistant"]))
    return out


def _shape(schema: str, rows: list[tuple[str, str, str]]) -> dict[str, list]:
    system, user, assistant = (list(c) for c in zip(*rows))
    if schema == "sharegpt":
        return {"conversations": [[{"from": "system", "value": s}, {"from": "human", "value": u},
                                   {"from": "gpt", "value": a}] for s, u, a in rows]}
    if schema == "alpaca":
        return {"instruction": system, "input": user, "output": assistant}
    if schema == "qa":
        return {"question": user, "answer": assistant}
    if schema == "preference":  # the dispreferred answer: another request's
        return {"prompt": user, "chosen": assistant, "rejected": assistant[1:] + assistant[:1]}
    if schema == "unpaired_preference":  # every other row another request's answer, labelled undesirable
        wrong = assistant[1:] + assistant[:1]
        return {"prompt": user, "completion": [a if i % 2 == 0 else w for i, (a, w) in enumerate(zip(assistant, wrong))],
                "label": [i % 2 == 0 for i in range(len(rows))]}
    if schema == "prompt_completion":
        return {"prompt": user, "completion": assistant}
    if schema == "text":
        return {"text": [f"{u}\n{a}" for u, a in zip(user, assistant)]}
    return {"messages": [[{"role": "system", "content": s}, {"role": "user", "content": u},
                          {"role": "assistant", "content": a}] for s, u, a in rows]}


def dry_run_dataset(schema: str, split: str | None = None, path: str = str(TINY_DATA), extra: list[str] = ()):
    """The embedded rows in `schema`'s columns (and each `extra` column, the rows as text); a Dataset
    for a split (slices too), else a DatasetDict with train, validation and test splits (the last two:
    the first 16 rows)."""
    from datasets import Dataset, DatasetDict

    rows = _rows(path)
    columns = _shape(schema, rows)
    columns.update({name: [f"{u}\n{a}" for _, u, a in rows] for name in extra if name not in columns})
    data = Dataset.from_dict(columns)
    if split is None:
        held_out = data.select(range(min(16, len(data))))
        return DatasetDict({"train": data, "validation": held_out, "test": held_out})
    name, _, part = split.partition("[")
    if not part:
        return data
    start, _, stop = part.rstrip("]").partition(":")

    def index(text: str, default: int) -> int:
        text = text.strip()
        if not text:
            return default
        return round(len(data) * float(text[:-1]) / 100) if text.endswith("%") else int(text)

    return data.select(range(index(start, 0), min(index(stop, len(data)), len(data))))


class _CpuProperties:
    name = "CPU (dry run)"
    total_memory = 16 * 1024 ** 3
    major, minor = 0, 0


def device_properties(device=0):
    """torch.cuda.get_device_properties on a GPU; a stand-in with the same fields on a CPU."""
    import torch

    return torch.cuda.get_device_properties(device) if torch.cuda.is_available() else _CpuProperties()
