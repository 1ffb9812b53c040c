"""The rewrites `kit convert` applies to one notebook cell, as libcst transforms.

libcst rather than `ast` because it keeps the user's comments, strings and layout: the script
should still read like their notebook. Each rule records what it changed, with the reason, so
`kit convert` can list every change by cell number. `kit/convert.py` reads the notebook and
assembles the script; this module only knows about single statements.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

# device_map values that split one model over several GPUs (accelerate's "big model" placement).
SPLIT_DEVICE_MAPS = {"auto", "balanced", "balanced_low_0", "sequential"}
UNSLOTH_LOADERS = {"FastLanguageModel", "FastModel", "FastVisionModel"}
# TRL's config classes; any *TrainingArguments is caught by name, other *Config by its keywords.
TRL_CONFIGS = {"SFTConfig", "DPOConfig", "GRPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig",
               "RewardConfig", "PPOConfig", "RLOOConfig", "GKDConfig", "OnlineDPOConfig"}
TRAINER_KEYWORDS = {"output_dir", "per_device_train_batch_size", "num_train_epochs", "max_steps",
                    "learning_rate", "gradient_accumulation_steps"}
# Calls whose statement runs on rank 0 only: writing files, pushing, printing results, plotting.
MAIN_ONLY_METHODS = {"save_model", "save_pretrained", "save_pretrained_merged", "save_pretrained_gguf",
                     "push_to_hub", "push_to_hub_merged", "push_to_hub_gguf", "savefig", "show"}
MAIN_ONLY_FUNCTIONS = {"print", "pprint", "display"}
PLOT_MODULES = {"plt", "sns", "matplotlib", "seaborn", "px"}

# Hugging Face Hub logins that prompt when called without a token.
HUB_LOGINS = {f"{m}{f}" for m in ("", "huggingface_hub.") for f in ("login", "notebook_login", "interpreter_login")}
DTYPE_KEYWORDS = {"torch_dtype", "dtype", "bnb_4bit_compute_dtype"}
DTYPES = {"torch.float16", "torch.bfloat16"}
RANK_MAP = '{"": rank_device}'  # `rank_device` comes from the script's rank block
NO_REENTRANT = '{"use_reentrant": False}'
PRECISIONS = {"fp16": (True, False), "bf16": (False, True), "fp32": (False, False)}
FIND_UNUSED_WHY = ("Trainer turns it on for a PEFT model, and with gradient checkpointing DDP then fails "
                   "with 'Expected to mark a variable ready only once'")
REENTRANT_WHY = "reentrant checkpointing marks LoRA weights ready twice under DDP"
SPLIT_WHY = ("a model split across GPUs with device_map cannot be trained under DDP, and it runs the "
             "GPUs one after another; each rank loads a whole copy on its own GPU instead")
TOKEN_CHECK = '''\
from huggingface_hub import get_token
if get_token() is None:
    raise SystemExit("No Hugging Face token: set HF_TOKEN (notebook_login() cannot prompt under torchrun)")
'''

BARRIER = """\
if dist.is_initialized():
    dist.barrier()  # kit: every rank loads {paths} below; wait until rank 0 has written it
"""


@dataclass
class Change:
    """One thing `kit convert` did or wants a human to check, at a notebook cell (1-based)."""

    cell: int
    text: str
    review: bool = False

    def __str__(self) -> str:
        return f"cell {self.cell}: {'REVIEW: ' if self.review else ''}{self.text}"


def call_name(call: cst.Call) -> str:
    """`trainer.save_model` for `trainer.save_model(...)`; '' for calls on expressions."""
    return get_full_name_for_node(call.func) or ""


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _set_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    """Set keyword `name=value` on a call, replacing it or appending it in the call's own layout."""
    expr = cst.parse_expression(value)
    old = _kwarg(call, name)
    if old is not None:
        return call.with_changes(args=[a.with_changes(value=expr) if a is old else a for a in call.args])
    args = list(call.args)
    new = cst.Arg(keyword=cst.Name(name), value=expr,
                  equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    # One argument per line? Then the new one goes on its own line, at the arguments' indentation.
    between = args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) \
        else call.whitespace_before_args
    if not isinstance(between, cst.ParenthesizedWhitespace):
        between = cst.SimpleWhitespace(" ")
    else:
        between = between.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
    if isinstance(last.comma, cst.Comma) and isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace) \
            and isinstance(between, cst.ParenthesizedWhitespace):
        # The old last argument keeps its trailing comment and the comment lines under it; the new
        # argument follows them, and the line break before ")" moves to it.
        closing = last.comma.whitespace_after
        args[-1] = last.with_changes(comma=last.comma.with_changes(
            whitespace_after=closing.with_changes(last_line=between.last_line)))
        new = new.with_changes(comma=cst.Comma(whitespace_after=closing.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[])))
    else:
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between),
                                     whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new])


