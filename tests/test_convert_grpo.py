"""`kit convert` on GRPO notebooks: vLLM (Unsloth's `fast_inference=True` and its sampling cells, TRL's
`use_vllm=True`) swapped for transformers generation with every change listed, the dry run's stand-in
prompts in the format the notebook's own reward functions read, and a reward function TRL cannot call
refused at conversion, naming its cell.

The corpus (tests/test_convert_corpus.py) runs both fixtures here under real torchrun, 2 CPU ranks,
without the vLLM stand-in on the path: the converted scripts import no vLLM."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kit.notebooks.convert import convert_notebook
from kit.notebooks.convert.dryrun import Plan
from tests.code_asserts import assigns, call, calls, squeeze
from tests.test_convert import cli, keywords, make_nb

FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"
UNSLOTH = FIXTURES / "unsloth_qwen3_grpo_fast_inference.ipynb"
TRL = FIXTURES / "trl_grpo_messages_colocate.ipynb"
WHY = "Colab's T4s"  # the reason every vLLM change gives


def _vllm_left(source: str) -> list[str]:
    """Every use of vLLM in a script's code: imports, vLLM keywords, vLLM-only model methods."""
    left = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
            left.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            left.append(ast.unparse(node))
        elif isinstance(node, ast.keyword) and node.arg and (node.arg in (
                "fast_inference", "gpu_memory_utilization", "max_lora_rank", "use_vllm") or node.arg.startswith("vllm_")):
            left.append(f"{node.arg}=")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("fast_generate", "load_lora", "save_lora") \
                and ast.unparse(node.func.value) != "kit_vllm":
            left.append(ast.unparse(node.func))
    return left


def test_unsloth_fast_inference_notebook_converts_to_transformers_generation(tmp_path, capsys):
    """It was refused ("fast_inference=True starts a vLLM engine in every torchrun rank"). Now the loader's
    vLLM arguments go, GRPOConfig loses vllm_sampling_params (its min_p moves over), the sampling cells
    go through kit_vllm over transformers' generate, save_lora is PEFT's save_pretrained; each is listed."""
    out = tmp_path / "train_ddp.py"
    code, report, err = cli([str(UNSLOTH), "-o", str(out)], capsys)
    assert code == 0, err
    source = out.read_text()
    assert _vllm_left(source) == []
    assert keywords(source, "GRPOConfig")["min_p"] == "0.1" and "top_k" not in keywords(source, "GRPOConfig")
    assert "model.save_pretrained('grpo_saved_lora')" in source.replace('"', "'")
    sample = call(source, "kit_vllm.fast_generate")
    assert (sample[0], sample[1]) == ("model", "tokenizer") and sample[2].startswith("[question]")
    assert call(source, "kit_vllm.load_lora")[1] == "'grpo_saved_lora'"
    assert [squeeze(c["lora_request"]) for c in calls(source, "kit_vllm.fast_generate")] == [
        "None", "kit_vllm.load_lora(model,'grpo_saved_lora')"]
    assert dict(assigns(source))["SamplingParams"] == "kit_vllm.SamplingParams"
    assert "class kit_vllm:" in source
    lines = [line for line in report.splitlines() if ": vllm: " in line]
    assert [line.split(":")[0].strip() for line in lines] == ["cell 3", "cell 7", "cell 7", "cell 9", "cell 10",
                                                              "cell 12", "cell 12"], lines
    assert all(k in lines[0] for k in ("dropped fast_inference", "gpu_memory_utilization", "max_lora_rank", WHY))
    doc = ast.get_docstring(ast.parse(source))
    assert WHY in " ".join(doc.split()) and "fast_inference=True" in doc
    dry = convert_notebook(UNSLOTH, dry_run=True).source  # text prompts (it builds its chats from them), short samples
    stand = call(dry, "StandIns")
    assert stand["schema"] == "'prompt_text'" and ast.literal_eval(stand["extra"])[:2] == ["answer", "solution"]
    assert "max_tokens = 8)" in dry


