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

Where the notebook passes an id or a path through a variable, a function argument or a config
object, the script asks `kit.notebooks.convert.standins` at run time (`kit_dry_run.model(x)`,
`kit_dry_run.load_dataset(...)`, `kit_dry_run.path(p)`), which swaps what is not on this machine.
GPU-only calls (`torch.cuda.get_device_capability()`, `assert torch.cuda.is_available()`, flash
attention, bitsandbytes) are neutralised here, in the dry run only. Masked-LM and seq2seq notebooks
get a tiny BERT or T5 (models/tiny-bert, models/tiny-t5) instead of the causal LM; chats with tools or
text parts get the causal one with a real chat template. A module the notebook imports that is not
installed here (it pip-installs its own) stops the run before any model loads, in one line naming it
and its cell.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst

from kit.errors import UsageError
from kit.notebooks.convert.kinds import is_model_loader, is_training_args
from kit.notebooks.convert.syntax import call_name, code, drop_kwarg, kwarg, normal, set_kwarg, short_name

from kit.notebooks.convert.standins import (BUILDERS, FAMILIES, GPU_PACKAGES, TINY_DATA, TINY_MODEL,  # noqa: F401
                                            dry_run_dataset)

DRY_RUN_STEPS = 2
MAX_NEW_TOKENS = 8
TOKENIZERS = ("AutoTokenizer", "AutoProcessor", "PreTrainedTokenizerFast")
PRODUCERS = {"save_pretrained", "save_model", "push_to_hub", "save_pretrained_merged", "push_to_hub_merged"}
# Schemas by the column that gives them away, most specific first.
SCHEMAS = [("conversations", "sharegpt"), ("instruction", "alpaca"), ("question", "qa"), ("chosen", "preference"),
           ("completion", "prompt_completion"), ("messages", "messages"), ("text", "text")]
# What a trainer needs its rows to be, whatever columns the notebook names.
TRAINER_SCHEMAS = {"DPOTrainer": "preference", "ORPOTrainer": "preference", "CPOTrainer": "preference",
                   "RewardTrainer": "preference", "KTOTrainer": "unpaired_preference", "GRPOTrainer": "prompt", "RLOOTrainer": "prompt",
                   "OnlineDPOTrainer": "prompt"}
# Arguments a TRL reward function gets that are no dataset column.
REWARD_ARGS = {"prompts", "completions", "completion_ids", "trainer_state", "kwargs", "log_extra", "log_metric",
               "environments"}
# Heads each stand-in family has; a loader's head picks the family (the first that has it).
FAMILY_HEADS = {"causal": {"CausalLM", "SequenceClassification", "TokenClassification", "QuestionAnswering"},
                "masked": {"MaskedLM", "SequenceClassification", "TokenClassification", "QuestionAnswering",
                           "MultipleChoice", "PreTraining", "NextSentencePrediction"},
                "seq2seq": {"Seq2SeqLM", "ConditionalGeneration", "SequenceClassification", "TokenClassification",
                            "QuestionAnswering"}}
SEQ2SEQ_MODELS = ("T5", "MT5", "Bart", "MBart", "Pegasus", "Marian", "LongT5", "UMT5", "FSMT", "Blenderbot")
SPLIT_NAME = re.compile(r"^(train|test|valid|validation|val|dev|eval|evaluation)(_\w+)?$")
# torch.cuda calls a CPU cannot answer (see standins.CPU_ANSWERS).
CUDA_CALLS = {"get_device_properties", "get_device_name", "get_device_capability", "mem_get_info",
              "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
              "reset_peak_memory_stats", "synchronize", "current_device", "is_bf16_supported", "memory_summary",
              "ipc_collect"}
FLASH = {"flash_attention_2", "flash_attention_3"}
DICT_METHODS = {"map", "filter", "shuffle", "remove_columns", "rename_column", "rename_columns", "select_columns",
                "cast", "cast_column", "with_format", "flatten", "sort"}
READERS = {"read_csv", "read_json", "read_parquet", "read_table", "read_excel", "from_csv", "from_json",
           "from_parquet", "from_text"}


