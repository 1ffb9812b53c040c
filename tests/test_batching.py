"""Padding-free and packed batches keep rows apart: the real TRL collator, the real tiny Qwen3 under
SDPA, and kit.train.data's packing; then the generated script trained with batching=packed."""

from __future__ import annotations

import json

import pytest
import torch

from kit.planning import config
from kit.train import data
from tests.scripts import FAST, ROOT, losses, train

TINY = ROOT / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32, attn_implementation="sdpa").eval()
    # As kit trains (modeling._prepare): with a KV cache transformers does not look for packed rows.
    model.config.use_cache = False
    return model, AutoTokenizer.from_pretrained(TINY)


def _examples(tokenizer):
    rows = [[{"role": "user", "content": "turn on the kitchen light"}, {"role": "assistant", "content": "done"}],
            [{"role": "user", "content": "dim the bedroom lamp to half please"},
             {"role": "assistant", "content": "the bedroom lamp is at half"}],
            [{"role": "user", "content": "lock"}, {"role": "assistant", "content": "locked the front door"}]]
    out = []
    for messages in rows:
        r = data.tokenize_row({"messages": messages}, "messages", {"messages": "messages"}, tokenizer, 512)
        labels = [t if m else -100 for t, m in zip(r["input_ids"], r["completion_mask"])]
        out.append({"input_ids": r["input_ids"], "labels": labels})
    assert len({len(e["input_ids"]) for e in out}) == 3  # unequal lengths, so padding matters
    return out


def _collate(tokenizer, examples, padding_free):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                                           padding_free=padding_free)(examples)


def test_padding_free_batch_gives_the_padded_batchs_logits_and_loss(tiny):
    model, tokenizer = tiny
    examples = _examples(tokenizer)
    padded, flat = _collate(tokenizer, examples, False), _collate(tokenizer, examples, True)
    assert "attention_mask" not in flat and flat["input_ids"].shape[0] == 1  # one row, no pad
    assert flat["input_ids"].shape[1] == sum(len(e["input_ids"]) for e in examples) < padded["input_ids"].numel()
    with torch.no_grad():
        out_padded, out_flat = model(**padded), model(**flat)
    offset = 0
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        torch.testing.assert_close(out_flat.logits[0, offset:offset + n], out_padded.logits[i, :n],
                                   atol=1e-5, rtol=1e-4)
        offset += n
    # The same trained tokens, so the same mean loss: no row learns from its neighbour's end.
    assert out_flat.loss.item() == pytest.approx(out_padded.loss.item(), abs=1e-5)


def test_without_restarting_positions_the_rows_would_attend_to_each_other(tiny):
    # The control: the same flat row with positions counting on (what a collator that ignored row
    # boundaries would give) changes the later rows' logits, so the test above can fail.
    model, tokenizer = tiny
    examples = _examples(tokenizer)
    flat = _collate(tokenizer, examples, True)
    leaky = {**flat, "position_ids": torch.arange(flat["input_ids"].shape[1])[None]}
    with torch.no_grad():
        good, bad = model(**flat).logits, model(**leaky).logits
    n0 = len(examples[0]["input_ids"])
    torch.testing.assert_close(bad[0, :n0], good[0, :n0], atol=1e-5, rtol=1e-4)  # the first row sees only itself
    assert (bad[0, n0:] - good[0, n0:]).abs().max() > 1e-2


def test_pack_keeps_every_row_whole_and_its_loss_mask(tmp_path, tiny):
    _, tokenizer = tiny
    rows = [{"messages": [{"role": "user", "content": "turn on the light " * k},
                          {"role": "assistant", "content": "ok " * (k + 1)}]} for k in range(1, 13)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config.load(None, [f"data.path={path}", "data.eval_fraction=0", "seq_len=96"])
    plain = data.prepare(cfg, tokenizer)
    packed = data.prepare(cfg, tokenizer, pack=True)
    assert packed.packed_rows == len(plain.train) == 12 and len(packed.train) < 12
    assert "12 train rows packed into" in packed.summary()
    lengths = sorted(len(r) for r in plain.train["input_ids"])
    assert sorted(n for seq in packed.train["seq_lengths"] for n in seq) == lengths  # whole rows, none cut
    assert all(len(ids) <= 96 for ids in packed.train["input_ids"])
    # The trained tokens are the same tokens: the loss mask travelled with its row.
    trained = sorted(t for r in plain.train for t, m in zip(r["input_ids"], r["completion_mask"]) if m)
    assert sorted(t for r in packed.train for t, m in zip(r["input_ids"], r["completion_mask"]) if m) == trained
    assert packed.mean_tokens == pytest.approx(sum(lengths) / len(packed.train))


@pytest.mark.slow
def test_generated_script_same_losses_padding_free_as_padded_and_packed_trains(tmp_path):
    trace = {}
    for batching in ("padded", "padding_free", "packed"):
        out = tmp_path / batching
        r = train([f"output_dir={out}", "max_steps=4", "save_steps=4", f"batching={batching}", *FAST], nproc=1)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-3000:]
        assert "[kit] complete: step 4 of 4" in log
        assert ("train rows packed into" in log) == (batching == "packed")
        trace[batching] = losses(out / "checkpoint-4")
    # The same batches without their pad tokens: the same loss at every step, to float32 noise.
    assert [s for s, _ in trace["padding_free"]] == [s for s, _ in trace["padded"]] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(trace["padding_free"], trace["padded"]):
        assert a == pytest.approx(b, abs=1e-4)
    assert trace["packed"] != trace["padded"]  # more rows per step: its own curve
