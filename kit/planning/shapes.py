"""Model shapes without downloading weights: a local config.json, a built-in table, or the Hub's config.json.

    facts = model_facts("unsloth/Qwen3-8B-unsloth-bnb-4bit")
    facts.params, facts.layers, facts.prequantized   # 8190735360, 36, 'bnb-4bit'

The table is consulted before the Hub so that planning on an offline notebook (or in tests) never
waits on a network timeout; its values are the families' published config.json values.
Parameter counts are computed from the shapes (decoder-only, gated MLP), text tower only.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from kit.errors import UsageError
from kit.files import json_problem, parse_json, read_json, regular_file


@dataclass
class ModelFacts:
    """The shape of a decoder-only LLM, enough to estimate memory."""

    name: str                 # what the config asked for (Hub id or local path)
    source: str               # "local" | "table" | "hub"
    model_type: str           # config.json model_type, e.g. "qwen3"
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_position: int
    prequantized: str | None = None   # "bnb-4bit" when the checkpoint itself is 4-bit
    params: int = 0                   # filled from the shapes when 0

    def __post_init__(self):
        if not self.params:
            self.params = count_params(self)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear in one decoder layer — what LoRA `all-linear` targets."""
        h, i = self.hidden, self.intermediate
        return {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
                "o_proj": (self.q_dim, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_linear_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values())

    def embedding_params(self) -> int:
        """Input embedding plus a separate lm_head when the two are not tied."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def to_dict(self) -> dict:
        return asdict(self)


def count_params(m: ModelFacts) -> int:
    # Norms: two per layer (Gemma has four), q/k norms (Qwen3, Gemma 3) and the final norm: < 0.01 %.
    norms = m.layers * (2 * m.hidden + 2 * m.head_dim) + m.hidden
    return m.layers * m.layer_linear_params() + m.embedding_params() + norms


# (layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied, max_position)
_QWEN3 = {"0.6b": (28, 1024, 3072, 16, 8, 128, 151936, True, 40960),
          "1.7b": (28, 2048, 6144, 16, 8, 128, 151936, True, 40960),
          "4b": (36, 2560, 9728, 32, 8, 128, 151936, True, 40960),
          "8b": (36, 4096, 12288, 32, 8, 128, 151936, False, 40960),
          "14b": (40, 5120, 17408, 40, 8, 128, 151936, False, 40960),
          "32b": (64, 5120, 25600, 64, 8, 128, 151936, False, 40960)}
_LLAMA3 = {"1b": (16, 2048, 8192, 32, 8, 64, 128256, True, 131072),
           "3b": (28, 3072, 8192, 24, 8, 128, 128256, True, 131072),
           "8b": (32, 4096, 14336, 32, 8, 128, 128256, False, 131072),
           "70b": (80, 8192, 28672, 64, 8, 128, 128256, False, 131072)}
_MISTRAL = {"7b": (32, 4096, 14336, 32, 8, 128, 32000, False, 32768)}
_GEMMA2 = {"2b": (26, 2304, 9216, 8, 4, 256, 256000, True, 8192),
           "9b": (42, 3584, 14336, 16, 8, 256, 256000, True, 8192),
           "27b": (46, 4608, 36864, 32, 16, 128, 256000, True, 8192)}
_GEMMA3 = {"1b": (26, 1152, 6912, 4, 1, 256, 262144, True, 32768),
           "4b": (34, 2560, 10240, 8, 4, 256, 262208, True, 131072),
           "12b": (48, 3840, 15360, 16, 8, 256, 262208, True, 131072),
           "27b": (62, 5376, 21504, 32, 16, 128, 262208, True, 131072)}
# A pattern on the lower-cased repo name (owner dropped) → (model_type, sizes). Instruct/-it/-Base
# and Unsloth's re-uploads share the base model's shapes.
_FAMILIES = [
    (re.compile(r"^qwen3-(0\.6b|1\.7b|4b|8b|14b|32b)(?!-a\d)"), "qwen3", _QWEN3),
    (re.compile(r"^(?:meta-)?llama-3(?:\.\d)?-(1b|3b|8b|70b)"), "llama", _LLAMA3),
    (re.compile(r"^mistral-(7b)"), "mistral", _MISTRAL),
    (re.compile(r"^gemma-2-(2b|9b|27b)"), "gemma2", _GEMMA2),
    (re.compile(r"^gemma-3-(1b|4b|12b|27b)"), "gemma3_text", _GEMMA3),
]
# config.json model_types that Liger's kernels patch (liger_kernel.transformers, 0.8.5): every family above.
LIGER_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3_text", "phi3"})
KNOWN_MODELS = ["Qwen/Qwen3-" + s.upper() for s in _QWEN3] + \
    ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B",
     "mistralai/Mistral-7B-v0.3"] + [f"google/gemma-2-{s}" for s in _GEMMA2] + [f"google/gemma-3-{s}-pt" for s in _GEMMA3]


def _prequantized(name: str) -> str | None:
    n = name.lower()
    return "bnb-4bit" if ("bnb-4bit" in n or "bnb_4bit" in n) else None


def from_table(name: str) -> ModelFacts | None:
    """Facts for a Hub id the built-in table recognises, else None."""
    repo = name.rstrip("/").split("/")[-1].lower()
    for pattern, model_type, sizes in _FAMILIES:
        m = pattern.match(repo)
        if not m:
            continue
        layers, h, i, nh, kv, hd, vocab, tied, max_pos = sizes[m.group(1)]
        if model_type == "mistral" and "v0.3" in repo:
            vocab = 32768  # v0.3 extended the vocabulary
        if model_type == "llama" and re.match(r"^(meta-)?llama-3-", repo):
            max_pos = 8192  # Llama 3.0; 3.1+ reach 128k
        return ModelFacts(name, "table", model_type, layers, h, i, nh, kv, hd, vocab, tied, max_pos,
                          prequantized=_prequantized(name))
    return None


def from_config_dict(name: str, cfg: dict, source: str) -> ModelFacts:
    """Facts from a transformers config.json dict (multimodal configs: their text_config)."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("text_config") or cfg, dict):
        raise UsageError(f"{name}: config.json is not a JSON object of model settings")
    text = cfg.get("text_config") or cfg
    try:
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        quant = cfg.get("quantization_config") or {}
        pre = _prequantized(name)
        if quant.get("load_in_4bit") or quant.get("bnb_4bit_quant_type"):
            pre = "bnb-4bit"
        facts = ModelFacts(
            name=name, source=source, model_type=str(text.get("model_type") or cfg.get("model_type") or "unknown"),
            layers=int(text["num_hidden_layers"]), hidden=hidden, intermediate=int(text["intermediate_size"]),
            heads=heads, kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads), vocab=int(text["vocab_size"]),
            tied_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))),
            max_position=int(text.get("max_position_embeddings") or 0), prequantized=pre)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        raise UsageError(f"{name}: config.json lacks a decoder-only shape ({e}); kit plans causal LMs only") from None
    sizes = {"num_hidden_layers": facts.layers, "hidden_size": facts.hidden, "intermediate_size": facts.intermediate,
             "num_attention_heads": facts.heads, "num_key_value_heads": facts.kv_heads, "head_dim": facts.head_dim,
             "vocab_size": facts.vocab}
    bad = [f"{k} {v}" for k, v in sizes.items() if v < 1]
    if bad or facts.heads % facts.kv_heads:
        why = ", ".join(bad) or f"num_attention_heads {facts.heads} is not a multiple of num_key_value_heads {facts.kv_heads}"
        raise UsageError(f"{name}: config.json has {why}: not a model that can be built")
    return facts


