"""vLLM out of a converted script: transformers generation in its place.

Unsloth's GRPO notebooks load their model with `fast_inference=True`, which starts a vLLM engine in
the process, sample through it (`model.fast_generate(…, sampling_params=SamplingParams(…),
lora_request=model.load_lora(…))`) and save with `model.save_lora`; TRL's pass `use_vllm=True` and
`vllm_*` settings to GRPOConfig. vLLM cannot be installed on Kaggle's or Colab's T4s and does not
run one engine per rank inside a torchrun process group, so the converted script generates with
transformers instead, which every rank has (TRL's GRPOTrainer and Unsloth's both generate with
transformers when vLLM is off: slower, the same training):

- the loader's vLLM-only arguments are dropped (`fast_inference`, `gpu_memory_utilization`,
  `max_lora_rank`, `float8_kv_cache`, `disable_log_stats`, `conservativeness`);
- GRPOConfig (and TRL's other configs) lose `use_vllm=True`, `vllm_mode` and every `vllm_*` setting;
  the sampling settings of Unsloth's `vllm_sampling_params=SamplingParams(…)` that GRPOConfig has
  too (top_p, top_k, min_p, repetition_penalty) move to GRPOConfig;
- `from vllm import SamplingParams`, `model.fast_generate(…)`, `model.load_lora(path)` go through
  `kit_vllm`, a few lines at the top of the script over transformers' `generate` that answer in
  vLLM's shape (`[0].outputs[0].text`), so the notebook's sampling cells run unchanged;
- `model.save_lora(path)` → `model.save_pretrained(path)`, PEFT's own save of the same adapter files.

Each change is one line of convert's report, and the script's docstring says why.
"""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from kit.notebooks.convert.facts import live_nodes
from kit.notebooks.convert.kinds import is_training_args
from kit.notebooks.convert.syntax import call_name, code, drop_kwarg, kwarg, set_kwarg, short_name

# Unsloth's loader arguments that only its vLLM engine reads.
LOADER_ARGS = ("fast_inference", "gpu_memory_utilization", "max_lora_rank", "float8_kv_cache", "disable_log_stats",
               "conservativeness")
# vLLM's SamplingParams fields that GRPOConfig has under the same name (a vLLM top_k of -1 is "off").
SAMPLING_FIELDS = ("top_p", "top_k", "min_p", "repetition_penalty")
VLLM_METHODS = {"fast_generate", "load_lora", "save_lora"}
WHY = ("vLLM cannot be installed on Kaggle's or Colab's T4s, nor run one engine per rank in a torchrun "
       "process group, so generation uses transformers (slower, same training)")

DOC_NOTE = ("vLLM: the notebook generated with vLLM ({what}). vLLM cannot be installed on Kaggle's or Colab's "
            "T4s, nor run one engine per rank inside a torchrun process group, so this script generates with "
            "transformers instead: GRPO's sampling during training (TRL's and Unsloth's trainers both do when "
            "vLLM is off: slower, the same training){sampling}. Every change is in kit convert's list (\"vllm:\").")
SAMPLING_NOTE = (", and the notebook's own sampling cells through `kit_vllm` below, which answers "
                 "model.fast_generate(...) over transformers' generate in vLLM's shape")


def doc_note(found: list[str], helpers: bool) -> str:
    """The script docstring's paragraph on vLLM, wrapped; "" when the notebook used none."""
    if not found:
        return ""
    text = DOC_NOTE.format(what=", ".join(found), sampling=SAMPLING_NOTE if helpers else "")
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False) + "\n\n"


