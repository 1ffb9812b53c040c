"""`kit convert` ports a notebook's old transformers/TRL/datasets/PEFT spellings to ones the installed
libraries accept (each listed with the version that changed it), and names in one REVIEW line what
has no mechanical new spelling. The table is checked here against the installed libraries' own
signatures and fields, and the ported calls are built for real."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect

import pytest

from kit.notebooks.convert import convert_notebook
from kit.notebooks.convert.ports import (CONFIG_RENAMES, CONFIG_REVIEW, EXPERIMENTAL, REMOVED_IMPORTS, TRAINER_MOVES,
                                         TRAINING_ARGS, TRAINING_ARGS_REVIEW)
from tests.code_asserts import assigns, call
from tests.test_convert import TRAIN, keywords, make_nb, texts


def port_imports(source: str) -> set[tuple[str, str]]:
    """(module, name) of each import line kit marked `# kit: port` ("" as the module of `import name`)."""
    found = set()
    for line in source.splitlines():
        if line.rstrip().endswith("# kit: port"):
            node = ast.parse(line.strip()).body[0]
            module = getattr(node, "module", None) or ""
            found |= {(module, a.name) for a in node.names}
    return found

@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture
def trl():
    return pytest.importorskip("trl")


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_table_matches_the_installed_libraries(transformers, trl):
    """Every old spelling is really gone from the installed versions, every new one really there."""
    args = _fields(transformers.TrainingArguments)
    for old, (new, _) in TRAINING_ARGS.items():
        if old.startswith("activation_"):  # 5.24 has both; 5.17 only the gradient_ name
            assert new in args
            continue
        assert old not in args, old
        assert new is None or new in args, new
    assert not set(TRAINING_ARGS_REVIEW) & args
    for trainer, (config, moves) in TRAINER_MOVES.items():
        signature = inspect.signature(getattr(trl, trainer).__init__).parameters
        fields = _fields(getattr(trl, config))
        for old, new in moves.items():
            assert old not in signature, (trainer, old)
            assert new is None or new in fields, (config, new)
    for config, renames in CONFIG_RENAMES.items():
        fields = _fields(getattr(trl, config))
        assert all(old not in fields and new in fields for old, new in renames.items())
    for config, gone in CONFIG_REVIEW.items():
        where = importlib.import_module(f"trl.experimental.{EXPERIMENTAL[config]}") if config in EXPERIMENTAL else trl
        assert not gone & _fields(getattr(where, config)), config
    for module, name in REMOVED_IMPORTS:
        mod = importlib.import_module(module)
        assert not hasattr(mod, name), (module, name)
    for name, sub in EXPERIMENTAL.items():  # gone from TRL's top level, there in trl.experimental
        assert not hasattr(trl, name) and hasattr(importlib.import_module(f"trl.experimental.{sub}"), name), name
    trainer = inspect.signature(transformers.Trainer.__init__).parameters
    assert "tokenizer" not in trainer and "processing_class" in trainer


OLD = [
    "from datasets import load_dataset, load_metric\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments\n"
    "from trl import SFTTrainer, setup_chat_format\n"
    "from peft import prepare_model_for_int8_training",
    "model = AutoModelForCausalLM.from_pretrained('org/m', load_in_8bit=True, torch_dtype='auto', use_auth_token=True)\n"
    "tok = AutoTokenizer.from_pretrained('org/m')\nmodel = prepare_model_for_int8_training(model)\n"
    "model, tok = setup_chat_format(model, tok)\nsetup_chat_format(model, tok)\nmetric = load_metric('accuracy')",
    "ds = load_dataset('org/d', trust_remote_code=True)\nmax_seq_length = 512",
    "args = TrainingArguments(output_dir='o', evaluation_strategy='steps', group_by_length=True, logging_dir='./logs',\n"
    "    warmup_ratio=0.1, overwrite_output_dir=True, no_cuda=False, split_batches=True)",
    "trainer = SFTTrainer(model=model, tokenizer=tok, args=args, train_dataset=ds['train'],\n"
    "    dataset_text_field='text', max_seq_length=max_seq_length, packing=False, infinite=True)\ntrainer.train()",
]


def test_old_apis_are_rewritten_and_listed_with_their_version(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, OLD))
    src, changes = conv.source, "\n".join(texts(conv))
    args = keywords(src, "SFTConfig")  # TrainingArguments took TRL's keywords: it became an SFTConfig
    assert args["eval_strategy"] == "'steps'" and args["train_sampling_strategy"] == "'group_by_length'"
    assert args["warmup_steps"] == "0.1" and args["use_cpu"] and args["max_length"] == "max_seq_length"
    assert args["dataset_text_field"] == "'text'" and args["packing"] == "False"
    used = {k.arg for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) for k in n.keywords}
    assert not used & {"evaluation_strategy", "group_by_length", "logging_dir", "overwrite_output_dir", "split_batches",
                       "no_cuda", "warmup_ratio", "infinite", "max_seq_length", "tokenizer", "torch_dtype",
                       "use_auth_token", "trust_remote_code"}  # load_in_8bit is BitsAndBytesConfig's
    assert keywords(src, "SFTTrainer")["processing_class"] == "tok"
    load = keywords(src, "AutoModelForCausalLM.from_pretrained")
    assert load == {"dtype": "'auto'", "token": "True", "quantization_config": "BitsAndBytesConfig(load_in_8bit=True)"}
    ported = port_imports(src)
    assert {("trl", "SFTConfig"), ("", "evaluate"), ("transformers", "BitsAndBytesConfig")} <= ported
    assert ("metric", "evaluate.load('accuracy')") in assigns(src) and call(src, "prepare_model_for_kbit_training")
    assert "evaluation_strategy='steps'" in changes and "→ eval_strategy='steps'" in changes
    assert "(renamed" in changes and "removed in transformers" in changes and "5.0" in changes
    assert "tokenizer= →" in changes and "→ processing_class=" in changes and "5.0 and TRL 0.12" in changes
    assert "datasets 3.0 removed" in changes and "load_metric" in changes and "PEFT 0.10" in changes
    reviews = [c for c in conv.changes if c.review and "port:" in c.text]
    # Not mechanical: one REVIEW line each (setup_chat_format is used twice, named once).
    assert sum("setup_chat_format" in c.text for c in reviews) == 1
    assert sum("split_batches" in c.text for c in reviews) == 1 and sum("trust_remote_code" in c.text
                                                                        for c in reviews) == 1
    flagged = [ln for ln in src.splitlines() if "# kit: REVIEW (cell 1)" in ln and "setup_chat_format`" in ln]
    assert len(flagged) == 1 and "port: `from trl import" in flagged[0]


def test_ported_configs_build_on_the_installed_libraries(tmp_path, transformers, trl):
    """The rewritten calls are not just text: the installed TrainingArguments/SFTConfig/DPOConfig take them."""
    nb = make_nb(tmp_path, [
        "from transformers import TrainingArguments\nfrom trl import DPOConfig, DPOTrainer, SFTTrainer",
        "a = TrainingArguments(output_dir='a', evaluation_strategy='epoch', group_by_length=True, adafactor=True,\n"
        "    include_inputs_for_metrics=True, per_gpu_train_batch_size=4, logging_dir='l', warmup_ratio=0.05,\n"
        "    activation_checkpointing=True)",
        "d = DPOConfig(output_dir='d', max_prompt_length=128, max_length=256)",
        "t = DPOTrainer(model=m, args=d, train_dataset=x, tokenizer=tok, beta=0.2, loss_type='ipo')\nt.train()"])
    src = convert_notebook(nb).source
    for func, cls in (("TrainingArguments", transformers.TrainingArguments), ("DPOConfig", trl.DPOConfig)):
        kw = {k: eval(v, {"torch": __import__("torch")}) for k, v in keywords(src, func).items()}
        kw["output_dir"] = str(tmp_path / func)
        built = cls(**kw)
        if func == "DPOConfig":
            assert built.beta == 0.2 and built.loss_type in ("ipo", ["ipo"]) and built.max_length == 256
        else:
            assert built.eval_strategy == "epoch" and built.train_sampling_strategy == "group_by_length"
            assert built.optim == "adafactor" and built.include_for_metrics == ["inputs"]
            assert built.per_device_train_batch_size == 4 and built.gradient_checkpointing
    assert "max_prompt_length" not in keywords(src, "DPOConfig")
    assert "beta" not in keywords(src, "DPOTrainer") and keywords(src, "DPOTrainer")["processing_class"] == "tok"


def test_moved_trainer_keywords_that_cannot_be_followed_are_one_review_line(tmp_path):
    """args= built somewhere kit cannot follow (a function's result): the keywords cannot be moved."""
    nb = make_nb(tmp_path, ["from trl import SFTTrainer",
                            "trainer = SFTTrainer(model=m, args=make_args(), train_dataset=d, dataset_text_field='text',"
                            " packing=True)\ntrainer.train()"])
    conv = convert_notebook(nb)
    reviews = [str(c) for c in conv.changes if c.review and "SFTTrainer" in c.text]
    assert len(reviews) == 1 and "dataset_text_field=," in reviews[0] and " packing=" in reviews[0]
    assert "args=make_args()" in reviews[0]
    assert "dataset_text_field" not in keywords(conv.source, "SFTTrainer")


def test_a_trainer_without_args_gets_its_config_for_the_moved_keywords(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, [
        "from trl import SFTTrainer", "trainer = SFTTrainer(model=m, train_dataset=d, max_seq_length=1024)\ntrainer.train()"]))
    assert keywords(conv.source, "SFTTrainer")["args"].startswith("SFTConfig(max_length=1024")
    assert ("trl", "SFTConfig") in port_imports(conv.source)
    ast.parse(conv.source)


