"""kit.planning.shapes: shapes from the built-in table, a local config.json, the Hub's config.json (real client,
local Hub server), and the offline refusal."""

import json
import os
import subprocess
import sys

import pytest

from kit.planning import shapes
from kit.errors import UsageError
from tests.hubserver import HubServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# Published parameter counts (model cards / safetensors metadata), text towers.
@pytest.mark.parametrize("name,params_b", [
    ("Qwen/Qwen3-0.6B", 0.596), ("Qwen/Qwen3-8B", 8.19), ("Qwen/Qwen3-32B", 32.76),
    ("meta-llama/Llama-3.2-1B", 1.236), ("meta-llama/Llama-3.1-8B", 8.03), ("meta-llama/Llama-3.1-70B", 70.55),
    ("mistralai/Mistral-7B-v0.3", 7.248), ("google/gemma-2-2b", 2.614), ("google/gemma-2-9b", 9.242),
    ("google/gemma-2-27b", 27.23),
])
def test_table_params_match_published_counts(name, params_b):
    assert shapes.model_facts(name).params / 1e9 == pytest.approx(params_b, rel=0.01)


def test_qwen3_shapes_are_the_published_config_values():
    m = shapes.model_facts("Qwen/Qwen3-8B")
    assert (m.layers, m.hidden, m.intermediate, m.heads, m.kv_heads, m.head_dim, m.vocab, m.tied_embeddings) == \
        (36, 4096, 12288, 32, 8, 128, 151936, False)
    s = shapes.model_facts("Qwen/Qwen3-0.6B")
    assert (s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim, s.tied_embeddings) == \
        (28, 1024, 3072, 16, 8, 128, True)


@pytest.mark.parametrize("name,base,prequantized", [
    ("unsloth/Qwen3-8B-unsloth-bnb-4bit", "Qwen/Qwen3-8B", "bnb-4bit"),
    ("unsloth/Qwen3-8B-bnb-4bit", "Qwen/Qwen3-8B", "bnb-4bit"),
    ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B", None),
    ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B", None),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", None),
    ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "meta-llama/Llama-3.1-8B", "bnb-4bit"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-70B", None),
    ("unsloth/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B", None),
    ("google/gemma-3-12b-it", "google/gemma-3-12b-pt", None),
    ("unsloth/gemma-3-4b-it-unsloth-bnb-4bit", "google/gemma-3-4b-pt", "bnb-4bit"),
])
def test_variants_share_the_base_shapes(name, base, prequantized):
    m, b = shapes.model_facts(name), shapes.model_facts(base)
    assert m.params == b.params and m.source == "table" and m.prequantized == prequantized


def test_moe_and_unknown_models_are_not_guessed():
    assert shapes.from_table("Qwen/Qwen3-30B-A3B") is None
    with pytest.raises(UsageError, match=r"'someone/Custom-7B'.*HF_HUB_OFFLINE.*local model directory or go online"):
        shapes.model_facts("someone/Custom-7B")
    with pytest.raises(UsageError, match="not a local directory"):
        shapes.model_facts("no-such-dir")


def test_local_directory_reads_config_json(tmp_path):
    tiny = shapes.model_facts("models/tiny-qwen3")
    assert tiny.source == "local" and tiny.layers == 2 and tiny.hidden == 64 and tiny.tied_embeddings
    # Gemma 3 style: the shape is under text_config; a bnb quantization_config marks it 4-bit.
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
        "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 34, "hidden_size": 2560,
                        "intermediate_size": 10240, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072}}))
    m = shapes.model_facts(str(tmp_path))
    assert m.prequantized == "bnb-4bit" and m.params == shapes.model_facts("google/gemma-3-4b-it").params


def test_local_directory_errors(tmp_path):
    with pytest.raises(UsageError, match="has no config.json"):
        shapes.model_facts(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"model config .*config.json is not valid JSON \(Expecting .* at line 1\)"):
        shapes.model_facts(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UsageError, match="decoder-only"):
        shapes.model_facts(str(tmp_path))


def test_hub_config_json_only_through_the_real_client(tmp_path):
    """An id the table does not know is read from the Hub's config.json (real huggingface_hub, local server)."""
    cfg = json.load(open(os.path.join(ROOT, "models", "tiny-qwen3", "config.json")))
    with HubServer() as server:
        server.create("someone/Custom-7B", private=False)
        server.put_files("someone/Custom-7B", {"config.json": json.dumps(cfg).encode()})
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1"}
        env.pop("HF_HUB_OFFLINE", None)
        out = subprocess.run([sys.executable, "-c", "import json; from kit.planning.shapes import model_facts; "
                              "print(json.dumps(model_facts('someone/Custom-7B').to_dict()))"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        facts = json.loads(out.stdout)
        assert facts["source"] == "hub" and facts["layers"] == 2 and facts["hidden"] == 64
        paths = [p for _, p, _ in server.requests]
        assert all("safetensors" not in p for p in paths) and any(p.endswith("config.json") for p in paths)
