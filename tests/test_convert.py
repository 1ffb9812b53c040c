"""`kit convert`: golden-style checks on notebooks shaped like real Unsloth/TRL/Kaggle ones, every
refusal branch through the real CLI, and the converted tiny notebook under real torchrun (gloo, CPU)."""

from __future__ import annotations

import ast
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.cli import main
from kit.machine.command import shell_word
from kit.notebooks.convert import convert_notebook
from kit.errors import UsageError
from tests.code_asserts import assigns, call, calls, changed, guarded, ifexp, line_of, mapping, squeeze, words_in

TRIPLE = '"' * 3
FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"
TRAIN = ["from trl import SFTTrainer, SFTConfig",
         "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'), train_dataset=d)\ntrainer.train()"]


def make_nb(tmp_path: Path, cells: list[str], name: str = "nb.ipynb") -> Path:
    """A notebook whose cells are `cells` (a "md:" prefix makes a markdown cell)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook(cells=[new_markdown_cell(c[3:]) if c.startswith("md:") else new_code_cell(c) for c in cells])
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def texts(conversion) -> list[str]:
    return [str(c) for c in conversion.changes]


def guarded_calls(source: str) -> set[str]:
    """Names of the calls that sit directly under an `if is_main:` block."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "is_main":
            found |= {ast.unparse(s.value.func) for s in node.body if isinstance(s, ast.Expr)
                      and isinstance(s.value, ast.Call)}
    return found


def rank0_tail(source: str) -> str:
    """The code after the split, where rank 0 runs alone."""
    return source[source.index("dist.destroy_process_group()\n"):]


def keywords(source: str, func: str) -> dict[str, str]:
    """Keyword arguments (as source) of the first call to `func` in `source`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == func:
            return {k.arg: ast.unparse(k.value) for k in node.keywords}
    raise AssertionError(f"no call to {func}")


NO_CUDA = "not torch.cuda.is_available()"
TORCHRUN2 = ["torchrun", "--standalone", "--nproc_per_node=2"]


def doc_lines(source: str) -> list[str]:
    """The script docstring's lines, stripped (it lists the shell lines to run before launching)."""
    return [ln.strip() for ln in ast.get_docstring(ast.parse(source)).splitlines()]


def call_at(source: str, func: str, first: str) -> dict:
    """The call to `func` whose first argument is `first`."""
    [found] = [c for c in calls(source, func) if c.get(0) == first]
    return found


def checks_token(source: str) -> bool:
    """The script stops before any work when no Hub token is set."""
    return any(isinstance(n, ast.If) and ast.unparse(n.test) == "huggingface_hub.get_token() is None"
               for n in ast.walk(ast.parse(source)))


