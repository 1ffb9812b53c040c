"""`kit convert --dry-run`: stand-ins for whatever the notebook passes however it passes it (run-time
decisions in kit.notebooks.convert.standins), GPU-only calls neutralised, other model heads, and
`--run`, which runs the converted script under torchrun (2 ranks on the CPU) itself.

The corpus (tests/test_convert_corpus.py) runs whole notebooks of each shape under torchrun; these
check the pieces in-process."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from kit.cli import main
from kit.notebooks.convert import convert_notebook
from kit.notebooks.convert.dryrun import Plan
from kit.notebooks.convert.standins import FAMILIES, TINY_MODEL, StandIns
from tests.code_asserts import assigns, call, calls, ifexp, mapping, squeeze, words_in
from tests.test_convert import TRAIN, make_nb

FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"


def _plan(*cells: str) -> Plan:
    return Plan([ast.parse(c) for c in cells])


def test_plan_finds_splits_columns_and_the_rows_a_trainer_needs():
    plan = _plan("imdb = load_dataset('stanfordnlp/imdb')\nt = imdb.map(f, batched=True, remove_columns=['text', 'label'])\n"
                 "print(imdb['unsupervised'], t['train'])\nchat = load_dataset('x/y')\nchat['train_sft']\n"
                 "df = df.dropna(subset=['review'])\nx = os.environ['HF_TOKEN']\nresult['word_ids'] = 1")
    assert {"unsupervised", "train", "train_sft"} <= plan.splits
    assert {"label", "review"} <= set(plan.extra) and "unsupervised" not in plan.extra
    assert "HF_TOKEN" not in plan.extra and "word_ids" not in plan.extra  # the environment; a key it writes
    grpo = _plan("d = d.map(lambda x: {'prompt': x['question'], 'solution': x['answer']})\n"
                 "def ok(prompts, completions, solution, **kwargs): return [1.0]\n"
                 "t = GRPOTrainer(model=m, reward_funcs=[ok], args=a, train_dataset=d)")
    assert grpo.schema == "prompt" and {"question", "answer", "solution"} <= set(grpo.extra)
    for code, schema in [("t = KTOTrainer(model=m, args=a)", "unpaired_preference"),
                         ("t = DPOTrainer(model=m, args=a)\nx = r['question']", "preference")]:
        assert _plan(code).schema == schema, code
    for loader, family in [("AutoModelForMaskedLM", "masked"), ("AutoModelForSeq2SeqLM", "seq2seq"),
                           ("T5ForConditionalGeneration", "seq2seq"), ("AutoModelForCausalLM", "causal")]:
        assert _plan(f"m = {loader}.from_pretrained(x)").family == family, loader


def test_ids_in_variables_arguments_and_configs_are_decided_at_run_time(tmp_path):
    """An id passed through a function argument or a config object was left as is: the dry run then
    downloaded (or failed on) the real model."""
    nb = make_nb(tmp_path, [
        "from dataclasses import dataclass\n@dataclass\nclass C:\n    model_id: str = 'org/big'\ncfg = C()",
        "def build(name):\n    return AutoModelForCausalLM.from_pretrained(name, attn_implementation='eager')\n"
        "model = build(cfg.model_id)\ntok = AutoTokenizer.from_pretrained(cfg.model_id)\n"
        "kw = {'attn_implementation': 'flash_attention_2', 'device_map': 'auto', 'quantization_config': q}\n"
        "m2 = AutoModelForCausalLM.from_pretrained(cfg.model_id, **kw)\nq = BitsAndBytesConfig(load_in_4bit=True)\n"
        "df = pd.read_csv('/kaggle/input/x/train.csv')\nwith open('/kaggle/input/x/extra.json') as f:\n    rows = json.load(f)\n"
        "ds = load_dataset(cfg.model_id.replace('big', 'data'))\nother = Trainer(model=model)", *TRAIN])
    src = convert_notebook(nb, dry_run=True).source
    assert "from_pretrained(kit_dry_run.model(name)" in src and "from_pretrained(kit_dry_run.model(cfg.model_id))" in src
    assert "'sdpa'" not in src and '"sdpa"' in src and "flash_attention_2" not in src.split("training_ok")[1]
    made = dict(assigns(src))
    assert mapping(made["kw"])["device_map"] == "{'': rank_device}" and mapping(made["kw"])["quantization_config"] == "None"
    assert made["q"] == "None"
    assert "pd.read_csv(kit_dry_run.path('/kaggle/input/x/train.csv'))" in src
    assert "open(kit_dry_run.path('/kaggle/input/x/extra.json'))" in src
    assert squeeze(call(src, "kit_dry_run.load_dataset")[0]) == "cfg.model_id.replace('big','data')"
    assert "Trainer(model=model)" in src  # a model object the notebook made is never wrapped


def test_gpu_only_calls_are_neutralised_in_the_dry_run_only(tmp_path):
    cells = ["import torch\nassert torch.cuda.is_available(), 'GPU!'\nprint(torch.cuda.get_device_name(0))\n"
             "cap = torch.cuda.get_device_capability()\nif not torch.cuda.is_available():\n    raise SystemExit('no GPU')\n"
             "free, total = torch.cuda.mem_get_info()\ndev = torch.device('cuda')", *TRAIN]
    nb = make_nb(tmp_path, cells)
    dry, real = convert_notebook(nb, dry_run=True).source, convert_notebook(nb).source
    assert "kit_dry_run.cuda('get_device_capability')" in dry and "kit_dry_run.cuda('mem_get_info')" in dry
    assert [c.get(1) for c in calls(dry, "kit_dry_run.cuda") if c[0] == "'get_device_name'"] == ["local_rank"]
    assert "    assert torch.cuda" not in dry and "SystemExit('no GPU')" not in dry
    assert ifexp(call(dry, "torch.device")[0]) == ("'cuda'", "torch.cuda.is_available()", "'cpu'")
    asserted = [ast.unparse(n.test) for n in ast.walk(ast.parse(real)) if isinstance(n, ast.Assert)]
    assert "torch.cuda.is_available()" in asserted and "kit_dry_run" not in real
    stand = StandIns()
    if not __import__("torch").cuda.is_available():
        assert stand.cuda("get_device_capability") == (7, 5) and stand.cuda("get_device_name", 0) == "CPU (dry run)"
        assert stand.cuda("get_device_properties", 0).total_memory > 0 and stand.cuda("synchronize") is None


def test_stand_ins_at_run_time(tmp_path, monkeypatch):
    """What the script's kit_dry_run answers: a stand-in for what is not here, the real thing for what is."""
    monkeypatch.chdir(tmp_path)
    stand = StandIns(schema="qa", extra=["review", "label"], splits=["unsupervised"], family="masked")
    assert stand.model("org/not-here") == str(FAMILIES["masked"]) and stand.model(str(TINY_MODEL)) == str(TINY_MODEL)
    assert stand.model(42) == 42  # not a name: passed through
    (tmp_path / "mine.csv").write_text("review,label\ngood,1\n")
    assert stand.path("mine.csv") == "mine.csv" and stand.path("/kaggle/out.csv", "w") == "/kaggle/out.csv"
    import pandas as pd

    df = pd.read_csv(stand.path("/kaggle/input/reviews/train.csv"))
    assert {"question", "answer", "review", "label"} <= set(df.columns) and set(df["label"]) == {0, 1}
    rows = __import__("json").load(open(stand.path("/kaggle/input/faq.json")))
    assert rows and {"question", "answer"} <= set(rows[0])
    dd = stand.load_dataset("stanfordnlp/imdb")
    assert {"train", "validation", "test", "unsupervised"} <= set(dd)
    files = stand.load_dataset("csv", data_files={"train": "/kaggle/input/a.csv", "dev": "/kaggle/input/b.csv"})
    assert {"train", "dev"} <= set(files)
    real = stand.load_dataset("csv", data_files="mine.csv", split="train")
    assert real.column_names == ["review", "label"] and len(real) == 1  # the user's own file, read for real
    streamed = stand.load_dataset("HuggingFaceFW/fineweb", split="train", streaming=True)
    from datasets import IterableDataset

    assert isinstance(streamed, IterableDataset) and "question" in next(iter(streamed))
    assert set(stand.load_from_disk("/kaggle/input/tokenized")) >= {"train", "unsupervised"}
    kto = StandIns(schema="unpaired_preference").load_dataset("trl-lib/kto-mix-14k", split="train")
    assert kto.column_names == ["prompt", "completion", "label"] and set(kto["label"]) == {True, False}


