"""kit.planning.config: defaults, YAML + overrides, every error branch one line with the key and value."""

import argparse

import pytest

from kit.checkpoints.fingerprint import config_fields, diff_lines
from kit.planning import config
from kit.errors import UsageError


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults_match_the_brief():
    cfg = config.load(None)
    assert cfg.model == "models/tiny-qwen3" and cfg.method == "lora" and cfg.backend == "auto"
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (16, 32, 0.0, "all-linear")
    assert cfg.data.path == "data/ha_commands.jsonl" and cfg.data.columns == {} and cfg.data.eval_fraction == 0.1
    assert cfg.per_device_batch is None and cfg.global_batch is None and cfg.max_steps is None
    assert (cfg.seq_len, cfg.learning_rate, cfg.save_steps, cfg.resume) == (512, 2e-4, 50, "auto")
    assert config.RunConfig().data.columns is not config.RunConfig().data.columns  # no shared mutable default


def test_yaml_then_overrides(tmp_path):
    path = write(tmp_path, "model: Qwen/Qwen3-8B\nlora:\n  r: 8\ndata:\n  columns: {q: prompt}\n")
    cfg = config.load(path, ["lora.r=4", "seq_len=1024", "max_steps=null", "lora.target_modules=[q_proj, v_proj]"])
    assert cfg.model == "Qwen/Qwen3-8B" and cfg.lora.r == 4 and cfg.seq_len == 1024
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.data.columns == {"q": "prompt"}
    assert cfg.lora.alpha == 32  # untouched nested keys keep their defaults


@pytest.mark.parametrize("raw,want", [("on", "on"), ("off", "off"), ("true", "on"), ("false", "off"),
                                      ("auto", "auto"), ('"off"', "off")])
def test_gradient_checkpointing_accepts_yaml_booleans(tmp_path, raw, want):
    yaml_text = f"gradient_checkpointing: {raw}\n"
    assert config.load(write(tmp_path, yaml_text)).gradient_checkpointing == want
    assert config.load(None, [f"gradient_checkpointing={raw}"]).gradient_checkpointing == want


@pytest.mark.parametrize("override,words", [
    ("lerning_rate=1e-4", ["'lerning_rate'", "did you mean 'learning_rate'"]),
    ("lr=1e-4", ["did you mean 'learning_rate'"]),
    ("lora.rank=8", ["'lora.rank'", "did you mean 'lora.r'"]),
    ("seq_len=abc", ["'seq_len'", "integer", "'abc'"]),
    ("seq_len=0", ["'seq_len'", "> 0", "0"]),
    ("per_device_batch=-2", ["'per_device_batch'", "-2"]),
    ("data.eval_fraction=1.0", ["'data.eval_fraction'", "[0, 1)", "1.0"]),
    ("method=dora", ["'method'", "'dora'", "lora|qlora|full"]),
    ("precision=fp8", ["'precision'", "'fp8'"]),
    ("gradient_checkpointing=maybe", ["'gradient_checkpointing'", "'maybe'"]),
    ("learning_rate=true", ["'learning_rate'", "True"]),
    ("data.allow_duplicates=3", ["'data.allow_duplicates'", "true or false"]),
    ("lora.target_modules=[1, 2]", ["'lora.target_modules'"]),
    ("data.columns=[a]", ["'data.columns'"]),
    ("lora=3", ["'lora'", "mapping"]),
    ("model=null", ["'model'", "null"]),
    ("noequals", ["KEY=VALUE"]),
    ("max_steps=1000000000000000000000", ["'max_steps'", "at most 2,147,483,647"]),
    ("seq_len=3000000000", ["'seq_len'", "at most 2,147,483,647"]),
    ("epochs=1e12", ["'epochs'", "at most 1,000,000"]),
    ("seed=4294967296", ["'seed'", "2**32"]),
    # Names of models and stores: checked here, not after the libraries load (or as a local folder 'gs:').
    ("model=hf://Qwen/Qwen3-8B", ["'model'", "repo id alone", "'Qwen/Qwen3-8B'"]),
    ("model=https://huggingface.co/Qwen/Qwen3-8B/tree/main", ["web address", "'Qwen/Qwen3-8B'"]),
    ("model=Qwén/Qwen3-8B", ["no such folder here", "not a Hub repo id"]),
    ("model=Qwen//Qwen3-8B", ["no such folder here", "not a Hub repo id"]),
    ("model=Qwen/Qwen3-8B..", ["not a Hub repo id"]),
    ("model=-Qwen/Qwen3-8B", ["not a Hub repo id"]),
    ("model=s3://bucket/qwen", ["not a s3:// address", "download it"]),
    ("store=gs://bucket/ckpts", ["'store'", "hf://owner/name or a local directory", "mount it"]),
    ("store=s3://bucket/ckpts", ["bucket (s3://)"]),
    ("store=hf:me/ckpts", ["written hf://owner/name"]),
    ("store=hf://me//ckpts", ["invalid Hugging Face repo id 'me//ckpts'", "expected hf://owner/name"]),
    ("store=https://huggingface.co/me/ckpts", ["hf://me/ckpts"]),
])
def test_bad_overrides_are_one_line_usage_errors(override, words):
    with pytest.raises(UsageError) as e:
        config.load(None, [override])
    msg = str(e.value)
    assert "\n" not in msg and e.value.exit_code == 2
    for w in words:
        assert w in msg


