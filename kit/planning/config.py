"""The run config: typed dataclasses are the truth, YAML files and `key=value` overrides hold values.

    cfg = load("configs/qwen3-8b-qlora-kaggle-t4x2.yaml", ["lora.r=8", "seq_len=1024"])

Every field carries its help text in `metadata["help"]`, which `describe()` and the CLI reuse.
Every error is a one-line `UsageError` (exit 2) naming the key and the value.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kit.errors import UsageError, shown
from kit.files import read_text, refuse_shared_folder
from kit.planning.config_values import check_value, unknown_key


def _f(default, help_text, **kw):
    """A dataclass field with its help text; mutable defaults go through default_factory."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help_text, **kw})
    return field(default=default, metadata={"help": help_text, **kw})


@dataclass
class LoraConfig:
    """LoRA adapter shape (used by method lora and qlora)."""

    r: int = _f(16, "LoRA rank: trainable params per targeted linear = r x (in + out)")
    alpha: float = _f(32, "LoRA scaling numerator; the update is scaled by alpha / r")
    dropout: float = _f(0.0, "dropout on the LoRA input, in [0, 1)")
    target_modules: Any = _f("all-linear", "'all-linear' or a list of module names, e.g. [q_proj, v_proj]")


@dataclass
class DataConfig:
    """Where the training examples come from and how they are read."""

    path: str = _f("data/ha_commands.jsonl", "a local .jsonl/.json/.csv/.parquet file or a Hub dataset id")
    format: str = _f("auto", "auto|messages|alpaca|prompt_completion|text (trainer sft) | preference "
                   "(dpo: prompt, chosen, rejected) | unpaired_preference (kto: prompt, completion, label) | prompts "
                   "(grpo: prompt, plus any columns the rewards read); auto detects from the columns")
    columns: dict = _f({}, "rename map from your column names to the format's, e.g. {instruction: question}")
    split: str = _f("train", "dataset split to read")
    eval_fraction: float = _f(0.1, "share of examples held out for evaluation, in [0, 1)")
    max_duplicate_fraction: float = _f(0.05, "refuse data with more exact duplicates than this share")
    allow_duplicates: bool = _f(False, "train even when duplicates exceed max_duplicate_fraction")


@dataclass
class EvalConfig:
    """The evaluation before the first step and after the last (kit.evaluation), on held-out rows."""

    baseline: bool = _f(True, "evaluate the starting model before the first step (once per job, kept in the store)")
    final: bool = _f(True, "evaluate again after the last step, on the same rows (final/ is written either way)")
    subset: int = _f(64, "held-out rows evaluated (a fixed, seeded choice; all of them when fewer)")
    metric: str = _f("auto", "auto|exact_match|none; auto = exact match of the generated answer when the "
                     "data has prompts and answers, none for plain text")
    min_rows: int = _f(10, "fewest held-out rows the task metric is computed on; fewer = skipped, reason recorded")
    samples: int = _f(5, "held-out prompts answered before and after training (greedy), written to samples.md")
    max_new_tokens: int = _f(64, "most tokens generated per answer for the metric and the samples")


@dataclass
class DpoConfig:
    """Settings of trainer=dpo (TRL's DPOTrainer): pairs of a preferred and a dispreferred answer."""

    beta: float = _f(0.1, "how far the policy may move from the reference (the starting model): higher = less; "
                     "the implicit reward of an answer is beta x (log p_policy - log p_reference)")
    loss_type: str = _f("sigmoid", "sigmoid (DPO) | hinge (SLiC) | ipo | robust | sigmoid_norm: TRL's DPO loss; "
                        "prompt + answer are cut to seq_len tokens each, chosen and rejected alike")
    precompute_ref_log_probs: str = _f("auto", "auto|on|off: on = the reference's log-probabilities computed "
                                       "once before training (one process only); auto/off = scored at every "
                                       "step: the base with the adapter disabled (LoRA, no copy) or a second "
                                       "frozen model copy (method=full)")


