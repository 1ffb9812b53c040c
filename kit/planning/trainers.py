"""What each trainer asks of a plan: sequences per example, the reference model, the batching it allows.

    of(cfg).sequences     # sequences one example puts through the policy with gradients: sft 1, dpo 2, kto 1
    reference(cfg)        # ("adapter_disabled" | "precomputed" | "model_copy", its Reason)

The one place these are decided: the planner (memory, reasons) and the generated script
(`precompute_ref_log_probs`) both ask here. Adding a trainer is a row in TRAINERS.

The reference of DPO and KTO is the starting model. With LoRA it is the base itself with the
adapter disabled: TRL runs the reference forward under `use_adapter(model, None)`, so no second
model is loaded and nothing is precomputed (kit drops the copy of its fresh adapter that TRL adds
for a given PeftModel: a fresh adapter is the identity, so the base is the same reference). With
full fine-tuning the weights themselves move, so the reference is a second, frozen model copy on
every GPU ("auto"), or its log-probabilities computed once before training
(`precompute_ref_log_probs=on`). TRL hands the precomputed values from rank 0 to the others
through a datasets cache file, which kit's in-memory data keeps in a per-process temporary folder:
on several processes rank 1 finds no file, so "on" is refused there (`one_process_precompute`).

ORPO is not a trainer here: TRL 1.x keeps ORPOTrainer under `trl.experimental` (no stability
promise between releases, and the GPU machines' TRL is older than this one's), and kit's script
must run on both. It needs no reference (a row with sequences=2, reference=False) once TRL
promotes it, as it promoted KTO.

GRPO samples its own completions (num_generations per prompt) and scores them with the user's reward
functions (kit.train.rewards); its batch rule is kit.planning.grpo's. Its reference is needed only
where grpo.beta > 0: under LoRA the base with the adapter disabled (TRL's `use_adapter(model, None)`,
kit drops TRL's "ref" copy of the fresh adapter as for DPO), with full fine-tuning a frozen copy
TRL loads itself. Nothing is precomputed (the completions do not exist before the step). Each rank
generates with a whole replica: FSDP and the layer split are refused (kit has not run TRL's
generation under either).
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.planning.measured import MEASURED
from kit.planning.reasons import Reason, why


@dataclass(frozen=True)
class Trainer:
    name: str
    sequences: int            # sequences per example through the policy with gradients (DPO: chosen + rejected)
    no_grad_sequences: int    # sequences per example through a forward without gradients (KTO's KL pairs)
    reference: bool           # a reference model (the starting one) scores every example
    min_batch: int            # smallest micro-batch the trainer works with
    batchings: tuple          # batchings its TRL trainer supports
    shards: bool = True       # FSDP and model parallelism allowed (GRPO: a whole replica on each rank)


TRAINERS = {
    "sft": Trainer("sft", 1, 0, False, 1, ("padded", "grouped", "padding_free", "packed")),
    # TRL 1.x's DPOTrainer concatenates chosen and rejected into one batch of 2 × micro-batch rows;
    # its padding_free falls back to padding, so batches are padded.
    "dpo": Trainer("dpo", 2, 0, True, 1, ("padded",)),
    # KTOTrainer also scores each completion against another row's prompt (the KL term) without
    # gradients, which needs a micro-batch of 2 or more and sequential sampling.
    "kto": Trainer("kto", 1, 1, True, 2, ("padded",)),
    # GRPOTrainer pads prompts (left) and completions (right); a micro-batch of per_device completions.
    # Its reference is conditional (grpo.beta > 0): `reference` decides it.
    "grpo": Trainer("grpo", 1, 0, False, 1, ("padded",), shards=False),
}


def of(cfg) -> Trainer:
    return TRAINERS[getattr(cfg, "trainer", "sft")]


def settings(cfg):
    """The trainer's own settings section of the config (cfg.dpo, cfg.kto, cfg.grpo), None for sft."""
    return getattr(cfg, of(cfg).name, None) if of(cfg).name != "sft" else None