def test_trl_use_vllm_is_dropped_from_the_config(tmp_path, capsys):
    """use_vllm=True and the vllm_* settings were kept: TRL then needs vLLM in every rank."""
    out = tmp_path / "train_ddp.py"
    code, report, err = cli([str(TRL), "-o", str(out)], capsys)
    assert code == 0, err
    assert _vllm_left(out.read_text()) == [] and "class kit_vllm" not in out.read_text()  # nothing samples by hand
    line = next(ln for ln in report.splitlines() if "vllm: GRPOConfig: dropped" in ln)
    assert all(k in line for k in ("use_vllm=True", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode"))
    plain = convert_notebook(FIXTURES / "trl_grpo_lora.ipynb")  # use_vllm=False: nothing to say, nothing changed
    assert "use_vllm = False" in plain.source and not any("vllm:" in c.text for c in plain.changes)


def test_kit_vllm_samples_with_transformers_in_vllms_shape(tmp_path):
    """What the converted sampling cells call: n samples per prompt as `[i].outputs[j].text`, the saved
    adapter loaded for a lora_request and removed after, the model's adapter and mode left as they were."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kit.notebooks.convert.standins import TINY_MODEL
    from kit.notebooks.convert.vllm_off import HELPERS

    space = {"_kit_torch": torch}
    exec(HELPERS, space)
    kit_vllm = space["kit_vllm"]
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(TINY_MODEL),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.train()
    params = kit_vllm.SamplingParams(n=2, temperature=0.8, top_k=50, max_tokens=4, seed=0, stop=["x"])
    out = kit_vllm.fast_generate(model, tokenizer, ["Turn on the lights"], sampling_params=params, lora_request=None)
    assert len(out) == 1 and len(out[0].outputs) == 2 and all(isinstance(o.text, str) for o in out[0].outputs)
    assert all(0 < len(o.token_ids) <= 4 for o in out[0].outputs)
    greedy = kit_vllm.SamplingParams(temperature=0, max_tokens=4)
    base = kit_vllm.fast_generate(model, tokenizer, "Turn on the lights", greedy)[0].outputs[0].token_ids
    with model.disable_adapter(), torch.no_grad():  # no lora_request: the base model, as vLLM samples it
        ids = tokenizer("Turn on the lights", return_tensors="pt", add_special_tokens=False)
        want = model.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
    assert base == want
    model.save_pretrained(tmp_path / "saved")
    tuned = kit_vllm.fast_generate(model, tokenizer, "Turn on the lights", greedy,
                                   lora_request=kit_vllm.load_lora(model, tmp_path / "saved"))[0].outputs[0].token_ids
    with torch.no_grad():
        want = model.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
    assert tuned == want  # the saved adapter is the trained one
    assert set(model.peft_config) == {"default"} and model.active_adapter == "default" and model.training
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {n for n, _ in model.named_parameters()
                                                                          if "lora_" in n}  # still training it


FIT = "trainer = GRPOTrainer(model='m', reward_funcs=REWARDS, args=GRPOConfig(output_dir='o'), train_dataset=d)\n" \
      "trainer.train()"


@pytest.mark.parametrize("cells, cell, fragment, fixed", [
    (["import re\ndef fmt(completions):\n    return [1.0 if re.search('x', c) else 0.0 for c in completions]",
      FIT.replace("REWARDS", "[fmt]")], "cell 1, line 2",
     "the reward function `fmt` (given to GRPOTrainer in cell 2) cannot be called by TRL: it takes no **kwargs",
     "import re\ndef fmt(completions, *args, **extra):\n    return [1.0 if re.search('x', c) else 0.0 for c in completions]"),
    (["def fmt(completions, /, **kwargs):\n    return [0.0] * len(completions)", FIT.replace("REWARDS", "fmt")],
     "cell 1, line 1", "its parameter 'completions' is positional-only",
     "def fmt(completions, answer, **kwargs):\n    return [0.0] * len(completions)"),
    (["def fmt(completions, **kwargs):\n    return [0.0] * len(completions)",
      FIT.replace("REWARDS", "[fmt, lenght_reward, 'org/reward-model']")], "cell 2, line 1",
     "reward_funcs names `lenght_reward`, which no cell defines or imports",
     "from trl.rewards import think_format_reward as lenght_reward\nfrom my_rewards import *\n"
     "def fmt(completions, **kwargs):\n    return [0.0] * len(completions)"),
    (["x = 1", FIT.replace("REWARDS", "[lambda completions: [0.0] * len(completions)]")], "cell 2, line 1",
     "a lambda in GRPOTrainer's reward_funcs cannot be called by TRL", "x = 1"),
])
def test_a_reward_function_trl_cannot_call_is_refused_naming_its_cell(tmp_path, capsys, cells, cell, fragment, fixed):
    """These converted, and the script stopped at TRL's first reward call, after the model had loaded.
    Fixed (or imported: trl.rewards, a star import, a reward model's id), the notebook converts."""
    out = tmp_path / "train_ddp.py"
    code, _, err = cli([str(make_nb(tmp_path, cells)), "-o", str(out)], capsys)
    assert code == 2 and err.startswith(f"error: {cell}: ") and err.count("\n") == 1, err
    assert fragment in err and not out.exists()
    train = cells[1].replace("lambda completions:", "lambda completions, **kw:")
    assert "GRPOTrainer" in convert_notebook(make_nb(tmp_path, [fixed, train], "fixed.ipynb")).source


def test_dry_run_prompts_come_in_the_format_the_notebook_reads():
    """The stand-in prompts were always chat messages: a notebook that builds its messages from a text
    `prompt` column (Unsloth's) or whose reward functions read text completions stopped in its own map."""
    unsloth = Plan([ast.parse(c) for c in [
        "d = d.map(lambda x: {'prompt': [{'role': 'user', 'content': x['prompt']}], 'answer': x['solution']})",
        "def ok(prompts, completions, answer, **kwargs):\n    return [c[0]['content'] == a for c, a in zip(completions, answer)]",
        "t = GRPOTrainer(model=m, reward_funcs=[ok], args=a, train_dataset=d)"]])
    assert unsloth.schema == "prompt_text" and {"answer", "solution"} <= set(unsloth.extra)
    text = Plan([ast.parse("def n(completions, **kw):\n    return [len(c) / 10 for c in completions]\n"
                           "t = GRPOTrainer(model=m, reward_funcs=[n], args=a, train_dataset=d)")])
    assert text.schema == "prompt_text"
    chat = Plan([ast.parse("def n(completions, **kw):\n    return [len(c[0]['content']) for c in completions]\n"
                           "t = GRPOTrainer(model=m, reward_funcs=[n], args=a, train_dataset=d)")])
    assert chat.schema == "prompt"
    from kit.notebooks.convert.standins import StandIns

    rows = StandIns(schema="prompt_text", extra=["answer", "expected_answer", "problem"]).load_dataset("org/math",
                                                                                                     split="train")
    assert isinstance(rows[0]["prompt"], str) and isinstance(rows[0]["problem"], str)
    # a math notebook's reference answers are numbers (as text): `float(answer)` and numeric filters run
    assert all(float(r["answer"]) > 0 and float(r["expected_answer"]) > 0 for r in rows)


def test_dry_run_checks_the_notebooks_reward_functions_on_their_calls(tmp_path, capsys):
    """In the dry run the notebook's own reward functions run (not stand-ins); one that raises or answers
    in the wrong shape stopped it with a traceback from deep inside TRL's step. Now: one line naming the
    function and its cell, exit 2."""
    import inspect

    from kit.notebooks.convert.standins import StandIns

    cells = ["import re\ndef fmt(completions, **kwargs):\n    return [0.5 if re.search('#', c) else 0.0 for c in completions]",
             "def bad(prompts, completions, answer, **kwargs):\n    return [float(a) for a in answer]",
             FIT.replace("REWARDS", "[fmt, bad, 'org/reward-model']")]
    code = convert_notebook(make_nb(tmp_path, cells), dry_run=True).source.split('"""', 2)[2]
    checked = call(code, "kit_dry_run.rewards")
    assert squeeze(checked[0]) == "[fmt,bad,'org/reward-model']" and ast.literal_eval(checked["cells"]) == {"fmt": 1, "bad": 2}
    assert squeeze(call(code, "GRPOTrainer")["reward_funcs"]).startswith("kit_dry_run.rewards(")

    def fmt(completions, **kwargs):
        return [1.0] * len(completions)

    def bad(prompts, completions, answer, **kwargs):
        return [float(a) for a in answer]

    def short(completions, **kwargs):
        return [1.0]

    def words(completions, **kwargs):
        return ["good" for _ in completions]

    stand = StandIns()
    checked = stand.rewards([fmt, bad, short, words, "org/reward-model"], cells={"bad": 2, "short": 3})
    assert checked[-1] == "org/reward-model" and checked[0].__name__ == "fmt"
    assert inspect.signature(checked[1]) == inspect.signature(bad)  # TRL passes the columns it names
    assert checked[0](prompts=["a", "b"], completions=["x", "y"]) == [1.0, 1.0]
    for func, line in ((checked[1], "error: cell 2: the reward function `bad` raised ValueError: could not convert"),
                       (checked[2], "error: cell 3: the reward function `short` returned 1 values for 2 completions"),
                       (checked[3], "error: the reward function `words` returned str 'good', not a number or None")):
        with pytest.raises(SystemExit) as stop:
            func(prompts=["a", "b"], completions=["x", "y"], answer=["4", "four"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(line) and err.count("\n") == 1, err


@pytest.mark.slow
def test_dry_run_of_a_grpo_notebook_with_a_broken_reward_function(tmp_path, capfd, monkeypatch):
    """Under torchrun (2 CPU ranks, `--run`): the notebook's reward function fails on the stand-in rows in
    the first GRPO step; the run ends with its one line naming the function and cell, and kit's exit line."""
    import os

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    cells = ["from datasets import load_dataset\nfrom trl import GRPOConfig, GRPOTrainer\n"
             "d = load_dataset('org/math', split='train')\nd = d.map(lambda x: {'answer': x['solution']})",
             "def numeric(completions, answer, **kwargs):\n    return [len(c) for c in completion]  # a typo",
             "trainer = GRPOTrainer(model='Qwen/Qwen3-0.6B', reward_funcs=[numeric], train_dataset=d,\n"
             "                      args=GRPOConfig(output_dir='o', max_steps=5, report_to='none'))\ntrainer.train()"]
    from kit.cli import main

    assert main(["convert", str(make_nb(tmp_path, cells)), "-o", "bad.py", "--dry-run", "--run"]) == 1
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("error: cell 2: "))
    assert all(k in line for k in ("`numeric`", "NameError", "'completion'"))
    assert "bad.py exited 1" in err


def test_dry_run_rows_have_the_columns_trls_own_reward_functions_take():
    """`from trl.rewards import accuracy_reward` (TRL's GRPO notebook): the stand-in rows had no `solution`
    column, which the notebook never names but TRL passes to it, so the first step stopped. Its required
    parameters in the installed TRL are columns now; a parameter with a default is a setting, not one."""
    plan = Plan([ast.parse("from trl.rewards import think_format_reward, reasoning_accuracy_reward as acc\n"
                           "import trl.rewards\n"
                           "t = GRPOTrainer(model=m, reward_funcs=[think_format_reward, acc, trl.rewards.accuracy_reward,"
                           " trl.rewards.no_such_reward], args=a, train_dataset=d)")])
    assert "solution" in plan.extra and "reasoning_delimiters" not in plan.extra and "completions" not in plan.extra
    from kit.notebooks.convert.standins import StandIns

    rows = StandIns(schema=plan.schema, extra=plan.extra).load_dataset("trl-lib/math", split="train")
    assert float(rows[0]["solution"]) > 0  # a reference answer, as math data sets have it


def test_chats_with_tools_or_text_parts_get_a_stand_in_template_that_renders_them(tmp_path):
    """TRL's tool-calling GRPO notebook stopped in GRPOTrainer ("does not support tool calling"), and one
    whose messages' content is a list of text parts in its first apply_chat_template (str + list): the
    tiny model's template renders role and text alone. Such a notebook's stand-in model now has a real
    chat template (Qwen3-VL's, as TRL ships it); others keep the tiny model as it is."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import supports_tool_calling

    from kit.notebooks.convert.standins import TINY_MODEL, StandIns

    parts = ["from trl import GRPOConfig, GRPOTrainer\n"
             "msgs = [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}]",
             "def ok(completions, **kwargs):\n    return [1.0] * len(completions)",
             FIT.replace("REWARDS", "[ok]")]
    dry = convert_notebook(make_nb(tmp_path, parts), dry_run=True).source
    assert call(dry, "StandIns")["chat"] == "True" and call(dry, "GRPOTrainer")["model"] == "kit_dry_run.model_dir"
    tools = [*parts[:2], FIT.replace("REWARDS", "[ok], tools=[ok]").replace("'m'", "'Qwen/Qwen3-1.7B'")]
    tools[0] = "from trl import GRPOConfig, GRPOTrainer"
    assert call(convert_notebook(make_nb(tmp_path, tools, "tools.ipynb"), dry_run=True).source, "StandIns")["chat"] == "True"
    plain = convert_notebook(make_nb(tmp_path, [tools[0], parts[1], FIT.replace("REWARDS", "[ok]")], "plain.ipynb"),
                             dry_run=True).source
    assert "chat=True" not in plain and f"model={str(TINY_MODEL)!r}" in plain
    stand = StandIns(chat=True)
    tokenizer = AutoTokenizer.from_pretrained(stand.model_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], tokenize=False)
    assert "hi" in text and supports_tool_calling(tokenizer)
    assert not supports_tool_calling(AutoTokenizer.from_pretrained(TINY_MODEL))
    same = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert same == AutoTokenizer.from_pretrained(TINY_MODEL).apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)  # plain chats: as before


def test_dry_run_stops_in_one_line_on_a_package_the_notebook_installs_itself(tmp_path, capsys):
    """`import langid` (Unsloth's DeepSeek-R1 GRPO notebook), `from smolagents import …` (TRL's agent one):
    packages the notebook pip-installs, which the script does not, so its dry run stopped with a traceback
    after the model had loaded and trained. Now the stand-ins check the notebook's imports first: one line
    naming the module and its cell, exit 2. An import in a try or a function is left to the notebook."""
    from kit.notebooks.convert.standins import StandIns

    cells = ["import re\nimport kit_no_such_module_a.sub as a\ntry:\n    import kit_no_such_module_b\nexcept ImportError:\n"
             "    pass\ndef later():\n    import kit_no_such_module_c", "def ok(completions, **kwargs):\n"
             "    return [1.0] * len(completions)", "from kit_no_such_module_d import x\n" + FIT.replace("REWARDS", "[ok]")]
    stand = call(convert_notebook(make_nb(tmp_path, cells), dry_run=True).source, "StandIns")
    assert ast.literal_eval(stand["imports"]) == {"re": 1, "kit_no_such_module_a": 1, "kit_no_such_module_d": 3}
    with pytest.raises(SystemExit) as stop:
        StandIns(imports={"re": 1, "kit_no_such_module_d": 3, "kit_no_such_module_a": 1})
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: cell 1: ") and err.count("\n") == 1, err
    assert re.search(r"kit_no_such_module_a,\s*kit_no_such_module_d\b", err) and "install them" in err
    StandIns(imports={"re": 1, "trl": 3})  # installed: nothing to say
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # an offline vLLM evaluation after training (TRL's QLoRA GRPO one)
        with pytest.raises(SystemExit):
            StandIns(imports={"vllm": 59})
        err = capsys.readouterr().err
        assert err.startswith("error: cell 59: ") and "vllm needs a CUDA GPU" in err


def test_a_trl_reward_function_missing_its_package_says_to_install_it(capsys):
    """TRL's accuracy_reward without math_verify: the line said "fix it in the notebook", which cannot help."""
    from kit.notebooks.convert.standins import StandIns

    def accuracy_reward(completions, solution, **kwargs):
        raise ImportError("Please install the `math_verify` package to use accuracy_reward")

    with pytest.raises(SystemExit) as stop:
        StandIns().rewards([accuracy_reward])[0](prompts=["a"], completions=["x"], solution=["1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "`math_verify`" in err
    assert "package it names" in err and "fix it in the notebook" not in err


def test_unsloths_cpu_stand_in_has_what_its_rl_notebooks_import(monkeypatch):
    """Unsloth's DPO and ORPO notebooks (`from unsloth import PatchDPOTrainer`), and its earlier GRPO ones
    (`PatchFastRL("GRPO", FastLanguageModel)`, `is_bf16_supported`), stopped at that import in a CPU dry
    run. Imported in this process (not a new Python: ~8 s of imports); what importing it patches, as
    Unsloth does (TRL's SFTTrainer, the export methods of PeftModel and torch.nn.Module), is undone after."""
    import importlib
    import sys

    import torch
    import trl
    from peft import PeftModel

    from kit.notebooks.convert.standins import CPU_PACKAGES

    patched = (trl.SFTTrainer, PeftModel, torch.nn.Module)
    before = [dict(vars(cls)) for cls in patched]
    monkeypatch.setattr(sys, "path", [str(CPU_PACKAGES), *sys.path])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a dry run's CPU, as CUDA_VISIBLE_DEVICES=""
    assert "unsloth" not in sys.modules
    try:
        unsloth = importlib.import_module("unsloth")
        assert Path(unsloth.__file__).is_relative_to(CPU_PACKAGES)
        from unsloth import FastLanguageModel, PatchDPOTrainer, PatchFastRL, is_bf16_supported

        PatchDPOTrainer()
        PatchFastRL("GRPO", FastLanguageModel)
        assert is_bf16_supported() is False
    finally:
        for name in [m for m in sys.modules if m == "unsloth" or m.startswith("unsloth.")]:
            del sys.modules[name]
        for cls, saved in zip(patched, before):
            for key in set(vars(cls)) - set(saved):
                delattr(cls, key)
            for key, value in saved.items():
                if vars(cls).get(key) is not value:
                    setattr(cls, key, value)


def test_preference_rows_are_chats_where_the_notebook_reads_them_as_chats():
    """Unsloth's Zephyr DPO notebook (ultrafeedback_binarized's shape) reads `example["chosen"][0]["role"]`:
    the stand-in preference rows were text, and its own map stopped (string indices must be integers)."""
    from kit.notebooks.convert.standins import StandIns

    trainer = "\nt = DPOTrainer(model=m, args=a, train_dataset=d)"
    for cell in ('p = [m for m in e["chosen"] if m["role"] == "user"][0]', 'x = e["rejected"][-1]["content"]',
                 't = tok.apply_chat_template(e["chosen"][1:], tokenize=False)'):
        assert Plan([ast.parse(cell + trainer)]).schema == "preference_chat", cell
    for cell in ('x = e["chosen"] + e["prompt"]', 'x = e["chosen"][:100]'):
        assert Plan([ast.parse(cell + trainer)]).schema == "preference", cell
    row = StandIns(schema="preference_chat").load_dataset("HuggingFaceH4/ultrafeedback_binarized", split="train")[0]
    assert [m["role"] for m in row["chosen"]] == ["user", "assistant"] == [m["role"] for m in row["rejected"]]
    assert row["chosen"][0] == row["rejected"][0] and row["chosen"][1] != row["rejected"][1]
    assert isinstance(row["prompt"], str) and row["prompt"] == row["chosen"][0]["content"]


def test_columns_the_notebook_makes_itself_are_no_stand_in_columns():
    """Zephyr's DPO notebook writes `example["text_chosen"] = …` in its map, removes every source column and
    renames text_chosen: the stand-in rows had a text_chosen column already (the rename names it), the map's
    remove_columns removed it again, and the rename stopped. A key read before it is written stays a column."""
    cells = ['def fmt(example):\n    example["text_chosen"] = tok.apply_chat_template(example["chosen"][1:], tokenize=False)\n'
             '    example["text_chosen"] = example["text_chosen"].strip()\n    example["review"] = example["review"].strip()\n'
             '    return example',
             'd = d.map(fmt, remove_columns=list(d.features))\nd = d.rename_columns({"text_chosen": "chosen"})\n'
             't = DPOTrainer(model=m, args=a, train_dataset=d)']
    plan = Plan([ast.parse(c) for c in cells])
    assert "text_chosen" not in plan.extra and "review" in plan.extra and plan.schema == "preference_chat"


def test_a_notebook_keeping_a_small_fraction_of_its_data_keeps_rows_of_the_stand_in():
    """Zephyr's DPO notebook keeps 0.5% of ultrafeedback (`select(range(int(frac * len(ds))))`) and prints
    row 8: of the 424 embedded rows it kept 2, and stopped. The stand-in now has enough rows that the
    smallest fraction the notebook names keeps 32; a notebook that takes no fraction keeps the 424."""
    from kit.notebooks.convert.standins import StandIns

    mixer = ('mixer = {"HuggingFaceH4/ultrafeedback_binarized": 0.005}\nfor name, frac in mixer.items():\n'
             '    ds = load_dataset(name, split="train_prefs")\n    ds = ds.select(range(int(frac * len(ds))))\n'
             't = DPOTrainer(model=m, args=DPOConfig(learning_rate=5e-6, weight_decay=0.01), train_dataset=ds)')
    plan = Plan([ast.parse(mixer)])
    assert plan.size == 6400
    stand = StandIns(schema=plan.schema, size=plan.size)
    rows = stand.load_dataset("HuggingFaceH4/ultrafeedback_binarized", split="train_prefs")
    assert len(rows) == 6400 and len(rows.select(range(int(0.005 * len(rows))))) == 32
    percent = 'ds = load_dataset("x", split="train[:5%]")\nt = DPOTrainer(model=m, train_dataset=ds)'
    assert Plan([ast.parse(percent)]).size == 640
    plain = Plan([ast.parse("n = len(ds)\nt = DPOTrainer(model=m, args=DPOConfig(weight_decay=0.01), train_dataset=ds)")])
    assert plain.size == 0 and len(StandIns(schema="preference").load_dataset("org/d", split="train")) == 424