# Calls that write to the Hub: a dry run prints that it skipped them (by the method's name).
HUB_WRITES = {"push_to_hub", "push_to_hub_merged", "push_to_hub_gguf", "upload_folder", "upload_file",
              "upload_large_folder", "create_repo", "create_commit", "create_branch", "delete_repo", "delete_file",
              "delete_folder", "move_repo", "update_repo_settings", "add_space_secret"}
# Names a notebook subscripts that are no extra data column: another schema's columns (TRL would
# read the rows as that format), tokenizer outputs, chat-turn keys.
TOKEN_KEYS = {"images", "image", "audio", "input_ids", "attention_mask", "labels", "token_type_ids", "role", "content",
              "from", "value", "completion_mask", "assistant_masks", "position_ids", "pixel_values"}
NOT_EXTRA = {c for c, _ in SCHEMAS} | {"input", "output", "answer", "prompt", "rejected"} | TOKEN_KEYS
# Training arguments that need a GPU, off in a dry run (which runs on a CPU too).
GPU_ONLY_ARGS = {"use_liger_kernel": "Liger's Triton kernels need a GPU",
                 "activation_offloading": "it offloads to the CPU from a GPU", "tf32": "TF32 is an Ampere GPU's"}


def _hub_id(value: object) -> bool:
    """`org/name` or a bare legacy id (`gpt2`); not a local path, not a datasets builder name."""
    return isinstance(value, str) and value.count("/") <= 1 and bool(value.strip()) \
        and not value.startswith((".", "/", "~")) and value not in BUILDERS and not Path(value).exists()



