"""Planning for speed: how rows share a micro-batch, which kernels, which AdamW — each with why.

Pure functions of (config, GPU facts); `kit.planning.plan.make_plan` calls them and carries the answers as
data (`Plan.batching`, `Plan.kernels`, `Plan.optimizer`). An "auto" choice turns a speed-up on only
where the H200 benchmark showed it to pay (bench/results/speed_h200.json, `python bench/speed.py`):
padding-free batches on NVIDIA GPUs (a T4 by the same SDPA path, unmeasured there); Liger's kernels
(1.29×, loss curve within 0.11 % of the plain one) on bf16-native NVIDIA GPUs where installed;
fused AdamW measured 1.017× (LoRA's optimizer step is a sliver of the step), under the 2 % that
would be worth a choice, so it is not chosen; TRL's activation offloading (2 GiB less with
checkpointing within the speed spread of three runs, `activation_offloading`); torch.compile of the decoder
layers (`compile`) 1.41× over the plain stack, with Liger and offloading 0.89× Unsloth direct at 0.95× its memory, the
loss curve within 0.04 % of eager's, on bf16-native NVIDIA GPUs for jobs long enough to repay compiling;
padding-free batches under Unsloth's trainer too (1.30× padded, bench/results/speed_h200_fill_chat_compile_trial.json).
Where nothing was measured (ROCm, the CPU) the choice is TRL's default and the reason says so.

Batching, for data whose rows are of unequal length (chat, instructions):
- `padded`: each micro-batch padded to its longest row (TRL's default); time goes to pad tokens.
- `grouped`: rows of similar length batched together (transformers' LengthGroupedSampler); any GPU.
- `padding_free`: the micro-batch's rows laid end to end, no pad tokens; position_ids restart at
  each row and transformers builds a block-diagonal mask from them for SDPA (on a T4 too: SDPA's
  memory-efficient kernel takes a mask; FlashAttention 2/3, which would need no mask, is not in
  the H200's image nor on a T4), so rows never attend to each other. Same rows per step as padded,
  so the same loss curve; tested on the CPU against padded batches (tests/test_batching.py). The
  mask makes the whole micro-batch one attention problem, so long rows lose: `settle_batching`.
- `packed`: rows packed into seq_len-long sequences (best-fit decreasing, whole rows): the most
  tokens per step. On the plain backend each sequence is a row of the batch under its own
  block-diagonal mask (kit.train.collate: a seq_len² problem per row, not one of the whole
  micro-batch); Unsloth's trainer lays them end to end like padding-free batches. Configured, a step then holds many more rows than
  global_batch says, so an epoch has fewer optimizer steps. "auto" packs only where it can fold
  gradient accumulation to keep the rows per optimizer step (`settle_batching`).
"""

from __future__ import annotations

from kit.machine import verdicts
from kit.planning.measured import MEASURED

SHORT_ROWS = 1 / 3  # padding-free batches for rows averaging at most this share of seq_len (settle_batching)


# Packing's trained tokens/s over padding-free batches', per backend: where at least PACKING_PAYS,
# "auto" packs short rows to fold accumulation (settle_batching). None: not measured.
PACKED_OVER_PADDING_FREE = {
    "transformers": MEASURED["packed_vs_padded"] / MEASURED["padding_free_vs_padded"],
    "unsloth": None,
}
PACKING_PAYS = 1.10


