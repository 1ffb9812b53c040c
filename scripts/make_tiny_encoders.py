"""Build the dry run's other two stand-ins: a 2-layer BERT (masked LM, classification, tagging,
extractive QA) and a 2-layer T5 (seq2seq), each with a tokenizer trained on the embedded data.

`kit convert --dry-run` uses them for notebooks whose model a causal LM cannot stand in for. No
download: WordPiece (BERT) and byte-level BPE (T5) tokenizers trained with `tokenizers` on
data/ha_commands.jsonl, seeded random weights. Re-running gives the same files:

    python scripts/make_tiny_encoders.py   # writes models/tiny-bert/ and models/tiny-t5/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def texts(data_path: Path) -> list[str]:
    return [m["content"] for line in data_path.read_text(encoding="utf-8").splitlines()
            for m in json.loads(line)["messages"]]


def bert(corpus: list[str], vocab_size: int, seed: int):
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special,
                                                              show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                        model_max_length=512)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return BertForMaskedLM(config), tokenizer


def t5(corpus: list[str], vocab_size: int, seed: int):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    special = ["<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>", model_max_length=512)
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=2, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(config), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "ha_commands.jsonl"))
    parser.add_argument("--out", default=str(ROOT / "models"))
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    corpus = texts(Path(args.data))
    for name, build in (("tiny-bert", bert), ("tiny-t5", t5)):
        model, tokenizer = build(corpus, args.vocab_size, args.seed)
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        n = sum(p.numel() for p in model.parameters())
        print(f"wrote {out}: {n:,} parameters, vocab {len(tokenizer)}")


if __name__ == "__main__":
    main()