class Plan:
    """What conversion learns from the whole notebook for its stand-ins."""

    def __init__(self, trees: list[ast.Module]):
        self.produced: set[str] = set()  # what the notebook saves or pushes itself (never swapped)
        self.literals: dict[str, str] = {}  # NAME -> literal, for top-level string settings
        self.splits: set[str] = set()  # split names it reads (`ds["validation"]`, `ds["train_sft"]`)
        self.objects: set[str] = set()  # names bound to what a call returns (a model, not an id)
        columns, extra, reward_funcs = set(), set(), []
        calls = [n for t in trees for n in ast.walk(t) if isinstance(n, ast.Call)]
        for tree in trees:
            for node in tree.body:
                self._literals(node)
        for node in calls:
            func = ast.unparse(node.func)
            short = func.rsplit(".", 1)[-1]
            if short in PRODUCERS and node.args:
                self.produced.add(normal(ast.unparse(node.args[0])))
            for k in node.keywords:
                if k.arg in ("hub_model_id", "output_dir", "repo_id", "save_directory"):
                    self.produced.add(normal(ast.unparse(k.value)))
                if k.arg in ("dataset_text_field", "text_column", "label_column") and isinstance(k.value, ast.Constant):
                    columns.add(k.value.value)
                if k.arg == "reward_funcs":
                    reward_funcs += getattr(k.value, "elts", [k.value])
            if short in ("remove_columns", "select_columns", "rename_column", "rename_columns", "cast_column"):
                for arg in [*node.args[:1], *(k.value for k in node.keywords if k.arg != "new_column_name")]:
                    extra |= _strings(arg)  # they must exist
        dicts = _dataset_dicts(trees)
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    self.objects |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(node, ast.Call):  # `.map(…, remove_columns=["text", "label"])`, `dropna(subset=[…])`
                    for k in node.keywords:
                        if k.arg in ("remove_columns", "input_columns", "subset", "columns", "column_names"):
                            extra |= _strings(k.value)
                if not isinstance(node, ast.Subscript) or not isinstance(node.ctx, ast.Load):
                    continue
                keys = _strings(node.slice) if isinstance(node.slice, (ast.Constant, ast.List, ast.Tuple)) else set()
                owner = ast.unparse(node.value)
                for key in keys:
                    if owner in dicts or SPLIT_NAME.match(key):  # `imdb["unsupervised"]`, `ds["validation"]`
                        self.splits.add(key)
                    elif not owner.endswith(("environ", "kwargs")):
                        columns.add(key)
        self.schema = next((s for col, s in SCHEMAS if col in columns), "messages")
        trainers = {ast.unparse(n.func).rsplit(".", 1)[-1] for n in calls}
        by_trainer = next((TRAINER_SCHEMAS[t] for t in sorted(trainers) if t in TRAINER_SCHEMAS), None)
        self.schema = by_trainer or self.schema
        functions = {f.name: f for tree in trees for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        rewards = [functions[fn.id] for fn in reward_funcs if isinstance(fn, ast.Name) and fn.id in functions]
        for fn in rewards:  # a GRPO reward function's own arguments are dataset columns
            extra |= {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs] if a.arg not in REWARD_ARGS}
        extra |= _library_reward_columns(trees, reward_funcs)  # TRL's own (trl.rewards.accuracy_reward: solution)
        if self.schema == "prompt" and _text_prompts(trees, rewards):
            self.schema = "prompt_text"
        if self.schema == "preference" and _chat_preferences(trees):
            self.schema = "preference_chat"
        extra |= columns  # every key the notebook reads, other than another schema's columns (below)
        taken = set(_schema_columns(self.schema))
        # With the rows' format fixed by the trainer (DPO, KTO, GRPO), other formats' columns the notebook
        # reads (`x["question"]` to build its prompts) are plain text columns; else they would change the format.
        skip = TOKEN_KEYS if by_trainer else NOT_EXTRA
        made = _made_columns(trees)  # `example["text_chosen"] = …` before any read: the notebook's own column
        self.extra = sorted(c for c in extra if c.isidentifier() and c not in skip and c not in taken and c not in made)
        self.chat = _rich_chat(trees)
        self.size = _fraction_size(trees)
        self.family = _family(trainers | {ast.unparse(n.func).rsplit(".", 1)[0].rsplit(".", 1)[-1] for n in calls})
        self.packages = sorted({(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                                for t in trees for n in ast.walk(t) if isinstance(n, (ast.Import, ast.ImportFrom))
                                for a in n.names} & GPU_PACKAGES)

    def _literals(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            self.literals |= {t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):  # `model_id, out = "a", "b"`
            for target in node.targets:
                if isinstance(target, ast.Tuple) and len(target.elts) == len(node.value.elts):
                    self.literals |= {t.id: v.value for t, v in zip(target.elts, node.value.elts)
                                      if isinstance(t, ast.Name) and isinstance(v, ast.Constant)
                                      and isinstance(v.value, str)}


def _fraction_size(trees: list[ast.Module]) -> int:
    """Rows for a stand-in data set where the notebook keeps a fraction of a big one (`select(range(int(frac *
    len(ds))))` with frac 0.005, `split="train[:1%]"`): enough that the smallest fraction it names keeps
    32 rows (at most 8192), where the embedded 424 kept 2 and the notebook's `ds[8]` stopped; else 0."""
    nodes = [n for t in trees for n in ast.walk(t)]
    takes = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and any(
        isinstance(side, ast.Call) and ast.unparse(side.func) == "len" for side in (n.left, n.right)) for n in nodes)
    fractions = [n.value for n in nodes if takes and isinstance(n, ast.Constant) and isinstance(n.value, float)
                 and 0.001 <= n.value < 0.1]
    fractions += [float(m.group(1)) / 100 for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  for m in re.finditer(r"\[[^\]]*?(\d+(?:\.\d+)?)%\]", n.value) if 0.1 <= float(m.group(1)) < 10]
    return min(8192, -(-32 * 1000 // round(min(fractions) * 1000))) if fractions else 0


def _made_columns(trees: list[ast.Module]) -> set[str]:
    """Keys the notebook writes (`example["text_chosen"] = …`) before it reads them anywhere, in source order
    (an assignment's value before its target): columns its own map makes. As stand-in columns they were
    there already, and a `.map(…, remove_columns=dataset.column_names)` then removed what the map made."""
    first: dict[str, bool] = {}  # key -> written before read

    class Order(ast.NodeVisitor):
        def visit_Assign(self, node: ast.Assign) -> None:
            self.visit(node.value)
            for target in node.targets:
                self.visit(target)

        def visit_Subscript(self, node: ast.Subscript) -> None:
            self.generic_visit(node)
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                first.setdefault(node.slice.value, isinstance(node.ctx, ast.Store))

    for tree in trees:
        Order().visit(tree)
    return {k for k, written in first.items() if written}


def _chat_preferences(trees: list[ast.Module]) -> bool:
    """Whether a preference notebook reads its `chosen`/`rejected` columns as chats (ultrafeedback_binarized's
    shape): `x["chosen"][0]["role"]`, `[m for m in x["chosen"] if m["role"] == "user"]`, or a chat template
    applied to them. Plain text preference rows stopped such a notebook's own map (string indices)."""
    def pair(node: ast.AST) -> bool:  # x["chosen"], x["rejected"][1:]
        while isinstance(node, ast.Subscript) and not (isinstance(node.slice, ast.Constant)
                                                       and node.slice.value in ("chosen", "rejected")):
            node = node.value
        return isinstance(node, ast.Subscript)

    def key(node: ast.AST) -> object:
        return node.slice.value if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) else None

    for node in (n for t in trees for n in ast.walk(t)):
        if key(node) in ("role", "content") and isinstance(node.value, ast.Subscript) \
                and key(node.value) not in ("chosen", "rejected") and pair(node.value):  # x["chosen"][0]["role"]
            return True
        if isinstance(node, ast.comprehension) and pair(node.iter) or isinstance(node, ast.For) and pair(node.iter):
            return True
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("apply_chat_template") and node.args \
                and pair(node.args[0]):
            return True
    return False


def _rich_chat(trees: list[ast.Module]) -> bool:
    """Whether the notebook's chats need more than role and text: tools (`tools=`, `environment_factory=`), or
    a message whose content is a list of parts (`"content": [{"type": "text", "text": …}]`)."""
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(k.arg in ("tools", "environment_factory") and not (
                    isinstance(k.value, ast.Constant) and k.value.value is None) for k in node.keywords):
                return True
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "content"
                                                  and isinstance(v, (ast.List, ast.ListComp))
                                                  for k, v in zip(node.keys, node.values)):
                return True
    return False


def _library_reward_columns(trees: list[ast.Module], reward_funcs: list[ast.expr]) -> set[str]:
    """The dataset columns TRL's own reward functions take (`from trl.rewards import accuracy_reward`, or
    `trl.rewards.accuracy_reward`): their parameters in the installed TRL, which the notebook never names."""
    import importlib
    import inspect

    imported = {(a.asname or a.name): f"{n.module}.{a.name}" for t in trees for n in ast.walk(t)
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "trl" for a in n.names}
    columns: set[str] = set()
    for fn in reward_funcs:
        dotted = imported.get(fn.id) if isinstance(fn, ast.Name) else ast.unparse(fn) if isinstance(fn, ast.Attribute) \
            else None
        if not dotted or dotted.split(".")[0] != "trl" or "." not in dotted:
            continue
        module, _, name = dotted.rpartition(".")
        try:
            func = getattr(importlib.import_module(module), name)
            params = inspect.signature(func).parameters.values()
        except (ImportError, AttributeError, TypeError, ValueError):  # not in the installed TRL: TRL says so itself
            continue
        columns |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                    and p.default is p.empty and p.name not in REWARD_ARGS}  # a default is a setting
    return columns