def _from_hub(name: str, revision: str | None) -> tuple[ModelFacts | None, str]:
    """(facts, why-not) from the Hub's config.json only; never downloads weights."""
    try:
        from huggingface_hub import hf_hub_download

        from kit.checkpoints.store.hub_http import hub_offline
    except ImportError:
        return None, "huggingface_hub is not installed"
    if hub_offline():
        return None, "HF_HUB_OFFLINE is set"
    try:
        path = hf_hub_download(name, "config.json", revision=revision)
    except Exception as e:  # network down, repo missing, gated: all mean "not from the Hub", with the reason
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    with open(path, "rb") as fh:
        try:
            cfg = parse_json(fh.read())
        except ValueError as e:  # a damaged download in the Hub cache
            return None, f"its config.json is {json_problem(e)}"
    return from_config_dict(name, cfg, "hub"), ""


def _local_dir(name: str) -> str | None:
    """`name` as a directory, also relative to the checkout kit runs from (the shipped models/tiny-qwen3)."""
    if os.path.isdir(name):
        return name
    import kit

    beside = os.path.join(kit.CHECKOUT, name)
    return beside if not os.path.isabs(name) and os.path.isdir(beside) else None


def model_facts(name: str, revision: str | None = None) -> ModelFacts:
    """Shapes of `name`: a local directory, then the built-in table, then the Hub's config.json.

    Raises:
        UsageError: the model is neither local, in the table, nor reachable on the Hub.
    """
    local = _local_dir(name)
    if local:
        path = os.path.join(local, "config.json")
        if regular_file(path, f"model directory {name}: config.json") is None:
            raise UsageError(f"model directory {name} has no config.json: is it a Hugging Face model folder?")
        return from_config_dict(name, read_json(path, "model config", "restore it from the model's source"),
                                "local")
    facts = from_table(name)
    if facts is not None:
        return facts
    if "/" not in name or name.startswith((".", "/")):
        raise UsageError(f"model {name!r} is not a local directory and not a Hub id (owner/name)")
    facts, why = _from_hub(name, revision)
    if facts is None:
        raise UsageError(f"model {name!r} is not in kit's table and its config.json could not be fetched "
                         f"({why}): give a local model directory or go online")
    return facts


def check_seq_len(cfg, limit: int | None) -> None:
    """seq_len within the model's max_position_embeddings (`limit`; None or 0: unknown). The planner
    asks before any plan; the script asks again for a seq_len given on its command line."""
    if limit and cfg.seq_len > limit:
        raise UsageError(f"seq_len={cfg.seq_len} is longer than {cfg.model}'s max_position_embeddings={limit}")
    completion = cfg.grpo.max_completion_length if getattr(cfg, "trainer", "sft") == "grpo" else 0
    if limit and cfg.seq_len + completion > limit:  # grpo: a prompt of up to seq_len tokens, then its completion
        raise UsageError(f"seq_len={cfg.seq_len} + grpo.max_completion_length={completion} is longer than "
                         f"{cfg.model}'s max_position_embeddings={limit} (a completion follows its prompt in one "
                         f"context); lower either, so that they add up to at most {limit}")
