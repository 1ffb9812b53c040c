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
from kit.planning.reasons import Reason, why

SHORT_ROWS = 1 / 3  # padding-free batches for rows averaging at most this share of seq_len (settle_batching)


# Packing's trained tokens/s over padding-free batches', per backend: where at least PACKING_PAYS,
# "auto" packs short rows to fold accumulation (settle_batching). None: not measured.
PACKED_OVER_PADDING_FREE = {
    "transformers": MEASURED["packed_vs_padded"] / MEASURED["padding_free_vs_padded"],
    "unsloth": None,
}
PACKING_PAYS = 1.10


def batching(cfg, gpu: dict | None) -> tuple[str, Reason]:
    """How rows share a micro-batch (see the module docstring), and why; `gpu` None means the CPU."""
    if cfg.batching != "auto":
        if cfg.batching == "packed":
            return "packed", why("batching_packed_configured")
        return cfg.batching, why("batching_configured", batching=cfg.batching)
    if gpu is None:
        return "padded", why("batching_cpu")
    if gpu["vendor"] != "nvidia":
        return "padded", why("batching_not_nvidia")
    arch = (None if verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
            verdicts.arch_name(gpu["vendor"], gpu["capability"]))
    return "padding_free", why("batching_padding_free", padding_free_vs_padded=MEASURED["padding_free_vs_padded"],
                               packed_vs_padded=MEASURED["packed_vs_padded"], unmeasured_arch=arch)


def settle_batching(cfg, planned: str, mean_tokens: float, seq_len: int, *,
                    grad_accum: int = 1, backend: str = "transformers") -> tuple[str, Reason | None]:
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
        return planned, None
    if mean_tokens <= SHORT_ROWS * seq_len:
        pays = PACKED_OVER_PADDING_FREE.get(backend)
        return ("packed" if grad_accum >= 2 and pays is not None and pays >= PACKING_PAYS else planned), None
    return "padded", why("batching_long_rows", mean_tokens=mean_tokens, seq_len=seq_len, short_rows=SHORT_ROWS)


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


def fold_reason(mean_tokens: float, seq_len: int, rows_per_sequence: float, before: tuple[int, int],
                after: tuple[int, int], rows_before: int, rows_now: float) -> Reason:
    """Why `for_data` packed the rows and folded the accumulation, with the numbers."""
    return why("batching_folded", mean_tokens=mean_tokens, seq_len=seq_len, rows_per_sequence=rows_per_sequence,
               per_device_before=before[0], accum_before=before[1], per_device_after=after[0],
               accum_after=after[1], rows_before=rows_before, rows_now=rows_now,
               packed_vs_padded=MEASURED["packed_vs_padded"], padding_free_vs_padded=MEASURED["padding_free_vs_padded"])


def unsloth_batching(cfg, planned: str) -> tuple[str, Reason | None]:
    """Unsloth patches TRL's trainer itself; padding-free batches measured to pay under it too (MEASURED).
    The Reason, where given, replaces the planner's batching reason."""
    if cfg.batching != "auto" or planned == "padded":
        return planned, None
    return planned, why("batching_unsloth", ratio=MEASURED["unsloth_padding_free_vs_padded"])


def kernels(cfg, facts, gpu: dict | None, backend: str, model_type: str) -> tuple[str, Reason | None]:
    """"liger" (Liger's Triton RMSNorm, SwiGLU and RoPE) or "none", and why."""
    from kit.planning.shapes import LIGER_MODEL_TYPES

    installed = bool((facts.packages or {}).get("liger_kernel"))
    if cfg.kernels == "none":
        return "none", None
    if cfg.kernels == "liger":
        off = ("not_nvidia" if gpu is None or gpu["vendor"] != "nvidia" else "unsloth" if backend == "unsloth" else None)
        return "liger", why("kernels_liger_configured", off=off, installed=installed)
    ratio = MEASURED["liger_vs_plain"]
    arch = verdicts.arch_name(gpu["vendor"], gpu["capability"]) if gpu is not None else None
    because = ("grpo" if cfg.trainer == "grpo" else
               "no_gpu" if gpu is None else
               "not_nvidia" if gpu["vendor"] != "nvidia" else
               "unsloth" if backend == "unsloth" else
               "model_type" if model_type not in LIGER_MODEL_TYPES else
               "not_paying" if ratio is None or ratio < 1.03 else
               "arch" if not verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
               "loss_unchecked" if not MEASURED["liger_loss_checked"] else
               "not_installed" if not installed else None)
    if because is None:
        return "liger", why("kernels_liger", ratio=ratio, loss_diff_pct=100 * MEASURED["liger_loss_max_rel_diff"])
    if gpu is not None and backend != "unsloth":
        return "none", why("kernels_none", because=because, model_type=model_type, arch=arch, ratio=ratio)
    return "none", None