def reference(cfg) -> tuple[str | None, Reason | None]:
    """How the reference model is had: (kind, its Reason). kind None for a trainer without one."""
    t = of(cfg)
    if t.name == "grpo":
        return _grpo_reference(cfg)
    if not t.reference:
        return None, None
    asked = settings(cfg).precompute_ref_log_probs
    if asked == "on":
        return "precomputed", why("reference_precomputed", trainer=t.name)
    if cfg.method != "full":
        return "adapter_disabled", why("reference_adapter_disabled")
    return "model_copy", why("reference_model_copy")


def _grpo_reference(cfg) -> tuple[str | None, Reason]:
    beta = cfg.grpo.beta
    if beta <= 0:
        return None, why("reference_none_grpo")
    if cfg.method != "full":
        return "adapter_disabled", why("reference_grpo_adapter_disabled", beta=beta)
    return "model_copy", why("reference_grpo_model_copy", beta=beta)


def check(cfg) -> None:
    """Settings the trainer's TRL trainer cannot run, refused (UsageError, exit 2) before anything loads."""
    from kit.errors import UsageError

    t = of(cfg)
    _other_sections(cfg)
    if t.name == "sft":
        return
    if not t.shards and cfg.strategy in ("fsdp", "model_parallel"):
        raise UsageError(f"strategy={cfg.strategy} is not for trainer {t.name}: each rank generates its completions "
                         "with a whole replica of the model (kit has not run TRL's generation sharded); use "
                         "strategy=auto or ddp")
    if t.name == "grpo":
        _check_grpo(cfg)
    if cfg.batching not in ("auto", *t.batchings):
        raise UsageError(f"batching={cfg.batching} is for trainer sft: TRL's {t.name.upper()}Trainer pads its "
                         f"{'pairs' if t.sequences == 2 else 'rows'}; use batching=auto or padded")
    if cfg.compile == "on" and t.name not in COMPILES:
        raise UsageError(f"compile=on is for trainers {' and '.join(COMPILES)}: TRL's {t.name.upper()}Trainer "
                         "patches the model's forward with its fused log-probability head, which kit has not "
                         "measured compiled; use compile=auto")
    if cfg.per_device_batch is not None and cfg.per_device_batch < t.min_batch:
        raise UsageError(f"trainer={t.name} needs per_device_batch of at least {t.min_batch} (its KL term pairs each "
                         f"row with another of the same micro-batch), got {cfg.per_device_batch}")


def _other_sections(cfg) -> None:
    """A setting of another trainer's section (grpo.num_generations with trainer sft) does nothing: refused, naming
    it, so a forgotten `trainer: grpo` is not an SFT run. A section at its defaults (a dumped config) is fine."""
    import dataclasses

    from kit.errors import UsageError, shown

    for name in TRAINERS:
        section = getattr(cfg, name, None) if name != of(cfg).name else None
        if section is None:
            continue
        default = type(section)()
        changed = [f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)]
        if changed:
            value = shown(getattr(section, changed[0]), quote=True, limit=80)
            raise UsageError(f"{name}.{changed[0]}={value} is set, but trainer={of(cfg).name}: the {name} section is "
                             f"for trainer={name} only and would do nothing; set trainer={name}, or remove the "
                             f"{name} settings")


# Trainers kit runs under Unsloth: importing unsloth first patches TRL's trainer (its PatchFastRL
# rewrites DPOTrainer; PatchDPOTrainer itself is a no-op in Unsloth 2026.10), and the script loads the model
# through FastLanguageModel as for sft. KTO under Unsloth is not measured: the plain stack. GRPO under
# Unsloth without vLLM was measured slower than kit's own generation pass (MEASURED["grpo_unsloth_vs_kit"]):
# the plain stack, saying so.
UNSLOTH_TRAINERS = ("sft", "dpo")
# Trainers whose compiled decoder layers were measured (compile=on accepted). DPO's fused log-probability
# head sits after the decoder layers, which are what kit compiles (bench/results/dpo_speed_h100.json).
COMPILES = ("sft", "dpo")