def shown_if_not_none(source: str) -> list[str]:
    """The values printed as IPython shows a cell's last value: `if (shown := VALUE) is not None: print(shown)`."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.NamedExpr) \
                and isinstance(n.test.ops[0], ast.IsNot) \
                and ast.unparse(n.body[0]) == "print(shown)":
            found.append((n.lineno, ast.unparse(n.test.left.value)))
    return [v for _, v in sorted(found)]


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["convert", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- golden-style checks on the three real-shaped notebooks ---------------------------------------

def test_unsloth_notebook():
    conv = convert_notebook(FIXTURES / "unsloth_qwen3_sft.ipynb")
    src, changes = conv.source, texts(conv)
    ast.parse(src)
    code = src.split(TRIPLE, 2)[2]
    assert "!pip" not in code and "%%capture" not in code
    assert "!pip install unsloth" in doc_lines(src)  # the user still sees what to install
    assert any(c.startswith("cell 2: dropped") and "`!pip install unsloth`" in c for c in changes)
    assert keywords(src, "FastLanguageModel.from_pretrained")["device_map"] == "{'': rank_device}"
    args = keywords(src, "SFTConfig")
    assert args["ddp_find_unused_parameters"] == "False"
    assert args["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"
    # --precision auto keeps Unsloth's capability-based choice untouched and flags nothing about it.
    # (fp16 is kept, but only where there is a GPU: fp16 mixed precision fails on a CPU.)
    assert args["fp16"].split(" and ") == ["not " + args["bf16"], "torch.cuda.is_available()"]
    assert args["bf16"] == "is_bfloat16_supported()" and args["use_cpu"] == NO_CUDA
    assert not any("bf16" in c and "REVIEW" in c for c in changes)
    assert {"model.save_pretrained", "tokenizer.save_pretrained", "model.push_to_hub",
            "tokenizer.push_to_hub", "print"} <= guarded_calls(src)
    # Generation after training runs on rank 0 alone, on the rank's device: nothing left to review.
    assert "_ = model.generate(" in rank0_tail(src) and '.to(rank_device)' in src
    assert not any("REVIEW" in c for c in changes)
    # Comments survive: libcst keeps the notebook's own words.
    assert "# Context length - can" in src


def test_trl_notebook_device_map_auto_and_login():
    conv = convert_notebook(FIXTURES / "trl_qlora_sft.ipynb")
    src, changes = conv.source, texts(conv)
    ast.parse(src)
    assert keywords(src, "AutoModelForCausalLM.from_pretrained")["device_map"] == "{'': rank_device}"
    assert "device_map" not in keywords(src, "AutoTokenizer.from_pretrained")
    [dm] = [c for c in changes if "device_map" in c]
    assert dm.startswith("cell 4:") and 'device_map="auto"' in dm
    assert "under DDP" in dm and "one after another" in dm
    assert not any(isinstance(n, ast.Call) and ast.unparse(n.func) == "notebook_login" for n in ast.walk(ast.parse(src)))
    assert "get_token() is None" in src and "HF_TOKEN" in src
    assert changed(conv, 2, "notebook_login(…)", "removed", review=False)
    # The token check comes before any work, even before the process group starts.
    assert line_of(src, "huggingface_hub.get_token") < line_of(src, "init_process_group")
    assert {"trainer.save_model", "trainer.push_to_hub"} <= guarded_calls(src)
    assert keywords(src, "SFTConfig")["ddp_find_unused_parameters"] == "False"
    assert keywords(src, "SFTConfig")["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"


def test_seed002_notebook_balanced_bf16_login():
    conv = convert_notebook(FIXTURES / "seed002_kaggle_t4x2.ipynb")
    src, changes = conv.source, texts(conv)
    ast.parse(src)
    [dm] = [c for c in changes if "device_map" in c]
    assert dm.startswith("cell 5:") and 'device_map="balanced"' in dm and "under DDP" in dm
    assert keywords(src, "FastLanguageModel.from_pretrained")["device_map"] == "{'': rank_device}"
    # The user's own comment above the load is still there.
    assert "# Two T4s: spread" in src
    [bf16] = [c for c in changes if "bf16=True is hard-coded" in c]
    assert bf16.startswith("cell 7: REVIEW") and "T4" in bf16
    assert "# kit: REVIEW (cell 7)" in src and "bf16=True is hard-coded" in src
    assert changed(conv, 4, "notebook_login(…)", "removed", review=False)
    assert {"model.save_pretrained", "model.push_to_hub", "plt.plot", "plt.savefig", "print"} <= guarded_calls(src)
    assert changed(conv, 7, "global batch", "steps (16)", "number of GPUs", review=False)
    assert changed(conv, None, "`%pip install -q unsloth", "`!nvidia-smi`")


@pytest.mark.parametrize("precision, fp16, bf16", [("fp16", "torch.cuda.is_available()", "False"), ("bf16", "False", "True"),
                                                   ("fp32", "False", "False")])
def test_precision_is_set(precision, fp16, bf16):
    conv = convert_notebook(FIXTURES / "seed002_kaggle_t4x2.ipynb", precision)
    args = keywords(conv.source, "SFTConfig")
    assert (args["fp16"], args["bf16"]) == (fp16, bf16)
    assert not any("hard-coded" in c for c in texts(conv))
    assert any(f"--precision {precision}" in c for c in texts(conv))


def test_fp16_precision_follows_into_load_dtypes(tmp_path):
    nb = make_nb(tmp_path, ["import torch\nq = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)\n"
                            "m = AutoModelForCausalLM.from_pretrained('x', torch_dtype=torch.bfloat16, device_map='auto')",
                            *TRAIN])
    conv = convert_notebook(nb, "fp16")
    assert keywords(conv.source, "BitsAndBytesConfig")["bnb_4bit_compute_dtype"] == "torch.float16"
    assert keywords(conv.source, "AutoModelForCausalLM.from_pretrained")["dtype"] == "torch.float16"
    assert changed(conv, 1, "BitsAndBytesConfig", "bnb_4bit_compute_dtype", "→ torch.float16", review=False)
    auto = convert_notebook(nb)  # auto leaves the dtypes alone
    assert keywords(auto.source, "BitsAndBytesConfig")["bnb_4bit_compute_dtype"] == "torch.bfloat16"


def test_fp16_precision_takes_out_what_only_ampere_runs(tmp_path):
    """--precision fp16 (for a T4) kept attn_implementation="flash_attention_2" and tf32=True: the
    first fails to load without an Ampere GPU, the second is refused by Trainer on a T4."""
    nb = make_nb(tmp_path, ["m = AutoModelForCausalLM.from_pretrained('x', attn_implementation='flash_attention_2')",
                            "from trl import SFTTrainer, SFTConfig",
                            "args = SFTConfig(output_dir='o', bf16=True, tf32=True)\n"
                            "trainer = SFTTrainer(model=m, args=args, train_dataset=d)\ntrainer.train()"])
    t4 = convert_notebook(nb, "fp16")
    assert keywords(t4.source, "AutoModelForCausalLM.from_pretrained")["attn_implementation"] == "'sdpa'"
    assert {k: v for k, v in keywords(t4.source, "SFTConfig").items() if k in ("tf32", "bf16", "fp16")} == {
        "tf32": "False", "bf16": "False", "fp16": "torch.cuda.is_available()"}
    assert changed(t4, 1, "flash_attention_2' →", '"sdpa"')
    for kept in (convert_notebook(nb), convert_notebook(nb, "bf16")):  # Ampere and newer: left as written
        assert keywords(kept.source, "AutoModelForCausalLM.from_pretrained")["attn_implementation"] == \
            "'flash_attention_2'"
        assert keywords(kept.source, "SFTConfig")["tf32"] == "True"


def test_script_shape():
    conv = convert_notebook(FIXTURES / "trl_qlora_sft.ipynb", script_name="train_ddp.py")
    tree = ast.parse(conv.source)
    doc = ast.get_docstring(tree)
    assert "trl_qlora_sft.ipynb" in doc
    assert words_in(doc, "torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py")
    assert words_in(doc, "python", "train_ddp.py")
    src = conv.source
    assert squeeze(dict(assigns(src))["local_rank"]) == "int(os.environ.get('LOCAL_RANK',0))"
    assert src.index("local_rank = ") < src.index("# --- notebook cell")
    assert "torch.cuda.set_device(local_rank)" in src and "init_process_group" in src
    [try_node] = [n for n in tree.body if isinstance(n, ast.Try)]
    final = ast.unparse(try_node.finalbody)
    assert "dist.destroy_process_group()" in final and "if training_ok:" in final
    assert ast.unparse(try_node.body[-1]) == "training_ok = True"
    assert all(c.startswith("cell ") for c in texts(conv))
    assert not any(line != line.rstrip() for line in src.splitlines())


# --- smaller rules, on notebooks built in the test ------------------------------------------------

def test_magics_dropped_and_line_numbers_kept(tmp_path):
    nb = make_nb(tmp_path, ["%%bash\necho hi", "import os\nif os.environ.get('X'):\n    !pip install a \\\n      b\n",
                            *TRAIN])
    conv = convert_notebook(nb)
    code = conv.source.split(TRIPLE, 2)[2]
    assert "echo hi" not in code and "pip" not in code
    # the %%bash cell's lines are listed to run before launching, as shell lines are
    assert "    echo hi\n" in ast.get_docstring(ast.parse(conv.source))
    assert changed(conv, 1, "dropped `echo hi`", "shell commands", review=False)
    # %env and %cd change the state the code below runs in: they become their Python equivalents.
    env = convert_notebook(make_nb(tmp_path, ["%env WANDB_PROJECT=ha\n%cd /kaggle/working", *TRAIN], "env.ipynb"))
    assert ("os.environ['WANDB_PROJECT']", "'ha'") in assigns(env.source)
    assert call(env.source, "os.chdir")[0] == "'/kaggle/working'"
    assert changed(env, 1, "`%env WANDB_PROJECT=ha`", "became", review=False)
    # Magics that run a Python statement keep it; captured shell output becomes subprocess, for review.
    timed = convert_notebook(make_nb(tmp_path, ["files = !ls data\nif files:\n    n = len(files)",
                                                TRAIN[0], TRAIN[1].replace("trainer.train()", "%timeit -n 1 -r 1 "
                                                                           "trainer.train()\nstats = %time 1 + 1")],
                                     "timed.ipynb"))
    body = timed.source.split(TRIPLE, 2)[2]
    assert dict(assigns(body))["files"].endswith(").splitlines()") and "%" not in body
    assert call(body, "subprocess.getoutput")[0] == "'ls data'"
    assert "\n    trainer.train()\n" in body and "stats = 1 + 1" in body
    assert changed(timed, 1, "`files = !ls data`", "every rank", review=True)
    assert changed(timed, 3, "`%timeit -n 1 -r 1", "became `trainer.train()`")
    ns: dict = {}
    exec(compile("import subprocess; files = subprocess.getoutput('echo a; echo b').splitlines()", "t", "exec"), ns)
    assert ns["files"] == ["a", "b"]  # what IPython's `files = !echo a; echo b` gives, as a list
    bad = make_nb(tmp_path, ["%pip install x\n\nmodel?", *TRAIN], "bad.ipynb")
    with pytest.raises(UsageError, match=r"cell 1, line 3: .*'model\?'"):
        convert_notebook(bad)


def test_mechanical_fixes_and_reload_barrier(tmp_path):
    nb = make_nb(tmp_path, [
        "import torch\nuse_bf16 = torch.cuda.is_bf16_supported()\nx = torch.zeros(1).to('cuda:0')\ndisplay(x)\n"
        "from IPython.display import HTML, Markdown\ndisplay(HTML(f'<b>{x}</b>'), Markdown(text='y'))\n"
        "device = 'cuda:0'\nname = torch.cuda.get_device_name(0)\nwith torch.autocast('cuda'):\n    pass",
        "m.save_pretrained('base')\nm = AutoModelForCausalLM.from_pretrained('base')",
        "from google.colab import drive, userdata\ndrive.mount('/content/drive')\ntok = userdata.get('HF_TOKEN')\n"
        "key = userdata.get('WANDB_API_KEY')\nwb = userdata.get('wandb')\nother = userdata.get('OPENAI')",
        "from kaggle_secrets import UserSecretsClient\nsecrets = UserSecretsClient()\nt = secrets.get_secret('HF_TOKEN')",
        *TRAIN])
    conv = convert_notebook(nb)
    src, changes = conv.source, texts(conv)
    reviews = [c for c in changes if "REVIEW" in c]
    assert len(reviews) == 1 and "is_bf16_supported" in reviews[0] and "pytorch#148322" in reviews[0]
    # Made, not flagged: devices follow the rank, display prints, secrets come from the environment.
    assert "torch.zeros(1).to(rank_device)" in src and "device = rank_device" in src
    assert "torch.cuda.get_device_name(local_rank)" in src and "torch.autocast('cuda')" in src
    assert "print(x)" in src and "display(" not in src
    # the text an HTML wrapper holds, not its repr
    assert call_at(src, "print", "f'<b>{x}</b>'")[1] == "Markdown(text='y')"
    made = dict(assigns(src))
    assert made["tok"] == made["t"] == "huggingface_hub.get_token()"
    assert made["key"] == made["wb"] == "os.environ.get('WANDB_API_KEY')" and made["other"] == "os.environ.get('OPENAI')"
    assert "google.colab" not in src and "kaggle_secrets" not in src and "drive.mount" not in src
    assert "UserSecretsClient" not in src.split(TRIPLE, 2)[2]
    assert changed(conv, 3, "drive.mount() removed", review=False)
    # Saved on rank 0, then everyone waits before loading it again.
    assert "m.save_pretrained('base')" in guarded(src)
    assert line_of(src, "m.save_pretrained") < line_of(src, "wait_for_all") < line_of(src, "AutoModelForCausalLM.from_pretrained")


def test_logins_go_and_the_token_check_comes_first(tmp_path):
    nb = make_nb(tmp_path, ["import wandb\nwandb.login()", "import huggingface_hub\nhuggingface_hub.login()",
                            *TRAIN, "from huggingface_hub import login\nlogin(token=os.environ['HF_TOKEN'])",
                            "if True:\n    notebook_login()\n    print('in')", "login(token='hf_abc')"])
    conv = convert_notebook(nb)
    changes = texts(conv)
    assert "wandb.login()" in conv.source  # not a Hub login: kept, flagged
    assert changed(conv, 1, "wandb.login()", review=True)
    calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(conv.source)) if isinstance(n, ast.Call)}
    assert not calls & {"login", "huggingface_hub.login", "notebook_login"}
    for cell in (2, 5, 6):
        assert any(c.startswith(f"cell {cell}: ") and "login(…) removed" in c for c in changes), cell
    # A token written in the notebook needs a person: it must move to HF_TOKEN.
    assert changed(conv, 7, "login(…) removed", "set HF_TOKEN", review=True)
    assert line_of(conv.source, "huggingface_hub.get_token") < line_of(conv.source, "trainer.train")


def test_training_args_call_without_keywords_is_completed(tmp_path):
    nb = make_nb(tmp_path, ["from transformers import TrainingArguments, Trainer\n"
                            "args = TrainingArguments('out', gradient_checkpointing=True, ddp_find_unused_parameters=True)\n"
                            "trainer = Trainer(model=m, args=args)\ntrainer.train()"])
    conv = convert_notebook(nb, "fp16")
    args = keywords(conv.source, "TrainingArguments")
    assert args["ddp_find_unused_parameters"] == "False" and args["bf16"] == "False"
    assert args["fp16"] == "torch.cuda.is_available()"
    assert args["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"


# --- refusals: one line, exit 2, nothing written ----------------------------------------------------

@pytest.mark.parametrize("cells, message", [
    (["import ipywidgets as w\nw.IntSlider()", *TRAIN], "cell 1, line 1: ipywidgets"),
    (["steps = int(input('steps? '))", *TRAIN], "cell 1, line 1: input()"),
    (["x = 1", "x + 1", "y = _ * 2", *TRAIN], "cell 3, line 1: `_` is IPython's interactive state"),
    (["y = Out[2]", *TRAIN], "cell 1, line 1: `Out`"),
    (["ip = get_ipython()", *TRAIN], "cell 1, line 1: `get_ipython`"),
    (["import torch\nmodel.train()\nfor b in data:\n    loss(b).backward()"],
     "cell 1, line 4: this notebook trains in its own PyTorch loop (`loss(b).backward()`)"),
    (["import torch", "for b in data:\n    optimizer.zero_grad()\n    optimizer.step()"],
     "cell 2, line 3: this notebook trains in its own PyTorch loop (`optimizer.step()`)"),
    (["md:# only words"], "no cell holds code: no training found"),
    (["x = 1", "md:# notes", "y = 2"], "cells 1-3: no training found (no Trainer's train() call"),
    (["import keras", "model.fit(x, y, epochs=3)"], "cell 2, line 1: `model.fit()` trains outside a Hugging Face"),
    (["from trl import SFTTrainer", "trainer = SFTTrainer(model=m, train_dataset=d)"],
     "cell 2, line 1: `SFTTrainer(…)` builds a trainer, but no cell calls its train()"),
    (["!pip install -q axolotl", "!accelerate launch -m axolotl.cli.train config.yaml"],
     "cell 2: `!accelerate launch -m axolotl.cli.train config.yaml` trains through the module axolotl.cli.train"),
    (["!axolotl train qwen.yaml"], "cell 1: `!axolotl train qwen.yaml` trains through `axolotl train`"),
    (["!llamafactory-cli train examples/llama3_lora_sft.yaml"], "trains through `llamafactory-cli train`"),
    (["!python -m pip install x", "import torch\nw = torch.zeros(1)"], "error: cell 2: no training found"),
    (["!git clone https://github.com/me/recipes", "!ACCELERATE_USE_FSDP=1 torchrun --nproc_per_node=4 ./scripts/run_fsdp_qlora.py "
      "--config llama.yaml"], "no cell trains; cell 2 launches ./scripts/run_fsdp_qlora.py"),
    (["!python scripts/run_sft.py --config qwen.yaml"], "no cell trains; cell 1 launches scripts/run_sft.py (`!python "
                                                         "scripts/run_sft.py --config qwen.yaml`): a script that trains"),
    (["from accelerate import Accelerator, notebook_launcher",
      "def loop():\n    acc = Accelerator()\n    model, opt = acc.prepare(m, o)\n    for b in data:\n"
      "        acc.backward(model(b).loss)", "notebook_launcher(loop, (), num_processes=2)"],
     "cell 2, line 2: this notebook trains in its own loop through accelerate's Accelerator"),
    (["x = 1", "y = !ls {path}", *TRAIN], "cell 2, line 1: `y = !ls {path}` captures a shell command with "
                                          "IPython's {var}/$var expansion"),
    (["x = 1", "if x:\n    names = %who_ls", *TRAIN], "cell 2, line 2: `names = %who_ls` captures the result of "
                                                     "IPython's `%who_ls` magic"),
    (["t = %timeit -o f()", *TRAIN], "cell 1, line 1: `t = %timeit -o f()` captures the result"),
    (["import asyncio\n\nawait asyncio.sleep(0)", *TRAIN], "cell 1, line 3: 'await' outside function: a "
                                                           "script has no event loop running"),
    (["async for x in y:\n    pass", *TRAIN], "cell 1, line 1: 'async for' outside async function"),
    (["return 1", *TRAIN], "cell 1, line 1: 'return' outside function: fix that line"),
])
def test_refused_notebooks(tmp_path, capsys, cells, message):
    nb = make_nb(tmp_path, cells)
    out = tmp_path / "train_ddp.py"
    code, stdout, err = cli([str(nb), "-o", str(out)], capsys)
    assert code == 2 and message in err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not out.exists() and not list(tmp_path.glob(".train_ddp.py.*"))


def test_bad_paths(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    (tmp_path / "broken.ipynb").write_text("{not json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "script.py").write_text("print(1)\n")
    for path, message in [(tmp_path / "missing.ipynb", "no such notebook file"), (tmp_path, "is a directory, not a file"),
                          (tmp_path / "broken.ipynb", "not valid JSON"), (tmp_path / "other.json", "not a Jupyter"),
                          (tmp_path / "script.py", "not valid JSON")]:
        code, _, err = cli([str(path), "-o", str(out)], capsys)
        assert code == 2 and message in err and err.count("\n") == 1, (path, err)
        assert not out.exists()
    code, _, err = cli([str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", str(tmp_path / "nope" / "x.py")], capsys)
    assert code == 2 and "does not exist" in err
    nb = make_nb(tmp_path, TRAIN)
    before = nb.read_text()
    code, _, err = cli([str(nb), "-o", str(nb), "--force"], capsys)
    assert code == 2 and "the notebook itself" in err and nb.read_text() == before
    code, _, err = cli([str(nb), "-o", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    out.write_text("# mine\n")
    nb = str(FIXTURES / "tiny_cpu_sft.ipynb")
    code, _, err = cli([nb, "-o", str(out)], capsys)
    assert code == 2 and "--force" in err and out.read_text() == "# mine\n"
    code, stdout, _ = cli([nb, "-o", str(out), "--force"], capsys)
    assert code == 0 and out.read_text().startswith('"""Rank-aware') and "# mine" not in out.read_text()
    lines = stdout.splitlines()
    assert lines[0].startswith("kit convert: ") and "tiny_cpu_sft.ipynb ->" in lines[0]
    assert re.search(r"\d+ changes, 0 to review", lines[0])
    assert all(line.startswith("  cell ") for line in lines[1:-1]) and lines[-1].startswith("next: torchrun ")