HELPERS = '''\
# kit: vLLM → transformers generation. vLLM cannot be installed on Kaggle's or Colab's T4s, nor run one
# engine per torchrun rank, so the notebook's vLLM sampling (Unsloth's model.fast_generate, SamplingParams,
# model.load_lora) goes through these few lines over transformers' generate, answering in vLLM's shape.
class kit_vllm:
    class SamplingParams:
        """vLLM's SamplingParams, kept for transformers' generate (fields it has no use for are ignored)."""

        def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
                     max_tokens=16, seed=None, **ignored):
            self.n, self.temperature, self.top_p, self.top_k, self.min_p = n, temperature, top_p, top_k, min_p
            self.repetition_penalty, self.max_tokens, self.seed = repetition_penalty, max_tokens, seed

        def generate_kwargs(self):
            kwargs = {"max_new_tokens": self.max_tokens, "num_return_sequences": self.n,
                      "do_sample": self.temperature > 0}
            if self.temperature > 0:
                kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0))
                if self.min_p:
                    kwargs["min_p"] = self.min_p
            if self.repetition_penalty != 1.0:
                kwargs["repetition_penalty"] = self.repetition_penalty
            return kwargs

    @staticmethod
    def load_lora(model, path):
        """model.load_lora(path): the adapter folder, which fast_generate loads through PEFT."""
        return str(path)

    @staticmethod
    def fast_generate(model, tokenizer, prompts, sampling_params=None, lora_request=None, **ignored):
        """model.fast_generate(...) with transformers: one result per prompt, `.outputs[i].text` as vLLM's.
        Without a lora_request vLLM samples the base model, so the adapter is off here too."""
        import contextlib
        import types

        from peft import PeftModel

        params = sampling_params or kit_vllm.SamplingParams()
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        gen, training = model, model.training  # PEFT's load_adapter puts the model in eval mode
        if lora_request is not None:  # the saved adapter, loaded next to the trained one and removed after
            if isinstance(model, PeftModel):
                active = model.active_adapter
                model.load_adapter(str(lora_request), adapter_name="kit_vllm_lora")
                model.set_adapter("kit_vllm_lora")
            else:
                gen = PeftModel.from_pretrained(model, str(lora_request))
        adapter_off = model.disable_adapter() if lora_request is None and isinstance(model, PeftModel) \\
            else contextlib.nullcontext()
        gen.eval()
        results = []
        try:
            with adapter_off, _kit_torch.no_grad():
                for text in texts:
                    batch = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(gen.device)
                    if params.seed is not None:
                        _kit_torch.manual_seed(params.seed)
                    out = gen.generate(**batch, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                                       **params.generate_kwargs())
                    start = batch["input_ids"].shape[1]
                    outputs = [types.SimpleNamespace(text=tokenizer.decode(seq[start:], skip_special_tokens=True),
                                                     token_ids=seq[start:].tolist()) for seq in out]
                    results.append(types.SimpleNamespace(prompt=text, outputs=outputs))
        finally:
            if lora_request is not None and isinstance(model, PeftModel):
                model.set_adapter(active)
                model.delete_adapter("kit_vllm_lora")
            elif gen is not model:
                gen.unload()
            model.train(training)
        return results

'''


def uses_vllm(trees: list[ast.Module]) -> list[str]:
    """What in the notebook generates with vLLM (for the docstring); [] when nothing does."""
    found = []
    for tree in trees:
        for node in live_nodes(tree):
            if isinstance(node, ast.Call):
                short = ast.unparse(node.func).rsplit(".", 1)[-1]
                for k in node.keywords:
                    if k.arg in ("fast_inference", "use_vllm") and ast.unparse(k.value) == "True":
                        found.append(f"{k.arg}=True")
                if short in VLLM_METHODS and isinstance(node.func, ast.Attribute):
                    found.append(f"{short}()")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" \
                    and any(a.name == "SamplingParams" for a in node.names):
                found.append("SamplingParams")
    return list(dict.fromkeys(found))