def _text_prompts(trees: list[ast.Module], rewards: list[ast.FunctionDef]) -> bool:
    """Whether a GRPO notebook's source data has its prompts as plain text, not chat messages: it reads
    `x["prompt"]` to build its own prompts (`{"prompt": [..., {"content": x["prompt"]}]}`), or its reward
    functions read their completions as text (TRL answers in the prompts' format: chats get chats)."""
    nodes = [n for t in trees for n in ast.walk(t)]
    reads = any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and _strings(n.slice) == {"prompt"}
                and isinstance(n.slice, ast.Constant) for n in nodes)
    builds = any(isinstance(n, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "prompt" for k in n.keys)
                 for n in nodes)
    if reads and builds:
        return True
    reading = [f for f in rewards if any(isinstance(n, ast.Name) and n.id == "completions" and isinstance(n.ctx, ast.Load)
                                         for s in f.body for n in ast.walk(s))]
    chat = any(isinstance(n, ast.Constant) and n.value in ("content", "role") for f in rewards for n in ast.walk(f))
    return bool(reading) and not chat


def _dataset_dicts(trees: list[ast.Module]) -> set[str]:
    """Names bound to a DatasetDict: `load_dataset(...)` without a split, and what `.map`, `.filter`…
    or a DatasetDict(...) of them return; their string subscripts are split names."""
    dicts: set[str] = set()
    assigns = [n for t in trees for n in ast.walk(t) if isinstance(n, ast.Assign) and len(n.targets) == 1
               and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Call)]
    for _ in range(4):  # a few rounds reach names derived from names derived from a load
        for node in assigns:
            func = ast.unparse(node.value.func)
            short = func.rsplit(".", 1)[-1]
            base = func.rsplit(".", 1)[0] if "." in func else ""
            split = any(k.arg == "split" for k in node.value.keywords)
            if (short == "load_dataset" and not split) or short in ("DatasetDict", "train_test_split") \
                    or (base in dicts and short in DICT_METHODS):
                dicts.add(node.targets[0].id)
    return dicts


