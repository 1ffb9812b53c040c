"""Unsloth driven directly, as its notebooks do: the bar for kit's Unsloth backend.

    python bench/reference_unsloth.py --model DIR --data FILE.jsonl --out result.json

FastLanguageModel (4-bit), LoRA r16 on the seven linear projections, Unsloth's gradient
checkpointing, TRL's SFTTrainer on a `text` column truncated to --seq-len; AdamW as kit uses.
Timed as kit times itself (median step time after two warm-up steps, tokens = batch × seq_len).
"""

from __future__ import annotations

import unsloth  # noqa: F401  (first: it patches transformers and trl)

import argparse
import json
import statistics
import time

import torch
from datasets import load_dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from unsloth import FastLanguageModel


class Timer(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        torch.cuda.reset_peak_memory_stats()
        self.ends = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()

    model, tokenizer = FastLanguageModel.from_pretrained(model_name=a.model, max_seq_length=a.seq_len,
                                                         dtype=torch.bfloat16, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(
        model, r=16, lora_alpha=32, lora_dropout=0, bias="none", use_gradient_checkpointing="unsloth",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        random_state=3407)
    ds = load_dataset("json", data_files=a.data, split="train")

    timer = Timer()
    args = SFTConfig(output_dir="/tmp/reference-unsloth", dataset_text_field="text", max_length=a.seq_len,
                     packing=False, max_steps=a.steps, per_device_train_batch_size=a.batch,
                     gradient_accumulation_steps=1, learning_rate=1e-4, bf16=True, optim="adamw_torch",
                     logging_steps=1, save_strategy="no", report_to="none", warmup_steps=0)
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=ds, args=args, callbacks=[timer])
    trainer.train()

    durations = [b - x for x, b in zip(timer.ends, timer.ends[1:])][2:]
    step_s = statistics.median(durations)
    result = {"script": "reference_unsloth", "step_s": round(step_s, 4),
              "tokens_per_s": round(a.batch * a.seq_len / step_s, 1), "steps_timed": len(durations),
              "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
              "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