@dataclass
class KtoConfig:
    """Settings of trainer=kto (TRL's KTOTrainer): single answers labelled desirable or not."""

    beta: float = _f(0.1, "how far the policy may move from the reference (the starting model): higher = less")
    desirable_weight: float = _f(1.0, "weight of the desirable rows' loss; raise it when they are the minority")
    undesirable_weight: float = _f(1.0, "weight of the undesirable rows' loss; raise it when they are the minority")
    precompute_ref_log_probs: str = _f("auto", "auto|on|off: as dpo.precompute_ref_log_probs")


@dataclass
class GrpoConfig:
    """Settings of trainer=grpo (TRL's GRPOTrainer): prompts, completions sampled by the model, scored by the user's
    reward functions."""

    rewards: str | None = _f(None, "the reward functions: FILE.py:name,name (a Python file beside the config, each "
                             "function taking completions and **kwargs, returning one float per completion)")
    num_generations: int = _f(8, "completions sampled per prompt and compared with each other; the global batch "
                              "(per_device x GPUs x accumulation) must be divisible by it: the planner picks one")
    max_completion_length: int = _f(256, "most tokens generated per completion (prompts over seq_len tokens are "
                              "left out, counted in the log)")
    temperature: float = _f(1.0, "sampling temperature of the completions")
    beta: float = _f(0.0, "KL coefficient against the reference (the starting model); 0 = no reference pass, "
                     "as TRL's default; with LoRA the reference is the base with the adapter disabled")
    loss_type: str = _f("dapo", "dapo | grpo | dr_grpo | bnpo: TRL's GRPO loss (dapo: token-level, TRL's default)")
    system_prompt: str | None = _f(None, "a system message put before every prompt, e.g. the answer format the rewards "
                                   "score: a string prompt becomes chat messages (this system message, then the prompt "
                                   "as the user's), a chat prompt without a system message gets it first; null = the "
                                   "prompts as they are")
    reward_timeout: float = _f(300.0, "most seconds one call of a reward function may take (the file's import and "
                               "the dry call on 2 rows too); past it the job stops with one error line naming it "
                               "instead of every rank waiting")