def _strings(node: ast.AST) -> set[str]:
    return {e.value for e in ast.walk(node) if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def _schema_columns(schema: str) -> list[str]:
    from kit.notebooks.convert.standins import _shape

    return list(_shape(schema, [("s", "u", "a")]))


def _family(owners: set[str]) -> str:
    """The stand-in family the notebook's model classes need: seq2seq, masked, else the causal LM."""
    heads = {m.group(1) for o in owners if (m := re.search(r"For(\w+)$", o))}
    if "Seq2SeqLM" in heads or any(o.startswith(SEQ2SEQ_MODELS) and o.endswith("ForConditionalGeneration")
                                   for o in owners) or "Seq2SeqTrainer" in owners:
        return "seq2seq"
    if "MaskedLM" in heads:
        return "masked"
    return "causal"


class DryRun(cst.CSTTransformer):
    """Rewrites one cell for a dry run; `notes` say what changed."""

    def __init__(self, trees: list[ast.Module], model: Path | None = None, data: Path = TINY_DATA, push: bool = False,
                 reward_cells: dict[str, int] | None = None):
        super().__init__()
        self.push = push  # --dry-run-push: Hub writes go through, to the Hub HF_ENDPOINT names (kit's tests)
        self.reward_cells = reward_cells or {}  # function name -> the cell that defines it
        self.plan = Plan(trees)
        self.produced, self.literals, self.schema, self.extra = (self.plan.produced, self.plan.literals,
                                                                 self.plan.schema, self.plan.extra)
        self.family = self.plan.family if model is None else "given"
        self.model = str(model or FAMILIES[self.plan.family])
        self.data = str(data)
        self.notes: list[str] = []
        self.used_helpers = False
        # Chats richer than the tiny model's template renders: the stand-in gets a real one (standins._chat_model).
        self._chat = self.plan.chat and self.family == "causal"
        self.cell = 0  # the cell being rewritten (set by the caller)
        self.imports: dict[str, int] = {}  # module the script imports unguarded -> the first cell that does
        self._guarded = 0  # inside a try (an import that may fail) or a function (it may never run)

    def setup(self) -> str:
        """The lines at the top of the script that make the stand-ins."""
        model = f", model={self.model!r}" if self.family == "given" else ""
        return ("from kit.notebooks.convert.standins import StandIns  # kit: --dry-run\n"
                f"kit_dry_run = StandIns(schema={self.schema!r}, extra={self.extra!r}, splits={sorted(self.plan.splits)!r}, "
                f"family={self.plan.family!r}{model}, data={self.data!r}"
                + (f", packages={self.plan.packages!r}" if self.plan.packages else "")
                + (", chat=True" if self._chat else "")
                + (f", size={self.plan.size}" if self.plan.size else "")
                + (f", imports={self.imports!r}" if self.imports else "") + ")\n")

    def _helper(self, what: str, *args: cst.Arg) -> cst.Call:
        self.used_helpers = True
        return cst.Call(func=cst.parse_expression(f"kit_dry_run.{what}"), args=list(args))

    def _swappable(self, arg: cst.BaseExpression) -> bool:
        if normal(code(arg)) in self.produced:
            return False
        if isinstance(arg, cst.SimpleString):
            return _hub_id(arg.evaluated_value)
        return isinstance(arg, cst.Name) and _hub_id(self.literals.get(arg.value))

    def _literal(self, arg: cst.BaseExpression) -> bool:
        return isinstance(arg, (cst.SimpleString, cst.ConcatenatedString)) or (
            isinstance(arg, cst.Name) and arg.value in self.literals)

    def _swap_model(self, call: cst.Call, name: str, positional: bool = True) -> cst.Call:
        args = list(call.args)
        for i, a in enumerate(args):
            if (positional and a.keyword is None and i == 0) or (a.keyword and a.keyword.value in (
                    "model_name", "pretrained_model_name_or_path", "model", "model_id")):
                if self._swappable(a.value):
                    self._check_head(name)
                    self.notes.append(f"{name}: {code(a.value)} → the tiny local model")
                    args[i] = a.with_changes(value=cst.parse_expression("kit_dry_run.model_dir") if self._chat
                                             else cst.SimpleString(repr(self.model)))
                elif not self._literal(a.value) and normal(code(a.value)) not in self.produced and not (
                        isinstance(a.value, cst.Name) and a.value.value in self.plan.objects):
                    # An id in a variable, an argument, a config field: decided at run time on its value.
                    self._check_head(name)
                    self.notes.append(f"{name}: {code(a.value)[:50]} → the tiny local model when it names no "
                                      "local folder (decided at run time)")
                    args[i] = a.with_changes(value=self._helper("model", cst.Arg(a.value)))
                break
        return call.with_changes(args=args)

    def _check_head(self, name: str) -> None:
        """A class none of the stand-ins has a head for (speech, vision) fails inside the dry run with a
        transformers traceback; say so now, in one line."""
        head = re.search(r"For(\w+)$", name.rsplit(".", 1)[0])
        if head and self.family != "given" and head.group(1) not in FAMILY_HEADS[self.plan.family]:
            raise UsageError(f"--dry-run: {name} needs a model with a {head.group(1)} head, and kit's stand-ins "
                             f"(tiny-qwen3, tiny-bert, tiny-t5) have none: give --dry-run-model a small local model "
                             "of that kind, or leave --dry-run out")

    # --- statements -------------------------------------------------------------------------------

    def visit_Try(self, node: cst.Try) -> bool:
        self._guarded += 1
        return True

    def leave_Try(self, original: cst.Try, updated: cst.Try):
        self._guarded -= 1
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._guarded += 1
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self._guarded -= 1
        return updated

    def leave_Import(self, original: cst.Import, updated: cst.Import):
        if not self._guarded:
            for alias in updated.names:
                self.imports.setdefault(code(alias.name).split(".")[0], self.cell)
        return updated

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        if not self._guarded and updated.module is not None and not updated.relative:
            self.imports.setdefault(code(updated.module).split(".")[0], self.cell)
        return updated

    def leave_Assert(self, original: cst.Assert, updated: cst.Assert):
        if "cuda" in code(updated.test):  # `assert torch.cuda.is_available()`: the dry run runs on a CPU too
            self.notes.append(f"`assert {code(updated.test)[:50]}` skipped (a dry run runs on the CPU too)")
            return cst.Expr(cst.parse_expression(f"print({'[dry run] skipped: assert ' + code(updated.test)[:60]!r})"))
        return updated

    def leave_If(self, original: cst.If, updated: cst.If):
        """`if not torch.cuda.is_available(): raise …` / `sys.exit(…)`: a GPU check, skipped."""
        body = updated.body.body
        stops = all(isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(x, cst.Raise) or (isinstance(x, cst.Expr) and isinstance(x.value, cst.Call)
                                         and code(x.value.func) in ("sys.exit", "exit", "quit", "print"))
            for x in s.body) for s in body)
        if "cuda" in code(updated.test) and updated.orelse is None and stops and any(
                isinstance(x, cst.Raise) or "exit" in code(x) for s in body for x in s.body):
            self.notes.append(f"`if {code(updated.test)[:50]}: …` (a stop without a GPU) skipped")
            return cst.SimpleStatementLine([cst.Expr(cst.parse_expression(
                f"print({'[dry run] skipped: if ' + code(updated.test)[:60] + ': stop'!r})"))])
        return updated

    # --- expressions ------------------------------------------------------------------------------

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString):
        value = updated.evaluated_value
        if isinstance(value, str) and (value in FLASH or value.startswith("kernels-community/")):
            self.notes.append(f"attention {value!r} → 'sdpa' (flash attention needs a GPU)")
            return cst.SimpleString('"sdpa"')
        if isinstance(value, str) and re.fullmatch(r"cuda(:\d+)?", value):  # torch.device("cuda"), autocast("cuda")
            self.notes.append(f"{value!r} → 'cpu' where there is no GPU")
            return cst.parse_expression(f'({value!r} if torch.cuda.is_available() else "cpu")')
        return updated

    def leave_DictElement(self, original: cst.DictElement, updated: cst.DictElement):
        key = updated.key.evaluated_value if isinstance(updated.key, cst.SimpleString) else None
        if key == "quantization_config" or key in ("load_in_4bit", "load_in_8bit"):
            self.notes.append(f"{{{key!r}: …}} → None/False (a tiny model on any device)")
            return updated.with_changes(value=cst.Name("None" if key == "quantization_config" else "False"))
        if key == "device_map":
            return updated.with_changes(value=cst.parse_expression('{"": rank_device}'))
        if key in ("torch_dtype", "dtype"):
            return updated.with_changes(value=cst.parse_expression("torch.float32"))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, short = call_name(updated), short_name(updated)
        owner = name.rsplit(".", 1)[0]
        if short in HUB_WRITES and not self.push:
            self.notes.append(f"{name}(…) skipped: a dry run writes nothing to the Hub")
            return cst.parse_expression(f"print({f'[dry run] skipped {name}(…): nothing is written to the Hub'!r})")
        if (a := kwarg(updated, "push_to_hub")) is not None and code(a.value) != "False" and not self.push:
            updated = set_kwarg(updated, "push_to_hub", "False")
            self.notes.append(f"{short}: push_to_hub=False (a dry run writes nothing to the Hub)")
        if short == "BitsAndBytesConfig":
            self.notes.append(f"{name}(…) → None: no bitsandbytes in a dry run (a tiny model on any device)")
            return cst.Name("None")
        if short == "from_pretrained" and (is_model_loader(owner) or owner.endswith(TOKENIZERS)
                                           or owner.endswith(("Tokenizer", "TokenizerFast", "Config"))):
            updated = self._swap_model(updated, name)
            return self._tiny_load(updated, name)
        if short.endswith("Trainer") and kwarg(updated, "quantization_config") is not None:  # trainer loads it
            updated = drop_kwarg(updated, "quantization_config")
            self.notes.append(f"{name}: quantization_config dropped (a tiny model on any device)")
        if short.endswith("Trainer") and (a := kwarg(updated, "reward_funcs")) is not None:
            cells = {n: c for n, c in self.reward_cells.items() if n in code(a.value)}
            self.notes.append(f"{short}: the notebook's reward functions checked on each call (a failure: one "
                              "line naming the function and its cell)")
            updated = set_kwarg(updated, "reward_funcs", code(self._helper(
                "rewards", cst.Arg(a.value), cst.Arg(cst.parse_expression(repr(cells)), keyword=cst.Name("cells"),
                                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))))
        if name in ("pipeline", "transformers.pipeline", "LLM", "vllm.LLM") or (
                short.endswith("Trainer") and (a := kwarg(updated, "model")) is not None
                and isinstance(a.value, (cst.SimpleString, cst.Name))):
            return self._swap_model(updated, name, positional=name in ("LLM", "vllm.LLM"))
        if name in ("load_dataset", "datasets.load_dataset") and updated.args \
                and normal(code(updated.args[0].value)) not in self.produced:
            self.notes.append(f"{name}({code(updated.args[0].value)[:40]}…) → the embedded data as {self.schema!r} "
                              "rows when its source is not on this machine (decided at run time)")
            return self._helper("load_dataset", *updated.args)
        if short == "from_pretrained" and owner.rsplit(".", 1)[-1] == "PeftModel" and len(updated.args) >= 2 \
                and updated.args[1].keyword is None and normal(code(updated.args[1].value)) not in self.produced:
            self.notes.append(f"{name}(…, {code(updated.args[1].value)[:40]}) → a fresh LoRA on the stand-in model "
                              "when the adapter is not on this machine (decided at run time)")
            return self._helper("adapter", cst.Arg(cst.parse_expression(owner)), *updated.args)
        if name in ("evaluate.load", "load_metric", "datasets.load_metric"):
            self.notes.append(f"{name}(…) → a stand-in metric: no metric script is downloaded in a dry run")
            return self._helper("metric", *updated.args)
        if short == "load_from_disk" and updated.args:
            return self._helper("load_from_disk", *updated.args)
        if (short in READERS or name == "open") and updated.args and updated.args[0].keyword is None:
            mode = updated.args[1].value if len(updated.args) > 1 and updated.args[1].keyword is None \
                else (kwarg(updated, "mode").value if kwarg(updated, "mode") else None)
            first = updated.args[0]
            wrapped = self._helper("path", cst.Arg(first.value), *([cst.Arg(mode)] if mode is not None else []))
            return updated.with_changes(args=[first.with_changes(value=wrapped), *updated.args[1:]])
        if is_training_args(updated):
            return self._training_args(updated, short)
        if name == "huggingface_hub.get_token":  # no token check in a dry run: a missing token reads as ""
            return cst.parse_expression('(huggingface_hub.get_token() or "")')
        if name.startswith("torch.cuda.") and short in CUDA_CALLS:
            self.notes.append(f"{name}() → a CPU answer when there is no GPU")
            return self._helper("cuda", cst.Arg(cst.SimpleString(repr(short))), *updated.args)
        if short in ("generate", "fast_generate") and kwarg(updated, "max_new_tokens") is not None:
            return set_kwarg(updated, "max_new_tokens", str(MAX_NEW_TOKENS))
        if short == "SamplingParams" and kwarg(updated, "max_tokens") is not None:  # vLLM's (kit_vllm's) spelling
            return set_kwarg(updated, "max_tokens", str(MAX_NEW_TOKENS))
        return updated

    def _tiny_load(self, call: cst.Call, name: str) -> cst.Call:
        for key in ("quantization_config",):
            if kwarg(call, key) is not None:
                call = drop_kwarg(call, key)
                self.notes.append(f"{name}: {key} dropped (a tiny model on any device)")
        for key in ("load_in_4bit", "load_in_8bit"):
            if (a := kwarg(call, key)) is not None and code(a.value) != "False":
                call = set_kwarg(call, key, "False")
                self.notes.append(f"{name}: {key}=False")
        for key in ("torch_dtype", "dtype"):
            if (a := kwarg(call, key)) is not None and code(a.value) != "None":
                call = set_kwarg(call, key, "torch.float32")
                self.notes.append(f"{name}: {key} → torch.float32")
        return call

    def _training_args(self, call: cst.Call, short: str) -> cst.Call:
        call = set_kwarg(call, "max_steps", str(DRY_RUN_STEPS))
        call = set_kwarg(call, "report_to", '"none"')
        self.notes.append(f"{short}: max_steps={DRY_RUN_STEPS}, report_to='none'")
        if (a := kwarg(call, "optim")) is not None and any(w in code(a.value) for w in ("8bit", "paged", "bnb")):
            call = set_kwarg(call, "optim", '"adamw_torch"')
            self.notes.append(f"{short}: optim {code(a.value)} → 'adamw_torch' (no bitsandbytes)")
        for key, why in GPU_ONLY_ARGS.items():
            if (a := kwarg(call, key)) is not None and code(a.value) != "False":
                call = set_kwarg(call, key, "False")
                self.notes.append(f"{short}: {key}=False ({why})")
        for key, cap in (("max_completion_length", 16), ("max_new_tokens", MAX_NEW_TOKENS)):
            if kwarg(call, key) is not None:
                call = set_kwarg(call, key, str(cap))
        if short == "GRPOConfig":  # generations per prompt must divide the global batch: 2 ranks x 2
            call = set_kwarg(call, "num_generations", "2")
            call = set_kwarg(call, "per_device_train_batch_size", "2")
            call = set_kwarg(call, "max_completion_length", "16")
        if (a := kwarg(call, "torch_compile")) is not None and code(a.value) != "False":
            call = set_kwarg(call, "torch_compile", "False")
        return call
