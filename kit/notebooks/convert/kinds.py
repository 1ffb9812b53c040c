"""What kind of call a notebook makes, for the rewrites: model loaders, training arguments, and
whether every step uses every trainable parameter (what DDP's find_unused_parameters depends on)."""

from __future__ import annotations

import libcst as cst

from kit.notebooks.convert.syntax import call_name, code, kwarg

UNSLOTH_LOADERS = {"FastLanguageModel", "FastModel", "FastVisionModel"}
TRL_CONFIGS = {"SFTConfig", "DPOConfig", "GRPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig",
               "RewardConfig", "PPOConfig", "RLOOConfig", "GKDConfig", "OnlineDPOConfig"}
TRL_TRAINERS = {c.replace("Config", "Trainer") for c in TRL_CONFIGS}
RICH = {"HTML", "Markdown", "Latex", "JSON", "Pretty", "Code"}  # IPython.display's rich-output wrappers
MEDIA = {"Audio", "Image", "Video", "IFrame", "YouTubeVideo", "SVG"}  # IPython.display's players and viewers
TRAINER_KEYWORDS = {"output_dir", "per_device_train_batch_size", "num_train_epochs", "max_steps",
                    "learning_rate", "gradient_accumulation_steps"}


def uses_every_parameter(func_names: set[str], peft: bool) -> bool:
    """True when each step uses every trainable parameter, so DDP need not search for unused ones:
    adapters, or a causal LM (loaded as one, by Unsloth, or by a TRL trainer). An encoder with
    LayerDrop (wav2vec2) or an unused head is not: there find_unused_parameters=False fails."""
    shorts = {part for f in func_names for part in f.split(".")}  # `AutoModelForCausalLM.from_pretrained`
    return peft or any(s in UNSLOTH_LOADERS or s.endswith(("ForCausalLM", "LMHeadModel")) or s in TRL_TRAINERS
                       for s in shorts)


def find_unused_why(peft: bool, dense: bool = True) -> str:
    if not dense:
        return ("gradient checkpointing is on, and with it DDP's search for unused parameters fails "
                "('Expected to mark a variable ready only once')")
    if peft:
        return ("Trainer turns it on for a PEFT model, and with gradient checkpointing DDP then fails with "
                "'Expected to mark a variable ready only once'")
    return ("left unset, Trainer asks DDP to search the graph for unused parameters after every step "
            "(slower, and an error with gradient checkpointing); a causal LM uses all of them")


def is_model_loader(owner: str) -> bool:
    short = owner.rsplit(".", 1)[-1]
    return (short in UNSLOTH_LOADERS or short.startswith(("AutoModel", "AutoPeftModel"))
            or short.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "ForSeq2SeqLM")))


def is_training_args(call: cst.Call) -> bool:
    """True for TrainingArguments, TRL's SFTConfig & co, and look-alikes that take trainer keywords."""
    short = call_name(call).rsplit(".", 1)[-1]
    if short.endswith("TrainingArguments") or short in TRL_CONFIGS:
        return True
    return short.endswith("Config") and any(kwarg(call, k) for k in TRAINER_KEYWORDS)


def shown_text(arg: cst.Arg) -> cst.Arg:
    """An argument of display() as print() should get it: display(HTML(x)) prints x, not `<…HTML object>`."""
    v = arg.value
    if isinstance(v, cst.Call) and code(v.func).split(".")[-1] in RICH and len(v.args) == 1 and not v.args[0].keyword:
        return arg.with_changes(value=v.args[0].value)
    return arg


def shows_media(value) -> bool:
    """`Audio(url)` or `display(Image(...))` (print(…) by now) as a statement: a player or viewer that
    only a notebook's front end shows; a script prints `<IPython.lib.display.Audio object>`."""
    if not isinstance(value, cst.Call):
        return False
    if code(value.func).split(".")[-1] in MEDIA:
        return True
    return code(value.func) in ("display", "print") and bool(value.args) and all(shows_media(a.value)
                                                                                  for a in value.args)
