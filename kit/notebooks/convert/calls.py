"""The call-level rewrites: each changes one call (or removes one line) and says why.

Devices follow the rank, Colab/Kaggle secrets become environment lookups, training arguments
get what DDP needs, unseeded dataset shuffles and splits get the notebook's seed. Statement-level
decisions (who runs what, barriers) are in `kit.notebooks.convert.ranks`.
"""

from __future__ import annotations

import libcst as cst

from kit.notebooks.convert.precision import PRECISIONS, follow_precision
from kit.notebooks.convert.logins import HUB_LOGINS, PLATFORM_MODULES, secret_lookup, token_arg
from kit.notebooks.convert.kinds import (TRL_CONFIGS, UNSLOTH_LOADERS, find_unused_why, is_training_args,
                                         shown_text, shows_media)
from kit.notebooks.convert.setup import install_command, plain_accelerator, removed_setup, unprepared
from kit.notebooks.convert.syntax import call_name, code, kwarg, set_kwarg, short_name

# device_map values that split one model over several GPUs (accelerate's "big model" placement).
SPLIT_DEVICE_MAPS = {"auto", "balanced", "balanced_low_0", "sequential"}
CUDA_LITERALS = {"cuda", "cuda:0", "cuda:1"}
DEVICE_ZERO_QUERIES = {"torch.cuda.get_device_properties", "torch.cuda.get_device_name",
                       "torch.cuda.mem_get_info", "torch.cuda.get_device_capability"}
RANK_MAP = '{"": rank_device}'  # `rank_device` comes from the script's rank block
NO_REENTRANT = '{"use_reentrant": False}'
REENTRANT_WHY = "reentrant checkpointing marks LoRA weights ready twice under DDP"
SPLIT_WHY = ("a model split across GPUs with device_map cannot be trained under DDP, and it runs the "
             "GPUs one after another; each rank loads a whole copy on its own GPU instead")


def _atom(node: cst.BaseExpression) -> str:
    """The notebook's expression as code that stays one operand when called or starred (`lambda: f()` in parens)."""
    simple = isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Tuple, cst.List)) or node.lpar
    return code(node) if simple else f"({code(node)})"


def _is_cuda(node) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == "cuda"