def batching(cfg, gpu: dict | None, reasons: list) -> str:
    """How rows share a micro-batch (see the module docstring); `gpu` None means the CPU."""
    if cfg.batching != "auto":
        if cfg.batching == "packed":
            reasons.append("batching packed as configured: rows packed into seq_len-long sequences; each step "
                           "trains on per_device_batch such sequences, many rows each, so an epoch has fewer "
                           "optimizer steps than global_batch rows per step would give.")
        else:
            reasons.append(f"batching {cfg.batching} as configured.")
        return cfg.batching
    if gpu is None:
        reasons.append("batching padded: on the CPU nothing was measured; padded is TRL's default.")
        return "padded"
    if gpu["vendor"] != "nvidia":
        reasons.append("batching padded: padding-free batches were measured on NVIDIA only (set batching=padding_free "
                       "to try them; the rows are kept apart by SDPA's mask there too).")
        return "padded"
    where = ("" if verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
             f"; measured on an H200, not on {verdicts.arch_name(gpu['vendor'], gpu['capability'])}, which has no "
             "FlashAttention 2 but runs the masked rows through SDPA's memory-efficient kernel")
    reasons.append(f"batching padding_free: each micro-batch's rows laid end to end without pad tokens, kept apart by a "
                   f"block-diagonal attention mask: {MEASURED['padding_free_vs_padded']:.2f}× the trained tokens/s of "
                   f"padded batches on chat-length data and less memory, the same rows per step{where}; the script "
                   f"goes back to padded batches if the rows average more than a third of seq_len, and packs short rows "
                   f"where gradient accumulation can fold (the same rows per optimizer step in fewer, fuller "
                   f"micro-batches: packed measured {MEASURED['packed_vs_padded']:.2f}×).")
    return "padding_free"


def settle_batching(cfg, planned: str, mean_tokens: float, seq_len: int, notes: list, *,
                    grad_accum: int = 1, backend: str = "transformers") -> str:
    """At launch, with the data in hand: padding-free batches only for short rows.

    All of a padding-free micro-batch is one sequence under one mask, so SDPA's attention work grows
    with the square of its tokens, where padded rows cost each row's own square. On the H200 a packed
    step of 8,192 tokens laid end to end took 1.92 s against 1.15 s for 4 padded rows that fill seq_len (so rows that
    long would lose about that much; inferred, not run padding-free), while on chat rows averaging
    0.28 of seq_len padding-free paid 1.15×. SHORT_ROWS, a third, lies between those two points: rows
    averaging more than that go back to padded batches, when "auto" chose.

    Short rows with gradient accumulation (≥ 2 micro-batches a step) are packed instead, and the
    accumulation folded (`folded_batch`), where packing measured to pay over padding-free
    batches (PACKED_OVER_PADDING_FREE): a step's cost hardly grows with its tokens (a QLoRA step
    dequantizes every 4-bit weight whatever the batch holds), so fewer, fuller micro-batches train
    the same rows per optimizer step in less time. Without accumulation there is nothing to fold:
    packing would put more rows into each step, so it stays opt-in.
    """
    if cfg.batching != "auto" or planned != "padding_free":
        return planned
    if mean_tokens <= SHORT_ROWS * seq_len:
        pays = PACKED_OVER_PADDING_FREE.get(backend)
        return "packed" if grad_accum >= 2 and pays is not None and pays >= PACKING_PAYS else planned
    notes.append(f"batching padded: rows average {mean_tokens:.0f} tokens of seq_len {seq_len}, more than "
                 f"{SHORT_ROWS:.2f} of it; padding-free batches pay only on short rows")
    return "padded"


FOLD_TOLERANCE = 0.25  # packed rows per optimizer step within this share of the unpacked global batch
MIN_ROWS_PER_SEQUENCE = 1.5  # fewer: packing saves too few micro-batches to be worth a changed batch


def folded_batch(per_device: int, grad_accum: int, world: int, rows_per_sequence: float) -> tuple[int, int] | None:
    """(packed sequences per micro-batch, accumulation steps) that train about as many rows per
    optimizer step as `per_device` × `grad_accum` × `world` unpacked rows, in fewer micro-batches;
    None where no such pair keeps the rows within FOLD_TOLERANCE, or the rows hardly pack.

    Fewest micro-batches first, then the closest row count. A packed sequence is at most seq_len
    tokens, as long as the longest row the memory plan sized a micro-batch for, so at most
    `per_device` of them fit where `per_device` rows did.
    """
    if rows_per_sequence < MIN_ROWS_PER_SEQUENCE:
        return None
    target = per_device * grad_accum * world
    fits = [(accum, abs(pd * accum * world * rows_per_sequence - target) / target, -pd)
            for accum in range(1, grad_accum) for pd in range(1, per_device + 1)]
    fits = [f for f in fits if f[1] <= FOLD_TOLERANCE]
    if not fits:
        return None
    accum, _, pd = min(fits)
    return -pd, accum


