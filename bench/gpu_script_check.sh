#!/usr/bin/env bash
# The generated train_ddp.py on one GPU: QLoRA smoke (bitsandbytes 4-bit), a LoRA run under
# torchrun/NCCL, a QLoRA run with checkpoints. What produced bench/results/h200_generated_script.txt.
# On a machine without trl/datasets/bitsandbytes: bash ../shared/tools/gpu-site.sh .gpu-site --no-unsloth
# and export PYTHONPATH=$PWD/.gpu-site first.
set -u
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 HF_HUB_DISABLE_TELEMETRY=1
out=${1:-bench/results}
(python3 train_ddp.py --smoke method=qlora 2>&1 | grep -v "it/s" | tail -14) > "$out/qlora_smoke.txt"
(torchrun --standalone --nproc_per_node=1 train_ddp.py output_dir=/tmp/o max_steps=10 save_steps=5 eval_steps=null 2>&1 \
  | grep -E "\[kit\]|Error|destroy_process_group" | tail -12) > "$out/nccl_lora.txt"
(python3 train_ddp.py method=qlora output_dir=/tmp/q max_steps=6 save_steps=3 eval_steps=null 2>&1 \
  | grep -E "\[kit\]|Error" | tail -8; ls /tmp/q/checkpoint-6) > "$out/qlora_train.txt"
cat "$out"/qlora_smoke.txt "$out"/nccl_lora.txt "$out"/qlora_train.txt
