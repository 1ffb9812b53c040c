"""Unsloth driven directly, as its notebooks do: the bar for kit's Unsloth backend.

    python bench/reference_unsloth.py --model DIR --data FILE.jsonl --out result.json

FastLanguageModel (4-bit), LoRA r16 on the seven linear projections, Unsloth's gradient
checkpointing, TRL's SFTTrainer on a `text` column truncated to --seq-len; AdamW as kit uses.
Timed as kit times itself (median step time after two warm-up steps, tokens = batch × seq_len).

    python bench/reference_unsloth.py --chat --model DIR --data CHAT.jsonl --out result.json

`--chat`: one epoch over `messages` rows (bench/chat_lengths.py), as Unsloth's own chat notebooks
train: the chat template applied to a `text` column, `train_on_responses_only` (loss on the
assistant turns), and TRL's `padding_free` left unset so Unsloth's own rule picks padded or
padding-free batches (unsloth/utils/padding_choice.py; an H200 keeps padding-free). Reported:
trained (label-carrying) tokens / the sum of all step times, warm-up steps included, as
bench/speed.py's chat rows are.
"""

from __future__ import annotations

import unsloth  # noqa: F401  (first: it patches transformers and trl)

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

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
    p.add_argument("--seed", type=int, default=42,
                   help="LoRA init and data order (kit's default seed: with it the loss curves of kit's "
                        "backend=unsloth and this driver can be compared step by step)")
    p.add_argument("--chat", action="store_true", help="one epoch of messages rows, loss on the responses only")
    p.add_argument("--probe", action="store_true", help="print what the trainer settled and each step's time")
    a = p.parse_args()
    if a.probe:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench import trainer_probe

        trainer_probe.install()

    model, tokenizer = FastLanguageModel.from_pretrained(model_name=a.model, max_seq_length=a.seq_len,
                                                         dtype=torch.bfloat16, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(
        model, r=16, lora_alpha=32, lora_dropout=0, bias="none", use_gradient_checkpointing="unsloth",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        random_state=a.seed)  # Unsloth's notebooks use 3407; kit passes its seed
    ds = load_dataset("json", data_files=a.data, split="train")
    if a.chat:
        ds = ds.map(lambda row: {"text": tokenizer.apply_chat_template(row["messages"], tokenize=False)},
                    remove_columns=ds.column_names)

    timer = Timer()
    length = {"max_steps": -1, "num_train_epochs": 1} if a.chat else {"max_steps": a.steps, "packing": False}
    args = SFTConfig(output_dir="/tmp/reference-unsloth", dataset_text_field="text", max_length=a.seq_len,
                     per_device_train_batch_size=a.batch, **length,
                     gradient_accumulation_steps=1, learning_rate=1e-4, bf16=True, optim="adamw_torch",
                     logging_steps=1, save_strategy="no", report_to="none", warmup_steps=0,
                     seed=a.seed, data_seed=a.seed)  # kit's shuffle: the same batches in the same order
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=ds, args=args, callbacks=[timer])
    trained = None
    if a.chat:
        from unsloth.chat_templates import train_on_responses_only

        trainer = train_on_responses_only(trainer, instruction_part="<|im_start|>user\n",
                                          response_part="<|im_start|>assistant\n")
        trained = sum(sum(1 for x in labels if x != -100) for labels in trainer.train_dataset["labels"])
    trainer.train()

    all_steps = [b - x for x, b in zip(timer.ends, timer.ends[1:])]
    durations = all_steps[2:]
    step_s = statistics.median(durations)
    result = {"script": "reference_unsloth", "step_s": round(step_s, 4),
              "tokens_per_s": round(a.batch * a.seq_len / step_s, 1), "steps_timed": len(durations),
              "steps_run": len(all_steps), "total_step_s": round(sum(all_steps), 3),
              "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
              "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
              "padding_free": getattr(trainer.args, "padding_free", None),
              "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
    if trained is not None:
        result["trained_tokens"] = trained
        result["trained_tokens_per_s"] = round(trained / sum(all_steps), 1)
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