def fold_words(mean_tokens: float, seq_len: int, rows_per_sequence: float, before: tuple[int, int],
               after: tuple[int, int], rows_before: int, rows_now: float) -> str:
    return (f"batching packed: rows average {mean_tokens:.0f} tokens of seq_len {seq_len}, {rows_per_sequence:.1f} "
            f"to a packed sequence; micro-batch {before[0]} × accumulation {before[1]} → {after[0]} sequences × "
            f"{after[1]}, so an optimizer step still trains on ~{rows_now:.0f} rows ({rows_before} unpacked) in "
            f"fewer, fuller micro-batches, the rows kept apart by position_ids: packed batches measured "
            f"{MEASURED['packed_vs_padded']:.2f}× the trained tokens/s of padded ones, padding-free "
            f"{MEASURED['padding_free_vs_padded']:.2f}× (H200, Qwen3-8B QLoRA)")


def unsloth_batching(cfg, planned: str, reasons: list) -> str:
    """Unsloth patches TRL's trainer itself; padding-free batches measured to pay under it too (MEASURED)."""
    if cfg.batching != "auto" or planned == "padded":
        return planned
    reasons[:] = [r for r in reasons if not r.startswith("batching ")]
    reasons.append(f"batching padding_free: with backend unsloth padding-free batches measured "
                   f"{MEASURED['unsloth_padding_free_vs_padded']:.2f}× the trained tokens/s of padded ones on "
                   "chat-length rows (H200, Qwen3-8B QLoRA) and less memory, the loss of every step within 0.1 %; "
                   "the script goes back to padded batches if the rows average more than a third of seq_len.")
    return planned


def kernels(cfg, facts, gpu: dict | None, backend: str, model_type: str, reasons: list) -> str:
    """"liger" (Liger's Triton RMSNorm, SwiGLU and RoPE) or "none"."""
    from kit.planning.shapes import LIGER_MODEL_TYPES

    installed = bool((facts.packages or {}).get("liger_kernel"))
    if cfg.kernels == "none":
        return "none"
    if cfg.kernels == "liger":
        if gpu is None or gpu["vendor"] != "nvidia":
            reasons.append("kernels liger as configured, but Liger's kernels are Triton on an NVIDIA GPU: the "
                           "script turns them off here.")
        elif backend == "unsloth":
            reasons.append("kernels liger as configured, but Unsloth brings its own kernels: off.")
        else:
            reasons.append("kernels liger as configured."
                           + ("" if installed else " liger-kernel is not installed there: `pip install liger-kernel`."))
        return "liger"
    ratio = MEASURED["liger_vs_plain"]
    why = ("trainer grpo: TRL then swaps in Liger's fused GRPO loss, which kit has not measured; kernels=liger turns "
           "it on" if cfg.trainer == "grpo" else
           "not on a GPU" if gpu is None else
           "not an NVIDIA GPU" if gpu["vendor"] != "nvidia" else
           "Unsloth brings its own kernels" if backend == "unsloth" else
           f"{model_type} is not a family Liger patches" if model_type not in LIGER_MODEL_TYPES else
           "not measured to pay" if ratio is None or ratio < 1.03 else
           f"not measured on {verdicts.arch_name(gpu['vendor'], gpu['capability'])}: Triton compiles for a T4, "
           "but Liger was only measured on an H200" if not verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
           f"measured {ratio:.2f}× the tokens/s of the plain stack on an H200, but its loss curve is not yet "
           "checked against the plain one; kernels=liger turns it on" if not MEASURED["liger_loss_checked"] else
           "liger-kernel is not installed (`pip install liger-kernel`)" if not installed else None)
    if why is None:
        reasons.append(f"kernels liger: Liger's RMSNorm, SwiGLU and RoPE measured {ratio:.2f}× the tokens/s of "
                       "the plain stack (H200, Qwen3-8B QLoRA), with a loss curve within "
                       f"{100 * MEASURED['liger_loss_max_rel_diff']:.2f} % of the plain one over 40 steps.")
        return "liger"
    if gpu is not None and backend != "unsloth":
        reasons.append(f"kernels none: Liger off ({why}).")
    return "none"