def activation_offloading(cfg, gpu: dict | None, backend: str, strategy: str,
                          checkpointing: bool) -> tuple[bool, Reason | None]:
    """Whether the layer inputs gradient checkpointing keeps go to pinned CPU memory during the step, and why.

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
        off = (None if not on else "cpu" if gpu is None else "unsloth" if backend == "unsloth" else None)
        # On the CPU the value is off too: there is nothing to offload to.
        return on and gpu is not None, why("offloading_configured", setting=cfg.activation_offloading, off=off)
    ratio = MEASURED["offload_vs_liger"]
    because = ("grpo" if cfg.trainer == "grpo" else
               "no_gpu" if gpu is None else
               "not_nvidia" if gpu["vendor"] != "nvidia" else
               "unsloth" if backend == "unsloth" else
               "no_checkpointing" if not checkpointing else
               "strategy" if strategy not in ("single", "ddp") else
               "arch" if not verdicts.bf16_native(gpu["vendor"], gpu["capability"]) else
               "not_paying" if ratio < OFFLOAD_PAYS else
               "preference" if cfg.trainer in ("dpo", "kto") and MEASURED["dpo_offload_vs_liger"] < OFFLOAD_PAYS
               else None)
    if because is None:
        return True, why("offloading_on", saved_gib=MEASURED["offload_saved_gib"], ratio=ratio)
    if gpu is None:
        return False, None
    return False, why("offloading_off", because=because, trainer=cfg.trainer, strategy=strategy,
                      arch=verdicts.arch_name(gpu["vendor"], gpu["capability"]),
                      dpo_ratio=MEASURED["dpo_offload_vs_liger"],
                      kto_tokens_per_s=MEASURED["kto_offload_tokens_per_s"])


OFFLOAD_PAYS = 0.97  # it is for memory: "auto" takes it where it costs no speed beyond the runs' spread


def compile_blocked(backend: str, strategy: str) -> str | None:
    """Why compiled layers stay off on a GPU with this backend and strategy, as a code ("unsloth",
    "strategy"); None where they can run. The planner (`compile_layers`) and the launch
    (kit.planning.settle.for_rank) both ask."""
    if backend == "unsloth":
        return "unsloth"
    if strategy not in ("single", "ddp"):
        return "strategy"
    return None


COMPILE_REPAID = 300  # micro-batches: compiling's 20-45 s measured repaid after ~40 (full rows), ~180 (chat rows)


def compile_layers(cfg, gpu: dict | None, backend: str, strategy: str) -> tuple[bool, Reason | None]:
    """Whether the script runs each decoder layer through torch.compile (`compile`), and why.

    Inductor fuses each layer's elementwise work (norms, rotary embedding, residual adds, the LoRA
    sums) into fewer kernels, rounding each intermediate to bf16 as eager does
    (kit.train.modeling.compile_layers), so the loss curve stays eager's. Measured on the H200
    (MEASURED), Qwen3-8B QLoRA: with Liger and activation offloading 0.89× Unsloth direct's tokens/s
    at 0.95× its memory on full-length rows (without compile 0.82×), and 1.17× eager from the third
    step on chat-length rows, whose changing lengths cost a second compile. Compiling takes 20-45 s
    in the first steps, so "auto" compiles on bf16-native NVIDIA GPUs with the plain backend and one
    replica per GPU, and the script runs eagerly a job of fewer than COMPILE_REPAID micro-batches
    (kit.planning.settle.for_steps). With Liger, inductor takes the RMSNorm over from Liger's kernel.
    """
    if cfg.compile == "off":
        return False, None
    because = "cpu" if gpu is None else compile_blocked(backend, strategy)
    if cfg.compile == "on":
        return because is None, why("compile_configured", off=because, strategy=strategy)
    arch = None if gpu is None else verdicts.arch_name(gpu["vendor"], gpu["capability"])
    if because is None and not (gpu["vendor"] == "nvidia" and verdicts.bf16_native(gpu["vendor"], gpu["capability"])):
        because = "arch"
    if because is None:
        return True, why("compile_on", vs_unsloth=MEASURED["compile_offload_vs_unsloth"],
                         memory_vs_unsloth=MEASURED["compile_offload_memory_vs_unsloth"],
                         chat_vs_eager=MEASURED["compile_chat_vs_eager"],
                         loss_diff_pct=100 * MEASURED["compile_loss_max_rel_diff"], repaid=COMPILE_REPAID)
    if gpu is None:
        return False, None
    return False, why("compile_off", because=because, strategy=strategy, arch=arch)


def compile_unpaid(cfg, micro_batches: int) -> Reason | None:
    """Why "auto"'s compiled layers are not worth it for a job of `micro_batches` more micro-batches
    (compiling's time would not come back); None where they are, or where compile was configured."""
    if cfg.compile != "auto" or micro_batches >= COMPILE_REPAID:
        return None
    return why("compile_unpaid", micro_batches=micro_batches, repaid=COMPILE_REPAID)


FUSED_ADAMW_PAYS = 1.02  # a smaller gain is within the run-to-run spread of these step times


def fused_adamw(cfg, gpu: dict | None) -> bool:
    """Whether "auto" should pick torch's fused AdamW (one kernel for all parameters) over the loop."""
    ratio = MEASURED["fused_adamw_vs_adamw"]
    return (cfg.optimizer == "auto" and gpu is not None and gpu["vendor"] == "nvidia"
            and ratio is not None and ratio >= FUSED_ADAMW_PAYS)