def _raw_nb(tmp_path: Path, edit, name: str = "raw.ipynb") -> Path:
    """A training notebook whose JSON `edit(raw)` changes before it is written (for shapes nbformat won't write)."""
    nb = json.loads(make_nb(tmp_path, TRAIN, "base.ipynb").read_text())
    edit(nb)
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


def _set_source(value):
    return lambda nb: nb["cells"][0].__setitem__("source", value)


@pytest.mark.parametrize("edit, message", [
    (_set_source(5), "cell 1's source is 5, not text or a list of lines"),
    (_set_source(["x = 1\n", 2]), "cell 1's source is [\"x = 1\\n\", 2], not text"),
    (_set_source(None), "cell 1's source is null"),
    (lambda nb: nb["cells"].insert(1, "x = 1"), "cell 2 is a JSON str, not an object"),
    (lambda nb: nb["cells"][1].pop("cell_type"), "cell 2 has no cell_type string"),
    (_set_source("x = '\0'\n"), "cell 1, line 1: contains a NUL byte"),
    (_set_source("a = 1\nx = " + "(" * 300 + "1" + ")" * 300 + "  # " + "y" * 4000),
     "cell 1, line 2: too many nested parentheses in 'x = (((("),
])
def test_malformed_cells_are_one_line_errors(tmp_path, capsys, edit, message):
    out = tmp_path / "train_ddp.py"
    code, _, err = cli([str(_raw_nb(tmp_path, edit)), "-o", str(out)], capsys)
    assert code == 2 and message in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert len(err) < 400, "echoed source is cut short"
    assert not out.exists()


def test_cells_without_ids_convert_without_nbformat_warning(tmp_path, capsys, recwarn):
    def no_ids(nb):
        nb["nbformat_minor"] = 5
        for cell in nb["cells"]:
            cell.pop("id", None)
    code, _, err = cli([str(_raw_nb(tmp_path, no_ids)), "-o", str(tmp_path / "x.py")], capsys)
    assert code == 0 and err == "", err
    assert not [w for w in recwarn if "missing an id" in str(w.message)]


def test_unwritable_output_is_refused_before_or_at_the_write(tmp_path, capsys):
    nb = make_nb(tmp_path, TRAIN)
    code, _, err = cli([str(nb), "-o", "/proc/kit_x.py"], capsys)
    assert code == 2 and "-o /proc/kit_x.py" in err and err.count("\n") == 1, err
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    code, _, err = cli([str(nb), "-o", str(fifo), "--force"], capsys)
    assert code == 2 and "not a regular file" in err and err.count("\n") == 1, err
    (tmp_path / "file").write_text("keep")
    code, _, err = cli([str(nb), "-o", str(tmp_path / "file" / "x.py")], capsys)
    assert code == 2 and "is not a directory" in err and (tmp_path / "file").read_text() == "keep"
    code, _, err = cli([str(nb), "-o", str(tmp_path / "x.py"), "--dry-run", "--dry-run-data", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err


@pytest.mark.parametrize("name", ['q"""\\N.py', "a b\\.py", 'e"nd.py', "tab\there.py", "cr\r.py", "\\x.py"])
def test_user_names_are_escaped_in_the_generated_script(tmp_path, capsys, name):
    nb = make_nb(tmp_path, ["!pip install a \\\n  b", *TRAIN], name='n"""b\\u.ipynb')
    out = tmp_path / name
    code, _, err = cli([str(nb), "-o", str(out)], capsys)
    assert code == 0, err
    doc = ast.get_docstring(ast.parse(out.read_text()), clean=False)
    # shell words as kit.machine.command writes them: a tab or CR in $'…' quoting, escaped, still pasteable
    assert f"python {shell_word(name, path=True)}" in doc and shell_word(nb.name, path=True) in doc
    assert "\t" not in doc and "\r" not in doc


def test_docstring_reads_back_as_its_text():
    from kit.notebooks.convert.script import docstring

    for text in ["plain\n", "a\\d\n", 'q"""\\N', '""""', 'ends"', "x\\", "a\rb\x00c\u2028"]:
        assert ast.literal_eval(docstring(text)) == text, text
    assert docstring("a\\d\n").startswith('r"""'), "a backslash alone stays readable"


def test_notebook_launcher_keeps_a_lambda_whole(tmp_path):
    nb = make_nb(tmp_path, ["from accelerate import notebook_launcher",
                            "def train(n):\n    " + TRAIN[1].replace("\n", "\n    "),
                            "notebook_launcher(lambda n: train(n), args=(2,), num_processes=2)"])
    tree = ast.parse(convert_notebook(nb).source)
    launched = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Lambda)]
    assert [(ast.unparse(n.func), [ast.unparse(a) for a in n.args]) for n in launched] == [
        ("lambda n: train(n)", ["*(2,)"])]


# --- the converted tiny notebook, for real --------------------------------------------------------