def activation_offloading(cfg, gpu: dict | None, backend: str, strategy: str, checkpointing: bool,
                          reasons: list) -> bool:
    """Whether the layer inputs gradient checkpointing keeps go to pinned CPU memory during the step.

    TRL's `activation_offloading` (torchtune's OffloadActivations) copies each tensor autograd saves
    to pinned host memory on a side stream and back for the backward pass, overlapped with compute;
    under checkpointing those are the decoder layers' inputs, (layers + 1) × tokens × hidden × 2 bytes
    (2.4 GiB for Qwen3-8B at 4 × 2,048 tokens). Measured on the H200 with Liger (MEASURED): 2.0 GiB
    smaller, the speed within the spread of three runs (+4 %, −4 %, −5 %). "auto" turns it on where it was measured: the plain
    backend, checkpointing on, one replica per GPU, a bf16-native NVIDIA GPU, and not under DPO or KTO: under DPO the
    same measurement on an H100 (bench/results/dpo_speed_h100.json) cost 12 % of the tokens/s for 1 GiB.
    """
    if cfg.activation_offloading != "auto":
        on = cfg.activation_offloading == "on"
        why = ("" if not on else " The CPU has nothing to offload to: the script leaves it off there." if gpu is None
               else " Unsloth offloads checkpointed activations its own way: the script leaves it off."
               if backend == "unsloth" else "")
        reasons.append(f"activation_offloading {cfg.activation_offloading} as configured.{why}")
        return on
    ratio = MEASURED["offload_vs_liger"]
    why = ("trainer grpo: TRL's GRPOConfig has no activation offloading" if cfg.trainer == "grpo" else
           "not on a GPU" if gpu is None else
           "not an NVIDIA GPU" if gpu["vendor"] != "nvidia" else
           "Unsloth offloads checkpointed activations its own way" if backend == "unsloth" else
           "gradient checkpointing is off, so every activation would cross PCIe twice a step (unmeasured)"
           if not checkpointing else
           f"strategy {strategy}: measured with one replica per GPU only" if strategy not in ("single", "ddp") else
           f"measured on an H200 only, not on {verdicts.arch_name(gpu['vendor'], gpu['capability'])}"
           if not verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
           "not measured to pay" if ratio < OFFLOAD_PAYS else
           f"trainer {cfg.trainer}: measured {MEASURED['dpo_offload_vs_liger']:.2f}× the tokens/s without it under "
           "TRL's DPOTrainer (H100, Qwen3-8B QLoRA, 2 pairs × 1,024 tokens, with Liger), 1.0 GiB saved"
           + (f"; KTO's script with it ran {MEASURED['kto_offload_tokens_per_s']:,} tokens/s, its cost not measured "
              "apart, and its step is the same kind (a policy pass with gradients, forwards without)"
              if cfg.trainer == "kto" else "")
           if cfg.trainer in ("dpo", "kto") and MEASURED["dpo_offload_vs_liger"] < OFFLOAD_PAYS else None)
    if why is None:
        reasons.append(f"activation_offloading on: the checkpointed layer inputs wait in pinned CPU memory during the "
                       f"step (TRL's activation_offloading): {MEASURED['offload_saved_gib']:.1f} GiB less at "
                       f"{ratio:.2f}× the tokens/s (H200, Qwen3-8B QLoRA, with Liger, the mean of three runs), "
                       f"the same losses.")
        return True
    if gpu is not None:
        reasons.append(f"activation_offloading off ({why})" +
                       ("." if cfg.trainer == "grpo" else "; activation_offloading=on turns it on."))
    return False


OFFLOAD_PAYS = 0.97  # it is for memory: "auto" takes it where it costs no speed beyond the runs' spread