@dataclass
class RunConfig:
    """One fine-tuning run: model, method, data, schedule, checkpoints."""

    model: str = _f("models/tiny-qwen3", "local model directory or Hub id, e.g. Qwen/Qwen3-8B")
    revision: str | None = _f(None, "Hub revision (branch, tag or commit) of the model; null = main")
    method: str = _f("lora", "lora (16-bit base + adapter) | qlora (4-bit nf4 base + adapter) | full")
    trainer: str = _f("sft", "sft (supervised: prompts and answers) | dpo (preference pairs: prompt, chosen, "
                             "rejected) | kto (answers labelled good or bad: prompt, completion, label) | grpo (prompts "
                             "and reward functions: grpo.rewards)")
    backend: str = _f("auto", "auto|transformers|unsloth; auto picks unsloth on one NVIDIA GPU when installed")
    strategy: str = _f("auto", "auto|ddp|fsdp|model_parallel; auto = a replica per GPU (DDP) when one fits, "
                               "else FSDP sharding, else the layers split over the GPUs in one process")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapter settings"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "training data settings"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "baseline and final evaluation"})
    dpo: DpoConfig = field(default_factory=DpoConfig, metadata={"help": "trainer=dpo settings"})
    kto: KtoConfig = field(default_factory=KtoConfig, metadata={"help": "trainer=kto settings"})
    grpo: GrpoConfig = field(default_factory=GrpoConfig, metadata={"help": "trainer=grpo settings"})
    seq_len: int = _f(512, "maximum tokens per example; longer examples are truncated")
    per_device_batch: int | None = _f(None, "micro-batch per GPU; null = the planner picks what fits")
    global_batch: int | None = _f(None, "examples per optimizer step over all GPUs; null = per_device x world")
    epochs: float = _f(1.0, "passes over the training data (used when max_steps is null)")
    max_steps: int | None = _f(None, "optimizer steps to run; null = derived from epochs")
    learning_rate: float = _f(2e-4, "peak learning rate")
    lr_scheduler: str = _f("cosine", "cosine|linear|constant|constant_with_warmup")
    warmup_steps: int = _f(0, "linear warmup steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    optimizer: str = _f("auto", "auto|adamw_torch|adamw_torch_fused|adamw_8bit|paged_adamw_8bit")
    batching: str = _f("auto", "auto|padded|grouped|padding_free|packed: how rows of unequal length share a "
                               "micro-batch (packed: rows packed into seq_len-long sequences)")
    kernels: str = _f("auto", "auto|liger|none: liger = Liger's Triton kernels (RMSNorm, SwiGLU, RoPE) on the GPU")
    activation_offloading: str = _f("auto", "auto|on|off: the layer inputs gradient checkpointing keeps, moved to "
                                            "pinned CPU memory during the step (TRL's activation_offloading)")
    compile: str = _f("auto", "auto|on|off: torch.compile each decoder layer (plain backend, GPU); auto = on for "
                            "bf16 NVIDIA GPUs with one replica per GPU, for jobs of at least 300 micro-batches")
    max_grad_norm: float = _f(1.0, "gradient clipping norm; 0 disables")
    precision: str = _f("auto", "auto|bf16|fp16|fp32; auto = bf16 where native, fp16 on T4/V100, fp32 on CPU")
    gradient_checkpointing: str = _f("auto", "auto|on|off; auto = on when needed to fit or model >= 1B params")
    output_dir: str = _f("outputs/default", "local directory for checkpoints and the final adapter")
    store: str | None = _f(None, "checkpoint store: hf://owner/name, a directory, or null for output_dir only")
    save_steps: int = _f(50, "save a checkpoint every this many optimizer steps")
    save_every_minutes: float | str = _f(30.0, "also save when this many minutes passed since the last save; "
                                         "auto = from the measured save + upload time and the risk of a cut")
    keep_checkpoints: int = _f(3, "checkpoints kept locally and in the store")
    lease_heartbeat_seconds: float = _f(60.0, "refresh the store's lease this often; a cut session's lease is "
                                        "taken over after 3 missed heartbeats (each one is a Hub commit)")
    squash_history_every: int = _f(0, "Hub store: squash the repo's history after every this many "
                                   "publishes, so removed checkpoints stop using storage; 0 = never")
    time_budget_minutes: float | None = _f(None, "stop cleanly before this many minutes; null = platform default")
    seed: int = _f(42, "random seed")
    logging_steps: int = _f(10, "log loss every this many steps")
    report_to: str = _f("none", "none|auto|trackio|wandb|tensorboard: the experiment tracker, logged from rank 0 and "
                        "named by kit's run id (a resumed job continues the same tracked run); auto = trackio where "
                        "installed, else none. Keys come from WANDB_API_KEY (or a Kaggle/Colab secret of that name)")
    eval_steps: int | None = _f(None, "evaluate every this many steps; null = at the end only")
    resume: str = _f("auto", "auto (newest complete checkpoint, silent if none) | never | a checkpoint PATH")


_SECTIONS = {"lora": LoraConfig, "data": DataConfig, "eval": EvalConfig, "dpo": DpoConfig, "kto": KtoConfig,
             "grpo": GrpoConfig}
def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def from_dict(d: dict | None, source: str = "") -> RunConfig:
    """Build a RunConfig from a (possibly partial) nested dict; missing keys keep their defaults."""
    cfg = RunConfig()
    for key, value in (d or {}).items():
        set_value(cfg, str(key), value, source)
    return cfg


def set_value(cfg: RunConfig, key: str, value, source: str = "") -> None:
    """Set dotted `key` (e.g. `lora.r`) on cfg after checking it; a whole section may be a dict."""
    from kit.auth import refuse_token

    # Settings are written into train_ddp.py, checkpoints and the store: a token never is.
    refuse_token(value, f"config key {shown(key, quote=True)}" + (f" in {source}" if source else ""))
    top, _, rest = key.partition(".")
    fields = _fields(RunConfig)
    if top not in fields:
        raise unknown_key(key, fields, "", source, value)
    if top in _SECTIONS:
        section = getattr(cfg, top)
        sub = _fields(_SECTIONS[top])
        if not rest:
            if not isinstance(value, dict):
                where = f" in {source}" if source else ""
                raise UsageError(f"config key {top!r}{where} must be a mapping, got {shown(value, quote=True)}")
            for k, v in value.items():
                set_value(cfg, f"{top}.{k}", v, source)
            return
        if rest not in sub:
            raise unknown_key(key, sub, f"{top}.", source, value)
        setattr(section, rest, check_value(key, sub[rest], value, source))
        return
    if rest:
        raise unknown_key(key, fields, "", source)
    setattr(cfg, top, check_value(key, fields[top], value, source))


def parse_overrides(overrides) -> list[tuple[str, Any]]:
    """Parse `key=value` strings; values are YAML scalars (`8` → int, `null` → None, `[a, b]` → list)."""
    import yaml

    overrides = list(overrides or ())
    if len(overrides) > MAX_OVERRIDES:  # each is parsed as YAML: 100,000 of them took a minute before a word
        raise UsageError(f"{len(overrides):,} key=value overrides; a run has at most {MAX_OVERRIDES:,}: put the "
                         "settings in a config file")
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"override {shown(item, quote=True)} is not KEY=VALUE (e.g. lora.r=8)")
        name = shown(key.strip(), quote=True)
        try:
            # The loader that refuses a key given twice, as in a file: `lora={r: 4, r: 8}` kept 8 silently.
            value = yaml.load(raw, Loader=_unique_keys_loader()) if raw.strip() else ""
        except yaml.YAMLError as e:
            if "is given twice" in str(getattr(e, "problem", "")):
                raise UsageError(f"override {name}: {e.problem.split(' (first on line')[0]}") from None
            value = raw  # an unparseable scalar is kept as the literal string
        except (ValueError, RecursionError):  # an integer past 4300 digits, or nested past Python's limit
            raise UsageError(f"override {name}: a value too large or nested too deep to read") from None
        _check_size(value, f"override {name}")
        pairs.append((key.strip(), _unfolded(raw, value, name)))
    return pairs


