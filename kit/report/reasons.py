"""Reasons in words: the one place a `kit.planning.reasons.Reason` (a code and its figures) becomes
the sentence `kit plan`, bootstrap, `--json` and the script's notes show.

    words(Reason("precision_configured", {"precision": "fp16"}))   # "precision fp16 as configured."

TEMPLATES maps each code to a `str.format` template of its figures; the few codes whose sentence
needs a choice or a computed phrase have a function in WORDERS instead. A plain string (a note
that is not a decision, e.g. the packed data's summary) is shown as it is.
"""

from __future__ import annotations

from kit.planning import hostram
from kit.planning.fit import passed_over_words
from kit.planning.reasons import Reason


def things(n: int, one: str, many: str | None = None) -> str:
    """`things(1, "process", "processes")` → "1 process"; `things(8, "GPU")` → "8 GPUs"."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params:,}"


def words(reason) -> str:
    """The sentence for `reason` (a Reason, its dict, or a plain string shown as it is).

    Raises:
        KeyError: a code with no template, or a template naming a figure the reason lacks.
    """
    if isinstance(reason, str):
        return reason
    reason = Reason.from_dict(reason)
    worder = WORDERS.get(reason.code)
    if worder is not None:
        return worder(reason.figures)
    figures = dict(reason.figures)
    if "trainer" in figures:
        figures["trainer_upper"] = str(figures["trainer"]).upper()
    return TEMPLATES[reason.code].format(**figures)


def sentence(reason) -> str:
    """`words`, ending with a full stop: a plan's reason as `kit plan` lists it."""
    text = words(reason)
    return text if text.endswith(".") else text + "."


def all_words(reasons) -> list[str]:
    return [words(r) for r in reasons]


def as_json(reasons) -> list[dict]:
    """Each reason as `kit plan --json` prints it: its code, its figures and its sentence."""
    return [{**Reason.from_dict(r).to_dict(), "words": sentence(r)} for r in reasons]


