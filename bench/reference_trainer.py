"""The baseline kit is measured against: QLoRA the way the transformers/PEFT docs show it.

    python bench/reference_trainer.py --model DIR --data FILE.jsonl --out result.json [--no-kbit-prep]

Plain `transformers.Trainer` + PEFT + bitsandbytes nf4, `prepare_model_for_kbit_training`
(unless --no-kbit-prep), gradient checkpointing, bf16, AdamW; every row truncated to --seq-len
tokens. Speed is timed as kit times itself (median step time after two warm-up steps, tokens =
batch × seq_len), and peak memory is rank 0's max_memory_allocated from the start of training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from datasets import load_dataset
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, DataCollatorForLanguageModeling,
                          Trainer, TrainerCallback, TrainingArguments)


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
    p.add_argument("--no-kbit-prep", action="store_true", help="skip prepare_model_for_kbit_training")
    a = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(a.model, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": 0})
    if a.no_kbit_prep:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    else:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                             target_modules="all-linear"))

    ds = load_dataset("json", data_files=a.data, split="train")
    ds = ds.map(lambda r: tokenizer(r["text"], truncation=True, max_length=a.seq_len), remove_columns=["text"])
    assert all(len(ids) == a.seq_len for ids in ds["input_ids"]), "every row must fill seq_len"

    timer = Timer()
    args = TrainingArguments(output_dir="/tmp/reference-trainer", max_steps=a.steps, per_device_train_batch_size=a.batch,
                             gradient_accumulation_steps=1, learning_rate=1e-4, bf16=True, gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": False}, optim="adamw_torch",
                             logging_steps=1, save_strategy="no", report_to="none", warmup_steps=0)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[timer],
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()

    durations = [b - x for x, b in zip(timer.ends, timer.ends[1:])][2:]
    step_s = statistics.median(durations)
    result = {"script": "reference_trainer" + (" --no-kbit-prep" if a.no_kbit_prep else ""),
              "step_s": round(step_s, 4), "tokens_per_s": round(a.batch * a.seq_len / step_s, 1),
              "steps_timed": len(durations), "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
              "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
