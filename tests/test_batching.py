"""Padding-free and packed batches keep rows apart: the real TRL collator, kit's packed-rows collator
(kit.train.collate), the real tiny Qwen3 under SDPA, and kit.train.data's packing; then the generated
script trained with batching=packed."""

from __future__ import annotations

import json
import types

import pytest
import torch

from kit.planning import config
from kit.train import data
from tests.scripts import FAST, ROOT, losses, train_here

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


def _packed_rows(tokenizer, examples):
    """The first two examples packed into one sequence, the third alone: two rows of a batch."""
    from kit.train.collate import PackedRows
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    a, b, c = examples
    packed = [{"input_ids": a["input_ids"] + b["input_ids"], "labels": a["labels"] + b["labels"],
               "seq_lengths": [len(a["input_ids"]), len(b["input_ids"])]},
              {"input_ids": c["input_ids"], "labels": c["labels"], "seq_lengths": [len(c["input_ids"])]}]
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return PackedRows(padded.pad_token_id)(packed), padded(packed)


def test_packed_sequences_as_rows_give_each_example_its_own_logits_and_loss(tiny):
    model, tokenizer = tiny
    examples = _examples(tokenizer)
    rows, _ = _packed_rows(tokenizer, examples)
    n0, n1, n2 = (len(e["input_ids"]) for e in examples)
    assert "attention_mask" not in rows and rows["input_ids"].shape == (2, n0 + n1)  # 2 rows, not 1 flat row
    assert rows["position_ids"][0].tolist() == [*range(n0), *range(n1)]
    assert rows["position_ids"][1, :n2].tolist() == list(range(n2))
    padded = _collate(tokenizer, examples, False)
    with torch.no_grad():
        out_rows, out_padded = model(**rows), model(**padded)
    for got, want in ((out_rows.logits[0, :n0], out_padded.logits[0, :n0]),
                      (out_rows.logits[0, n0:n0 + n1], out_padded.logits[1, :n1]),
                      (out_rows.logits[1, :n2], out_padded.logits[2, :n2])):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert out_rows.loss.item() == pytest.approx(out_padded.loss.item(), abs=1e-5)


def test_packed_rows_with_the_padding_mask_would_attend_across_examples(tiny):
    # The control: TRL's padded collator alone keeps an all-ones attention_mask, under which
    # transformers builds no per-row packed mask, so the second example of a row sees the first.
    model, tokenizer = tiny
    examples = _examples(tokenizer)
    rows, leaky = _packed_rows(tokenizer, examples)
    assert "attention_mask" in leaky
    n0 = len(examples[0]["input_ids"])
    with torch.no_grad():
        good, bad = model(**rows).logits, model(**leaky).logits
    torch.testing.assert_close(bad[0, :n0], good[0, :n0], atol=1e-5, rtol=1e-4)
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
        r = train_here([f"output_dir={out}", "max_steps=4", "save_steps=4", f"batching={batching}", *FAST])
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


@pytest.mark.parametrize("batching,backend,rows", [("packed", "transformers", True), ("packed", "unsloth", False),
                                                   ("padding_free", "transformers", False),
                                                   ("padded", "transformers", False)])
def test_packed_sequences_are_collated_as_rows_only_on_the_plain_backend(batching, backend, rows):
    from kit.planning.plan import Plan
    from kit.train import collate

    plan = Plan(precision="bf16", strategy="single", per_device_batch=4, global_batch=4, backend=backend,
                batching=batching)
    collator = collate.collator(plan, types.SimpleNamespace(pad_token_id=7))
    assert isinstance(collator, collate.PackedRows) == rows
    assert (collator is None) == (not rows)  # TRL's own: padded, or padding-free (it refuses ours then)
    assert plan.padding_free == (batching == "padding_free" or (batching == "packed" and not rows))
    if rows:
        batch = collator([{"input_ids": [1, 2, 3], "labels": [1, 2, 3], "seq_lengths": [3]},
                          {"input_ids": [4, 5], "labels": [-100, 5], "seq_lengths": [1, 1]}])
        assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, 7]]  # padded with the tokenizer's pad token
        assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
        assert batch["labels"].tolist() == [[-100, 2, 3], [-100, -100, -100]]


def test_the_script_builds_its_trainer_with_packed_rows_and_no_card(tmp_path, monkeypatch):
    """The generated script (in-process) with batching=packed: the trainer is constructed with kit's
    packed-rows collator and trains with it, and its class writes no card over the user's README.md."""
    import inspect

    from transformers import Trainer

    from kit.train.collate import PackedRows

    built, init = [], Trainer.__init__

    def watched(self, *args, **kwargs):  # records what TRL's trainer hands transformers' Trainer; no stand-in
        built.append((self, inspect.signature(init).bind(self, *args, **kwargs).arguments.get("data_collator")))
        init(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", watched)
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# my notes on this run\n")
    r = train_here([f"output_dir={out}", "max_steps=2", "save_steps=1", "batching=packed", *FAST])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "train rows packed into" in r.stdout
    (trainer, constructed_with), = built
    assert isinstance(constructed_with, PackedRows)  # passed in, not swapped in after TRL built its own
    assert trainer.data_collator is constructed_with
    assert "create_model_card" not in vars(trainer)  # nothing patched onto the object
    type(trainer).create_model_card(trainer, model_name="out")  # what TRL calls at each save: writes nothing
    assert (out / "README.md").read_text() == "# my notes on this run\n"
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "README.md").is_file()  # kit's card
