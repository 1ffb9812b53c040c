"""The H200 measurements behind kit's speed choices (kit.planning.speed), each with where it came from.

Facts only: `kit.planning.speed` decides from them. Each figure is a ratio from one `python bench/speed.py`
run (or the mean of the runs named), its results file in bench/results/.
"""

# The H200 measurements behind the "auto" choices (bench/results/speed_h200.json): Qwen3-8B shape,
# QLoRA nf4, LoRA r16 all-linear, seq_len 2048 × micro-batch 4, gradient checkpointing.
MEASURED = {
    # Trained tokens/s on chat rows with LMSYS-Chat-1M's lengths, against padded batches (1,263/s,
    # half the tokens computed were pad): padding-free 1,447/s and 8.3 GiB against 10.3 GiB.
    "padding_free_vs_padded": 1.146,
    # Packed sequences as rows (kit.train.collate), one run (bench/results/speed_h200_chat_batching.json):
    # 4,061 trained tokens/s against padded 1,402, 10.25 GiB both; with Liger 3,842 (median step 1.00 s,
    # 1.69 s when the same batches were one flattened sequence).
    "packed_vs_padded": 2.896,
    # Tokens/s on rows that fill seq_len: Liger 9,201/s and 9.65 GiB against 7,111/s and 10.11 GiB.
    "liger_vs_plain": 1.294,
    # Liger's loss curve against the plain one, same weights, data and seed, 40 steps
    # (bench/results/loss_equivalence_h200.json): at most 0.105 % apart, 0.043 % on average, where
    # the same run twice differs by up to 0.055 %. Tolerance fixed before the run: mean ≤ 1 %, every step ≤ 3 %.
    "liger_loss_checked": True,
    "liger_loss_max_rel_diff": 0.00105,
    # adamw_torch_fused against adamw_torch, fill rows, 12 steps: 7,197 against 7,075 tokens/s, same
    # memory (bench/results/speed_fused_adamw_h200.json): below FUSED_ADAMW_PAYS.
    "fused_adamw_vs_adamw": 1.017,
    "fp16_vs_bf16": 0.968,            # fp16 with loss scaling and fp32 adapters, same model and batch
    # backend unsloth on the chat rows, one run (bench/results/speed_h200_fill_chat_compile_trial.json): padding-free
    # 1,867 trained tokens/s and 7.31 GiB against padded 1,434 and 8.32 GiB; per-step losses within 0.098 %.
    "unsloth_padding_free_vs_padded": 1.302,
    # backend unsloth padding-free against Unsloth driven directly, the same 80 batches of LMSYS-length
    # rows, one H100, 4 pairs in A-B-B-A / B-A-A-B order (bench/results/speed_h100_chat_unsloth_pairs_*.json):
    # steps 2-80 summed 159.03 s against 158.61 s (pairs 0.974, 1.036, 1.005, 0.972); 7.31 GiB both.
    "unsloth_backend_vs_direct": 0.997,
    # backend unsloth under TRL's DPOTrainer (Unsloth 2026.10.9 patches it at import), kit's script against
    # DPOTrainer driven directly in the same run, one H100, Qwen3-8B QLoRA, 2 pairs x 1,024 tokens, 12 steps
    # (bench/results/dpo_speed_h100.json, "unsloth_call"): 0.574 against 0.945 s a step; kit's plain
    # stack with Liger 0.925 s (1.02x) in the same run. Peak 7.35 GiB against an estimate of 6.89. Its first two
    # steps took about 41 s against TRL's 7.6 s (Unsloth compiling its kernels), repaid after about 90 steps.
    "unsloth_dpo": {"vs_trl": 1.646, "tokens_per_s": 7138, "trl_tokens_per_s": 4336, "plain_vs_trl": 1.021,
                    "peak_gib": 7.35, "trl_peak_gib": 8.05},
    # TRL's activation_offloading on top of Liger, fill rows, three runs on three machines
    # (bench/results/speed_h200_fill_chat_offloading_trial.json, speed_h200_fill_liger_offload_unsloth.json, speed_h200_fill_offload_cold.json):
    # 9,030 against 8,670, 8,763 against 9,120 and (30 steps) 8,584 against 9,022 tokens/s; 7.61 against
    # 9.65 GiB every time; the losses the same to 4 digits.
    "offload_vs_liger": 0.985,  # the three runs' mean (1.042, 0.961, 0.951)
    "offload_saved_gib": 2.04,
    # The same under TRL's DPOTrainer, Qwen3-8B QLoRA, 2 pairs x 1024 tokens, Liger, one H100, two calls
    # (bench/results/dpo_speed_h100.json): 3,673 against 4,200 tokens/s in one call (0.875x), and
    # 3,778 against TRL + Liger driven directly's 4,179 (0.90x) in the other; 6.83 against 7.82 GiB.
    "dpo_offload_vs_liger": 0.875,
    # KTO's script with offloading (auto's choice then), one H100, Qwen3-8B QLoRA, 4 rows x 1,024 tokens a step
    # (bench/results/dpo_speed_h100.json, "unsloth_call"): 1.337 s a step, 3,064 tokens/s, 6.83 GiB against an
    # estimate of 6.89. Its cost was not measured apart; "auto" follows the DPO figure above (the same TRL
    # offloading around the same kind of step: policy forward and backward plus forwards without gradients).
    "kto_offload_tokens_per_s": 3064,
    # compile=on (each decoder layer compiled, Liger's RMSNorm left to inductor) under DPOTrainer against
    # TRL + Liger driven directly, one H100, same run (dpo_speed_h100.json): 0.687 against 0.703 s a step;
    # kit's eager plain stack gave 0.963x TRL + Liger in another run, so compiling is not shown to pay beyond
    # the spread between runs (+-4 %): "auto" leaves it off for DPO.
    "dpo_compile_vs_trl_liger": 1.024,
    # torch.compile of each decoder layer on top of Liger, same run: 9,231 tokens/s (1.065×) but 9.81 GiB
    # and losses up to 1.8 % apart from Liger's alone (an inductor warning on Liger's RMSNorm).
    "compile_vs_liger": 1.065,
    # Liger (its RMSNorm left to inductor) + activation offloading + torch.compile of each decoder layer
    # (`compile=on`), against Unsloth direct in the same run, three runs: 9,159 against 10,349 and 9,492
    # against 10,514 tokens/s, 30 steps (bench/results/speed_h200_fill_compile_patched_cold.json
    # through bench/patched_run.py, _fill_compile.json through kit's script), and 9,155 against 10,236,
    # 20 steps, with inductor rounding as eager does (speed_h200_fill_compile_eager_rounding.json); 7.56 against
    # 7.95 GiB every time; Liger alone 0.875× and 0.888× at 9.65 GiB, + offloading 0.82×.
    "compile_offload_vs_unsloth": 0.894,  # the three runs' mean (0.885, 0.903, 0.894)
    "compile_offload_memory_vs_unsloth": 0.951,
    # The loss curves, same call: before, compiled layers sat below eager's from the
    # first update on (1.27 % on average, 3.95 % at most, alone; 0.77 % and 1.85 % with Liger), as
    # inductor kept fused intermediates in fp32 that eager rounds to bf16. Rounding as eager does
    # (kit.train.modeling.compile_layers), 20 steps: compile alone within 0.04 % of plain at most,
    # with Liger and offloading 0.02 %, and 9,880 against 9,743 tokens/s without the rounding; on chat
    # rows (below) 0.09 %, where Liger against plain was 0.105 % and one run twice 0.055 %.
    "compile_loss_max_rel_diff": 0.0009,
    # Chat-length rows, padding-free with Liger, same 40 batches (160 rows,
    # speed_h200_chat_compile.json): compiled 43.3 s against eager 50.4 s from the third step
    # on, but the first two steps 44.6 s against 18.1 s (compiled once per shape, then once with the
    # length dynamic): 0.78× over that 40-step epoch. Losses within 0.09 % of eager's at every step.
    "compile_chat_vs_eager": 1.165,
    # torch.compile alone on the plain stack, cold caches: 10,163 tokens/s (0.967× Unsloth direct, 1.41×
    # plain) at 10.22 GiB (1.29×); with eager rounding: 9,880, 0.965×.
    "compile_alone_vs_unsloth": 0.967,
    # GRPO with kit.train.generation against TRL's GRPOTrainer driven directly, one H100, Qwen3-1.7B shape, bf16
    # LoRA r16, 8 generations x 256 tokens from one 128-token prompt (bench/results/grpo_speed_h100.json): 3.26 s
    # a step against 15.31 s, 2.80 s of it generating (11 ms a token) and 0.46 s training.
    "grpo_step_h100": {"vs_trl": 0.21, "step_s": 3.26, "generation_s": 2.80},
    # The same GRPO step through Unsloth 2026.10 without vLLM (FastLanguageModel, fast_inference=False, its LoRA
    # and gradient checkpointing, its CUDA-graph decoding), kit's generation and TRL direct in one run
    # (bench/results/grpo_speed_unsloth_h100.json): Unsloth 3.70 s a step (2.92 s generating, 11.4 ms a token;
    # 5.04 GiB peak), kit 2.57 s (2.15 s, 8.4 ms; 4.29 GiB), TRL 13.22 s.
    "grpo_unsloth_vs_kit": {"ratio": 1.44, "unsloth_step_s": 3.70, "kit_step_s": 2.57, "unsloth_peak_gib": 5.04,
                            "kit_peak_gib": 4.29},
}