@pytest.mark.parametrize("override", ["model=Qwen/Qwen3-8B", "model=gpt2", "model=models/tiny-qwen3",
                                      "model=/kaggle/input/qwen-3/transformers/8b/1", "model=~/models/q",
                                      "store=hf://me/qwen3-ckpts", "store=/kaggle/working/ckpts", "store=ckpts"])
def test_good_model_and_store_names_are_kept(override):
    """Absolute paths may exist only where the job runs (a Kaggle input): the script checks those."""
    key, value = override.split("=", 1)
    assert getattr(config.load(None, [override]), key) == value


def test_the_largest_sensible_values_are_kept():
    cfg = config.load(None, ["max_steps=2147483647", "seed=4294967295", "epochs=1000000"])
    assert (cfg.max_steps, cfg.seed, cfg.epochs) == (2147483647, 4294967295, 1e6)


@pytest.mark.parametrize("text, line, key", [
    ("learning_rate: 2.0e-4\nseed: 1\nlearning_rate: 2.0e-2\n", 3, "learning_rate"),
    ("lora:\n  r: 8\n  alpha: 16\n  r: 16\n", 4, "r"),
    ("lora: {r: 8, r: 16}\n", 1, "r"),
])
def test_a_key_given_twice_is_refused_not_last_wins(tmp_path, text, line, key):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(UsageError, match=rf"c.yaml line {line}: key '{key}' is given twice \(first on line \d\)"):
        config.load(str(tmp_path / "c.yaml"))


def test_yaml_merge_keys_still_load(tmp_path):
    (tmp_path / "c.yaml").write_text("lora:\n  <<: {r: 8, alpha: 16}\n  dropout: 0.1\n")
    cfg = config.load(str(tmp_path / "c.yaml"))
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (8, 16, 0.1)


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "model: x\nlora:\n  r: 8\n   alpha: [1\n")
    with pytest.raises(UsageError, match=r"line \d+"):
        config.load(path)


def test_unknown_nested_key_in_file_names_file_and_suggestion(tmp_path):
    path = write(tmp_path, "data:\n  pth: x.jsonl\n")
    with pytest.raises(UsageError, match=r"'data.pth' in .*c.yaml; did you mean 'data.path'"):
        config.load(path)


def test_non_mapping_and_missing_files(tmp_path):
    with pytest.raises(UsageError, match="must be a mapping"):
        config.load(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(UsageError, match="cannot read config"):
        config.load(str(tmp_path / "missing.yaml"))
    # A file with no settings is refused, not planned as the built-in defaults (see test_bad_input).
    with pytest.raises(UsageError, match="is empty"):
        config.load(write(tmp_path, "# only a comment\n"))


def test_exponent_floats_without_a_dot(tmp_path):
    # PyYAML (YAML 1.1) reads 2e-4 as the string "2e-4"; everyone writes learning rates that way.
    assert config.load(write(tmp_path, "learning_rate: 2e-4\n")).learning_rate == 2e-4
    assert config.load(None, ["weight_decay=1e-2"]).weight_decay == 0.01


def test_round_trip_through_yaml(tmp_path):
    cfg = config.load(None, ["lora.target_modules=[q_proj]", "store=hf://me/ckpt", "gradient_checkpointing=on"])
    again = config.load(write(tmp_path, config.dump_yaml(cfg)))
    assert again == cfg and config.from_dict(config.to_dict(cfg)) == cfg


def test_fingerprint_and_diff():
    a = config_fields(config.load(None))
    b = config_fields(config.load(None, ["lora.r=8", "learning_rate=1e-3"]))
    assert set(a) == {"model", "revision", "method", "lora.r", "lora.target_modules", "data.path",
                      "data.format", "data.columns", "seq_len"}
    assert diff_lines(a, a) == []
    [only] = diff_lines(a, b)  # lr may change
    assert only.startswith("lora.r: ") and only.split()[1:] == ["16", "(checkpoint)", "!=", "8", "(config)"]


def test_cli_arguments_helper():
    parser = argparse.ArgumentParser()
    config.add_config_arguments(parser)
    args = parser.parse_args(["--config", "configs/default.yaml", "lora.r=8", "seq_len=64"])
    assert args.config == "configs/default.yaml" and args.overrides == ["lora.r=8", "seq_len=64"]
    cfg = config.from_args(parser.parse_args(["lora.r=8"]))
    assert cfg.lora.r == 8


def test_every_field_is_documented():
    rows = config.describe()
    assert len(rows) >= 35 and all(help_text for _, help_text, _ in rows)