# ---- the planner -----------------------------------------------------------------------------------
TEMPLATES = {
    "said": "{words}",
    "refused": "{message}",
    "gpu_unsupported": "{verdict}.",
    # precision (kit.planning.precision)
    "precision_cpu": "precision fp32 on the CPU.",
    "precision_fp16_rocm": "precision fp16 as configured; on ROCm fp16 has given NaNs (MI300X): bf16 is safer.",
    "precision_configured": "precision {precision} as configured.",
    "precision_no_bf16": ("{gpu} ({arch}) has no native bf16: fp16 with loss scaling "
                          "(torch.cuda.is_bf16_supported() says True here only through emulation); on an H200, fp16 "
                          "measured {fp16_vs_bf16:.2f}× bf16's tokens/s for Qwen3-8B QLoRA (loss scaling and fp32 "
                          "LoRA weights are its cost; a T4's own speed was not measured)."),
    "precision_bf16_rocm": "{gpu} ({arch}) has native bf16; on ROCm bf16 is preferred: fp16 gave NaNs on MI300X.",
    "precision_bf16": "{gpu} ({arch}) has native bf16: bf16, no loss scaling needed.",
    # report_to (kit.planning.tracking)
    "tracker_auto_trackio": ("report_to=auto: trackio is installed, so metrics go to trackio (its local database, "
                             "or the Space TRACKIO_SPACE_ID names)."),
    "tracker_auto_unknown": "report_to=auto: trackio if it is installed where the script runs, else no tracker.",
    "tracker_auto_none": "report_to=auto: trackio is not installed, so no tracker (`pip install trackio` to get one).",
    # what a trainer asks (kit.planning.trainers)
    "reference_precomputed": ("reference: its log-probabilities computed once before training "
                              "({trainer}.precompute_ref_log_probs=on; one process only)."),
    "reference_adapter_disabled": ("reference: the base with the LoRA adapter disabled, in the same model (no "
                                   "second copy, nothing precomputed: one extra forward without gradients per step)."),
    "reference_model_copy": ("reference: full fine-tuning moves the weights, so a second, frozen copy of the starting "
                             "model scores the answers (precompute_ref_log_probs=on saves its memory, one process "
                             "only)."),
    "reference_none_grpo": ("reference: none (grpo.beta=0, TRL's default: the loss has no KL term, so no reference "
                            "forward)."),
    "reference_grpo_adapter_disabled": ("reference (grpo.beta={beta:g}): the base with the LoRA adapter disabled, in "
                                        "the same model (no second copy: one extra forward without gradients per "
                                        "step)."),
    "reference_grpo_model_copy": ("reference (grpo.beta={beta:g}): full fine-tuning moves the weights, so TRL loads a "
                                  "second, frozen copy of the starting model."),
    "backend_trainer_plain": ("backend transformers for trainer {trainer}: kit runs Unsloth for {unsloth_trainers} "
                              "only (its {trainer_upper} patch is not measured)."),
    "backend_grpo_plain": ("backend transformers for trainer grpo: Unsloth without vLLM took {ratio:.2f}x kit's step "
                           "time ({unsloth_step_s:.2f} against {kit_step_s:.2f} s, {unsloth_peak_gib:.2f} against "
                           "{kit_peak_gib:.2f} GiB; H100, Qwen3-1.7B LoRA, 8 x 256 tokens), kit's generation pass is "
                           "the faster one; Unsloth's own GRPO speed comes with vLLM (fast_inference=True), which "
                           "kit does not run beside the trained model."),
    "batching_trainer": ("batching padded for trainer {trainer}: TRL's {trainer_upper}Trainer pads its batches "
                         "(its padding_free falls back to padding)."),
    "batching_trainer_grpo": ("batching padded for trainer grpo: TRL's GRPOTrainer pads its batches (prompts on the "
                              "left, completions on the right)."),
    # speed choices (kit.planning.speed)
    "batching_packed_configured": ("batching packed as configured: rows packed into seq_len-long sequences; each "
                                   "step trains on per_device_batch such sequences, many rows each, so an epoch has "
                                   "fewer optimizer steps than global_batch rows per step would give."),
    "batching_configured": "batching {batching} as configured.",
    "batching_cpu": "batching padded: on the CPU nothing was measured; padded is TRL's default.",
    "batching_not_nvidia": ("batching padded: padding-free batches were measured on NVIDIA only (set "
                            "batching=padding_free to try them; the rows are kept apart by SDPA's mask there too)."),
    "batching_unsloth": ("batching padding_free: with backend unsloth padding-free batches measured {ratio:.2f}× the "
                         "trained tokens/s of padded ones on chat-length rows (H200, Qwen3-8B QLoRA) and less memory, "
                         "the loss of every step within 0.1 %; the script goes back to padded batches if the rows "
                         "average more than a third of seq_len."),
    "kernels_liger": ("kernels liger: Liger's RMSNorm, SwiGLU and RoPE measured {ratio:.2f}× the tokens/s of the plain "
                      "stack (H200, Qwen3-8B QLoRA), with a loss curve within {loss_diff_pct:.2f} % of the plain one "
                      "over 40 steps."),
    "offloading_on": ("activation_offloading on: the checkpointed layer inputs wait in pinned CPU memory during the "
                      "step (TRL's activation_offloading): {saved_gib:.1f} GiB less at {ratio:.2f}× the tokens/s "
                      "(H200, Qwen3-8B QLoRA, with Liger, the mean of three runs), the same losses."),
    "compile_on": ("compile on: each decoder layer runs through torch.compile, rounding as eager does: with Liger and "
                   "activation offloading {vs_unsloth:.2f}× Unsloth direct's tokens/s at {memory_vs_unsloth:.2f}× its "
                   "memory on full-length rows, {chat_vs_eager:.2f}× eager after the first steps on chat-length rows, "
                   "the loss curve within {loss_diff_pct:.2f} % of eager's (H200, Qwen3-8B QLoRA); compiling takes "
                   "20-45 s at the start, so a job of fewer than {repaid} micro-batches runs eagerly; compile=off "
                   "turns it off."),
    # the model, the GPUs, quantization (kit.planning.plan)
    "qlora_prequantized": "{model} is a bnb-4bit checkpoint: its base stays 4-bit, so this is QLoRA.",
    "qlora": ("QLoRA: linear weights in 4-bit nf4 (bitsandbytes); embeddings, norms and lm_head stay 16-bit (kit does "
              "not call prepare_model_for_kbit_training: {saved_gib} GiB and {slower_pct} % slower for Qwen3-8B)."),
    "bitsandbytes_missing": "bitsandbytes is not installed there: `pip install bitsandbytes` before training.",
    "gpu_memory_held": ("GPU {gpu} already has {used_gib:.1f} GiB in use by another process (a notebook kernel holding "
                        "a model?): planning with the free {budget_gib:.1f} GiB; restart that kernel to get it back."),
    "fsdp_qlora": ("QLoRA under FSDP: the 4-bit weights are stored as {precision} (bnb_4bit_quant_storage) so FSDP2 "
                   "can shard them; each rank quantizes the whole base on its GPU while loading (~{load_gib:.1f} GiB) "
                   "before sharding it."),
    "fsdp_16bit": ("FSDP with a 16-bit base: the weights load on the CPU, one rank per node reads them and the others "
                   "receive their shards; no GPU holds a full replica."),
    "cpu_only": "CPU-only: training will be CPU-slow; fine for the tiny default.",
    "backend_unsloth_configured_multi_gpu": ("backend unsloth as configured, on several GPUs: Unsloth's multi-GPU "
                                             "support is limited; use backend=transformers if it fails."),
    "backend_plain_multi_gpu": "backend transformers: Unsloth is installed but its multi-GPU support is limited.",
    # the CPU's swaps (kit.planning.device_rules)
    "optimizer_needs_gpu": "optimizer {optimizer} needs a GPU: using adamw_torch",
    "optimizer_fused_on_cpu": "optimizer adamw_torch_fused is planned for a GPU: using adamw_torch on the CPU",
    # the plan settled by the script (kit.planning.settle)
    "warmup_over_max_steps": ("warning: warmup_steps={warmup_steps} is more than max_steps={max_steps}: the learning "
                              "rate never reaches learning_rate={learning_rate:g}; lower warmup_steps for a real run"),
    "precision_settled": "precision {precision} on this GPU (the rendered plan said {planned})",
    "fsdp_one_process": ("one process without torchrun (or on the CPU): training without FSDP sharding; start it with "
                         "torchrun --standalone --nproc_per_node=N train_ddp.py to shard"),
    "batching_long_rows": ("batching padded: rows average {mean_tokens:.0f} tokens of seq_len {seq_len}, more than "
                           "{short_rows:.2f} of it; padding-free batches pay only on short rows"),
    "batching_folded": ("batching packed: rows average {mean_tokens:.0f} tokens of seq_len {seq_len}, "
                        "{rows_per_sequence:.1f} to a packed sequence; micro-batch {per_device_before} × accumulation "
                        "{accum_before} → {per_device_after} sequences × {accum_after}, so an optimizer step still "
                        "trains on ~{rows_now:.0f} rows ({rows_before} unpacked) in fewer, fuller micro-batches, the "
                        "rows kept apart by position_ids: packed batches measured {packed_vs_padded:.2f}× the trained "
                        "tokens/s of padded ones, padding-free {padding_free_vs_padded:.2f}× (H200, Qwen3-8B QLoRA)"),
    "compile_unpaid": ("compile off: {micro_batches} micro-batch(es) to train, fewer than the {repaid} that repay "
                       "compiling (20-45 s at the start); compile=on compiles anyway"),
    "grpo_generation": ("grpo generation: sampling the completions takes most of each step ({generation_s:.2f} of "
                        "{step_s:.2f} s measured on an H100, Qwen3-1.7B LoRA, 8 × 256 tokens), so "
                        "grpo.max_completion_length and grpo.num_generations set the step time more than the batch "
                        "does. It is transformers' generate in TRL's GRPOTrainer; on CUDA kit switches it to a "
                        "static KV cache and compiled one-token decoding (kit.train.generation, measured "
                        "{step_time_vs_trl:.2f}x TRL's step time on an H100; the first step compiles, about a "
                        "minute), eager decoding elsewhere. vLLM is not used: it would generate faster (paged "
                        "attention, continuous batching) but holds its own copy of the weights and its KV cache "
                        "outside PyTorch's allocator, beside the model being trained, and TRL would copy the "
                        "adapter into it every step."),
}