class VllmOff(cst.CSTTransformer):
    """Rewrites one statement's vLLM use to transformers; `notes` (review?, text) say what changed and
    `helpers` whether the script needs `kit_vllm` at its top."""

    def __init__(self, trees: list[ast.Module]):
        super().__init__()
        self.found = uses_vllm(trees)
        self.notes: list[tuple[bool, str]] = []
        self.helpers = False
        self.tokenizers = _tokenizers(trees)
        self.sampling = _sampling_settings(trees)

    def note(self, text: str, review: bool = False) -> None:
        if (review, f"vllm: {text}") not in self.notes:
            self.notes.append((review, f"vllm: {text}"))

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        if not self.found or updated.module is None or isinstance(updated.names, cst.ImportStar) \
                or code(updated.module).split(".")[0] != "vllm":
            return updated
        names = [(code(a.name), a.asname.name.value if a.asname else code(a.name)) for a in updated.names]
        if [n for n, _ in names] != ["SamplingParams"]:
            return updated  # vLLM's LLM & co: kit.notebooks.convert.facts.vllm_refusal decides
        self.helpers = True
        self.note(f"`{code(updated)}` → kit_vllm.SamplingParams: {WHY}")
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(names[0][1]))],
                          value=cst.parse_expression("kit_vllm.SamplingParams"))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self.found:
            return updated
        name, short = call_name(updated), short_name(updated)
        dropped = [k for k in LOADER_ARGS if kwarg(updated, k) is not None]
        if dropped and short == "from_pretrained":
            for key in dropped:
                updated = drop_kwarg(updated, key)
            self.note(f"{name}: dropped {', '.join(dropped)} (Unsloth's vLLM engine settings): {WHY}")
        if is_training_args(updated):
            return self._config(updated, short)
        if isinstance(updated.func, cst.Attribute) and short in VLLM_METHODS and name != "kit_vllm." + short:
            owner = updated.func.value
            if short == "save_lora":
                self.note(f"{code(owner)}.save_lora(…) → {code(owner)}.save_pretrained(…): PEFT's save of the same "
                          "adapter files (save_lora is Unsloth's vLLM-side name for it)")
                return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("save_pretrained")))
            self.helpers = True
            args = [cst.Arg(owner)]
            if short == "fast_generate":
                args.append(cst.Arg(cst.Name(self.tokenizers.get(code(owner), "tokenizer"))))
                self.note(f"{code(owner)}.fast_generate(…) → kit_vllm.fast_generate({code(owner)}, {args[1].value.value}, "
                          "…): transformers' generate, answering in vLLM's shape; without a lora_request the "
                          "adapter is off, as in vLLM")
            else:
                self.note(f"{code(owner)}.load_lora(…) → kit_vllm.load_lora(…): the adapter folder, loaded "
                          "through PEFT by kit_vllm.fast_generate")
            return cst.Call(func=cst.parse_expression(f"kit_vllm.{short}"), args=[*args, *updated.args])
        return updated

    def _config(self, call: cst.Call, short: str) -> cst.Call:
        vllm = [a for a in call.args if a.keyword is not None and (a.keyword.value == "use_vllm"
                                                                    or a.keyword.value.startswith("vllm_"))]
        if not vllm:
            return call
        moved = []
        params = kwarg(call, "vllm_sampling_params")
        if params is not None:
            settings = self.sampling.get(code(params.value), {})
            for key in SAMPLING_FIELDS:
                value = settings.get(key)
                if value is None or kwarg(call, key) is not None or (key == "top_k" and value.lstrip("-") != value):
                    continue
                call = set_kwarg(call, key, value)
                moved.append(f"{key}={value}")
        for a in vllm:
            if a.keyword.value == "use_vllm" and code(a.value) == "False":
                continue
            call = drop_kwarg(call, a.keyword.value)
        names = [a.keyword.value + (f"={code(a.value)}" if a.keyword.value == "use_vllm" else "")
                 for a in vllm if not (a.keyword.value == "use_vllm" and code(a.value) == "False")]
        if names:
            self.note(f"{short}: dropped {', '.join(names)}"
                      + (f"; {', '.join(moved)} moved from vllm_sampling_params" if moved else "")
                      + f": {WHY}")
        return call


def _tokenizers(trees: list[ast.Module]) -> dict[str, str]:
    """model name -> tokenizer name, from `model, tokenizer = FastLanguageModel.from_pretrained(...)`."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func).endswith("from_pretrained") and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == 2 \
                    and all(isinstance(e, ast.Name) for e in node.targets[0].elts):
                model, tokenizer = (e.id for e in node.targets[0].elts)
                out[model] = tokenizer
    return out


def _sampling_settings(trees: list[ast.Module]) -> dict[str, dict[str, str]]:
    """NAME -> {field: source} for `NAME = SamplingParams(field=literal, …)`."""
    out: dict[str, dict[str, str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func).rsplit(".", 1)[-1] == "SamplingParams":
                fields = {k.arg: ast.unparse(k.value) for k in node.value.keywords
                          if k.arg and isinstance(k.value, (ast.Constant, ast.UnaryOp))}
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = fields
    return out