_LINE_BREAKS = "\n\r\x85\u2028\u2029"  # what YAML folds into a space inside a scalar


def _unfolded(raw: str, value, name: str):
    """`value` as the command line gave it where YAML would have changed a string's characters: a line
    break inside a scalar folds into a space (`data.path=$'a\\nb.jsonl'` became 'a b.jsonl') and ` #…`
    is a comment (`store=/x #1` became '/x'). A plain string is kept as typed (its check then refuses a
    line break by name); a line break inside a quoted string or a list's or mapping's item is refused."""
    import yaml

    if value is raw or not raw.strip() or not any(c in raw for c in _LINE_BREAKS + "#"):
        return value  # unparseable (kept as typed), empty, or nothing YAML would drop or fold
    top = yaml.compose(raw, Loader=yaml.SafeLoader)
    if top is None or (isinstance(value, str) and isinstance(top, yaml.ScalarNode) and top.style is None):
        return raw.strip()  # a plain string (or one YAML reads as only a comment, `#run1`): the text itself
    todo, folded = [top], False
    while todo and not folded:
        node = todo.pop()
        if isinstance(node, yaml.ScalarNode):
            folded = any(c in raw[node.start_mark.index:node.end_mark.index] for c in _LINE_BREAKS)
        elif isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            todo.extend(n for item in node.value for n in (item if isinstance(item, tuple) else (item,)))
    if not folded:  # line breaks between a list's items or around the value: YAML's own layout
        return value
    raise UsageError(f"override {name}: {shown(raw, quote=True)} holds a line break inside a value: write it "
                     "on one line")


def given(overrides, key: str) -> bool:
    """Whether `key` is among the `key=value` overrides (a value from the command line, not a file)."""
    return any(k == key for k, _ in parse_overrides(overrides))


MAX_OVERRIDES = 1000  # key=value arguments on one command line (there are about 60 keys)
MAX_NODES = 10_000  # values in one config, YAML aliases expanded: a real one has about a hundred