def _tracker_named(f) -> str:
    note = "" if f["known"] else f" (not known whether {f['tracker']} is installed there)"
    key = (f" Its key, if it needs one, comes from {f['key']} or a Kaggle/Colab secret of that name."
           if f["key"] else "")
    return f"report_to={f['tracker']}: logged from rank 0, its run named by kit's run id{note}.{key}"


def _grpo_batch(f) -> str:
    how = ("with global_batch null kit makes it the smallest multiple of per_device x ranks that does, through "
           "accumulation steps." if f["global_batch"] is None else f"global_batch={f['global_batch']} as configured.")
    return (f"grpo: the global batch counts completions and holds whole groups of num_generations="
            f"{f['num_generations']} (TRL compares a prompt's completions with each other); " + how)


def _compile_off_trainer(f) -> str:
    t = f["trainer"]
    return f"compile off for trainer {t}: " + (
        f"compiled layers measured {f['ratio']:.2f}× the tokens/s of TRL's DPOTrainer with Liger driven directly "
        "(H100, Qwen3-8B QLoRA), within the spread between runs; compile=on turns them on." if f["measured"] else
        "compiled decoder layers were measured for sft and dpo only (its generation pass is compiled on CUDA: "
        "kit.train.generation)." if t == "grpo" else
        "its fused log-probability head patches the forward; compiled layers were measured for sft and dpo only.")