def _cells_code(source: str, first: int, last: int) -> str:
    """The converted statements of notebook cells first..last, out of the script's try block."""
    import textwrap

    lines = source.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == f"# --- notebook cell {first} ---")
    end = next(i for i, ln in enumerate(lines) if ln.strip() == f"# --- notebook cell {last + 1} ---")
    return textwrap.dedent("\n".join(lines[start:end]))


def test_chat_template_token_ids_come_back_as_the_notebook_reads_them(tmp_path):
    """transformers 5 returns a BatchEncoding from a tokenizing apply_chat_template: Unsloth's GRPO
    notebooks' `len(tokenizer.apply_chat_template(x))` counted its 2 keys, and their batched
    `dataset.map(lambda x: {"tokens": tokenizer.apply_chat_template(x["prompt"], tokenize=True)})`
    stopped (a dict is no column). Each tokenizing call gets return_dict=False, listed; the ids are v4's."""
    from kit.notebooks.convert.standins import TINY_MODEL

    prep = ("msgs = [{'role': 'user', 'content': 'What is 2+2?'}]\n"
            "ids = tokenizer.apply_chat_template(msgs, add_generation_prompt = True)\n"
            "first = tokenizer.apply_chat_template(msgs, tokenize = True)[0]\n"
            "df = pd.DataFrame({'Messages': [msgs, msgs + [{'role': 'assistant', 'content': '4'}]]})\n"
            "df['N'] = df['Messages'].apply(lambda x: len(tokenizer.apply_chat_template(x)))\n"
            "d = Dataset.from_dict({'prompt': [msgs, msgs]})\n"
            "tokenized = d.map(\n    lambda x: {'tokens': tokenizer.apply_chat_template(x['prompt'], "
            "add_generation_prompt = True, tokenize = True)},\n    batched = True,\n)\n"
            "tokenized = tokenized.map(lambda x: {'L': len(x['tokens'])})\n"
            "pt = tokenizer.apply_chat_template(msgs, add_generation_prompt = True, return_tensors = 'pt')\n"
            "text = tokenizer.apply_chat_template(msgs, tokenize = False)\n"
            "enc = tokenizer.apply_chat_template(msgs, return_dict = True)\n"
            "kw = {'add_generation_prompt': True}\nsplat = tokenizer.apply_chat_template(msgs, **kw)")
    conv = convert_notebook(make_nb(tmp_path, [
        "import pandas as pd\nfrom datasets import Dataset\nfrom transformers import AutoTokenizer\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(TINY_MODEL)!r})", prep, *TRAIN]))
    space: dict = {"is_main": True}
    exec(_cells_code(conv.source, 1, 2), space)
    tokenizer, msgs = space["tokenizer"], space["msgs"]
    want = tokenizer(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
    assert space["ids"] == want and space["first"] == want[0]
    assert list(space["df"]["N"]) == [len(tokenizer.apply_chat_template(m, return_dict=False))
                                      for m in space["df"]["Messages"]] and min(space["df"]["N"]) > 2
    assert space["tokenized"]["L"] == [len(want)] * 2 and space["tokenized"][0]["tokens"] == want
    assert tuple(space["pt"].shape) == (1, len(want))
    assert isinstance(space["text"], str) and list(space["enc"]["input_ids"]) == space["enc"]["input_ids"]
    ported = [c for c in conv.changes if "apply_chat_template" in c.text]
    assert [(c.cell, c.review) for c in ported] == [(2, False), (2, True)]  # one line a cell, and the REVIEW
    assert all("return_dict=False" in c.text and "transformers 5.0" in c.text for c in ported)
    code_lines = [ln for ln in conv.source.splitlines() if not ln.strip().startswith("#")]
    assert sum(ln.count("return_dict=False") for ln in code_lines) == 5 and "REVIEW (cell 2)" in conv.source


def test_trainers_trl_moved_to_experimental_are_imported_from_there(tmp_path):
    """Unsloth's ORPO notebook: `from trl import ORPOConfig, ORPOTrainer` failed on TRL 1.x, which moved them
    to trl.experimental.orpo. Now they are imported from there (an alias kept), each listed."""
    conv = convert_notebook(make_nb(tmp_path, [
        "from trl import ORPOConfig, ORPOTrainer as OT, SFTConfig",
        "trainer = OT(model=m, args=ORPOConfig(output_dir='o'), train_dataset=d, tokenizer=t)\ntrainer.train()"]))
    assert port_imports(conv.source) >= {("trl.experimental.orpo", "ORPOConfig"), ("trl.experimental.orpo", "ORPOTrainer")}
    kept = [ln.strip() for ln in conv.source.splitlines() if ln.strip().startswith("from trl import")]
    assert [ln.split()[-1] for ln in kept] == ["SFTConfig"]
    assert sum("trl.experimental" in c.text for c in conv.changes) == 2
    namespace: dict = {}
    for line in conv.source.splitlines():
        if line.rstrip().endswith("# kit: port") and "experimental" in line:
            exec(line.split("#")[0], namespace)  # the installed TRL has them there
    assert {"ORPOConfig", "OT"} <= set(namespace)


def test_a_trainer_keyword_no_trl_config_has_now_is_dropped_for_review(tmp_path):
    """Unsloth's Zephyr DPO notebook passes DPOTrainer(max_prompt_length=512), a trainer keyword until TRL 0.11
    that DPOConfig no longer has either: the trainer stopped with a TypeError. Now it is dropped, one REVIEW."""
    conv = convert_notebook(make_nb(tmp_path, [
        "from trl import DPOConfig, DPOTrainer",
        "t = DPOTrainer(model=m, args=DPOConfig(output_dir='o', beta=0.1), train_dataset=d, max_prompt_length=512,\n"
        "               max_length=1024)\nt.train()"]))
    trainer = keywords(conv.source, "DPOTrainer")
    assert "max_prompt_length" not in trainer and "max_length" not in trainer
    assert keywords(conv.source, "DPOConfig")["max_length"] == "1024"
    reviews = [c for c in conv.changes if c.review and "max_prompt_length=512" in c.text]
    assert len(reviews) == 1 and reviews[0].cell == 2 and "DPOTrainer" in reviews[0].text