def _check_size(data, what: str) -> None:
    """Refuse a value that YAML aliases blow up (`&a [*b, *b, …]` nested: a billion strings from a few
    lines) before anything walks or prints it expanded."""
    count, todo = 0, [data]
    while todo:
        item = todo.pop()
        count += 1
        if count > MAX_NODES:
            raise UsageError(f"{what} expands to over {MAX_NODES:,} values (YAML aliases?): not a kit config")
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


def load(path: str | None = None, overrides=()) -> RunConfig:
    """Read a YAML config (None → defaults) and apply `key=value` overrides on top."""
    import yaml

    data: dict = {}
    if path is not None:
        text = read_text(path, "config")
        where = shown(path)
        try:
            data = yaml.load(text, Loader=_unique_keys_loader())
        except (ValueError, RecursionError):  # an integer past 4300 digits, or nested past Python's limit
            raise UsageError(f"config {where} holds a value too large or nested too deep to read") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise UsageError(f"malformed YAML in {where}{line}: {problem}") from None
        if data is None or data == {}:  # planning the built-in defaults instead would be silent
            raise UsageError(f"config {where} is empty (no settings, only comments or blank lines): write the "
                             "settings into it (e.g. `model: Qwen/Qwen3-0.6B`), or leave --config out")
        if not isinstance(data, dict):
            raise UsageError(f"config {where} must be a mapping of keys to values (`key: value` lines), got a "
                             f"YAML {type(data).__name__}: {shown(data, quote=True, limit=80)}")
        _check_size(data, f"config {where}")
    cfg = from_dict(data, source=path or "")
    for key, value in parse_overrides(overrides):
        set_value(cfg, key, value, source="command line")
    refuse_shared_folder(cfg.output_dir)  # output_dir=/ filled the root with checkpoints (the script checks again)
    return cfg


def _unique_keys_loader():
    """yaml.SafeLoader, except that a key given twice in one mapping is an error: PyYAML keeps the
    last silently, so `learning_rate: 2e-4` above a forgotten `learning_rate: 2e-2` trained at 2e-2."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    again = key in seen
                except TypeError:  # an unhashable key: the base class says so
                    break
                if again:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {shown(key, quote=True)} is given twice (first on line {seen[key] + 1}); keep one",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

    return UniqueKeys


def to_dict(cfg: RunConfig) -> dict:
    """The config as plain nested dicts/lists (YAML and JSON safe)."""
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: RunConfig) -> str:
    """The config as YAML text, keys in declaration order."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def describe() -> list[tuple[str, str, Any]]:
    """(dotted key, help, default) for every field — for CLI help and docs."""
    rows = []
    for f in dataclasses.fields(RunConfig):
        if f.name in _SECTIONS:
            for sf in dataclasses.fields(_SECTIONS[f.name]):
                rows.append((f"{f.name}.{sf.name}", sf.metadata["help"], getattr(getattr(RunConfig(), f.name), sf.name)))
        else:
            rows.append((f.name, f.metadata["help"], getattr(RunConfig(), f.name)))
    return rows


# The config of the README's main job: what every command uses when no --config is given.
DEFAULT_CONFIG = "configs/default.yaml"


def default_config() -> str | None:
    """DEFAULT_CONFIG when it is in the current folder (the kit checkout), else None: built-in defaults,
    which train the same tiny model into the same output_dir."""
    import os

    return DEFAULT_CONFIG if os.path.isfile(DEFAULT_CONFIG) else None


def add_config_arguments(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """Add `--config PATH` and positional `KEY=VALUE` overrides, the same way for every entry point.

    `default`: the config used without --config (commands pass `default_config()`; the generated
    script passes none: it trains its own SETTINGS).
    """
    keys = ", ".join(k for k, _, _ in describe())
    parser.add_argument("--config", metavar="PATH", default=default,
                        help=f"run config YAML (default: {DEFAULT_CONFIG}, the README's main job, when it is in this "
                             "folder; else built-in defaults)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help=f"override config values, dotted for nested keys (lora.r=8). Keys: {keys}")


def from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig named by the arguments `add_config_arguments` added."""
    return load(getattr(args, "config", None), getattr(args, "overrides", None) or ())