def _batching_padding_free(f) -> str:
    where = ("" if f["unmeasured_arch"] is None else
             f"; measured on an H200, not on {f['unmeasured_arch']}, which has no FlashAttention 2 but runs the masked "
             "rows through SDPA's memory-efficient kernel")
    return (f"batching padding_free: each micro-batch's rows laid end to end without pad tokens, kept apart by a "
            f"block-diagonal attention mask: {f['padding_free_vs_padded']:.2f}× the trained tokens/s of padded batches "
            f"on chat-length data and less memory, the same rows per step{where}; the script goes back to padded "
            f"batches if the rows average more than a third of seq_len, and packs short rows where gradient "
            f"accumulation can fold (the same rows per optimizer step in fewer, fuller micro-batches: packed measured "
            f"{f['packed_vs_padded']:.2f}×).")


def _kernels_liger_configured(f) -> str:
    if f["off"] == "not_nvidia":
        return ("kernels liger as configured, but Liger's kernels are Triton on an NVIDIA GPU: the script turns them "
                "off here.")
    if f["off"] == "unsloth":
        return "kernels liger as configured, but Unsloth brings its own kernels: off."
    return "kernels liger as configured." + ("" if f["installed"] else
                                             " liger-kernel is not installed there: `pip install liger-kernel`.")


LIGER_OFF = {
    "grpo": ("trainer grpo: TRL then swaps in Liger's fused GRPO loss, which kit has not measured; kernels=liger turns "
             "it on"),
    "no_gpu": "not on a GPU",
    "not_nvidia": "not an NVIDIA GPU",
    "unsloth": "Unsloth brings its own kernels",
    "model_type": "{model_type} is not a family Liger patches",
    "not_paying": "not measured to pay",
    "arch": "not measured on {arch}: Triton compiles for a T4, but Liger was only measured on an H200",
    "loss_unchecked": ("measured {ratio:.2f}× the tokens/s of the plain stack on an H200, but its loss curve is not "
                       "yet checked against the plain one; kernels=liger turns it on"),
    "not_installed": "liger-kernel is not installed (`pip install liger-kernel`)",
}

OFFLOADING_OFF = {
    "grpo": "trainer grpo: TRL's GRPOConfig has no activation offloading",
    "no_gpu": "not on a GPU",
    "not_nvidia": "not an NVIDIA GPU",
    "unsloth": "Unsloth offloads checkpointed activations its own way",
    "no_checkpointing": "gradient checkpointing is off, so every activation would cross PCIe twice a step (unmeasured)",
    "strategy": "strategy {strategy}: measured with one replica per GPU only",
    "arch": "measured on an H200 only, not on {arch}",
    "not_paying": "not measured to pay",
}

COMPILE_OFF = {
    "cpu": "on the CPU the script runs eagerly",
    "unsloth": "Unsloth compiles its own decoder blocks",
    "strategy": "strategy {strategy}: measured with one replica per GPU only",
    "arch": "measured on an H200 only, not on {arch}",
}


def _offloading_off(f) -> str:
    if f["because"] == "preference":
        because = (f"trainer {f['trainer']}: measured {f['dpo_ratio']:.2f}× the tokens/s without it under TRL's "
                   "DPOTrainer (H100, Qwen3-8B QLoRA, 2 pairs × 1,024 tokens, with Liger), 1.0 GiB saved"
                   + (f"; KTO's script with it ran {f['kto_tokens_per_s']:,} tokens/s, its cost not measured apart, "
                      "and its step is the same kind (a policy pass with gradients, forwards without)"
                      if f["trainer"] == "kto" else ""))
    else:
        because = OFFLOADING_OFF[f["because"]].format(**f)
    return (f"activation_offloading off ({because})" +
            ("." if f["trainer"] == "grpo" else "; activation_offloading=on turns it on."))