def test_run_needs_dry_run(tmp_path, capsys):
    nb = make_nb(tmp_path, TRAIN)
    assert main(["convert", str(nb), "-o", str(tmp_path / "x.py"), "--run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--run only" in err and "with --dry-run" in err


def test_without_run_the_exact_command_is_printed(tmp_path, capsys):
    nb = make_nb(tmp_path, TRAIN)
    assert main(["convert", str(nb), "-o", str(tmp_path / "x.py"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()[-2]  # the last: next:
    assert out.startswith("dry run, exactly: ") and out.split()[3:5] == ["CUDA_VISIBLE_DEVICES=''", "OMP_NUM_THREADS=1"]
    assert words_in(out, "python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(tmp_path / "x.py"))
    assert "--run" in out


@pytest.mark.slow
def test_run_runs_the_dry_run_under_torchrun_and_reports_its_exit(tmp_path, capsys, monkeypatch):
    """--run: the converted tiny notebook on 2 CPU ranks, exit 0; a notebook that fails exits 1 with one
    error line naming the exit code; one that hangs is stopped at the time limit."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    assert main(["convert", str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", "ok.py", "--dry-run", "--run"]) == 0
    out = capsys.readouterr().out
    assert "ran to the end" in out and "2 CPU ranks (exit 0)" in out
    # The failing and the hanging cell come before the notebook's imports: the ranks get there without
    # loading TRL (some 5 s of CPU each), and how far a notebook got is not the point.
    bad = make_nb(tmp_path, ["raise ValueError('the notebook fails')", *TRAIN], "bad.ipynb")
    assert main(["convert", str(bad), "-o", "bad.py", "--dry-run", "--run"]) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "error: the dry run" in err and "bad.py exited 1" in err
    import kit.commands.convert as command

    monkeypatch.setattr(command, "DRY_TIMEOUT_S", 15)
    hang = make_nb(tmp_path, ["import time\ntime.sleep(600)", *TRAIN], "hang.ipynb")
    assert main(["convert", str(hang), "-o", "hang.py", "--dry-run", "--run"]) == 1
    err = capsys.readouterr().err
    assert "ran past 15 s" in err and "stopped" in err
    assert sys.modules  # the test process itself is alive: the job's process group was stopped, not us


def test_unsloth_notebooks_get_the_cpu_stand_in_without_a_gpu(tmp_path, monkeypatch):
    """Unsloth cannot be imported without a GPU, so every Unsloth notebook's dry run on the CPU stopped
    at `from unsloth import FastLanguageModel`."""
    nb = make_nb(tmp_path, ["from unsloth import FastLanguageModel\nimport unsloth.chat_templates", *TRAIN])
    assert "packages=['unsloth']" in convert_notebook(nb, dry_run=True).source
    assert "packages=" not in convert_notebook(make_nb(tmp_path, TRAIN, "plain.ipynb"), dry_run=True).source
    if __import__("torch").cuda.is_available():
        pytest.skip("with a GPU the real Unsloth is used")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    from kit.notebooks.convert.standins import CPU_PACKAGES

    StandIns(packages=["unsloth"])
    assert sys.path[0] == str(CPU_PACKAGES) and os.environ["PYTHONPATH"].startswith(str(CPU_PACKAGES))
    assert (CPU_PACKAGES / "unsloth" / "__init__.py").is_file()


def test_a_metric_the_notebook_loads_is_stood_in_for_without_a_download(tmp_path):
    """evaluate.load("accuracy") downloads a metric script (rouge and bleu another package too): a dry
    run on a machine without them stopped there. The stand-in takes evaluate's calls and answers every
    score name with the share of exact matches."""
    cells = ["import evaluate\nimport numpy as np\nmetric = evaluate.load('rouge')\n"
             "def compute_metrics(p):\n    return {'r': metric.compute(predictions=p[0], references=p[1])['rougeL']}",
             *TRAIN]
    src = convert_notebook(make_nb(tmp_path, cells), dry_run=True).source
    code = src.split("\"\"\"", 2)[2]  # past the docstring, which lists the changes
    assert ("metric", "kit_dry_run.metric('rouge')") in assigns(code) and "evaluate.load(" not in code
    metric = StandIns().metric("evaluate-metric/accuracy")
    metric.add_batch(predictions=[1, 0], references=[1, 1])
    metric.add(prediction=2, reference=2)
    scores = metric.compute()
    assert scores["accuracy"] == pytest.approx(2 / 3) and scores["rougeL"] == pytest.approx(2 / 3)
    import numpy as np

    assert metric.compute(predictions=[np.array([1, 2]), "a"], references=[np.array([1, 2]), "b"])["f1"] == 0.5
    assert metric.compute() == {"accuracy": 0.0}  # nothing added: no score to speak of, not a crash


def test_an_adapter_the_notebook_did_not_train_is_stood_in_for(tmp_path):
    """PeftModel.from_pretrained(base, "someone/adapter") downloaded an adapter for another base: the dry
    run stopped there. Now a fresh LoRA on the stand-in model, and the real one where it is here."""
    cells = ["from peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n"
             "base = AutoModelForCausalLM.from_pretrained('org/base')\n"
             "model = PeftModel.from_pretrained(base, 'someone/adapter', is_trainable=True)", *TRAIN]
    code = convert_notebook(make_nb(tmp_path, cells), dry_run=True).source.split('"""', 2)[2]
    adapter = call(code, "kit_dry_run.adapter")
    assert [adapter[i] for i in range(3)] == ["PeftModel", "base", "'someone/adapter'"]
    assert adapter["is_trainable"] == "True"
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    stand = StandIns()
    model = stand.adapter(PeftModel, AutoModelForCausalLM.from_pretrained(str(TINY_MODEL)), "someone/adapter")
    assert isinstance(model, PeftModel) and model.num_parameters(only_trainable=True) > 0
    model.save_pretrained(tmp_path / "mine")  # one that is here is loaded for real
    again = stand.adapter(PeftModel, AutoModelForCausalLM.from_pretrained(str(TINY_MODEL)), str(tmp_path / "mine"))
    assert isinstance(again, PeftModel) and set(again.peft_config) == {"default"}
