"""What each trainer asks of a plan: sequences per example, the reference model, the batching it allows.

    of(cfg).sequences     # sequences one example puts through the policy with gradients: sft 1, dpo 2, kto 1
    reference(cfg)        # ("adapter_disabled" | "precomputed" | "model_copy", why)

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
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.planning.measured import MEASURED


@dataclass(frozen=True)
class Trainer:
    name: str
    sequences: int            # sequences per example through the policy with gradients (DPO: chosen + rejected)
    no_grad_sequences: int    # sequences per example through a forward without gradients (KTO's KL pairs)
    reference: bool           # a reference model (the starting one) scores every example
    min_batch: int            # smallest micro-batch the trainer works with
    batchings: tuple          # batchings its TRL trainer supports


TRAINERS = {
    "sft": Trainer("sft", 1, 0, False, 1, ("padded", "grouped", "padding_free", "packed")),
    # TRL 1.x's DPOTrainer concatenates chosen and rejected into one batch of 2 × micro-batch rows;
    # its padding_free falls back to padding, so batches are padded.
    "dpo": Trainer("dpo", 2, 0, True, 1, ("padded",)),
    # KTOTrainer also scores each completion against another row's prompt (the KL term) without
    # gradients, which needs a micro-batch of 2 or more and sequential sampling.
    "kto": Trainer("kto", 1, 1, True, 2, ("padded",)),
}


def of(cfg) -> Trainer:
    return TRAINERS[getattr(cfg, "trainer", "sft")]


def settings(cfg):
    """The trainer's own settings section of the config (cfg.dpo, cfg.kto), None for sft."""
    return getattr(cfg, of(cfg).name, None) if of(cfg).reference else None


def reference(cfg) -> tuple[str | None, str]:
    """How the reference model is had: (kind, why). kind None for a trainer without one."""
    t = of(cfg)
    if not t.reference:
        return None, ""
    asked = settings(cfg).precompute_ref_log_probs
    if asked == "on":
        return "precomputed", (f"reference: its log-probabilities computed once before training "
                               f"({t.name}.precompute_ref_log_probs=on; one process only)")
    if cfg.method != "full":
        return "adapter_disabled", ("reference: the base with the LoRA adapter disabled, in the same model (no "
                                    "second copy, nothing precomputed: one extra forward without gradients per step)")
    return "model_copy", ("reference: full fine-tuning moves the weights, so a second, frozen copy of the starting "
                          "model scores the answers (precompute_ref_log_probs=on saves its memory, one process only)")



def check(cfg) -> None:
    """Settings the trainer's TRL trainer cannot run, refused (UsageError, exit 2) before anything loads."""
    from kit.errors import UsageError

    t = of(cfg)
    if t.name == "sft":
        return
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


# Trainers kit runs under Unsloth: importing unsloth first patches TRL's trainer (its PatchFastRL
# rewrites DPOTrainer; PatchDPOTrainer itself is a no-op in Unsloth 2026.10), and the script loads the model
# through FastLanguageModel as for sft. KTO under Unsloth is not measured: the plain stack.
UNSLOTH_TRAINERS = ("sft", "dpo")
# Trainers whose compiled decoder layers were measured (compile=on accepted). DPO's fused log-probability
# head sits after the decoder layers, which are what kit compiles (bench/results/dpo_speed_h100.json).
COMPILES = ("sft", "dpo")


def backend(cfg, chosen: str, reasons: list) -> str:
    """The backend for this trainer: Unsloth where kit wired and measured its trainer (UNSLOTH_TRAINERS),
    else the plain stack, said in the reasons."""
    if chosen != "unsloth" or of(cfg).name in UNSLOTH_TRAINERS:
        return chosen
    reasons.append(f"backend transformers for trainer {of(cfg).name}: kit runs Unsloth for "
                   f"{' and '.join(UNSLOTH_TRAINERS)} only (its {of(cfg).name.upper()} patch is not measured).")
    return "transformers"


def plan_rules(cfg, plan, reasons: list) -> None:
    """The planner's choices a trainer overrides, each with its reason: padded batches, the reference."""
    t = of(cfg)
    if t.name == "sft":
        return
    if plan.batching not in t.batchings:
        reasons.append(f"batching padded for trainer {t.name}: TRL's {t.name.upper()}Trainer pads its batches "
                       "(its padding_free falls back to padding).")
        plan.batching = "padded"
    kind, why = reference(cfg)
    reasons.append(why + ".")


def compiled(cfg, chosen: bool, reasons: list) -> bool:
    """Compiled decoder layers for this trainer: "auto"'s choice stands for sft; a preference trainer
    compiles only when asked (compile=on, for the trainers in COMPILES), its reason replacing the
    planner's (`reasons`: the compile reasons alone)."""
    t = of(cfg)
    if not chosen or t.name == "sft" or (t.name in COMPILES and cfg.compile == "on"):
        return chosen
    reasons[:] = [f"compile off for trainer {t.name}: " + (
        f"compiled layers measured {MEASURED['dpo_compile_vs_trl_liger']:.2f}× the tokens/s of TRL's DPOTrainer "
        "with Liger driven directly (H100, Qwen3-8B QLoRA), within the spread between runs; compile=on turns "
        "them on." if t.name in COMPILES else
        "its fused log-probability head patches the forward; compiled layers were measured for sft and dpo only.")]
    return False


def one_process_precompute(cfg, world_size: int) -> None:
    """Refuse precomputed reference log-probabilities on several processes (see the module docstring)."""
    from kit.errors import UsageError

    if world_size > 1 and reference(cfg)[0] == "precomputed":
        raise UsageError(f"{cfg.trainer}.precompute_ref_log_probs=on runs in one process only: TRL shares the "
                         f"values through a dataset cache file the other {world_size - 1} process(es) cannot read; "
                         f"set {cfg.trainer}.precompute_ref_log_probs=auto, or start one process")
