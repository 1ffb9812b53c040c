"""Packed sequences as the rows of a batch, each row's examples kept apart by its position_ids.

TRL batches packed sequences padding-free: the micro-batch's sequences laid end to end as ONE row.
Without FlashAttention (not in the H200's image, not on a T4) SDPA then attends through one
block-diagonal mask over the whole micro-batch: 4 sequences of 2,048 tokens are one 8,192² problem,
16 times one sequence's, and a packed step took 1.92 s where 4 rows that fill seq_len took 1.15 s
(bench/results/speed_h200.json). As rows, a packed step with Liger took 1.00 s (median), 1.69 s
flattened, and packed batches trained 2.90× the tokens/s of padded ones
(bench/results/speed_h200_chat_batching.json). Kept as rows, each sequence is its own 2,048² problem: `PackedRows`
pads them to the longest, gives each its examples' restarting position_ids and no attention_mask,
and transformers builds a block-diagonal mask per row from the position_ids (masking_utils'
find_packed_sequence_indices), so examples never attend to each other.

The label of an example's first token is dropped (-100), as TRL does padding-free: it would
otherwise be predicted from the end of the example before it. Pads get position 0 each, so each
is its own one-token sequence; their labels are -100 already.

    SFTTrainer(..., data_collator=collate.collator(plan, tokenizer))
"""

from __future__ import annotations


class PackedRows:
    """Collates packed examples (input_ids, labels, seq_lengths) into padded rows with position_ids."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: list[dict]) -> dict:
        import torch

        width = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), width), -100, dtype=torch.long)
        positions = torch.zeros((len(examples), width), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            input_ids[i, :n] = torch.tensor(e["input_ids"])
            labels[i, :n] = torch.tensor(e.get("labels", e["input_ids"]))
            positions[i, :n] = torch.cat([torch.arange(k) for k in e.get("seq_lengths") or [n]])
        labels[positions == 0] = -100  # an example's first token is not predicted from the one before
        # No attention_mask: present, it would turn off the per-row packed masks.
        return {"input_ids": input_ids, "labels": labels, "position_ids": positions}


def collator(plan, tokenizer) -> PackedRows | None:
    """The SFT trainer's `data_collator`: packed sequences batched as rows where the plan says so
    (`Plan.packed_as_rows`), padded with the tokenizer's pad token (kit.train.modeling sets it, as TRL
    would). None elsewhere: TRL's own collator, padded rows or, with `padding_free`, one flattened row
    (TRL refuses a collator of ours with padding_free)."""
    return PackedRows(tokenizer.pad_token_id) if plan.packed_as_rows else None


def sampler_args(plan) -> dict:
    """SFTConfig arguments for length-grouped batches, in the spelling of the installed transformers.

    transformers 5.2x replaced `group_by_length=True` with `train_sampling_strategy="group_by_length"`;
    older 5.x releases (5.17 on the H200 that measured this) know only the first.
    """
    if plan.batching != "grouped":
        return {}
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}