def compile_blocked(backend: str, strategy: str) -> str | None:
    """Why compiled layers stay off on a GPU with this backend and strategy; None where they can run.
    The planner (`compile_layers`) and the launch (kit.planning.adapt) both ask."""
    if backend == "unsloth":
        return "Unsloth compiles its own decoder blocks"
    if strategy not in ("single", "ddp"):
        return f"strategy {strategy}: measured with one replica per GPU only"
    return None


COMPILE_REPAID = 300  # micro-batches: compiling's 20-45 s measured repaid after ~40 (full rows), ~180 (chat rows)


def compile_layers(cfg, gpu: dict | None, backend: str, strategy: str, reasons: list) -> bool:
    """Whether the script runs each decoder layer through torch.compile (`compile`).

    Inductor fuses each layer's elementwise work (norms, rotary embedding, residual adds, the LoRA
    sums) into fewer kernels, rounding each intermediate to bf16 as eager does
    (kit.train.modeling.compile_layers), so the loss curve stays eager's. Measured on the H200
    (MEASURED), Qwen3-8B QLoRA: with Liger and activation offloading 0.89× Unsloth direct's tokens/s
    at 0.95× its memory on full-length rows (without compile 0.82×), and 1.17× eager from the third
    step on chat-length rows, whose changing lengths cost a second compile. Compiling takes 20-45 s
    in the first steps, so "auto" compiles on bf16-native NVIDIA GPUs with the plain backend and one
    replica per GPU, and the script runs eagerly a job of fewer than COMPILE_REPAID micro-batches
    (kit.planning.adapt.settle_compile). With Liger, inductor takes the RMSNorm over from Liger's kernel.
    """
    if cfg.compile == "off":
        return False
    why = "on the CPU the script runs eagerly" if gpu is None else compile_blocked(backend, strategy)
    if cfg.compile == "on":
        reasons.append("compile on as configured: each decoder layer runs through torch.compile (compiled once "
                       "per shape at the start)." + (f" Off here: {why}." if why else ""))
        return why is None
    if why is None and not (gpu["vendor"] == "nvidia" and verdicts.bf16_native(gpu["vendor"], gpu["capability"])):
        why = f"measured on an H200 only, not on {verdicts.arch_name(gpu['vendor'], gpu['capability'])}"
    if why is None:
        reasons.append(f"compile on: each decoder layer runs through torch.compile, rounding as eager does: with Liger "
                       f"and activation offloading {MEASURED['compile_offload_vs_unsloth']:.2f}× Unsloth direct's "
                       f"tokens/s at {MEASURED['compile_offload_memory_vs_unsloth']:.2f}× its memory on full-length "
                       f"rows, {MEASURED['compile_chat_vs_eager']:.2f}× eager after the first steps on chat-length "
                       f"rows, the loss curve within {100 * MEASURED['compile_loss_max_rel_diff']:.2f} % of eager's "
                       f"(H200, Qwen3-8B QLoRA); compiling takes 20-45 s at the start, so a job of fewer than "
                       f"{COMPILE_REPAID} micro-batches runs eagerly; compile=off turns it off.")
        return True
    if gpu is not None:
        reasons.append(f"compile off ({why}); compile=on turns it on.")
    return False


def compile_unpaid(cfg, micro_batches: int) -> str | None:
    """Why "auto"'s compiled layers are not worth it for a job of `micro_batches` more micro-batches
    (compiling's time would not come back); None where they are, or where compile was configured."""
    if cfg.compile != "auto" or micro_batches >= COMPILE_REPAID:
        return None
    return (f"{micro_batches} micro-batch(es) to train, fewer than the {COMPILE_REPAID} that repay compiling "
            "(20-45 s at the start)")


FUSED_ADAMW_PAYS = 1.02  # a smaller gain is within the run-to-run spread of these step times


def fused_adamw(cfg, gpu: dict | None) -> bool:
    """Whether "auto" should pick torch's fused AdamW (one kernel for all parameters) over the loop."""
    ratio = MEASURED["fused_adamw_vs_adamw"]
    return (cfg.optimizer == "auto" and gpu is not None and gpu["vendor"] == "nvidia"
            and ratio is not None and ratio >= FUSED_ADAMW_PAYS)