def _offloading_configured(f) -> str:
    off = {None: "", "cpu": " The CPU has nothing to offload to: the script leaves it off there.",
           "unsloth": " Unsloth offloads checkpointed activations its own way: the script leaves it off."}[f["off"]]
    return f"activation_offloading {f['setting']} as configured.{off}"


def _compile_configured(f) -> str:
    off = f" Off here: {COMPILE_OFF[f['off']].format(**f)}." if f["off"] else ""
    return ("compile on as configured: each decoder layer runs through torch.compile (compiled once per shape at the "
            "start)." + off)


def _model(f) -> str:
    return f"{f['model']}: {count(f['params'])} parameters, {f['layers']} layers, vocab {f['vocab']} (from {f['source']})."


def _strategy(f) -> str:
    strategy, n, nodes, gpu = f["strategy"], f["n"], f["nodes"], f["gpu"]
    need = f"estimated {f['est_gib']:.1f} GiB per GPU of {f['budget_gib']:.1f} GiB"
    over = f"{things(n, 'GPU')} ({nodes} nodes × {n // nodes}× {gpu})" if nodes > 1 else f"{n}× {gpu}"
    replica = ("a replica per GPU was passed over (above)" if f["ddp_passed"] else
               "a full replica does not fit one GPU")
    sharded = "FSDP was passed over (above)" if f["fsdp_passed"] else "FSDP does not fit"
    if strategy == "single":
        return f"single device: one {gpu}; {need}."
    if strategy == "ddp":
        return (f"DDP over {over}: one replica fits each GPU ({need}); each rank trains on its own share of the "
                f"batches, so {n} GPUs give about {n}× the throughput.")
    if strategy == "fsdp":
        return (f"FSDP over {over} as configured ({need})." if f["configured"] == "fsdp" else
                f"FSDP over {over}: {replica}, sharded {n} ways it fits ({need}).")
    split = ("as configured" if f["configured"] == "model_parallel" else
             f"{replica} and {sharded}, only the layers spread over the GPUs fit")
    return (f"model parallel (device_map) over {n}× {gpu}: {split} ({need}): about {f['layers'] // max(n, 1)} of the "
            f"{f['layers']} layers on each GPU (device_map=\"auto\" balances them by size); one process, the GPUs run "
            "one after another, so it is no speed-up; launched with python, never torchrun.")


def _checkpointing(f) -> str:
    because = {"config": "set in the config",
               "big": f"the model has {f['params'] / 1e9:.1f}B ≥ 1B parameters",
               "needed": "needed to fit",
               "small": f"the model is small ({count(f['params'])} parameters)"}[f["because"]]
    return f"gradient checkpointing {'on' if f['on'] else 'off'}: {because}."


def _batch(f) -> str:
    b = "as configured" if f["configured"] else "the largest power of two ≤ 8 that fits"
    return (f"micro-batch {f['per_device_batch']} ({b}), {things(f['grad_accum'], 'accumulation step')}, "
            f"global batch {f['global_batch']}.")


def _host_ram(f) -> str:
    load = hostram.load_words(f)  # the refusals' words too
    have = (f"{f['ram_gib']:.1f} GiB usable" if f["ram_gib"] is not None else
            "the machine's RAM is not known, so this was not checked: make sure it has that much")
    where = " per node" if f["nodes"] > 1 else ""
    return f"host RAM while loading: ~{f['load_gib']:.1f} GiB{where} ({load}; {have})."


def _nodes(f) -> str:
    return (f"{f['nodes']} nodes × {things(f['nproc'], 'GPU')} = {f['world']} ranks, started by torchrun's c10d "
            f"rendezvous at {f['endpoint']}; only global rank 0 talks to the store, each node downloads the model and "
            "data once and keeps its own output_dir; a node that dies ends the job (non-zero exit), and the same "
            "commands resume it.")


def _cpu_processes(f) -> str:
    return (f"precision {f['precision']} on the CPU; " +
            (f"{f['nproc']} processes over gloo" if f["nproc"] > 1 else "one process") +
            (", FSDP-sharded (checks the script's FSDP path; no memory saved: the ranks share one RAM)."
             if f["fsdp"] else "."))