def backend(cfg, chosen: str) -> tuple[str, Reason | None]:
    """The backend for this trainer: Unsloth where kit wired and measured its trainer (UNSLOTH_TRAINERS),
    else the plain stack, with the Reason."""
    if chosen != "unsloth" or of(cfg).name in UNSLOTH_TRAINERS:
        return chosen, None
    if of(cfg).name == "grpo":
        return "transformers", why("backend_grpo_plain", **MEASURED["grpo_unsloth_vs_kit"])
    return "transformers", why("backend_trainer_plain", trainer=of(cfg).name,
                               unsloth_trainers=" and ".join(UNSLOTH_TRAINERS))


def plan_rules(cfg, batching: str) -> tuple[str, tuple[Reason, ...]]:
    """The planner's choices a trainer overrides: (the batching it allows, the Reasons for it and the reference)."""
    t = of(cfg)
    if t.name == "sft":
        return batching, ()
    if t.name == "grpo":
        return _grpo_rules(cfg, batching)
    said = []
    if batching not in t.batchings:
        said.append(why("batching_trainer", trainer=t.name))
        batching = "padded"
    return batching, (*said, reference(cfg)[1])


def compiled(cfg, chosen: bool) -> tuple[bool, Reason | None]:
    """Compiled decoder layers for this trainer: "auto"'s choice stands for sft (Reason None: the
    planner's stands); a preference trainer compiles only when asked (compile=on, for the trainers in
    COMPILES), its Reason replacing the planner's."""
    t = of(cfg)
    if not chosen or t.name == "sft" or (t.name in COMPILES and cfg.compile == "on"):
        return chosen, None
    return False, why("compile_off_trainer", trainer=t.name, measured=t.name in COMPILES,
                      ratio=MEASURED["dpo_compile_vs_trl_liger"])


def one_process_precompute(cfg, world_size: int) -> None:
    """Refuse precomputed reference log-probabilities on several processes (see the module docstring)."""
    from kit.errors import UsageError

    if world_size > 1 and reference(cfg)[0] == "precomputed":
        raise UsageError(f"{cfg.trainer}.precompute_ref_log_probs=on runs in one process only: TRL shares the "
                         f"values through a dataset cache file the other {world_size - 1} process(es) cannot read; "
                         f"set {cfg.trainer}.precompute_ref_log_probs=auto, or start one process")


def _check_grpo(cfg) -> None:
    """GRPO's settings before any plan: the batch the user fixed (kit.planning.grpo), the rewards named."""
    from kit.errors import UsageError
    from kit.planning import grpo

    if not cfg.grpo.rewards:
        raise UsageError("trainer=grpo needs reward functions: set grpo.rewards: FILE.py:NAME[,NAME...] (a Python "
                         "file beside the config, each function taking completions and **kwargs)")
    from kit.train.rewards import parse_spec

    parse_spec(cfg.grpo.rewards)  # the spec's shape; the file and its functions are checked at launch
    if cfg.activation_offloading == "on":
        raise UsageError("activation_offloading=on is not for trainer grpo: TRL's GRPOConfig has no activation "
                         "offloading; use activation_offloading=auto or off")
    if cfg.eval_steps:
        raise UsageError(f"eval_steps={cfg.eval_steps} is not for trainer grpo: TRL would generate num_generations "
                         "completions for every held-out prompt at each evaluation, in batches it refuses unless they "
                         "hold whole groups; kit measures each reward's mean on the held-out prompts before and after "
                         "training (eval.baseline, eval.final): set eval_steps=null")
    if cfg.grpo.num_generations < 2:
        raise UsageError(grpo.batch_problem(per_device_batch=1, world_size=1, accumulation=1,
                                            num_generations=cfg.grpo.num_generations))


def _grpo_rules(cfg, batching: str) -> tuple[str, tuple[Reason, ...]]:
    """`plan_rules` for grpo: padded batches, the reference, the batch rule and the generation pass (compiled layers:
    `compiled`)."""
    said = []
    if batching != "padded":
        said.append(why("batching_trainer_grpo"))
        batching = "padded"
    said += [reference(cfg)[1],
             why("grpo_batch", num_generations=cfg.grpo.num_generations, global_batch=cfg.global_batch),
             why("grpo_generation", step_time_vs_trl=MEASURED["grpo_step_h100"]["vs_trl"],
                 generation_s=MEASURED["grpo_step_h100"]["generation_s"], step_s=MEASURED["grpo_step_h100"]["step_s"])]
    return batching, tuple(said)
