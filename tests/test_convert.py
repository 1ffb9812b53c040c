"""`kit convert`: golden-style checks on notebooks shaped like real Unsloth/TRL/Kaggle ones, every
refusal branch through the real CLI, and the converted tiny notebook under real torchrun (gloo, CPU)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kit.cli import main
from kit.convert import convert_notebook
from kit.errors import UsageError

TRIPLE = '"' * 3
FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"
TRAIN = ["from trl import SFTTrainer, SFTConfig",
         "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'), train_dataset=d)\ntrainer.train()"]


def make_nb(tmp_path: Path, cells: list[str], name: str = "nb.ipynb") -> Path:
    """A notebook whose cells are `cells` (a "md:" prefix makes a markdown cell)."""
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


def keywords(source: str, func: str) -> dict[str, str]:
    """Keyword arguments (as source) of the first call to `func` in `source`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == func:
            return {k.arg: ast.unparse(k.value) for k in node.keywords}
    raise AssertionError(f"no call to {func}")


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
    assert "    !pip install unsloth\n" in ast.get_docstring(ast.parse(src))  # the user still sees what to install
    assert any(c.startswith("cell 2: dropped") and "`!pip install unsloth`" in c for c in changes)
    assert keywords(src, "FastLanguageModel.from_pretrained")["device_map"] == "{'': rank_device}"
    args = keywords(src, "SFTConfig")
    assert args["ddp_find_unused_parameters"] == "False"
    assert args["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"
    # --precision auto keeps Unsloth's capability-based choice untouched and flags nothing about it.
    assert args["fp16"] == "not is_bfloat16_supported()" and args["bf16"] == "is_bfloat16_supported()"
    assert not any("bf16" in c and "REVIEW" in c for c in changes)
    assert {"model.save_pretrained", "tokenizer.save_pretrained", "model.push_to_hub",
            "tokenizer.push_to_hub", "print"} <= guarded_calls(src)
    assert any(c.startswith("cell 14: REVIEW") and "generate" in c for c in changes)
    # Comments survive: libcst keeps the notebook's own words.
    assert "# Context length - can be longer, but uses more memory" in src


def test_trl_notebook_device_map_auto_and_login():
    conv = convert_notebook(FIXTURES / "trl_qlora_sft.ipynb")
    src, changes = conv.source, texts(conv)
    ast.parse(src)
    assert keywords(src, "AutoModelForCausalLM.from_pretrained")["device_map"] == "{'': rank_device}"
    assert "device_map" not in keywords(src, "AutoTokenizer.from_pretrained")
    [dm] = [c for c in changes if "device_map" in c]
    assert dm.startswith("cell 4:") and 'device_map="auto"' in dm
    assert "cannot be trained under DDP" in dm and "one after another" in dm
    assert not any(isinstance(n, ast.Call) and ast.unparse(n.func) == "notebook_login" for n in ast.walk(ast.parse(src)))
    assert "get_token() is None" in src and "HF_TOKEN" in src
    assert any(c.startswith("cell 2: notebook_login() replaced") for c in changes)
    assert {"trainer.save_model", "trainer.push_to_hub"} <= guarded_calls(src)
    assert keywords(src, "SFTConfig")["ddp_find_unused_parameters"] == "False"
    assert keywords(src, "SFTConfig")["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"


def test_seed002_notebook_balanced_bf16_login():
    conv = convert_notebook(FIXTURES / "seed002_kaggle_t4x2.ipynb")
    src, changes = conv.source, texts(conv)
    ast.parse(src)
    [dm] = [c for c in changes if "device_map" in c]
    assert dm.startswith("cell 5:") and 'device_map="balanced"' in dm and "cannot be trained under DDP" in dm
    assert keywords(src, "FastLanguageModel.from_pretrained")["device_map"] == "{'': rank_device}"
    # The user's own comment above the load is still there.
    assert "# Two T4s: spread the model over both" in src
    [bf16] = [c for c in changes if "bf16=True is hard-coded" in c]
    assert bf16.startswith("cell 7: REVIEW") and "T4" in bf16
    assert "# kit: REVIEW (cell 7): SFTConfig: bf16=True is hard-coded" in src
    assert any(c.startswith("cell 4: notebook_login() replaced") for c in changes)
    assert {"model.save_pretrained", "model.push_to_hub", "plt.plot", "plt.savefig", "print"} <= guarded_calls(src)
    assert any(c.startswith("cell 7: SFTConfig: note: under torchrun the global batch") for c in changes)
    assert any("`%pip install -q unsloth trl peft`" in c and "`!nvidia-smi`" in c for c in changes)


@pytest.mark.parametrize("precision, fp16, bf16", [("fp16", "True", "False"), ("bf16", "False", "True"),
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
    assert keywords(conv.source, "AutoModelForCausalLM.from_pretrained")["torch_dtype"] == "torch.float16"
    assert any(c.startswith("cell 1: BitsAndBytesConfig: bnb_4bit_compute_dtype=torch.bfloat16 → torch.float16")
               for c in texts(conv))
    auto = convert_notebook(nb)  # auto leaves the dtypes alone
    assert keywords(auto.source, "BitsAndBytesConfig")["bnb_4bit_compute_dtype"] == "torch.bfloat16"


def test_script_shape():
    conv = convert_notebook(FIXTURES / "trl_qlora_sft.ipynb", script_name="train_ddp.py")
    tree = ast.parse(conv.source)
    doc = ast.get_docstring(tree)
    assert "trl_qlora_sft.ipynb" in doc
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in doc and "python train_ddp.py" in doc
    src = conv.source
    assert src.index("local_rank = int(os.environ.get(\"LOCAL_RANK\", 0))") < src.index("# --- notebook cell")
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
    assert "echo hi" not in conv.source and "pip" not in conv.source.split(TRIPLE, 2)[2]
    assert any(c.startswith("cell 1: dropped the whole cell: `%%bash`") for c in texts(conv))
    env = convert_notebook(make_nb(tmp_path, ["%env WANDB_PROJECT=ha\n%cd /kaggle/working", *TRAIN], "env.ipynb"))
    assert any(c.startswith("cell 1: REVIEW: `%env WANDB_PROJECT=ha` was dropped") for c in texts(env))
    assert any(c.startswith("cell 1: REVIEW: `%cd /kaggle/working` was dropped") for c in texts(env))
    bad = make_nb(tmp_path, ["%pip install x\n\nmodel?", *TRAIN], "bad.ipynb")
    with pytest.raises(UsageError, match=r"cell 1, line 3: .*'model\?'"):
        convert_notebook(bad)


def test_review_flags_and_reload_barrier(tmp_path):
    nb = make_nb(tmp_path, [
        "import torch\nuse_bf16 = torch.cuda.is_bf16_supported()\nx = torch.zeros(1).to('cuda:0')\ndisplay(x)",
        "m.save_pretrained('base')\nm = AutoModelForCausalLM.from_pretrained('base')",
        "from google.colab import drive, userdata\ndrive.mount('/content/drive')\ntok = userdata.get('HF_TOKEN')",
        *TRAIN])
    conv = convert_notebook(nb)
    reviews = [c for c in texts(conv) if "REVIEW" in c]
    assert any("is_bf16_supported" in c and "pytorch#148322" in c for c in reviews)
    assert any("'cuda:0'" in c for c in reviews) and any("display()" in c for c in reviews)
    assert any(c.startswith("cell 3: REVIEW: drive.mount()") for c in reviews)
    assert any(c.startswith("cell 3: REVIEW: userdata.get()") for c in reviews)
    # Saved on rank 0, then everyone waits before loading it again.
    src = conv.source
    assert src.index("if is_main:\n        m.save_pretrained('base')") < src.index("dist.barrier()  # kit: every rank")
    assert src.index("dist.barrier()  # kit: every rank") < src.index("AutoModelForCausalLM.from_pretrained")


def test_logins(tmp_path):
    nb = make_nb(tmp_path, ["import wandb\nwandb.login()", "import huggingface_hub\nhuggingface_hub.login()",
                            "from huggingface_hub import login\nlogin(token=os.environ['HF_TOKEN'])",
                            "if True:\n    notebook_login()", *TRAIN])
    conv = convert_notebook(nb)
    changes = texts(conv)
    assert "wandb.login()" in conv.source  # not a Hub login: kept, flagged
    assert any(c.startswith("cell 1: REVIEW: wandb.login()") for c in changes)
    assert any(c.startswith("cell 2: huggingface_hub.login() replaced") for c in changes)
    assert "login(token=os.environ['HF_TOKEN'])" in conv.source and not any(c.startswith("cell 3") for c in changes)
    assert any(c.startswith("cell 4: REVIEW: notebook_login() prompts") for c in changes)


def test_training_args_call_without_keywords_is_completed(tmp_path):
    nb = make_nb(tmp_path, ["from transformers import TrainingArguments, Trainer\n"
                            "args = TrainingArguments('out', gradient_checkpointing=True, ddp_find_unused_parameters=True)\n"
                            "trainer = Trainer(model=m, args=args)\ntrainer.train()"])
    conv = convert_notebook(nb, "fp16")
    args = keywords(conv.source, "TrainingArguments")
    assert args["ddp_find_unused_parameters"] == "False" and args["fp16"] == "True" and args["bf16"] == "False"
    assert args["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"


# --- refusals: one line, exit 2, nothing written ----------------------------------------------------

@pytest.mark.parametrize("cells, message", [
    (["import ipywidgets as w\nw.IntSlider()", *TRAIN], "cell 1, line 1: ipywidgets"),
    (["steps = int(input('steps? '))", *TRAIN], "cell 1, line 1: input()"),
    (["x = 1", "x + 1", "y = _ * 2", *TRAIN], "cell 3, line 1: `_` is IPython's interactive state"),
    (["y = Out[2]", *TRAIN], "cell 1, line 1: `Out`"),
    (["ip = get_ipython()", *TRAIN], "cell 1, line 1: `get_ipython`"),
    (["import torch\nmodel.train()\nfor b in data:\n    loss(b).backward()"], "no training code found"),
    (["md:# only words"], "no training code found"),
    (["x = 1"], "no training code found"),
    (["x = 1", "y = !ls", *TRAIN], "cell 2, line 1: invalid syntax"),
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
    for path, message in [(tmp_path / "missing.ipynb", "no such notebook file"), (tmp_path, "no such notebook"),
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
    assert code == 0 and out.read_text().startswith('"""Rank-aware training script')
    lines = stdout.splitlines()
    assert lines[0].startswith("kit convert: tiny_cpu_sft.ipynb -> ") and "changes, 0 to review" in lines[0]
    assert all(line.startswith("  cell ") for line in lines[1:])


# --- the converted tiny notebook, for real --------------------------------------------------------

def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


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
    assert "destroy_process_group() was not called" not in res.stderr


def test_converted_notebook_runs_as_one_process(tmp_path):
    assert main(["convert", str(FIXTURES / "tiny_cpu_sft.ipynb"), "-o", str(tmp_path / "train_ddp.py")]) == 0
    res = _run([sys.executable, "train_ddp.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'epoch': '0.25'" in res.stdout and (tmp_path / "outputs" / "final-rank0").is_dir()


def test_unsloth_train_counts_as_training(tmp_path):
    nb = make_nb(tmp_path, ["from unsloth import unsloth_train",
                            "trainer = SFTTrainer(model=m, args=SFTConfig(output_dir='o'))\nstats = unsloth_train(trainer)"])
    assert "unsloth_train(trainer)" in convert_notebook(nb).source