def _backend_unsloth(f) -> str:
    dpo = (f"; trainer dpo: {f['dpo_vs_trl']:.2f}× the tokens/s of TRL's DPOTrainer driven directly, "
           f"{f['dpo_tokens_per_s']:,} against {f['trl_tokens_per_s']:,}, where kit's plain stack with Liger gave "
           f"{f['plain_vs_trl']:.2f}× in the same run (H100, Qwen3-8B QLoRA, 2 pairs × 1,024 tokens), at "
           f"{f['peak_gib']} against {f['trl_peak_gib']} GiB" if f["trainer"] == "dpo" else "")
    return ("backend unsloth: installed and one NVIDIA GPU (measured in one run on an H200 for Qwen3-8B QLoRA, "
            "seq_len 2048 × 4: 1.20× the tokens/s of kit's plain stack with Liger, 10,358 against 8,631, and 86 % of "
            "its memory, 8.32 against 9.65 GiB; on chat-length rows padding-free, 1.60× its trained tokens/s, "
            f"{f['vs_direct']:.3f}× Unsloth driven directly on the same batches" + dpo +
            "; the memory estimate is Unsloth's: its checkpointing keeps each layer's input in CPU memory).")


HERE_OFF = {"cpu": "this rank runs on the CPU", "unsloth_kernels": "Unsloth brings its own kernels",
            "not_installed": "liger-kernel is not installed",
            "unsloth_offloading": "Unsloth offloads checkpointed activations its own way"}


def _plan_settled(f) -> str:
    processes = things(f["world_size"], "process", "processes")
    where = "on the CPU" if f["device"] != "cuda" else f"on {f['gpu'] or 'this GPU'}"
    changes = ", ".join(f"{name} {f[name + '_was']} → {f[name + '_now']}" for name in f["changed"].split(","))
    return f"plan settled for {processes} {where} and the settings given: {changes}"


def _replanned(f) -> str:
    where = f"{f['nproc']}× {f['gpu']}" if f["device"] == "cuda" else "the CPU"
    where = f"{f['nodes']} nodes × {where}" if f["nodes"] > 1 else where
    machines = "these machines" if f["nodes"] > 1 else "this machine"
    return (f"--config {f['source']}: planned for {machines} ({where}): {f['strategy']}, {f['precision']}, "
            f"micro-batch {f['per_device_batch']} × {f['grad_accum']} accumulation, gradient checkpointing "
            f"{'on' if f['gradient_checkpointing'] else 'off'}")


WORDERS = {
    "passed_over_host_ram": lambda f: f"passed over {passed_over_words(Reason('passed_over_host_ram', f))}.",
    "passed_over_fsdp_load": lambda f: f"passed over {passed_over_words(Reason('passed_over_fsdp_load', f))}.",
    "model": _model,
    "strategy": _strategy,
    "checkpointing": _checkpointing,
    "batch": _batch,
    "host_ram": _host_ram,
    "nodes": _nodes,
    "cpu_processes": _cpu_processes,
    "backend_unsloth": _backend_unsloth,
    "plan_settled": _plan_settled,
    "replanned": _replanned,
    "unsloth_unavailable": lambda f: (
        "Unsloth is not available here ("
        + {"no_gpu": "there is no CUDA GPU", "not_installed": "Unsloth is not installed"}[f["because"]]
        + "): using the transformers backend"),
    "kernels_off_here": lambda f: "Liger kernels off: " + HERE_OFF[
        "unsloth_kernels" if f["because"] == "unsloth" else f["because"]],
    "offloading_off_here": lambda f: "activation offloading off: " + HERE_OFF[
        "unsloth_offloading" if f["because"] == "unsloth" else f["because"]],
    "compile_off_here": lambda f: "compile off: " + (
        HERE_OFF["cpu"] if f["because"] == "cpu" else COMPILE_OFF[f["because"]].format(**f)),
    "batching_padding_free": _batching_padding_free,
    "kernels_liger_configured": _kernels_liger_configured,
    "kernels_none": lambda f: f"kernels none: Liger off ({LIGER_OFF[f['because']].format(**f)}).",
    "offloading_configured": _offloading_configured,
    "offloading_off": _offloading_off,
    "compile_configured": _compile_configured,
    "compile_off": lambda f: f"compile off ({COMPILE_OFF[f['because']].format(**f)}); compile=on turns it on.",
    "grpo_batch": _grpo_batch,
    "compile_off_trainer": _compile_off_trainer,
    "tracker_named": _tracker_named,
}