def _is_model_loader(owner: str) -> bool:
    short = owner.rsplit(".", 1)[-1]
    return (short in UNSLOTH_LOADERS or short.startswith(("AutoModel", "AutoPeftModel"))
            or short.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "ForSeq2SeqLM")))


def is_training_args(call: cst.Call) -> bool:
    """True for TrainingArguments, TRL's SFTConfig & co, and look-alikes that take trainer keywords."""
    short = call_name(call).rsplit(".", 1)[-1]
    if short.endswith("TrainingArguments") or short in TRL_CONFIGS:
        return True
    return short.endswith("Config") and any(_kwarg(call, k) for k in TRAINER_KEYWORDS)


class CellRewriter(cst.CSTTransformer):
    """Rewrites the calls inside one top-level statement; notes say what changed and why.

    Args:
        precision: "fp16", "bf16", "fp32" force the training precision; "auto" keeps the notebook's.
    """

    def __init__(self, precision: str):
        super().__init__()
        self.precision = precision
        self.notes: list[tuple[bool, str]] = []  # (review?, text) for the statement being visited
        self.found_training_args = False
        self._def_depth = 0

    def visit_FunctionDef(self, node):
        self._def_depth += 1

    def leave_FunctionDef(self, original, updated):
        self._def_depth -= 1
        return updated

    def leave_SimpleString(self, original, updated):
        if updated.evaluated_value in ("cuda:0", "cuda:1"):
            self.notes.append((True, f"{updated.value} names one GPU for every rank; use `rank_device`"))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = call_name(updated)
        updated = self._match_dtype(updated, name)
        short = name.rsplit(".", 1)[-1]
        if short == "from_pretrained":
            return self._pin_device_map(updated, name)
        if is_training_args(updated):
            self.found_training_args = True
            return self._fix_training_args(updated, short)
        if short == "gradient_checkpointing_enable" and _kwarg(updated, "gradient_checkpointing_kwargs") is None:
            self.notes.append((False, f"{name}(): gradient_checkpointing_kwargs={NO_REENTRANT}: "
                                      f"{REENTRANT_WHY}"))
            return _set_kwarg(updated, "gradient_checkpointing_kwargs", NO_REENTRANT)
        if name == "torch.cuda.is_bf16_supported":
            self.notes.append((True, "torch.cuda.is_bf16_supported() says True on a T4, which has no native "
                                     "bf16 (it counts emulation, pytorch#148322): use "
                                     "torch.cuda.get_device_capability() >= (8, 0), or --precision fp16"))
        elif name in HUB_LOGINS and not updated.args:
            self.notes.append((True, f"{name}() prompts for a token and hangs under torchrun: set HF_TOKEN "
                                     "in the environment and remove it"))
        elif name == "wandb.login" and not updated.args:
            self.notes.append((True, "wandb.login() prompts when WANDB_API_KEY is unset, which hangs under "
                                     "torchrun: set WANDB_API_KEY in the environment"))
        elif name.endswith("drive.mount") or name.endswith("userdata.get"):
            # Colab serves these through the notebook kernel; a torchrun child process has none.
            self.notes.append((True, f"{name}() works only inside the Colab kernel: mount Drive or read "
                                     "the secret in the notebook, pass it as an environment variable, "
                                     "and remove this line"))
        elif short == "display":
            self.notes.append((True, "display() shows rich output only in a notebook; a script prints text"))
        elif short == "generate" and self._def_depth == 0:
            self.notes.append((True, f"{name}() runs on every rank; put it under `if is_main:` "
                                     "to run it once"))
        return updated

    def _match_dtype(self, call: cst.Call, name: str) -> cst.Call:
        """Under --precision fp16/bf16, load and compute dtypes follow it (a T4 has no native bf16)."""
        want = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(self.precision)
        for arg in call.args if want else ():
            if arg.keyword and arg.keyword.value in DTYPE_KEYWORDS and _code(arg.value) in DTYPES - {want}:
                call = _set_kwarg(call, arg.keyword.value, want)
                self.notes.append((False, f"{name}: {arg.keyword.value}={_code(arg.value)} → {want} "
                                          f"(--precision {self.precision})"))
        return call

    def _pin_device_map(self, call: cst.Call, name: str) -> cst.Call:
        owner = name.rsplit(".", 1)[0]
        old = _kwarg(call, "device_map")
        if old is None:
            if not _is_model_loader(owner):
                return call  # tokenizers, configs, PEFT adapters: nothing to place
            self.notes.append((False, f"{name}: device_map={RANK_MAP} added: each rank loads "
                                      "its own copy on its own GPU"))
        else:
            was = _code(old.value)
            if was == RANK_MAP:
                return call
            value = old.value.evaluated_value if isinstance(old.value, cst.SimpleString) else None
            why = SPLIT_WHY if value in SPLIT_DEVICE_MAPS else "each rank loads its own copy onto its own device"
            self.notes.append((False, f"{name}: device_map={was} → {RANK_MAP}: {why}"))
        return _set_kwarg(call, "device_map", RANK_MAP)

    def _fix_training_args(self, call: cst.Call, short: str) -> cst.Call:
        if self.precision in PRECISIONS:
            fp16, bf16 = PRECISIONS[self.precision]
            before = {k: _code(a.value) for k in ("fp16", "bf16") if (a := _kwarg(call, k)) is not None}
            wanted = {"fp16": str(fp16), "bf16": str(bf16)}
            if before != wanted:
                call = _set_kwarg(_set_kwarg(call, "fp16", wanted["fp16"]), "bf16", wanted["bf16"])
                was = ", ".join(f"{k}={v}" for k, v in before.items()) or "unset"
                self.notes.append((False, f"{short}: fp16={fp16}, bf16={bf16} (--precision {self.precision}; "
                                          f"was {was})"))
        elif (a := _kwarg(call, "bf16")) is not None and _code(a.value) == "True":
            self.notes.append((True, f"{short}: bf16=True is hard-coded, and a T4 or P100 has no native bf16: "
                                     "rerun with --precision fp16 for those GPUs"))
        accum = _kwarg(call, "gradient_accumulation_steps")
        if accum is not None and _code(accum.value) not in ("1", "None"):
            # The seed-002 user's run: batch 1 × accumulation 8 × 2 GPUs = a global batch of 16.
            self.notes.append((False, f"{short}: note: under torchrun the global batch is per-device batch × "
                                      f"gradient_accumulation_steps ({_code(accum.value)}) × the GPU count; "
                                      "divide the accumulation by the GPU count to keep the notebook's batch"))
        unused = _kwarg(call, "ddp_find_unused_parameters")
        if unused is None or _code(unused.value) != "False":
            call = _set_kwarg(call, "ddp_find_unused_parameters", "False")
            self.notes.append((False, f"{short}: ddp_find_unused_parameters=False: {FIND_UNUSED_WHY}"))
        # transformers 5 renames gradient_* to activation_*; follow whichever name the notebook uses.
        word = "activation" if _kwarg(call, "activation_checkpointing") else "gradient"
        ckpt = _kwarg(call, f"{word}_checkpointing")
        # TRL's configs turn gradient checkpointing on by default.
        ckpt_on = _code(ckpt.value) == "True" if ckpt is not None else short in TRL_CONFIGS
        if ckpt_on and _kwarg(call, f"{word}_checkpointing_kwargs") is None:
            call = _set_kwarg(call, f"{word}_checkpointing_kwargs", NO_REENTRANT)
            self.notes.append((False, f"{short}: {word}_checkpointing_kwargs={NO_REENTRANT}: {REENTRANT_WHY}"))
        return call