def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_converted_notebook_trains_under_torchrun(tmp_path, capsys):
    assert main(["convert", str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", str(tmp_path / "train_ddp.py")]) == 0
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    res = _run([torchrun, "--standalone", "--nproc_per_node=2", "train_ddp.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'loss'" in res.stdout and "train_loss" in res.stdout
    # 24 rows, 2 per device: 3 steps are half an epoch only when two ranks share the data.
    assert "'epoch': '0.5'" in res.stdout
    assert res.stdout.count("train loss ") == 1  # printed by rank 0 alone
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["final-rank0"]
    assert "destroy_process_group()" not in res.stderr  # torch's warning of a group left open


@pytest.mark.slow
def test_converted_notebook_runs_as_one_process(tmp_path):
    assert main(["convert", str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", str(tmp_path / "train_ddp.py")]) == 0
    res = _run([sys.executable, "train_ddp.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'epoch': '0.25'" in res.stdout and (tmp_path / "outputs" / "final-rank0").is_dir()


def test_unsloth_train_counts_as_training(tmp_path):
    nb = make_nb(tmp_path, ["from unsloth import unsloth_train",
                            "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'))\nstats = unsloth_train(trainer)"])
    assert "unsloth_train(trainer)" in convert_notebook(nb).source


# --- the rank rule, seeds, vLLM, written scripts, options -------------------------------------------

def _main_blocks(source: str) -> list[str]:
    return [ast.unparse(n) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "is_main"]


def test_side_effects_before_training_are_guarded_at_any_depth(tmp_path):
    nb = make_nb(tmp_path, [
        "import wandb\nrun = wandb.init(project='p')\nfor i in range(2):\n    print(i)\n"
        "def show(x):\n    print(x)\n    return x\n"
        "if False: model.save_pretrained_merged('m', tok)\n"
        "if False:\n    model.push_to_hub_gguf('u/g', tok)\n    model.save_lora('l')\n"
        "ds.to_json('rows.jsonl')\nwith open('notes.txt', 'w') as f:\n    f.write('x')\nrows = load_dataset('json', data_files='rows.jsonl')",
        *TRAIN])
    src = convert_notebook(nb).source
    blocks = _main_blocks(src)
    for needle in ("run = wandb.init(project='p')", "print(i)", "print(x)", "model.save_pretrained_merged('m', tok)",
                   "model.push_to_hub_gguf('u/g', tok)", "model.save_lora('l')", "ds.to_json('rows.jsonl')",
                   "with open('notes.txt', 'w') as f"):
        assert any(needle in b for b in blocks), needle
    assert "return x" in src and not any("return x" in b for b in blocks)  # the function still returns for all
    # Rank 0 wrote rows.jsonl and notes.txt; every rank reads rows.jsonl: a barrier between.
    assert any(line_of(src, "ds.to_json") < c["line"] < line_of(src, "load_dataset", "rows.jsonl")
               for c in calls(src, "wait_for_all"))


def test_after_the_last_collective_rank0_runs_alone(tmp_path):
    nb = make_nb(tmp_path, [
        "from trl import SFTTrainer, SFTConfig",
        "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'), train_dataset=d)\ntrainer.train()\nprint('a')",
        "metrics = trainer.evaluate()\nprint(metrics)",
        "def helper(x):\n    return x\nresults = [helper(pipe(p)) for p in prompts]\nunknown_upload(results)\n"
        "if False:\n    model.save_pretrained_gguf('g', tok)"])
    conv = convert_notebook(nb)
    src = conv.source
    tree = ast.parse(src)
    split = src.index("dist.destroy_process_group()\n")
    # evaluate() needs every rank: it stays before the split, with its print on rank 0.
    assert line_of(src, "trainer.evaluate") < line_of(src, "destroy_process_group") and "print(metrics)" in guarded(src)
    tail = src[split:]
    assert any(g.startswith("def helper(x):") for g in guarded(src)) and "def helper(x)" in tail
    assert line_of(src, "helper", "pipe(p)") > line_of(src, "destroy_process_group")
    assert "unknown_upload(results)" in tail and "model.save_pretrained_gguf('g'" in tail
    [try_node] = [n for n in tree.body if isinstance(n, ast.Try)]
    last = try_node.body[-2]
    assert ast.unparse(last.test) == "is_main" and isinstance(last.body[0], ast.FunctionDef)
    assert last.body[0].name == "helper"
    assert changed(conv, 3, "from here on rank 0", review=False)


def test_a_definition_after_training_is_on_rank_0_with_the_values_it_names(tmp_path):
    """peft's QDoRA notebook: `def generate(..., max_new_tokens=max_new_tokens)` stayed on every rank
    while the assignment went under `if is_main:`, a NameError on rank 1 after training."""
    conv = convert_notebook(make_nb(tmp_path, [*TRAIN, "max_new_tokens = 64\n"
                                               "def generate(p, n=max_new_tokens):\n    return p * n",
                                               "class Shown(dict):\n    pass\nprint(generate(2))"]))
    tree = ast.parse(conv.source)
    [try_node] = [n for n in tree.body if isinstance(n, ast.Try)]
    body = try_node.body
    split = next(i for i, n in enumerate(body) if "destroy_process_group" in ast.unparse(n))
    after = body[split + 1:-1]
    assert ast.unparse(body[-1]) == "training_ok = True"
    assert after and all(isinstance(n, ast.If) and ast.unparse(n.test) == "is_main" for n in after)
    for is_main, shown in ((False, ""), (True, "128\n")):  # rank 1, then rank 0, run the tail as written
        printed: list[str] = []
        exec(compile(ast.Module(body=after, type_ignores=[]), "tail", "exec"),
             {"is_main": is_main, "print": lambda *a, out=printed: out.append(" ".join(map(str, a)) + "\n")})
        assert "".join(printed) == shown


def test_a_cuda_device_variable_stays_comparable_and_a_numbered_one_follows_the_rank(tmp_path):
    """smol-course's ORPO notebook: `device = "cuda" if … else "cpu"` became rank_device (an int),
    so its later `if device == "cuda":` silently took the other branch (another optimizer)."""
    import torch

    conv = convert_notebook(make_nb(tmp_path, [
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "optim = 'adamw_torch_fused' if device == 'cuda' else 'adamw_torch'\nplain = 'cuda'\none = 'cuda:0'",
        *TRAIN]))
    src = conv.source
    made = dict(assigns(src))
    assert ifexp(made["device"]) == ifexp(made["plain"]) == ("'cuda'", "torch.cuda.is_available()", "'cpu'")
    assert ifexp(made["optim"]) == ("'adamw_torch_fused'", "device == 'cuda'", "'adamw_torch'")
    assert made["one"] == "rank_device"
    namespace = {"torch": torch}
    exec("device = 'cuda' if torch.cuda.is_available() else 'cpu'\nplain = "
         + src.split("plain = ", 1)[1].split("\n", 1)[0], namespace)
    assert namespace["plain"] == namespace["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cd_expands_what_ipython_expands(tmp_path, monkeypatch):
    """`%cd {os.getcwd()}/x` became os.chdir('{os.getcwd()}/x'), a folder with braces in its name."""
    (tmp_path / "work" / "data").mkdir(parents=True)
    conv = convert_notebook(make_nb(tmp_path, ["import os\nbase = 'work'\n%cd {os.getcwd()}/work\n%cd ..\n"
                                               "%cd $base/data\n%cd ~", *TRAIN]))
    lines = [line.strip() for line in conv.source.splitlines() if "chdir" in line and "kit" not in line]
    assert lines == ["os.chdir(f'{os.getcwd()}/work')", "os.chdir('..')", "os.chdir(f'{base}/data')",
                     "os.chdir(os.path.expanduser('~'))"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "work"))
    seen = []
    namespace = {"os": os, "base": "work"}
    for line in lines:
        exec(line, namespace)
        seen.append(os.getcwd())
    assert seen == [str(tmp_path / "work"), str(tmp_path), str(tmp_path / "work" / "data"), str(tmp_path / "work")]


def test_shell_lines_after_training_run_there_on_rank_0_or_are_flagged(tmp_path):
    """`!zip -r out.zip o` after trainer.train() was listed as "run before launching" with no REVIEW;
    then `!wget URL` followed by Python that opens the file crashed rank 0 before the notebook's own
    save. A one-line shell command after training now runs in place, on rank 0; what cannot (IPython's
    `{var}` expansion, a `\\` continuation) is flagged to run once the script has finished."""
    conv = convert_notebook(make_nb(tmp_path, ["!nvidia-smi\n!pip install -q trl", TRAIN[0],
                                               TRAIN[1] + "\n!ls o", "!wget https://x.org/a.flac\nopen('a.flac')\n"
                                               "!zip -r {name}.zip o\n!pip install gguf\ntrainer.save_model('s')"]))
    doc = ast.get_docstring(ast.parse(conv.source))
    first, then = doc.split("run what you need before launching:", 1)[1].split("once this script has finished:")
    assert "!nvidia-smi" in first and "!pip install -q trl" in first and "!pip install gguf" in first
    assert "!zip -r {name}.zip o" in then and "!zip" not in first and "!ls" not in doc and "wget" not in doc
    tail = rank0_tail(conv.source)
    ls, wget, opened, saved = (tail.index(x) for x in ("subprocess.run('ls o', shell=True)",
                               "subprocess.run('wget https://x.org/a.flac', shell=True)", "open('a.flac')",
                               "trainer.save_model('s')"))
    assert ls < wget < opened < saved  # in the notebook's order, where rank 0 runs alone
    assert "subprocess.run" not in conv.source[:conv.source.index("dist.destroy_process_group()\n")]
    reviews = [c for c in texts(conv) if "REVIEW" in c and "ran after training" in c]
    assert len(reviews) == 1 and "`!zip -r {name}.zip o`" in reviews[0]
    assert changed(conv, 4, "`!wget https://x.org", "ran after training", "subprocess.run", review=False)
    assert changed(conv, 1, "`!nvidia-smi`", "`!pip install -q trl`", "shell commands", review=False)


def test_media_players_are_removed_not_printed_as_object_reprs(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, ["from IPython.display import Audio, Image, display", *TRAIN,
                                               "display(Audio('x.wav'))\nAudio(url)\nImage(filename='p.png')\n"
                                               "player = Audio(url)\ndisplay(df)"]))
    tail = rank0_tail(conv.source)
    lines = [line.strip() for line in tail.splitlines()]
    assert "Audio('x.wav')" not in tail and "Audio(url)" not in lines and "Image(" not in tail
    assert "player = Audio(url)" in tail and "print(df)" in tail  # an assignment is kept; a table prints
    assert len(changed(conv, 4, "audio/image/video", "only in a notebook")) == 3


def test_unseeded_data_prep_gets_the_notebook_seed(tmp_path):
    nb = make_nb(tmp_path, ["import random\nds = ds.shuffle().select(range(10))\nsp = ds.train_test_split(test_size=0.2)\n"
                            "keep = ds.shuffle(seed=1)\nsub = df.sample(frac=0.5)\npick = random.sample(rows, 2)",
                            "args = SFTConfig(output_dir='o', seed=3407)\ntrainer = SFTTrainer(args=args)\ntrainer.train()"])
    conv = convert_notebook(nb)
    src = conv.source
    assert [c.get("seed") for c in calls(src, "ds.shuffle")] == ["3407", "1"]
    assert call(src, "ds.train_test_split")["seed"] == "3407" and call(src, "df.sample")["random_state"] == "3407"
    assert "random.seed(3407)" in src.split("training_ok = False")[0]
    assert changed(conv, None, "random.seed(3407)", "rank block", "SFTConfig(seed=3407)")
    plain = convert_notebook(make_nb(tmp_path, ["ds = ds.shuffle()", *TRAIN, "pick = eval_ds.shuffle()[0]"],
                                     "plain.ipynb"))
    assert "ds.shuffle(seed=42)" in plain.source
    assert "eval_ds.shuffle()[0]" in rank0_tail(plain.source)  # after training rank 0 alone: left as it was
    spelled = convert_notebook(make_nb(tmp_path, ["import numpy\nx = numpy.random.rand(8)", *TRAIN], "np.ipynb"))
    assert "np.random.seed(42)" in spelled.source.split("training_ok = False")[0]  # numpy.random, not only np.random
    seeded = convert_notebook(make_nb(tmp_path, ["import numpy\nnumpy.random.seed(1)\nx = numpy.random.rand(8)",
                                                 *TRAIN], "npseeded.ipynb"))
    assert "np.random.seed(" not in seeded.source.split("training_ok = False")[0]


def test_device_maps_cpu_and_use_cpu(tmp_path):
    nb = make_nb(tmp_path, ["m = AutoModelForCausalLM.from_pretrained('x')\n"
                            "c = AutoModelForCausalLM.from_pretrained('x', device_map='cpu')\n"
                            "d = AutoModelForCausalLM.from_pretrained('x', device_map={'': 'cpu'})\n"
                            "u, tok = FastLanguageModel.from_pretrained(model_name='x')",
                            "from transformers import TrainingArguments\nargs = TrainingArguments('o')\n"
                            "trainer = Trainer(model=m, args=args)\ntrainer.train()"])
    conv = convert_notebook(nb)
    src = conv.source
    assert "from_pretrained('x')\n" in src  # transformers loads on the CPU; Trainer moves it to the rank's GPU
    assert "device_map='cpu'" in src and "device_map={'': 'cpu'}" in src
    assert keywords(src, "FastLanguageModel.from_pretrained")["device_map"] == "{'': rank_device}"
    args = keywords(src, "TrainingArguments")
    assert args["use_cpu"] == NO_CUDA
    [why] = [c for c in texts(conv) if "ddp_find_unused_parameters" in c]
    assert "PEFT" not in why and "unused parameters" in why  # a full fine-tune


def test_keep_global_batch(tmp_path):
    nb = make_nb(tmp_path, ["args = SFTConfig(output_dir='o', gradient_accumulation_steps=8)\n"
                            "trainer = SFTTrainer(args=args)\ntrainer.train()"])
    conv = convert_notebook(nb, keep_global_batch=True)
    assert keywords(conv.source, "SFTConfig")["gradient_accumulation_steps"] == "max(1, 8 // world_size)"
    assert "--keep-global-batch" in conv.source.split(TRIPLE)[1]
    default = convert_notebook(nb)
    assert keywords(default.source, "SFTConfig")["gradient_accumulation_steps"] == "8"
    assert changed(default, 1, "N GPUs train on N times", review=False)
    one = make_nb(tmp_path, ["args = SFTConfig(output_dir='o')\ntrainer = SFTTrainer(args=args)\ntrainer.train()"], "one.ipynb")
    assert changed(convert_notebook(one, keep_global_batch=True), 1, "--keep-global-batch",
                   "gradient_accumulation_steps", "is 1", review=True)


def test_vllm(tmp_path, capsys):
    fast = make_nb(tmp_path, ["m, t = FastLanguageModel.from_pretrained(model_name='x', fast_inference=True)",
                              "trainer = GRPOTrainer(model=m, args=GRPOConfig(output_dir='o'))\ntrainer.train()"])
    src = convert_notebook(fast).source
    assert "fast_inference" not in src.split("training_ok")[1]  # dropped: vLLM is off (tests/test_convert_grpo.py)
    before = make_nb(tmp_path, ["from vllm import LLM\nllm = LLM(model='x')\nrows = llm.generate(['a'])", *TRAIN], "b.ipynb")
    code, _, err = cli([str(before), "-o", str(tmp_path / "x.py")], capsys)
    assert code == 2 and err.startswith("error: cell 1, line 2: ") and "vLLM's LLM()" in err
    assert err.count("\n") == 1
    after = make_nb(tmp_path, [*TRAIN, "from vllm import LLM\nllm = LLM(model='x')\nprint(llm.generate(['a']))"], "a.ipynb")
    tail = rank0_tail(convert_notebook(after).source)
    assert "llm = LLM(model='x')" in tail


def test_written_and_launched_script_is_converted(tmp_path):
    nb = make_nb(tmp_path, ["!pip install trl", "%%writefile train.py\nfrom trl import SFTTrainer, SFTConfig\n"
                            "def main():\n    t = SFTTrainer(model='x', args=SFTConfig(output_dir='o'))\n    t.train()\n"
                            "    t.save_model()\n\nif __name__ == '__main__':\n    main()",
                            "!accelerate launch --multi_gpu \\\n  --num_processes 2 train.py\n!ls o"])
    conv = convert_notebook(nb)
    assert "t.save_model()" in guarded(conv.source)
    assert changed(conv, 2, "train.py", "(cell 3 launches it")
    # The launch is this script now: listed to run after it, it would train the job twice.
    doc = ast.get_docstring(ast.parse(conv.source))
    assert "accelerate launch" not in doc and "--num_processes" not in doc
    assert call_at(conv.source, "subprocess.run", "'ls o'")["line"] > line_of(conv.source, "destroy_process_group")
    assert changed(conv, 3, "`!accelerate launch", "replaced by this script")
    assert not any("accelerate" in c and "REVIEW" in c for c in texts(conv))


def test_comment_only_cells_kept_and_imports_inside_try(tmp_path):
    nb = make_nb(tmp_path, ["# TODO: a longer run\n# next week", "import trl", *TRAIN])
    src = convert_notebook(nb).source
    assert [ln.strip() for ln in src.splitlines() if ln.strip().startswith("# TODO")] == ["# TODO: a longer run"]
    assert src.splitlines()[src.splitlines().index("    # TODO: a longer run") + 1] == "    # next week"
    [try_node] = [n for n in ast.parse(src).body if isinstance(n, ast.Try)]
    assert ast.unparse(try_node.body[0]) == "import trl"


def test_notebook_launcher_becomes_a_call(tmp_path):
    nb = make_nb(tmp_path, ["from accelerate import notebook_launcher",
                            "def fn(a):\n    trainer = Trainer(model=m)\n    trainer.train()",
                            "notebook_launcher(fn, (1,), num_processes=2)"])
    assert "fn(*(1,))" in convert_notebook(nb).source


@pytest.mark.parametrize("argv, message", [
    (["--dry-run-model", "models/tiny-qwen3"], "only make sense with --dry-run"),
    (["--dry-run-push"], "only make sense with --dry-run"),
    (["--dry-run", "--dry-run-model", "nowhere"], "no config.json there"),
    (["--dry-run", "--dry-run-data", "nowhere.jsonl"], "no such file"),
])
def test_dry_run_option_errors(tmp_path, capsys, argv, message):
    out = tmp_path / "x.py"
    code, _, err = cli([str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", str(out), *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and not out.exists()


def test_dry_run_swaps_hub_ids_but_not_the_notebooks_own(tmp_path):
    from kit.notebooks.convert.dryrun import TINY_DATA, TINY_MODEL, dry_run_dataset

    nb = make_nb(tmp_path, ["MODEL = 'org/big'\nm = AutoModelForCausalLM.from_pretrained(MODEL, load_in_4bit=True, "
                            "quantization_config=q, dtype=torch.bfloat16)\ntok = AutoTokenizer.from_pretrained('gpt2')\n"
                            "ds = load_dataset('yahma/alpaca-cleaned', split='train[:10]')\nj = load_dataset('json', data_files='x')\n"
                            "f = lambda e: e['instruction']",
                            "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='out', optim='adamw_8bit'))\ntrainer.train()",
                            "trainer.save_model()\nm2 = AutoPeftModelForCausalLM.from_pretrained('out')"])
    src = convert_notebook(nb, dry_run=True).source
    load = keywords(src, "AutoModelForCausalLM.from_pretrained")
    assert "quantization_config" not in load and "load_in_4bit" not in load and load["dtype"] == "torch.float32"
    assert src.count(repr(str(TINY_MODEL))) == 2 and "from_pretrained('out')" in src
    assert call_at(src, "kit_dry_run.load_dataset", "'yahma/alpaca-cleaned'")["split"] == "'train[:10]'"
    assert "schema='alpaca'" in src and f"data={str(TINY_DATA)!r}" in src
    assert call_at(src, "kit_dry_run.load_dataset", "'json'")["data_files"] == "'x'"  # not here: the run time decides
    args = keywords(src, "SFTConfig")
    assert args["max_steps"] == "2" and args["optim"] == "'adamw_torch'" and args["report_to"] == "'none'"
    assert "DRY RUN" in ast.get_docstring(ast.parse(src))
    rows = dry_run_dataset("alpaca", split="train[:10]")
    assert len(rows) == 10 and set(rows.column_names) == {"instruction", "input", "output"}
    assert len(dry_run_dataset("sharegpt", split="train[:50%]")) == 212
    assert list(dry_run_dataset("messages")) == ["train", "validation", "test"]  # notebooks read all three


@pytest.mark.slow
def test_a_dry_run_writes_nothing_to_the_hub(tmp_path):
    """A dry run trains kit's stand-in for two steps: pushing that to the notebook's own repo would
    replace the user's model. push_to_hub=True becomes False and every Hub write is skipped, out
    loud; run offline, any call left would fail (OfflineModeIsEnabled), so the run exiting 0 shows it."""
    nb = json.loads((FIXTURES / "tiny_cpu_sft.ipynb").read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        cell["source"] = text.replace('report_to="none",', 'report_to="none", push_to_hub=True, hub_model_id="me/real",')
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": (
        "from huggingface_hub import HfApi, create_repo\ncreate_repo('me/real-merged', exist_ok=True)\n"
        "trainer.push_to_hub()\nHfApi().upload_folder(repo_id='me/real', folder_path=OUTPUT_DIR)\n"
        "model.save_pretrained('merged', push_to_hub=True, repo_id='me/real-merged')")})
    path = tmp_path / "pushes.ipynb"
    path.write_text(json.dumps(nb))
    src = convert_notebook(path, dry_run=True).source
    assert keywords(src, "SFTConfig")["push_to_hub"] == "False"
    assert "HF_TOKEN" not in src.split("training_ok = False")[0]  # no token asked for: nothing needs one
    (tmp_path / "train_ddp.py").write_text(src)
    res = _run([sys.executable, "train_ddp.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("[dry run] skipped") == 3  # create_repo, push_to_hub, upload_folder
    assert (tmp_path / "merged" / "config.json").is_file()  # saved locally, not pushed


@pytest.mark.parametrize("loader, refused", [("AutoModelForMaskedLM", False), ("WhisperForConditionalGeneration", True),
                                             ("AutoModelForAudioClassification", True), ("AutoModelForSeq2SeqLM", False),
                                             ("AutoModelForSequenceClassification", False),
                                             ("AutoModelForCausalLM", False)])
def test_dry_run_refuses_a_head_its_stand_in_has_not(tmp_path, capsys, loader, refused):
    """A masked-LM notebook's dry run failed inside the script with a transformers traceback."""
    nb = make_nb(tmp_path, [f"m = {loader}.from_pretrained('bert-base-uncased')", *TRAIN])
    out = tmp_path / "dry.py"
    code, _, err = cli([str(nb), "-o", str(out), "--dry-run"], capsys)
    if refused:
        assert code == 2 and err.count("\n") == 1 and not out.exists()
        assert f"--dry-run: {loader}" in err and ".from_pretrained needs" in err and "--dry-run-model" in err
    else:
        assert code == 0 and out.exists(), err


def test_missing_token_stops_before_any_work(tmp_path, monkeypatch):
    """A notebook that pushes: without a token the script stops at the top, before loading anything.
    The script runs in this process (runpy): huggingface_hub read where a saved token lives when it was
    imported, so that path is pointed at an empty folder here as HF_TOKEN_PATH does for a new process."""
    from huggingface_hub import constants

    from tests.scripts import cpu_env, train_here

    nb = make_nb(tmp_path, ["import trl\nopen('started', 'w').close()", *TRAIN, "trainer.push_to_hub()"])
    assert main(["convert", str(nb), "-o", str(tmp_path / "train_ddp.py")]) == 0
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    env = {k: v for k, v in cpu_env().items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    res = train_here([], env=env, script=tmp_path / "train_ddp.py", cwd=tmp_path)
    assert res.returncode == 1 and "set HF_TOKEN" in res.stderr
    assert not (tmp_path / "started").exists()


def test_a_collective_inside_a_print_runs_on_every_rank(tmp_path):
    """`print(trainer.evaluate())` under `if is_main:` would leave rank 0 waiting in evaluate()'s
    gather for ranks that never come: the call is hoisted for every rank, only the print is rank 0's
    (the corpus notebook hf_trainer_clm_full runs this shape under real torchrun)."""
    conv = convert_notebook(make_nb(tmp_path, [*TRAIN, "print(f\"F1: {trainer.predict(test).metrics['f1']}\")\n"
                                                       "for d in sets:\n    json.dump(trainer.evaluate(d), f)"]))
    made = assigns(conv.source)
    assert ("kit_result", "trainer.predict(test)") in made and ("kit_result", "trainer.evaluate(d)") in made
    shown = guarded(conv.source)
    assert "json.dump(kit_result, f)" in shown and any("{kit_result.metrics[" in s for s in shown)
    assert line_of(conv.source, "trainer.predict") < line_of(conv.source, "print", "kit_result.metrics")
    assert line_of(conv.source, "trainer.evaluate", "(d)") < line_of(conv.source, "json.dump")
    assert changed(conv, 3, "trainer.predict()", "taken out", review=False)


def test_hub_use_in_dead_code_asks_for_no_token(tmp_path):
    """Unsloth's notebooks keep their merge/push cells under `if False:`; only a live push or login
    makes the script refuse to start without a token."""
    dead = ["if False: model.push_to_hub_merged('me/x', tokenizer, save_method='merged_16bit')",
            "if True:\n    pass\nelse:\n    model.push_to_hub('me/x')", "if 0:\n    login(token='x')"]
    conv = convert_notebook(make_nb(tmp_path, [*TRAIN, *dead]))
    assert "get_token() is None" not in conv.source
    live = convert_notebook(make_nb(tmp_path, [*TRAIN, *dead, "if True: model.push_to_hub('me/x')"], "live.ipynb"))
    assert checks_token(live.source)


def test_a_repo_name_without_a_push_or_a_non_hub_secret_asks_for_no_token(tmp_path):
    """smol-course: `# login()` commented out, TrainingArguments(hub_model_id=..., push_to_hub=False):
    nothing reaches the Hub, yet the script refused to start without a token. A W&B key read from
    Colab's userdata is not the Hub's either."""
    quiet = convert_notebook(make_nb(tmp_path, [
        "# login()\nfrom google.colab import userdata\nkey = userdata.get('WANDB_API_KEY')\n"
        "from trl import SFTTrainer, SFTConfig\nargs = SFTConfig(output_dir='o', hub_model_id='me/x', push_to_hub=False)",
        "trainer = SFTTrainer(model=m, args=args, train_dataset=d)\ntrainer.train()"]))
    assert "get_token() is None" not in quiet.source
    for line in ("args2 = SFTConfig(output_dir='o', hub_model_id='me/x', push_to_hub=True)",
                 "t = userdata.get('HF_TOKEN')", "t = userdata.get(name)"):
        loud = convert_notebook(make_nb(tmp_path, [*TRAIN, line], "loud.ipynb"))
        assert checks_token(loud.source), line


def test_a_login_with_the_notebooks_own_token_is_kept_as_its_token(tmp_path):
    """`login(token=hf_token)` after load_dotenv(): the token is the notebook's own, so it becomes
    HF_TOKEN for every rank, and no up-front check refuses a run whose token is not in HF_TOKEN yet.
    A Kaggle/Colab secret stays an environment lookup with the up-front check, as before."""
    own = convert_notebook(make_nb(tmp_path, ["import os\nfrom dotenv import load_dotenv\nload_dotenv()\n"
                                              "hf_token = os.getenv('hf_api_key')\nif hf_token: login(token=hf_token)",
                                              *TRAIN, "model.push_to_hub('me/x')"]))
    assert "set_hub_token(hf_token)" in own.source and "get_token() is None" not in own.source
    assert call(own.source, "set_hub_token")[0] == "hf_token" and not calls(own.source, "login")
    assert not checks_token(own.source)
    ns = {"_kit_os": os}
    exec(compile(own.source[own.source.index("def set_hub_token"):own.source.index("\n\n", own.source.index(
        "def set_hub_token"))], "s", "exec"), ns)
    saved = os.environ.pop("HF_TOKEN", None)
    try:
        ns["set_hub_token"](None)  # an empty token: nothing set, and no prompt
        assert "HF_TOKEN" not in os.environ
        ns["set_hub_token"]("hf_x")
        assert os.environ["HF_TOKEN"] == "hf_x"
    finally:
        os.environ.pop("HF_TOKEN", None)
        if saved is not None:
            os.environ["HF_TOKEN"] = saved
    secret = convert_notebook(make_nb(tmp_path, ["from kaggle_secrets import UserSecretsClient\n"
                                                 "hf_token = UserSecretsClient().get_secret('HF_TOKEN')\n"
                                                 "login(token=hf_token)", *TRAIN], "kaggle.ipynb"))
    assert "set_hub_token" not in secret.source and checks_token(secret.source)


def test_device_map_after_training_is_the_notebooks(tmp_path):
    """Before training each rank loads its own copy (device_map → the rank's GPU); after it rank 0
    runs alone with every GPU free, so a merge load keeps device_map="auto" and may spread out."""
    conv = convert_notebook(make_nb(tmp_path, [
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained('a', device_map='auto')",
        *TRAIN, "base = AutoModelForCausalLM.from_pretrained('a', device_map='auto')\nbase.push_to_hub('me/x')"]))
    body = conv.source.split("training_ok = False", 1)[1]
    before, after = body.split("dist.destroy_process_group()", 1)
    split = line_of(conv.source, "destroy_process_group")
    [first, last] = calls(conv.source, "AutoModelForCausalLM.from_pretrained")
    assert first["line"] < split < last["line"]
    assert (first[0], first["device_map"]) == ("'a'", "{'': rank_device}")
    assert (last[0], last["device_map"]) == ("'a'", "'auto'")


@pytest.mark.parametrize("loader, ckpt, forced", [
    ("AutoModelForCausalLM", "False", True),          # a causal LM uses every parameter each step
    ("AutoModelForAudioClassification", "False", False),  # wav2vec2's LayerDrop skips layers: False fails
    ("AutoModelForAudioClassification", "True", True),    # checkpointing on: Trainer's own default is False
])
def test_find_unused_parameters_is_forced_off_only_where_every_parameter_is_used(tmp_path, loader, ckpt, forced):
    nb = make_nb(tmp_path, [f"from transformers import {loader}, TrainingArguments, Trainer\n"
                            f"m = {loader}.from_pretrained('x')\n"
                            f"args = TrainingArguments('out', gradient_checkpointing={ckpt})\n"
                            "trainer = Trainer(model=m, args=args)\ntrainer.train()"])
    conv = convert_notebook(nb)
    args = keywords(conv.source, "TrainingArguments")
    assert args.get("ddp_find_unused_parameters") == ("False" if forced else None)
    if not forced:
        assert changed(conv, 1, "ddp_find_unused_parameters", "left to Trainer")


def test_a_shell_line_inside_a_block_is_flagged_and_a_token_in_one_is_never_written(tmp_path):
    """`!pip install` inside `if IN_COLAB:` is setup, dropped as before; a command run per pass of a
    loop cannot be "run first": it is flagged for review where it was. A dropped line holding a token
    is listed with the token as *** (the script never holds a token)."""
    token = "hf_" + "a" * 30
    conv = convert_notebook(make_nb(tmp_path, [
        f"if IN_COLAB:\n    !pip install unsloth\n!huggingface-cli login --token {token}",
        "for f in files:\n    !python make_pairs.py {f} --out data/{f}.json\n    n = 1", *TRAIN]))
    assert token not in conv.source and "--token ***" in conv.source and "!huggingface-cli login" in conv.source
    [flagged] = [ln for ln in conv.source.splitlines() if "make_pairs.py" in ln and "#" in ln]
    assert flagged.split("#")[0].strip() == "pass" and "kit: REVIEW (cell 2)" in flagged
    assert "{f} --out data/{f}.json" in flagged and "was dropped" in flagged
    reviews = [c for c in texts(conv) if "REVIEW" in c]
    assert len(reviews) == 1 and "make_pairs.py" in reviews[0]  # not the pip install


def test_bf16_hard_coded_through_a_constant_is_flagged(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, ["BF16 = True", TRAIN[0], TRAIN[1].replace(
        "SFTConfig(output_dir='o')", "SFTConfig(output_dir='o', bf16=BF16)")]))
    assert changed(conv, 3, "SFTConfig", "bf16=BF16 is hard-coded", review=True)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="PEP 701 f-strings parse from Python 3.12")
def test_a_python_312_f_string_is_named_as_such(tmp_path):
    with pytest.raises(UsageError, match=r"cell 1, line 1: f-string: .* \(valid from Python 3\.12; kit runs on 3\.1"):
        convert_notebook(make_nb(tmp_path, ['print(f"{d["q"]}")', *TRAIN]))


def test_a_result_a_cell_showed_after_training_is_printed_by_rank_0(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, [*TRAIN, "model.print_trainable_parameters()\nscore = 1",
                                               "metric.compute(predictions=p, references=r)",
                                               "outputs = model.generate(x)\ntokenizer.batch_decode(outputs)",
                                               "model.save_pretrained('o')"]))
    tail = rank0_tail(conv.source)
    split = line_of(conv.source, "destroy_process_group")
    printed = {c[0].split("(")[0]: c for c in calls(conv.source, "print") if 0 in c}
    assert printed["metric.compute"]["line"] > split and printed["tokenizer.batch_decode"]["line"] > split
    assert squeeze(printed["metric.compute"][0]) == "metric.compute(predictions=p,references=r)" and "print(model.save_pretrained" not in tail
    assert changed(conv, 4, "the cell's last line", "`metric.compute(")
    early = convert_notebook(make_nb(tmp_path, ["model.print_trainable_parameters()", "ds = make()\nds",
                                                "base = trainer.evaluate()\nbase['eval_loss']",
                                                "trainer.evaluate()", *TRAIN], "early.ipynb"))
    shown = guarded(early.source)
    assert "model.print_trainable_parameters()" in shown
    # Before training too: the value a cell showed is printed by rank 0; a collective still runs on every rank.
    assert "print(ds)" in shown and "ds = make()" not in shown and ("ds", "make()") in assigns(early.source)
    assert "print(base['eval_loss'])" in shown
    assert "print(kit_result)" in shown and ("kit_result", "trainer.evaluate()") in assigns(early.source)
    assert not any("evaluate" in s for s in shown)


def test_dry_run_swaps_a_model_named_in_a_tuple_assignment_and_turns_liger_off(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, ["model_id, output_dir = 'Qwen/Qwen3-14B', 'out'",
                                               "from trl import SFTTrainer, SFTConfig",
                                               "trainer = SFTTrainer(model=model_id, args=SFTConfig(output_dir=output_dir, "
                                               "use_liger_kernel=True), train_dataset=d)\ntrainer.train()"]), dry_run=True)
    assert "SFTTrainer(model='" in conv.source and "tiny-qwen3" in conv.source.split("SFTTrainer(model=", 1)[1][:200]
    assert "use_liger_kernel=False" in conv.source


@pytest.mark.parametrize("line, what", [
    ('open_ai_key = "sk-proj-' + "Ab1" * 10 + '"', "an OpenAI/Anthropic API key"),
    ('wandb.login(key="' + "0123456789abcdef" * 2 + '01234567")', 'a secret (key="…")'),
    ('os.environ["WANDB_API_KEY"] = "' + "9f" * 20 + '"', 'a secret (WANDB_API_KEY="…")'),
    ('client = Client(api_key="AKIA' + "ABCDEFGHIJKLMNOP" + '")', "an AWS access key"),
    ('!wandb login ' + "a1" * 20 + ' && echo ghp_' + "x" * 36, "a GitHub token"),
    ("TOKEN = 'hf_' + '" + "abcdefghijklmnopqrstuvwxyz123456" + "'", "a Hugging Face token"),  # split: was written
])
def test_a_secret_in_a_cell_is_refused_by_cell_and_line_never_written(tmp_path, capsys, line, what):
    """Only Hugging Face tokens were kept out of the script: an OpenAI or W&B key in a cell was
    written into it verbatim. The error names the cell and line, never the value."""
    out = tmp_path / "x.py"
    nb = make_nb(tmp_path, [TRAIN[0], "import os\nx = 1\n" + line, TRAIN[1]])
    code, _, err = cli([str(nb), "-o", str(out)], capsys)
    assert code == 2 and err.startswith("error: cell 2, line 3 ") and what in err and err.count("\n") == 1
    assert not out.exists() and max(re.findall(r"[A-Za-z0-9_-]{16,}", line), key=len)[-16:] not in err


@pytest.mark.parametrize("line", ['open_ai_key = "sk-xxxx"  # replace with your key', 'api_key = "YOUR_API_KEY_HERE"',
                                  'tokenizer.pad_token = tokenizer.eos_token', 'max_tokens = 2048',
                                  'key = "meta-llama/Llama-3.1-8B-Instruct"'])
def test_placeholders_and_ordinary_names_are_not_secrets(tmp_path, line):
    assert line.split(" = ")[0] in convert_notebook(make_nb(tmp_path, [TRAIN[0], line, TRAIN[1]])).source


def test_dry_run_data_has_the_columns_the_notebook_names(tmp_path):
    """The stand-in rows had only the detected schema's columns: `samples["quote"]` raised KeyError and
    `remove_columns([...])` ValueError inside the dry run, on the notebook's own column names."""
    from kit.notebooks.convert.dryrun import dry_run_dataset

    nb = make_nb(tmp_path, ["data = load_dataset('Abirate/english_quotes')\n"
                            "data = data.map(lambda samples: tokenizer(samples['quote']), batched=True)\n"
                            "ds = load_dataset('HuggingFaceH4/Multilingual-Thinking', split='train')\n"
                            "ds = ds.remove_columns(column_names=['developer', 'user'])\nm = row['messages']", *TRAIN])
    src = convert_notebook(nb, dry_run=True).source
    extras = [k["extra"] for c in ("StandIns", "kit_dry_run.StandIns") for k in calls(src, c) if "extra" in k]
    assert extras == [repr(["developer", "quote", "user"])]  # StandIns(...) at the top
    rows = dry_run_dataset("messages", split="train", extra=["developer", "quote", "user"])
    assert {"messages", "quote", "developer", "user"} <= set(rows.column_names)
    assert rows.remove_columns(column_names=["developer", "user"]).column_names == ["messages", "quote"]
    assert rows[0]["quote"].strip()


def test_after_training_any_value_a_cell_showed_is_printed_unless_none(tmp_path):
    """`classifier(text)` or `tokenizer.decode(ids).replace(...)` as a cell's last line after training
    was computed and dropped: the notebook showed it. Shown now as IPython does: not when None, not
    after a `;`, and never a call run for its effect (save, push)."""
    conv = convert_notebook(make_nb(tmp_path, [*TRAIN, "classifier = pipeline('text-classification', model='o')\n"
                                               "classifier('I love this')", "tokenizer.decode(ids).replace('<pad>', '')",
                                               "plot_losses();", "model.save_pretrained('o')", "a + b"]))
    tail = rank0_tail(conv.source)
    shown = shown_if_not_none(conv.source)  # a save's None result is never shown
    assert len(shown) == 2 and shown[0].startswith("classifier(") and "I love this" in shown[0]
    assert shown[1].startswith("tokenizer.decode(ids).replace(") and "'<pad>', ''" in shown[1]
    assert "print(a + b)" in tail and "plot_losses();" in tail and line_of(conv.source, "print", "a + b") > \
        line_of(conv.source, "destroy_process_group")
    before = convert_notebook(make_nb(tmp_path, ["prepare(ds)", *TRAIN], "before.ipynb")).source
    assert "shown :=" not in before  # before training every rank runs it: left as it was


def test_deletes_are_rank_0_writes_at_any_depth(tmp_path):
    """`shutil.rmtree(output_dir)` inside a notebook's own training function ran on every rank: rank 1
    removed the folder rank 0 was still saving into (and two ranks removing one folder race)."""
    conv = convert_notebook(make_nb(tmp_path, [TRAIN[0], "import os, shutil\ndef phase(out):\n"
                                               "    t = SFTTrainer(model=m, args=SFTConfig(output_dir=out), train_dataset=d)\n"
                                               "    t.train()\n    t.save_model(out + '/final')\n"
                                               "    shutil.rmtree(out + '/checkpoints')\n    os.remove(out + '/log.txt')",
                                               "phase('o1')\nphase('o2')"]))
    calls = guarded_calls(conv.source)
    assert {"t.save_model", "shutil.rmtree", "os.remove"} <= calls


def test_a_written_training_script_is_converted_beside_another_launched_script(tmp_path):
    """`!python prepare_data.py` (a script the notebook did not write) beside a %%writefile train.py it
    launches: train.py is the job, not a reason to refuse."""
    conv = convert_notebook(make_nb(tmp_path, ["!python prepare_data.py --out d", "%%writefile train.py\n"
                                               "from trl import SFTTrainer, SFTConfig\nt = SFTTrainer(model='x', "
                                               "args=SFTConfig(output_dir='o'))\nt.train()",
                                               "!accelerate launch --multi_gpu train.py"]))
    assert "t.train()" in conv.source
    assert words_in(ast.get_docstring(ast.parse(conv.source)), "!python", "prepare_data.py", "--out", "d")


@pytest.mark.slow
@pytest.mark.parametrize("trainer, dataset", [("DPO", "trl-lib/ultrafeedback_binarized"), ("KTO", "trl-lib/kto-mix-14k")])
def test_a_dry_run_of_a_preference_notebook_trains_on_stand_in_rows(tmp_path, trainer, dataset):
    """A DPO or KTO notebook names no column (it hands the Hub dataset to the trainer): its stand-in rows
    were chat messages, which DPOTrainer cannot read. Now the trainer picks them: pairs with another
    request's answer as the rejected one, or answers labelled desirable and undesirable in turn."""
    nb = make_nb(tmp_path, ["from datasets import load_dataset\nfrom transformers import AutoModelForCausalLM, "
                            f"AutoTokenizer\nfrom trl import {trainer}Config, {trainer}Trainer",
                            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2-0.5B-Instruct')\n"
                            "tokenizer = AutoTokenizer.from_pretrained('Qwen/Qwen2-0.5B-Instruct')",
                            f"train_dataset = load_dataset('{dataset}', split='train')",
                            f"args = {trainer}Config(output_dir='out', per_device_train_batch_size=2, logging_steps=1)\n"
                            f"trainer = {trainer}Trainer(model=model, args=args, processing_class=tokenizer, "
                            "train_dataset=train_dataset)\ntrainer.train()", "trainer.save_model('out/final')"])
    assert main(["convert", str(nb), "-o", str(tmp_path / "train_ddp.py"), "--dry-run"]) == 0
    schema = "preference" if trainer == "DPO" else "unpaired_preference"
    assert f"StandIns(schema={schema!r}" in (tmp_path / "train_ddp.py").read_text()
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    res = _run([torchrun, "--standalone", "--nproc_per_node=2", "train_ddp.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "train_loss" in res.stdout and (tmp_path / "out" / "final").is_dir()


# --- what the user runs next, and one REVIEW line per construct ----------------------------------

def test_convert_prints_the_next_commands(tmp_path, capsys):
    nb = make_nb(tmp_path, TRAIN, name="my nb.ipynb")
    out = tmp_path / "train_ddp.py"
    code, stdout, _ = cli([str(nb), "-o", str(out)], capsys)
    last = stdout.splitlines()[-1]
    assert code == 0 and last.split()[:5] == ["next:", *TORCHRUN2, str(out)]
    dry = tmp_path / "train_ddp_dry_run.py"
    assert words_in(last, "kit", "convert", f"'{nb.parent}/my", "nb.ipynb'", "-o", str(dry), "--dry-run", "&&",
                    *TORCHRUN2, str(dry))
    code, stdout, _ = cli([str(nb), "-o", str(dry), "--dry-run"], capsys)
    last = stdout.splitlines()[-1]
    assert code == 0 and last.split()[:5] == ["next:", *TORCHRUN2, str(dry)] and "(the dry run" in last


def test_one_review_line_per_construct_on_a_line(tmp_path):
    nb = make_nb(tmp_path, ["import torch\nuse_bf16 = torch.cuda.is_bf16_supported() and torch.cuda.is_bf16_supported()",
                            *TRAIN])
    conv = convert_notebook(nb)
    reviews = [c for c in texts(conv) if "is_bf16_supported" in c]
    flagged = [ln for ln in conv.source.splitlines() if "kit: REVIEW (cell 1)" in ln and "is_bf16_supported()" in ln]
    assert len(reviews) == 1 and len(flagged) == 1


# --- a notebook that rebinds the names kit's own code uses -------------------------------------------

REBINDS = [
    "import torch as th\nclass SFTConfig(dict):\n    def __init__(self, **kw):\n        super().__init__(kw)",
    "torch = None  # the notebook's own\ndist = 'normal'\nos = 'linux'\nsys = 0\nlocal_rank = -1\nworld_size = 'all'\n"
    "device = 'cuda'",
    # A Trainer stand-in: every rank meets the others in train(), as a real one does.
    "class Trainer:\n    def __init__(self, args):\n        self.args = args\n    def train(self):\n"
    "        if th.distributed.is_initialized():\n            th.distributed.barrier()\n"
    "        print('use_cpu', self.args['use_cpu'], 'fp16', self.args['fp16'])\n"
    "    def save_model(self, path):\n        open(path, 'w').write('weights')\n"
    "trainer = Trainer(SFTConfig(output_dir='o', fp16=True))\ntrainer.train()",
    "trainer.save_model('model.bin')\nprint('after', device)",
]


def test_rebound_torch_and_os_use_kits_own_names(tmp_path):
    src = convert_notebook(make_nb(tmp_path, REBINDS)).source
    args = keywords(src, "SFTConfig")
    assert args["use_cpu"] == NO_CUDA.replace("torch", "_kit_torch") and "_kit_torch.cuda" in args["fp16"]
    made = [ifexp(v) for t, v in assigns(src) if t == "device" and " if " in v]
    assert made == [("'cuda'", "_kit_torch.cuda.is_available()", "'cpu'")]
    plain = convert_notebook(make_nb(tmp_path, TRAIN, "plain.ipynb")).source  # no rebinding: the plain names
    assert keywords(plain, "SFTConfig")["use_cpu"] == NO_CUDA


@pytest.mark.slow
def test_rebound_names_run_under_torchrun(tmp_path, capsys):
    assert main(["convert", str(make_nb(tmp_path, REBINDS)), "-o", str(tmp_path / "train_ddp.py")]) == 0
    capsys.readouterr()
    res = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train_ddp.py"],
               tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    # print() in the notebook's own class is rank 0's too, like every print before training
    assert res.stdout.count("use_cpu True fp16 False") == 1 and res.stdout.count("after cpu") == 1
    assert (tmp_path / "model.bin").read_text() == "weights"
    assert "destroy_process_group()" not in res.stderr  # torch's warning of a group left open


# --- distributed or device setup outside the Trainer; side effects and barriers at any depth ----------

SETUP = [
    "import os\n%env CUDA_VISIBLE_DEVICES=0\nos.environ['WORLD_SIZE'] = '1'\nos.environ.setdefault('MASTER_PORT', '29500')\n"
    "os.environ['WANDB_PROJECT'] = 'x'",
    "import subprocess, sys\ndef setup():\n    os.system('pip install -q peft')\n"
    "    subprocess.check_call([sys.executable, '-m', 'pip', 'install', 'trl==0.9'])\n    os.makedirs('out', exist_ok=True)\n"
    "setup()",
    "import torch\ntorch.cuda.set_device(0)\nfrom accelerate import Accelerator, FullyShardedDataParallelPlugin\n"
    "acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), mixed_precision='bf16', log_with='wandb')\n"
    "model = acc.prepare_model(model)\nmodel, opt = acc.prepare(model, opt)",
    *TRAIN,
    "os.system('pip install llama-cpp-python')",
]


def test_setup_outside_the_trainer_is_removed_with_its_reason(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, SETUP))
    src = conv.source
    code = src.split(TRIPLE, 2)[2]
    for gone in ("'CUDA_VISIBLE_DEVICES'", "'WORLD_SIZE'", "MASTER_PORT", "set_device(0)", "pip install -q peft",
                 "'install', 'trl==0.9'", "fsdp_plugin", "mixed_precision", "prepare"):
        assert gone not in code, gone
    made = assigns(code)
    assert ("os.environ['WANDB_PROJECT']", "'x'") in made and ("acc", "Accelerator(log_with='wandb')") in made
    assert ("model", "model") in made and ("(model, opt)", "(model, opt)") in made
    doc = ast.get_docstring(ast.parse(src))
    assert "!pip install -q peft" in doc_lines(src) and words_in(doc, "!python", "-m", "pip", "install", "trl==0.9")
    kept = call(src, "os.system")  # after training: rank 0 alone, kept
    assert "llama-cpp-python" in kept[0] and kept["line"] > line_of(src, "destroy_process_group")
    assert changed(conv, None, "CUDA_VISIBLE_DEVICES'", "removed", "each rank's own GPU")
    assert changed(conv, None, "`torch.cuda.set_device(0)`", "removed", "rank block already set")
    assert changed(conv, None, "Accelerator():", "fsdp_plugin,", "mixed_precision removed")
    assert changed(conv, None, "acc.prepare_model(model)", "→ model", "wraps the model for DDP")
    assert len(changed(conv, None, "every rank would install", "the same environment")) == 2


def _function(src: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)


CALLBACK_AND_PHASES = [
    "import wandb\nfrom transformers import TrainerCallback, AutoModelForCausalLM\nfrom trl import SFTTrainer, SFTConfig\n"
    "wandb.init(project='p')",
    "class WandbCB(TrainerCallback):\n    def on_log(self, args, state, control, logs=None, **kw):\n"
    "        wandb.log(logs)\n        wandb.run.summary['last'] = logs\n"
    "        if state.is_world_process_zero:\n            trainer_log_to_disk(logs)",
    "def trainer_log_to_disk(logs):\n    with open('log.txt', 'a') as f:\n        f.write(str(logs))",
    "def train_phase(name, data):\n    trainer = SFTTrainer(model=model, args=SFTConfig(output_dir=name), train_dataset=data,"
    " callbacks=[WandbCB()])\n    trainer.train()\n    trainer.save_model(name)\n    trainer.push_to_hub()\n"
    "    return AutoModelForCausalLM.from_pretrained(name)",
    "model = train_phase('phase1', d1)\nmodel = train_phase('phase2', d2)",
]


def test_callbacks_and_functions_guard_side_effects_and_barriers_go_where_the_write_is(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, CALLBACK_AND_PHASES))
    src = conv.source
    on_log = _function(src, "on_log")
    guarded = [ast.unparse(s) for n in ast.walk(on_log) if isinstance(n, ast.If) and ast.unparse(n.test) == "is_main"
               for s in n.body]
    assert "wandb.log(logs)" in guarded and "wandb.run.summary['last']=logs" in map(squeeze, guarded)
    phase = ast.unparse(_function(src, "train_phase"))
    assert phase.index("trainer.push_to_hub()") < phase.index("wait_for_all()") < phase.index("from_pretrained(name)")
    # No barrier where the def runs (it would run when the function is defined), none in a callback's helper
    # called under a rank test (the other ranks never arrive there).
    body = ast.parse(src).body[-1].body  # the try block
    defs = [i for i, s in enumerate(body) if isinstance(s, ast.FunctionDef)]
    assert defs and not any(ast.unparse(body[i + 1]).startswith("wait_for_all") for i in defs)
    assert "wait_for_all" not in ast.unparse(_function(src, "trainer_log_to_disk"))
    assert changed(conv, None, "barrier (wait_for_all)", "inside def train_phase")


def test_a_barrier_goes_inside_a_top_level_loop_that_writes_and_reads_back(tmp_path):
    nb = make_nb(tmp_path, ["from transformers import AutoModelForCausalLM",
                            "for p in ['a', 'b']:\n    model.save_pretrained(p)\n"
                            "    model = AutoModelForCausalLM.from_pretrained(p)", *TRAIN])
    loop = next(n for n in ast.walk(ast.parse(convert_notebook(nb).source)) if isinstance(n, ast.For))
    first, barrier, load = loop.body
    assert ast.unparse(first.test) == "is_main" and [ast.unparse(s) for s in first.body] == ["model.save_pretrained(p)"]
    assert ast.unparse(barrier) == "wait_for_all()"
    assert ast.unparse(load.targets[0]) == "model" and ast.unparse(load.value) == "AutoModelForCausalLM.from_pretrained(p)"


# --- shell cells after training: one rule ---------------------------------------------------------

SERVICE_AFTER = [
    "from trl import SFTTrainer, SFTConfig\ntrainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o', push_to_hub=True), "
    "train_dataset=d)\ntrainer.train()",
    "!huggingface-cli login\n!wandb login\n!wandb login --relogin 0123\ntrainer.save_model('out')",
    "%%bash\nnohup python -m http.server 18573 > server.log 2>&1 &\necho $! > server.pid\nhf auth login",
    "import urllib.request\nprint(urllib.request.urlopen('http://localhost:18573').status)",
    "%%bash\nexport HF_TOKEN=hf_" "abcdefghijklmnopqrstuvwxyz0123\ndocker run -d --name tgi -p 8080:80 ghcr.io/tgi",
    "import requests\nrequests.post('http://127.0.0.1:8080/generate', json={})",
    "!docker stop tgi",
    "!ls out",
]


def test_a_service_and_its_users_are_kept_or_dropped_together_and_logins_never_run(tmp_path):
    conv = convert_notebook(make_nb(tmp_path, SERVICE_AFTER))
    tail = rank0_tail(conv.source)
    # The server cell runs (through bash, on rank 0), and so does the cell that queries it.
    assert "nohup python -m" in tail and "http.server 18573" in tail and "executable='/bin/bash'" in tail
    assert "urlopen('http://localhost:18573')" in tail
    # The one kit cannot run (a token in it) takes its users along, and says so.
    assert "docker run" not in tail and "8080/generate" not in tail and "docker stop" not in tail
    assert len(changed(conv, None, "dropped with cell 5", "starts the service")) == 2
    split = line_of(conv.source, "destroy_process_group")
    ls = call_at(conv.source, "subprocess.run", "'ls out'")  # other shell lines still run in place
    assert ls["shell"] == "True" and ls["line"] > split
    # Interactive logins: never run, each dropped with its reason; a login with its key still runs.
    assert "login" not in tail.replace("wandb login --relogin", "")
    assert len(changed(conv, None, "an interactive login", "requires HF_TOKEN")) == 3
    [keyed] = [c for c in calls(conv.source, "subprocess.run") if "--relogin 0123" in c[0]]
    assert keyed[0].split()[:2] == ["'wandb", "login"] and keyed["shell"] == "True" and keyed["line"] > split
    assert not changed(conv, 3, "dropped the whole cell")


# --- big data literals: conversion time follows the code, not the data -------------------------------

def test_a_big_data_literal_is_kept_as_written_and_lines_still_count(tmp_path, capsys):
    rows = "ROWS = [\n" + "".join(f"    {{'q': 'question {i}', 'a': \"answer {i}\"}},\n" for i in range(3000)) + "]\n"
    blob = "BLOB = '" + "ab" * 20000 + "'\n"
    nb = make_nb(tmp_path, [rows + blob + "print(len(ROWS), len(BLOB))", *TRAIN])
    conv = convert_notebook(nb)
    assert rows in conv.source and blob.strip() in conv.source and "_kit_literal" not in conv.source
    assert not any("_kit_literal" in c for c in texts(conv))
    # Line numbers in messages stay the notebook's: the literal's lines still count.
    bad = make_nb(tmp_path, [rows + "steps = input('steps? ')", *TRAIN], "bad.ipynb")
    code, _, err = cli([str(bad), "-o", str(tmp_path / "x.py")], capsys)
    assert code == 2 and "cell 1, line 3003: " in err and "input()" in err
    # A key inside a big literal is still never written into the script.
    keyed = make_nb(tmp_path, [rows.replace("answer 7\"", "sk-proj-" + "a1" * 15 + "\""), *TRAIN], "keyed.ipynb")
    code, _, err = cli([str(keyed), "-o", str(tmp_path / "y.py")], capsys)
    assert code == 2 and "cell 1, line 9 " in err and "OpenAI/Anthropic API key" in err


def test_a_big_cell_parsed_statement_by_statement_converts_as_a_whole_one_does(tmp_path, monkeypatch):
    from kit.notebooks.convert import cells

    # A cell past the chunking threshold, lowered for the test: libcst's whole-cell parse of a cell past
    # the real 64,000 characters takes half a minute, and the threshold is not what is tested.
    monkeypatch.setattr(cells, "CHUNKED", 2_000)
    parts = ["# settings\n\nimport os\n"]
    for i in range(50):
        parts.append(f"# step {i}\nif os.environ.get('X{i}'):\n  value_{i} = [{i},\n     {i} + 1]  # two\n"
                     f"  # inside\nelse:\n\tvalue_{i} = '''a\n  b'''\n")
    nb = make_nb(tmp_path, ["".join(parts) + "print(value_1)\n# the end\n", *TRAIN])
    assert len(parts) * 60 > cells.CHUNKED
    chunked = convert_notebook(nb)
    monkeypatch.setattr(cells, "CHUNKED", 10 ** 9)  # the whole cell to libcst at once
    whole = convert_notebook(nb)
    assert chunked.source == whole.source and texts(chunked) == texts(whole)
    assert "        value_7 = [7,\n" in chunked.source and "# step 49\n" in chunked.source


def test_a_tracker_run_object_is_rank_0s_too(tmp_path):
    nb = make_nb(tmp_path, ["import wandb\nrun = wandb.init(project='p')",
                            "def log_it(x):\n    run.log({'x': x})\n    run.summary['best'] = x\nlog_it(1)", *TRAIN])
    src = convert_notebook(nb).source
    fn = ast.unparse(_function(src, "log_it"))
    assert guarded(fn) == ["run.log({'x': x})", "run.summary['best'] = x"]


def test_a_shell_cell_kit_does_not_run_is_listed_line_by_line(tmp_path):
    nb = make_nb(tmp_path, ["%%bash\n# fetch the data\ngit clone https://github.com/me/data\ncd data && make", *TRAIN,
                            "%%bash\nexport HF_TOKEN=hf_" "abcdefghijklmnopqrstuvwxyz0123\nhf upload me/m out"])
    conv = convert_notebook(nb)
    doc, changes = ast.get_docstring(ast.parse(conv.source)), texts(conv)
    before, after = doc.split("once this script has finished")
    assert words_in(before, "git", "clone", "https://github.com/me/data", "cd", "data", "&&", "make")
    assert [ln.strip() for ln in before.splitlines()].index("cd data && make") > 0
    assert "    hf upload me/m out\n" in after and "hf_abcdef" not in conv.source
    assert not any("dropped the whole cell" in c for c in changes)
    assert any(c.text.startswith("dropped `git clone") for c in changed(conv, 1, review=False))
    assert any(c.text.startswith("dropped `export HF_TOKEN") for c in changed(conv, 4, "=***", review=True))


def test_a_device_map_in_a_kwargs_dict_is_pinned_to_the_rank(tmp_path):
    """`from_pretrained(name, **model_kwargs)` with device_map="auto" in the dict split the model over
    every GPU on every rank (only a device_map keyword was pinned). A literal dict and dict(...) alike;
    after training, where rank 0 loads alone, the notebook's placement stays."""
    nb = make_nb(tmp_path, ["import torch\nfrom transformers import AutoModelForCausalLM\n"
                            "kw = {'device_map': 'auto', 'dtype': torch.bfloat16}\n"
                            "kw2 = dict(device_map='balanced', trust_remote_code=False)\n"
                            "keep = {'device_map': 'cpu'}\n"
                            "m = AutoModelForCausalLM.from_pretrained('org/m', **kw)", *TRAIN,
                            "merged = AutoModelForCausalLM.from_pretrained('o', **{'device_map': 'auto'})"])
    conv = convert_notebook(nb)
    code = conv.source.split(TRIPLE, 2)[2]
    made = dict(assigns(code))
    assert mapping(made["kw"]) == {"device_map": "{'': rank_device}", "dtype": "torch.bfloat16"}
    assert mapping(made["kw2"]) == {"device_map": "{'': rank_device}", "trust_remote_code": "False"}
    assert mapping(made["keep"]) == {"device_map": "'cpu'"}  # an intentional CPU load stays
    merged = call_at(conv.source, "AutoModelForCausalLM.from_pretrained", "'o'")
    assert mapping(merged["**"]) == {"device_map": "'auto'"} and merged["line"] > line_of(conv.source, "destroy_process_group")
    assert len(changed(conv, 1, "device_map='auto' →", '{"": rank_device}')) == 1
    assert len(changed(conv, 1, "device_map='balanced' →")) == 1
