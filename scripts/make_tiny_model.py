"""Build kit's embedded default model: a 2-layer Qwen3 with a tokenizer trained on the data.

No download: the tokenizer is a byte-level BPE trained with `tokenizers` on
data/ha_commands.jsonl, the weights are a seeded random init of a `Qwen3Config`. Re-running
gives the same files:

    python scripts/make_ha_data.py && python scripts/make_tiny_model.py   # writes models/tiny-qwen3/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ChatML, the format of Qwen's chat models, so the tiny model formats data like the real ones.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def texts(data_path: Path) -> list[str]:
    out = []
    for line in data_path.read_text(encoding="utf-8").splitlines():
        for m in json.loads(line)["messages"]:
            out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    return out


def train_tokenizer(corpus: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, chat_template=CHAT_TEMPLATE, model_max_length=1024)


def build_model(vocab_size: int, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         tie_word_embeddings=True, rope_theta=10000.0)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "ha_commands.jsonl"))
    parser.add_argument("--out", default=str(ROOT / "models" / "tiny-qwen3"))
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = train_tokenizer(texts(Path(args.data)), args.vocab_size)
    model = build_model(len(tokenizer), args.seed)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n:,} parameters, vocab {len(tokenizer)}")


if __name__ == "__main__":
    main()