def _only_call(stmt: cst.BaseStatement) -> cst.Call | None:
    """The call of a one-call statement line (`f(x)` or `y = f(x)`), else None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    value = getattr(small, "value", None) if isinstance(small, (cst.Expr, cst.Assign)) else None
    return value if isinstance(value, cst.Call) else None


def _normal(code: str) -> str:
    return ast.unparse(ast.parse(code.strip(), mode="eval"))


def loaded_paths(trees: list[ast.Module]) -> set[str]:
    """The first argument of every `from_pretrained(...)` call, as normalized source text."""
    found = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("from_pretrained"):
                kws = [k.value for k in node.keywords if k.arg in ("pretrained_model_name_or_path", "model_name")]
                found |= {ast.unparse(a) for a in [*node.args[:1], *kws]}
    return found


def saved_for_reload(stmt: cst.BaseStatement, reloaded: set[str]) -> str | None:
    """The path a `save_pretrained(path)` statement writes when the notebook loads it again."""
    call = _only_call(stmt)
    if call is None or not call.args or not call_name(call).endswith(".save_pretrained"):
        return None
    path = _normal(_code(call.args[0].value))
    return path if path in reloaded else None


def is_main_only(stmt: cst.BaseStatement) -> bool:
    """Saves, pushes, result printing and plotting: work that rank 0 alone should do."""
    call = _only_call(stmt)
    if call is None:
        return False
    name = call_name(call)
    short = name.rsplit(".", 1)[-1]
    is_expr = isinstance(stmt.body[0], cst.Expr)
    return (short in MAIN_ONLY_METHODS and "." in name) or (is_expr and name in MAIN_ONLY_FUNCTIONS) or (
        is_expr and name.split(".", 1)[0] in PLOT_MODULES)


def is_login_prompt(stmt: cst.BaseStatement) -> bool:
    """`notebook_login()` or a bare Hub `login()`: they wait for a token typed by a person."""
    call = _only_call(stmt)
    return (call is not None and isinstance(stmt.body[0], cst.Expr) and not call.args
            and call_name(call) in HUB_LOGINS)


def is_setup(stmt: cst.BaseStatement) -> bool:
    """Imports, defs, classes and literal settings: what may stay above the try block."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return True
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, (cst.Import, cst.ImportFrom)):
            continue
        value = getattr(small, "value", None) if isinstance(small, (cst.Assign, cst.AnnAssign)) else None
        if value is None:
            return False
        try:
            ast.literal_eval(_code(value))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False  # computed, not a literal setting
    return True