class CellRewriter(cst.CSTTransformer):
    """Rewrites the calls inside one statement; `notes` say what changed and why.

    Args:
        precision: "fp16", "bf16", "fp32" force the training precision; "auto" keeps the notebook's.
        seed: the notebook's seed, given to unseeded shuffles and splits.
        keep_global_batch: divide gradient accumulation by the number of ranks.
        peft: the notebook trains adapters (for the find_unused_parameters reason).
        dense: every step uses every trainable parameter (`uses_every_parameter`).
    """

    def __init__(self, precision: str, seed: int, keep_global_batch: bool = False, peft: bool = True,
                 secret_names: frozenset[str] = frozenset(), dense: bool = True,
                 true_names: frozenset[str] = frozenset(), rebound: frozenset[str] = frozenset(),
                 accelerators: frozenset[str] = frozenset()):
        super().__init__()
        self.accelerators = accelerators  # names the notebook assigns an Accelerator(...) to
        self.installs: list[str] = []  # installs run from Python that kit removed: to run before launching
        # The notebook rebinds `torch` or `os` somewhere: kit's code uses the rank block's own names.
        self.torch, self.os = ("_kit_torch" if "torch" in rebound else "torch"), ("_kit_os" if "os" in rebound else "os")
        self.precision, self.seed, self.keep_global_batch, self.peft = precision, seed, keep_global_batch, peft
        self.secret_names = secret_names  # names the notebook assigns from a Kaggle/Colab secret
        self.dense = dense
        self.true_names = true_names  # names the notebook sets to True (`BF16 = True`)
        self.notes: list[tuple[bool, str]] = []  # (review?, text) for the statement being visited
        self.found_training_args = False
        self.needs_hub_import = False
        self.own_token = False  # a login(token=...) with a token of the notebook's own (a .env file, say)
        self.after_training = False  # the statement being visited runs on rank 0 alone, all GPUs free

    def note(self, text: str, review: bool = False) -> None:
        self.notes.append((review, text))

    def _own_token(self, call: cst.Call) -> cst.BaseExpression | None:
        """The login's token when it is the notebook's own: not a literal (refused below), not a Kaggle/Colab
        secret (those become environment lookups, and the up-front check covers them)."""
        token = token_arg(call)
        if token is None or isinstance(token, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return None
        shown = code(token)
        if "get_token()" in shown or "os.environ" in shown or shown in self.secret_names:
            return None
        return token

    # --- lines that go away -------------------------------------------------------------------

    def leave_SimpleStatementLine(self, original, updated):
        kept = [s for s in updated.body if not self._removed(s)]
        if len(kept) == len(updated.body):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(body=kept)

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:  # every line of the block was removed: Python needs one
            return updated.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
        return updated

    def _removed(self, small: cst.BaseSmallStatement) -> bool:
        if not self.after_training and (why := removed_setup(small)) is not None:
            self.note(why)
            return True
        value = getattr(small, "value", None)
        if not self.after_training and isinstance(small, cst.Expr) and isinstance(value, cst.Call) \
                and (command := install_command(value)) is not None:
            self.installs.append(command)
            self.note(f"`{code(value)[:60]}` removed: every rank would install into the same environment at once; "
                      "it is listed at the top of the script with the installs to run before launching")
            return True
        if isinstance(small, cst.ImportFrom) and small.module is not None:
            module = code(small.module)
            if module.startswith(PLATFORM_MODULES):
                self.note(f"`from {module} import …` removed: it exists only inside the Colab/Kaggle kernel, "
                          "and the secrets it reads come from the environment here")
                return True
        value = getattr(small, "value", None)
        if isinstance(small, cst.Expr) and shows_media(value):
            self.note(f"`{code(value)[:60]}` removed: an audio/image/video player shows only in a notebook; "
                      "open the file or URL yourself after the run")
            return True
        if isinstance(value, cst.Call):
            name = call_name(value)
            if name.rsplit(".", 1)[-1] == "UserSecretsClient":
                return True  # its get_secret() calls became environment lookups
            if name in HUB_LOGINS:
                literal = any(isinstance(a.value, cst.SimpleString) for a in value.args)
                self.note(f"{name}(…) removed: the script checks for a Hub token at the top, before any "
                          "training, and the Hub client reads HF_TOKEN or a saved `hf auth login` itself"
                          + ("; the notebook wrote its token in the code: set HF_TOKEN instead" if literal else ""),
                          review=literal)
                return True
            if name.endswith(("drive.mount", "files.download")):
                self.note(f"{name}() removed: it works only in the Colab kernel; mount Drive (or download "
                          "the files) in the notebook before or after launching — child processes see the mount")
                return True
        return False

    # --- calls ----------------------------------------------------------------------------------

    def _device(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """A literal CUDA device as the rank's device: cuda:0 on every rank puts rank 1's tensors on
        rank 0's GPU, and a CPU (a dry run, a CPU-only box) has no "cuda" at all."""
        if isinstance(node, cst.SimpleString) and node.evaluated_value in CUDA_LITERALS:
            self.note(f"{code(node)} → rank_device: each rank uses its own GPU (the CPU without one)")
            return cst.Name("rank_device")
        if isinstance(node, cst.IfExp):
            return node.with_changes(body=self._device(node.body))
        return node

    def _placement(self, value: cst.BaseExpression, where: str) -> cst.BaseExpression:
        """A device_map held in a kwargs dict (`{"device_map": "auto"}`, `dict(device_map="auto")`) that
        a loader gets through `**`: each rank's own device, as a keyword device_map is pinned."""
        if self.after_training or not isinstance(value, cst.SimpleString):
            return value
        placement = value.evaluated_value
        if placement not in SPLIT_DEVICE_MAPS | CUDA_LITERALS:
            return value
        why = SPLIT_WHY if placement in SPLIT_DEVICE_MAPS else "each rank loads its own copy onto its own device"
        self.note(f"{where}: device_map={code(value)} → {RANK_MAP}: {why}")
        return cst.parse_expression(RANK_MAP)

    def leave_Dict(self, original, updated):
        return updated.with_changes(elements=[
            e.with_changes(value=self._placement(e.value, "a kwargs dict"))
            if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
            and e.key.evaluated_value == "device_map" else e for e in updated.elements])

    def leave_Assign(self, original, updated):
        # `device = "cuda:0"` names one GPU for every rank: the rank's own instead. A plain "cuda" is
        # already the rank's own (the rank block calls set_device first), and later lines compare it
        # (`if device == "cuda":`): it stays a string, and "cpu" where there is no GPU.
        value = updated.value
        if isinstance(value, cst.IfExp) and _is_cuda(value.body):
            return updated
        if _is_cuda(value):
            self.note(f"{code(value)} → \"cuda\" if {self.torch}.cuda.is_available() else \"cpu\": \"cuda\" is each "
                      "rank's own GPU (set_device), and a CPU run has none")
            return updated.with_changes(value=cst.parse_expression(f'"cuda" if {self.torch}.cuda.is_available() else "cpu"'))
        return updated.with_changes(value=self._device(value))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name, short = call_name(updated), short_name(updated)
        if name in HUB_LOGINS and (token := self._own_token(updated)) is not None:
            self.own_token = True
            self.note(f"{name}(token={code(token)}) → set_hub_token({code(token)}): the notebook brings its own "
                      "token, so every rank takes it from there (login() prompts, which hangs under torchrun, "
                      "when it is empty), and the script does not ask for HF_TOKEN up front")
            return cst.Call(func=cst.Name("set_hub_token"), args=[cst.Arg(token)])
        if not self.after_training and (prepared := unprepared(updated, self.accelerators)) is not None:
            self.note(prepared[1])
            return prepared[0]
        if not self.after_training and (plain := plain_accelerator(updated)) is not None:
            self.note(plain[1])
            updated = plain[0]
        updated, notes = follow_precision(updated, name, self.precision)
        for note in notes:
            self.note(note)
        if short == "to" and isinstance(updated.func, cst.Attribute) and updated.args:
            first = updated.args[0]
            updated = updated.with_changes(args=[first.with_changes(value=self._device(first.value)), *updated.args[1:]])
        updated = updated.with_changes(args=[a.with_changes(value=self._device(a.value))
                                             if a.keyword is not None and a.keyword.value in ("device", "device_map")
                                             else a for a in updated.args])
        if name == "dict":  # dict(device_map="auto"): kwargs a loader gets through **
            updated = updated.with_changes(args=[a.with_changes(value=self._placement(a.value, "dict(…)"))
                                                 if a.keyword is not None and a.keyword.value == "device_map"
                                                 else a for a in updated.args])
        if short == "from_pretrained":  # after training rank 0 alone loads, and may spread over every GPU
            return updated if self.after_training else self._pin_device_map(updated, name)
        if is_training_args(updated):
            self.found_training_args = True
            return self._fix_training_args(updated, short)
        if short == "gradient_checkpointing_enable" and kwarg(updated, "gradient_checkpointing_kwargs") is None:
            self.note(f"{name}(): gradient_checkpointing_kwargs={NO_REENTRANT}: {REENTRANT_WHY}")
            return set_kwarg(updated, "gradient_checkpointing_kwargs", NO_REENTRANT)
        if name in DEVICE_ZERO_QUERIES and updated.args and code(updated.args[0].value) == "0":
            self.note(f"{name}(0) → {name}(local_rank): each rank asks about its own GPU")
            return updated.with_changes(args=[updated.args[0].with_changes(value=cst.Name("local_rank"))])
        if short == "cuda" and isinstance(updated.func, cst.Attribute) and not updated.args:
            self.note(f"{name}() → .to(rank_device): .cuda() means the current GPU, the CPU has none")
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")),
                                        args=[cst.Arg(cst.Name("rank_device"))])
        if (short == "get_secret" or name.endswith("userdata.get")) and updated.args:
            lookup = secret_lookup(updated.args[0].value, self.os)
            self.needs_hub_import |= lookup.startswith("huggingface_hub")
            self.note(f"{name}({code(updated.args[0].value)}) → {lookup}: platform secrets exist only in the "
                      "notebook kernel; torchrun's processes read the environment (set it from the secret)")
            return cst.parse_expression(lookup)
        if name == "torch.cuda.is_bf16_supported":
            self.note("torch.cuda.is_bf16_supported() says True on a T4, which has no native bf16 (it counts "
                      "emulation, pytorch#148322): use torch.cuda.get_device_capability() >= (8, 0), or "
                      "--precision fp16", review=True)
        elif name == "wandb.login" and not updated.args:
            self.note("wandb.login() prompts when WANDB_API_KEY is unset, which hangs under torchrun: set "
                      "WANDB_API_KEY in the environment", review=True)
        elif name == "display":
            self.note("display() → print(): a script has no rich output")
            return updated.with_changes(func=cst.Name("print"), args=[shown_text(a) for a in updated.args])
        elif short in ("shuffle", "train_test_split") and isinstance(updated.func, cst.Attribute) \
                and not code(updated.func.value).endswith("random") and kwarg(updated, "seed") is None \
                and not self.after_training:  # after it rank 0 alone runs: nothing for ranks to agree on
            return self._seed(updated, name, "seed")
        elif short == "sample" and isinstance(updated.func, cst.Attribute) and kwarg(updated, "frac") is not None \
                and kwarg(updated, "random_state") is None and not self.after_training:
            return self._seed(updated, name, "random_state")
        elif name == "notebook_launcher" and updated.args:
            fn = _atom(updated.args[0].value)
            args = _atom(updated.args[1].value) if len(updated.args) > 1 and updated.args[1].keyword is None \
                else (_atom(kwarg(updated, "args").value) if kwarg(updated, "args") else "()")
            self.note(f"notebook_launcher({fn}, …) → {fn}(*{args}): torchrun starts the processes, one per GPU")
            return cst.parse_expression(f"{fn}(*{args})")
        return updated

    def _seed(self, call: cst.Call, name: str, key: str) -> cst.Call:
        self.note(f"{name}(): {key}={self.seed}: unseeded, each rank would shuffle or split differently and "
                  "the ranks would train on different (even each other's test) rows")
        return set_kwarg(call, key, str(self.seed))

    def _pin_device_map(self, call: cst.Call, name: str) -> cst.Call:
        owner = name.rsplit(".", 1)[0]
        old = kwarg(call, "device_map")
        if old is None:
            # Without device_map transformers loads on the CPU and Trainer moves the model to the
            # rank's GPU; only Unsloth's loader places the model itself (on GPU 0 by default).
            if owner.rsplit(".", 1)[-1] not in UNSLOTH_LOADERS:
                return call
            self.note(f"{name}: device_map={RANK_MAP} added: each rank loads its own copy on its own GPU")
            return set_kwarg(call, "device_map", RANK_MAP)
        was = code(old.value)
        value = old.value.evaluated_value if isinstance(old.value, cst.SimpleString) else None
        if was == RANK_MAP or value == "cpu" or "'cpu'" in was or '"cpu"' in was:
            return call  # an intentional CPU load (to merge, to inspect) stays on the CPU
        why = SPLIT_WHY if value in SPLIT_DEVICE_MAPS else "each rank loads its own copy onto its own device"
        self.note(f"{name}: device_map={was} → {RANK_MAP}: {why}")
        return set_kwarg(call, "device_map", RANK_MAP)

    def _fix_training_args(self, call: cst.Call, short: str) -> cst.Call:
        if self.precision in PRECISIONS:
            fp16, bf16 = PRECISIONS[self.precision]
            before = {k: code(a.value) for k in ("fp16", "bf16") if (a := kwarg(call, k)) is not None}
            wanted = {"fp16": str(fp16), "bf16": str(bf16)}
            if before != wanted:
                call = set_kwarg(set_kwarg(call, "fp16", wanted["fp16"]), "bf16", wanted["bf16"])
                was = ", ".join(f"{k}={v}" for k, v in before.items()) or "unset"
                self.note(f"{short}: fp16={fp16}, bf16={bf16} (--precision {self.precision}; was {was})")
        elif (a := kwarg(call, "bf16")) is not None and code(a.value) in {"True", *self.true_names}:
            self.note(f"{short}: bf16={code(a.value)} is hard-coded, and a T4 or P100 has no native bf16: rerun with "
                      "--precision fp16 for those GPUs", review=True)
        if (a := kwarg(call, "fp16")) is not None and code(a.value) not in ("False", "None") \
                and "cuda.is_available" not in code(a.value):
            gpu = f"{self.torch}.cuda.is_available()"
            call = set_kwarg(call, "fp16", gpu if code(a.value) == "True" else f"({code(a.value)}) and {gpu}")
            self.note(f"{short}: fp16 only with a GPU: fp16 mixed precision needs CUDA")
        if kwarg(call, "use_cpu") is None:
            call = set_kwarg(call, "use_cpu", f"not {self.torch}.cuda.is_available()")
            self.note(f"{short}: use_cpu=not {self.torch}.cuda.is_available(): without it a CPU run is not DDP "
                      "(each rank trains alone on all the data)")
        call = self._global_batch(call, short)
        # transformers 5 renames gradient_* to activation_*; follow whichever name the notebook uses.
        word = "activation" if kwarg(call, "activation_checkpointing") else "gradient"
        ckpt = kwarg(call, f"{word}_checkpointing")
        ckpt_on = code(ckpt.value) == "True" if ckpt is not None else short in TRL_CONFIGS  # TRL's default
        unused = kwarg(call, "ddp_find_unused_parameters")
        if (self.dense or ckpt_on) and (unused is None or code(unused.value) != "False"):
            call = set_kwarg(call, "ddp_find_unused_parameters", "False")
            self.note(f"{short}: ddp_find_unused_parameters=False: {find_unused_why(self.peft, self.dense)}")
        elif unused is None:
            self.note(f"{short}: ddp_find_unused_parameters left to Trainer (it searches for unused parameters "
                      "when gradient checkpointing is off): this is not a causal LM or an adapter, and its "
                      "steps may skip parameters (LayerDrop, an unused head), where False fails")
        if ckpt_on and kwarg(call, f"{word}_checkpointing_kwargs") is None:
            call = set_kwarg(call, f"{word}_checkpointing_kwargs", NO_REENTRANT)
            self.note(f"{short}: {word}_checkpointing_kwargs={NO_REENTRANT}: {REENTRANT_WHY}")
        return call

    def _global_batch(self, call: cst.Call, short: str) -> cst.Call:
        accum = kwarg(call, "gradient_accumulation_steps")
        steps = code(accum.value) if accum is not None else "1"
        if not self.keep_global_batch:
            self.note(f"{short}: the global batch is per-device batch × gradient_accumulation_steps ({steps}) × "
                      "the number of GPUs, so N GPUs train on N times the notebook's batch (fewer, larger steps "
                      "per epoch); --keep-global-batch divides the accumulation by the GPU count instead")
            return call
        if steps in ("1", "None"):
            self.note(f"{short}: --keep-global-batch: gradient_accumulation_steps is 1, nothing to divide: "
                      "halve per_device_train_batch_size by hand to keep the notebook's batch", review=True)
            return call
        self.note(f"{short}: gradient_accumulation_steps={steps} → max(1, {steps} // world_size) "
                  "(--keep-global-batch): N GPUs train on the notebook's global batch (smaller when the GPU count "
                  "does not divide it)")
        return set_kwarg(call, "gradient_accumulation_steps", f"max(1, ({steps}) // world_size)")