def _comments(text: str, first: str) -> list[cst.EmptyLine]:
    """`# kit: …` comment lines, wrapped at 100 columns so the script stays readable."""
    lines = textwrap.wrap(text, 96, initial_indent=first, subsequent_indent="    ")
    return [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in lines]


def rewrite_cell(module: cst.Module, cell: int, precision: str, changes: list[Change],
                 reloaded: frozenset[str] = frozenset()) -> tuple[list[cst.BaseStatement], bool]:
    """Rewrite one parsed cell's top-level statements.

    Args:
        reloaded: paths the notebook passes to `from_pretrained` (see `loaded_paths`); a
            `save_pretrained` to one of them stays on every rank, since every rank loads it.

    Returns the new statements (main-only runs grouped under `if is_main:`) and whether a
    TrainingArguments-like call was seen. Appends to `changes`; review items also become
    `# kit: REVIEW (cell N): …` comments above the statement.
    """
    rewriter = CellRewriter(precision)
    out: list[cst.BaseStatement] = []
    guarded: list[cst.BaseStatement] = []
    waits: list[str] = []  # paths saved under `if is_main:` that every rank loads later

    def flush():
        if guarded:
            calls = ", ".join(dict.fromkeys(f"{call_name(_only_call(s))}()" for s in guarded))
            changes.append(Change(cell, f"under `if is_main:`: {calls}: rank 0 alone saves, pushes and prints"))
            lead = guarded[0].leading_lines
            body = [guarded[0].with_changes(leading_lines=()), *guarded[1:]]
            out.append(cst.If(test=cst.Name("is_main"), body=cst.IndentedBlock(body=body), leading_lines=lead))
            guarded.clear()
        if waits:
            # transformers writes only on rank 0 once a process group exists, so the other ranks must
            # wait for rank 0's files before they load them (rank 0 writes, then everyone meets once).
            out.append(cst.parse_statement(BARRIER.format(paths=", ".join(dict.fromkeys(waits)))))
            changes.append(Change(cell, f"barrier after saving {', '.join(dict.fromkeys(waits))}: the notebook "
                                        "loads it again with from_pretrained, so the other ranks wait for rank 0"))
            waits.clear()

    for stmt in module.body:
        if is_login_prompt(stmt):
            flush()
            check = list(cst.parse_module(TOKEN_CHECK).body)
            note = _comments(f"{_code(stmt).strip()} replaced: it cannot prompt under torchrun; the Hub "
                             "client reads HF_TOKEN or a saved `hf auth login` token", "kit: ")
            check[0] = check[0].with_changes(leading_lines=(*stmt.leading_lines, *note))
            out.extend(check)
            changes.append(Change(cell, f"{_code(stmt).strip()} replaced by a check for a token from HF_TOKEN "
                                        "(or a saved login): a login prompt hangs under torchrun"))
            continue
        rewriter.notes = []
        new = stmt.visit(rewriter)
        lines = [line for r, t in rewriter.notes
                 for line in _comments(t, f"kit: REVIEW (cell {cell}): " if r else "kit: ")]
        changes.extend(Change(cell, t, r) for r, t in rewriter.notes)
        if lines:
            new = new.with_changes(leading_lines=(*new.leading_lines, *lines))
        if is_main_only(new):
            guarded.append(new)
            if (path := saved_for_reload(new, reloaded)) is not None:
                waits.append(path)
        else:
            flush()
            out.append(new)
    flush()
    return out, rewriter.found_training_args
