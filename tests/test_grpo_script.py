"""trainer=grpo end to end: the plan, the rendered script in-process (a bad reward file, name, signature or
return length, a wrong data shape, an indivisible batch: one line, exit 2, before any model loads), and under
real torchrun (2 gloo ranks, CPU, the tiny model) with the test Hub (tests/hubserver.py) as the store,
kill -9 and resume."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest

from kit import cli
from kit.planning import config, grpo, memory, shapes
from kit.planning.fit import batch_for_world
from kit.planning.plan import make_plan
from kit.machine import gpu_table
from kit.report.reasons import words
from tests.code_asserts import assigns, call
from tests.test_plan import reason
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, elsewhere_env as env, hub_env, kill_job, kit_cli, losses, torchrun_cmd, \
    two_ranks as run
from tests.test_bad_input import run_script_in_process
from tests.test_resume import assert_same_training, kill_9_after_steps_and_rerun

CONFIG = "configs/grpo-tiny.yaml"
STEPS = ["max_steps=12", "save_steps=3", "keep_checkpoints=2", *FAST]
# Steps that are mostly generation, as on a GPU, without the held-out evaluations' own generating.
LONG_GENERATION = ["grpo.max_completion_length=160", "eval.baseline=false", "eval.final=false"]


def grpo_cfg(**changes) -> config.RunConfig:
    cfg = config.load(str(ROOT / CONFIG))
    for key, value in changes.items():
        config.set_value(cfg, key.replace("__", "."), value)
    return cfg


# ---- the plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus,nproc", [("2xT4", None), ("1xT4", None), ("1xH100", None)])
@pytest.mark.parametrize("pdb,generations", [(None, 4), (None, 8), (2, 8), (3, 4)])
def test_the_planner_picks_a_global_batch_of_whole_groups(gpus, nproc, pdb, generations):
    cfg = grpo_cfg(per_device_batch=pdb, global_batch=None, grpo__num_generations=generations)
    plan = make_plan(gpu_table.synthesize(gpus), cfg, nproc)
    assert plan.global_batch % generations == 0
    assert plan.global_batch == plan.per_device_batch * plan.grad_accum * plan.nproc
    if pdb:
        assert plan.per_device_batch == pdb
    assert reason(plan, "grpo_batch")["num_generations"] == generations
    # The same rule at launch (the script settles the plan's global batch through fit.batch_for_world), for the
    # number of processes the script actually gets.
    at_launch = dataclasses.replace(cfg, global_batch=plan.global_batch)
    for world in (1, 2, 4):
        per_device, accum, global_batch = batch_for_world(at_launch, cfg.per_device_batch or plan.per_device_batch,
                                                          world)
        assert global_batch == plan.global_batch and per_device * accum * world == global_batch


def test_a_fixed_indivisible_batch_is_one_line_naming_the_nearest_valid_ones(capsys):
    code = cli.main(["plan", "--config", str(ROOT / CONFIG), "--gpus", "2xT4", "global_batch=6",
                     "per_device_batch=null"])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "num_generations=4" in errors[0] and "global_batch=4 or 8" in errors[0]
    code = cli.main(["plan", "--config", str(ROOT / CONFIG), "--gpus", "2xT4", "global_batch=6",
                     "per_device_batch=3"])
    err = capsys.readouterr().err
    assert code == 2 and "global_batch=12" in err and "3 per GPU x 2 GPUs" in err


@pytest.mark.parametrize("change, words", [
    ({"strategy": "fsdp"}, "strategy=fsdp is not for trainer grpo"),
    ({"strategy": "model_parallel"}, "strategy=model_parallel is not for trainer grpo"),
    ({"grpo__rewards": None}, "trainer=grpo needs reward functions"),
    ({"grpo__rewards": "rewards.py"}, "is not FILE.py:NAME"),
    ({"activation_offloading": "on"}, "TRL's GRPOConfig has no activation offloading"),
    ({"batching": "packed"}, "batching=packed is for trainer sft"),
    ({"eval_steps": 5}, "eval_steps=5 is not for trainer grpo"),
])
def test_settings_grpo_cannot_run_are_refused_at_plan_time(change, words):
    from kit.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(words)):
        make_plan(gpu_table.synthesize("2xT4"), grpo_cfg(**change))


def test_plan_text_shows_the_grpo_memory_terms(capsys):
    # Qwen3-4B LoRA on Kaggle's 2xT4 (fp16), 1 completion a micro-batch, 16 generations: each rank generates 8
    # completions of 512 + 1024 tokens at once, then trains on them one at a time: generation is the peak.
    code = cli.main(["plan", "--config", str(ROOT / CONFIG), "--gpus", "2xT4", "model=Qwen/Qwen3-4B", "seq_len=512",
                     "grpo.max_completion_length=1024", "grpo.num_generations=16", "per_device_batch=1",
                     "global_batch=null", "gradient_checkpointing=auto"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ddp" in out and "fp16" in out
    assert re.search(r"kv_cache\s+\d+\.\d\d", out) and "sampling_logits_fp32" in out
    assert "generation is the peak" in out and "its own share" in out
    assert "1 per GPU × 8 accumul" in out and "× 2 processes = 16" in out
    plan = make_plan(gpu_table.synthesize("2xT4"), grpo_cfg(model="Qwen/Qwen3-4B", seq_len=512,
                                                             grpo__max_completion_length=1024,
                                                             grpo__num_generations=16, per_device_batch=1,
                                                             global_batch=None, gradient_checkpointing="auto"))
    m = shapes.model_facts("Qwen/Qwen3-4B")
    generated = plan.per_device_batch * plan.grad_accum  # each rank generates its share of a generation batch at once
    assert plan.memory["terms"]["kv_cache"] == memory.kv_cache_bytes(m, generated, 512 + 1024, 2)
    # The reasons say there is no reference (beta 0) and how it generates (no vLLM), each worded in the text above.
    for code in ("reference_none_grpo", "grpo_generation"):
        assert words(reason(plan, code)) in out


def test_the_reference_counts_only_with_beta():
    cfg = grpo_cfg(model="Qwen/Qwen3-1.7B", method="full", seq_len=128, grpo__max_completion_length=256)
    m = shapes.model_facts("Qwen/Qwen3-1.7B")
    without = memory.estimate(m, cfg, "bf16", 8, True, False)
    assert "reference_weights" not in without.terms
    cfg.grpo.beta = 0.04
    assert memory.estimate(m, cfg, "bf16", 8, True, False).terms["reference_weights"] == m.params * 2
    lora = grpo_cfg(model="Qwen/Qwen3-1.7B", grpo__beta=0.04)
    est = memory.estimate(m, lora, "bf16", 8, True, False)
    assert "reference_weights" not in est.terms and any("adapter disabled" in n for n in est.notes)


def test_the_memory_of_a_grpo_step_is_grpo_estimate():
    cfg = grpo_cfg(model="Qwen/Qwen3-1.7B", seq_len=128, grpo__max_completion_length=256, grpo__num_generations=8,
                   global_batch=None)
    m = shapes.model_facts("Qwen/Qwen3-1.7B")
    via_plan = memory.estimate(m, cfg, "bf16", 8, True, False)
    direct = memory.grpo_estimate(m, cfg, "bf16", completions_per_device=8, prompt_tokens=128, completion_tokens=256,
                                  beta=0.0, gradient_checkpointing=True, quantized=False)
    assert via_plan.terms == direct.terms
    assert grpo.accumulation(cfg, 2, 1) == 4  # 2 completions a micro-batch: 4 accumulation steps hold a group of 8


# ---- the script, in-process ---------------------------------------------------------------------
@pytest.fixture
def box(tmp_path, monkeypatch):
    """A temp copy of the checkout's configs, data and model with train_grpo.py rendered there, as the cwd."""
    root = tmp_path / "box"
    root.mkdir()
    for name in ("configs", "data", "models"):
        shutil.copytree(ROOT / name, root / name)
    monkeypatch.chdir(root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("KIT_PLATFORM", "local")
    assert cli.main(["render", "--config", CONFIG, "-o", "train_grpo.py"]) == 0
    return root


def run_script(box: Path, argv: list[str]) -> int:
    return run_script_in_process(box, argv, "train_grpo.py")


GOOD = "def ok(completions, **kwargs):\n    return [1.0] * len(completions)\n"
REWARD_CASES = [
    ("missing-file", {}, "nope.py:ok", "rewards: .*nope.py not found"),
    ("import-fails", {"r.py": "import not_a_module_anywhere\n"}, "r.py:ok", "r.py failed to import: ModuleNotFoundError"),
    ("missing-name", {"r.py": GOOD}, "r.py:ok,format", "r.py has no function 'format'"),
    ("not-callable", {"r.py": GOOD + "format = 3\n"}, "r.py:format", "r.py:format is a int, not a function"),
    ("no-kwargs", {"r.py": "def ok(completions):\n    return [1.0] * len(completions)\n"}, "r.py:ok",
     "r.py:ok cannot be called by TRL: it takes no \\*\\*kwargs"),
    ("unknown-parameter", {"r.py": "def ok(completions, solution, **kwargs):\n    return [1.0] * len(completions)\n"},
     "r.py:ok", "its parameter 'solution' has no default and is not a column of the data"),
    ("raises", {"r.py": "def ok(completions, **kwargs):\n    return [1 / 0]\n"}, "r.py:ok",
     "r.py:ok raised ZeroDivisionError"),
    ("wrong-length", {"r.py": "def ok(completions, **kwargs):\n    return [1.0]\n"}, "r.py:ok",
     "r.py:ok returned 1 values for 2 completions"),
    ("not-numbers", {"r.py": "def ok(completions, **kwargs):\n    return ['good'] * len(completions)\n"}, "r.py:ok",
     "r.py:ok returned str values"),
]


def assert_refused_before_loading(code: int, capfd, want: str) -> None:
    out, err = capfd.readouterr()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2, f"exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert len(errors) == 1 and re.search(want, errors[0]), err[-2000:]
    assert "Traceback" not in out + err
    assert "trainable parameters" not in out and "Loading weights" not in out + err  # no model was loaded


@pytest.mark.parametrize("files,spec,want", [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES])
def test_a_bad_reward_file_is_one_line_exit_2_before_the_model_loads(box, capfd, files, spec, want):
    # The config lives in its own folder with its reward file beside it: the file is found from there.
    folder = box / "job"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "job.yaml").write_text((box / CONFIG).read_text().replace("grpo_rewards.py:json_format,brevity", spec)
                                     .replace("data/grpo_prompts.jsonl", str(box / "data" / "grpo_prompts.jsonl")))
    code = run_script(box, ["--config", str(folder / "job.yaml"), f"output_dir={box / 'out'}"])
    assert_refused_before_loading(code, capfd, want)
    assert not (box / "out").exists() or not any((box / "out").glob("checkpoint-*"))


def prompt_rows(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("files,argv,want", [
    ({}, ["data.path=data/ha_commands.jsonl"], "trainer=grpo needs a column prompt .*set trainer=sft or dpo"),
    ({"p.jsonl": prompt_rows([{"prompt": 5, "answer": "x"}, {"prompt": 6, "answer": "y"}])},
     ["data.path=p.jsonl"], "p.jsonl line 1: field 'prompt' is int"),
    ({"p.jsonl": prompt_rows([{"prompt": "turn on the light", "answer": "x"}, {"prompt": " ", "answer": "y"}])},
     ["data.path=p.jsonl"], "p.jsonl line 2: field 'prompt' is empty"),
    ({"p.jsonl": prompt_rows([{"prompt": [{"role": "bot", "content": "x"}], "answer": "x"}])},
     ["data.path=p.jsonl"], "p.jsonl line 1: prompt\\[0\\] has role 'bot'"),
    ({"p.jsonl": prompt_rows([{"question": "q", "answer": "x"}] * 4)}, ["data.path=p.jsonl",
                                                                        "data.columns={prompt: query}"],
     "data.columns maps prompt → 'query'"),
    ({"p.jsonl": prompt_rows([{"prompt": f"light {i}", "completions": "x"} for i in range(4)])},
     ["data.path=p.jsonl"], "p.jsonl has a column completions, a name TRL passes the reward functions itself"),
    ({}, ["global_batch=6"], "global_batch 6 is not a multiple of per_device_batch 2|num_generations=4"),
    ({}, ["global_batch=10", "per_device_batch=null"], "num_generations=4.*global_batch=8 or 12"),
    ({}, ["grpo.num_generations=1"], "it needs at least 2"),
    # One generation batch holds global_batch / num_generations = 2 prompts; TRL's sampler drops a partial one.
    ({"p.jsonl": prompt_rows([{"prompt": "turn on the light", "answer": "x"}])}, ["data.path=p.jsonl"],
     "p.jsonl: 1 training prompt, fewer than the 2 one generation batch holds .*no step would train"),
    ({"p.jsonl": prompt_rows([{"prompt": [{"role": "system", "content": " "}, {"role": "user", "content": ""}],
                               "answer": "x"}] * 4)}, ["data.path=p.jsonl"],
     "p.jsonl line 1: field 'prompt' holds only empty messages"),
    ({"p.jsonl": prompt_rows([{"prompt": f"light {i}", "image": f"img/{i}.png"} for i in range(4)])},
     ["data.path=p.jsonl"], "p.jsonl has a column image, which TRL's GRPOTrainer reads as the prompts' images"),
], ids=["sft-data", "prompt-not-text", "prompt-empty", "bad-role", "columns-missing", "reserved-column",
        "indivisible", "indivisible-picked", "one-generation", "one-prompt", "empty-messages", "image-column"])
def test_a_wrong_data_shape_or_batch_is_one_line_exit_2_before_the_model_loads(box, capfd, files, argv, want):
    for name, text in files.items():
        (box / name).write_text(text)
    code = run_script(box, [f"output_dir={box / 'out'}", *argv])
    assert_refused_before_loading(code, capfd, want)


def test_prompts_that_fill_no_generation_batch_after_the_split_are_one_line_exit_2(box, capfd):
    # 2 prompts pass the check before the model loads; the held-out split leaves 1 to train on, fewer than the 2
    # a generation batch holds: TRL's sampler would hand out nothing and the job end at step 0 "complete".
    (box / "p.jsonl").write_text(prompt_rows([{"prompt": f"turn on light {i}", "answer": "x"} for i in range(2)]))
    code = run_script(box, [f"output_dir={box / 'out'}", "data.path=p.jsonl"])
    out, err = capfd.readouterr()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "1 training prompt, fewer than the 2" in errors[0], err[-2000:]
    assert "Traceback" not in out + err and not any((box / "out").glob("checkpoint-*"))


LATER = "def ok(completions, trainer_state=None, **kwargs):\n    late = trainer_state is not None and trainer_state.global_step >= 1\n"


@pytest.mark.parametrize("body,want", [
    (LATER + "    return [float('inf') if late else 1.0 for _ in completions]\n",
     r"rewards: ok returned inf .*advantages would be NaN.* at step 2 "),
    (LATER + "    return [1.0] * (len(completions) - late)\n", r"rewards: ok returned 7 values for 8 completions at step 2 "),
    (LATER + "    if late:\n        raise KeyError('answer')\n    return [1.0] * len(completions)\n",
     r"rewards: ok raised KeyError: 'answer' at step 2 \(on 8 completions; it passed the dry call\)"),
    (LATER + "    if late:\n        import os\n        os._exit(0)\n    return [1.0] * len(completions)\n",
     r"rewards: ok called os._exit\(0\) at step 2 "),
], ids=["inf-later", "short-later", "raises-later", "os-exit-later"])
def test_a_reward_that_goes_wrong_in_training_stops_with_one_line_and_keeps_the_checkpoints(box, capfd, body, want):
    # The dry call passes; at step 2 TRL got inf (NaN advantages: the adapter's weights went NaN), one value short or
    # an exception (TRL's traceback), or os._exit(0) (the job ended "successfully" with no word). kit runs every call
    # as the dry call, and names the function and the step.
    (box / "configs" / "grpo_rewards.py").write_text(body)
    code = run_script(box, [f"output_dir={box / 'out'}", "grpo.rewards=grpo_rewards.py:ok", "max_steps=4",
                            "save_steps=1", "eval.baseline=false"])
    out, err = capfd.readouterr()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and re.search(want, errors[0]), err[-3000:]
    assert "Traceback" not in err
    assert (box / "out" / "checkpoint-1" / "adapter_model.safetensors").is_file()  # step 1's checkpoint is kept


def test_prompts_keep_their_columns_for_the_rewards_and_a_mapped_prompt_is_read(box):
    from kit.train import prompt_data

    (box / "q.jsonl").write_text(prompt_rows([{"question": f"turn on light {i}", "answer": str(i), "level": i}
                                              for i in range(10)]))
    cfg = grpo_cfg(data__path="q.jsonl", data__columns={"prompt": "question"})
    ds = prompt_data.load(cfg)
    assert sorted(ds.column_names) == ["answer", "level", "prompt", "row_hash"]
    assert ds[3]["prompt"] == "turn on light 3" and ds[3]["level"] == 3
    rows = prompt_data.dry_rows(ds)
    assert rows["answer"] == ["0", "1"] and "row_hash" not in rows


def test_a_system_prompt_goes_first_in_every_prompt_the_trainer_and_the_evaluation_see(box):
    # GSM8K's questions are plain strings: without a system message the model is never told the answer format the
    # rewards score. grpo.system_prompt makes each string prompt [system, user], puts the system message first in a
    # chat prompt, and keeps a chat prompt's own system message.
    from transformers import AutoTokenizer

    from kit.train import data

    tokenizer = AutoTokenizer.from_pretrained(str(box / "models" / "tiny-qwen3"))
    system = "Answer as JSON.\nThen stop."

    def seen(rows, **changes):
        (box / "q.jsonl").write_text(prompt_rows(rows))
        prepared = data.prepare(grpo_cfg(data__path="q.jsonl", data__eval_fraction=0.25, **changes), tokenizer)
        assert len(prepared.eval) > 0  # the held-out prompts the baseline and final evaluation generate for
        prompts = list(prepared.train["prompt"]) + list(prepared.eval["prompt"])
        return {(p[-1]["content"] if isinstance(p, list) else p): p for p in prompts}

    strings = seen([{"prompt": f"turn on light {i}", "answer": str(i)} for i in range(12)], grpo__system_prompt=system)
    assert len(strings) == 12 and strings["turn on light 3"] == [{"role": "system", "content": system},
                                                                  {"role": "user", "content": "turn on light 3"}]
    chats = seen([{"prompt": [{"role": "user", "content": f"dim lamp {i}"}], "answer": "x"} for i in range(8)]
                 + [{"prompt": [{"role": "system", "content": "theirs"}, {"role": "user", "content": f"open door {i}"}],
                     "answer": "y"} for i in range(4)], grpo__system_prompt=system)
    assert chats["dim lamp 5"] == [{"role": "system", "content": system}, {"role": "user", "content": "dim lamp 5"}]
    assert chats["open door 1"][0] == {"role": "system", "content": "theirs"} and len(chats["open door 1"]) == 2
    unset = seen([{"prompt": f"turn on light {i}", "answer": str(i)} for i in range(12)])
    assert unset["turn on light 3"] == "turn on light 3"  # without it, the prompts as they are


@pytest.mark.parametrize("value,want", [
    ("", "must not be empty"),
    ("a\x1bb", "holds a control character (NUL, ESC, a carriage return)"),
])
def test_a_system_prompt_that_cannot_be_text_is_one_line(value, want):
    from kit.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(want)):
        config.load(str(ROOT / CONFIG), [f"grpo.system_prompt={value}"])
    assert config.load(str(ROOT / CONFIG), ["grpo.system_prompt=line one\n\tline two"]).grpo.system_prompt == \
        "line one\n\tline two"


def test_a_system_prompt_for_a_model_without_a_chat_template_is_one_line(box):
    from transformers import AutoTokenizer

    from kit.errors import UsageError
    from kit.train import data

    (box / "q.jsonl").write_text(prompt_rows([{"prompt": f"light {i}", "answer": "x"} for i in range(10)]))
    tokenizer = AutoTokenizer.from_pretrained(str(box / "models" / "tiny-qwen3"))
    tokenizer.chat_template = None
    with pytest.raises(UsageError, match="grpo.system_prompt makes every prompt chat messages, but the tokenizer"):
        data.prepare(grpo_cfg(data__path="q.jsonl", grpo__system_prompt="be brief"), tokenizer)
    assert data.prepare(grpo_cfg(data__path="q.jsonl"), tokenizer).format == "prompts"  # plain strings need none


def test_a_system_prompt_that_leaves_no_prompt_under_seq_len_says_so(box):
    from transformers import AutoTokenizer

    from kit.errors import UsageError
    from kit.train import data

    (box / "q.jsonl").write_text(prompt_rows([{"prompt": f"light {i}", "answer": "x"} for i in range(10)]))
    tokenizer = AutoTokenizer.from_pretrained(str(box / "models" / "tiny-qwen3"))
    with pytest.raises(UsageError, match=r"the shortest has \d+; grpo.system_prompt's \d+ tokens are in each\)"):
        data.prepare(grpo_cfg(data__path="q.jsonl", seq_len=64, grpo__system_prompt=" ".join(["light"] * 200)),
                     tokenizer)


def test_prompts_longer_than_seq_len_are_left_out_and_counted(box):
    from transformers import AutoTokenizer

    from kit.train import data

    long = " ".join(["light"] * 400)
    (box / "p.jsonl").write_text(prompt_rows([{"prompt": long if i % 5 == 0 else f"light {i}", "answer": "x"}
                                              for i in range(20)]))
    cfg = grpo_cfg(data__path="p.jsonl", seq_len=64)
    prepared = data.prepare(cfg, AutoTokenizer.from_pretrained(str(box / "models" / "tiny-qwen3")))
    assert prepared.format == "prompts" and prepared.dropped_too_long == 4
    assert len(prepared.train) + len(prepared.eval) == 16
    assert "4 dropped" in prepared.summary() and "seq_len" in prepared.summary()


def test_the_script_builds_grpo_trainer_with_the_rewards_and_the_fast_generation(box):
    text = (box / "train_grpo.py").read_text()
    compile(text, "train_grpo.py", "exec")
    made = dict(assigns(text))
    assert made["training_args"].startswith("GRPOConfig(") and made["Trainer"] == "output_dir.without_card(GRPOTrainer)"
    assert "reward_funcs=job.reward_funcs," in text and "num_generations=cfg.grpo.num_generations" in text
    speed = call(text, "generation.speed_up_generation")
    assert speed[0] == "trainer" and speed["max_prompt_tokens"] == "cfg.seq_len"
    assert "modeling.reference_is_base(trainer.model)" in text
    assert "'dpo'" not in text.split("SETTINGS = ")[1].split("PLAN = ")[0]  # its own trainer's section only


# ---- under torchrun -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    """train_grpo.py, rendered by `kit render` from the shipped config for 2 CPU ranks."""
    out = tmp_path_factory.mktemp("scripts") / "train_grpo.py"
    r = kit_cli(["render", "--config", CONFIG, "-o", str(out)], env=env())  # `python -m kit render …`, here
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def server():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as s:
        yield s


@pytest.fixture(scope="module")
def pushed(script, tmp_path_factory):
    """One 2-rank run to the end into a test Hub store, tracked (report_to=tensorboard), and what `kit status`
    says of it afterwards (text, --json, --plot): the tests below each read a part of it."""
    tmp = tmp_path_factory.mktemp("pushed")
    out = tmp / "run"
    out.mkdir()
    (out / "README.md").write_text("# my notes\n")  # the trainer's saves write no card over it
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        environ = hub_env(server)
        r = run(script, [f"output_dir={out}", "store=hf://me/grpo-tiny", "report_to=tensorboard", *STEPS], environ)
        status = ["status", "--config", CONFIG, f"output_dir={out}", "store=hf://me/grpo-tiny", *STEPS]
        text = kit_cli(status, env=environ)
        as_json = kit_cli([*status, "--json", "--plot", str(tmp / "job.png")], env=environ)
        yield SimpleNamespace(out=out, log=r.stdout + r.stderr, code=r.returncode, text=text, json=as_json,
                              plot=tmp / "job.png", files=server.files("me/grpo-tiny"))


@pytest.mark.slow
def test_two_ranks_train_deliver_and_push_once(pushed):
    out, log = pushed.out, pushed.log
    assert pushed.code == 0, log[-3000:]
    assert log.count("complete: step 12 of 12") == 1 and "2 × cpu" in log
    assert (out / "README.md").read_text() == "# my notes\n"
    assert "accumulation 2 × 2 = 8" in log  # 2 prompts x 4 generations per optimizer step
    assert "[kit] rewards:" in log and "json_format, brevity" in log
    assert log.count("[kit] pushed: ") == 1  # final/ once, by rank 0
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert "ref" not in {p.name for p in (out / "final").iterdir()}
    card = (out / "final" / "README.md").read_text()
    assert "TRL GRPOTrainer" in card and "json_format" in card and "brevity" in card  # the reward functions by name
    assert "final/adapter_model.safetensors" in pushed.files and "final/eval_results.json" in pushed.files
    history = json.loads((out / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "loss" in h]
    assert len(steps) == 12 and all("rewards/json_format/mean" in h and "rewards/brevity/mean" in h for h in steps)
    assert any(h["grad_norm"] > 0 for h in steps)  # the rewards differ within groups: the adapter moves
    # Each reward function's mean on the held-out prompts, before and after (kit.evaluation.rewards).
    results = json.loads((out / "final" / "eval_results.json").read_text())
    for record in (results["baseline"]["result"], results["final"]["result"]):
        assert set(record["rewards"]) == {"json_format", "brevity"}, record


@pytest.mark.slow
def test_status_shows_a_grpo_jobs_rewards_where_its_loss_says_nothing(pushed):
    # GRPO's loss is near 0 by construction; what says how the job goes is the reward TRL logs each step.
    assert pushed.text.returncode == 0 and pushed.json.returncode == 0, pushed.text.stderr + pushed.json.stderr
    history = json.loads((pushed.out / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h for h in history if "reward" in h}
    facts = json.loads(pushed.json.stdout)
    assert [r["step"] for r in facts["rewards"]] == list(range(1, 13))
    for r in facts["rewards"]:
        assert r["reward"] == logged[r["step"]]["reward"]
        assert r["rewards"] == {name: logged[r["step"]][f"rewards/{name}/mean"] for name in ("json_format", "brevity")}
    line = next(ln for ln in pushed.text.stdout.splitlines() if ln.startswith("reward "))
    first = sum(logged[s]["reward"] for s in (1, 2, 3)) / 3  # a quarter of the 12 logged steps each
    last = sum(logged[s]["reward"] for s in (10, 11, 12)) / 3
    assert f"{first:.3g} over steps 1-3 → {last:.3g} over steps 10-12" in line, line
    assert "json_format " in line and "brevity " in line, line
    assert facts["plot"] == str(pushed.plot) and pushed.plot.stat().st_size > 0
    # The goodput ledger of the one session: 12 steps done, none redone, on 2 processes.
    assert facts["complete"] and [(r["steps_done"], r["steps_lost"], r["weight"])
                                  for r in facts["goodput"]["sessions"]] == [(12, 0, 2)]


@pytest.mark.slow
def test_rank_0_alone_tracks_the_run_with_each_reward_functions_mean(pushed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id = json.loads((pushed.out / "kit_run.json").read_text())["run_id"]
    events = list((pushed.out / "runs").rglob("events.out.tfevents.*"))
    assert [e.parent.name for e in events] == [run_id], events  # one event file: rank 0's, named by kit's run id
    tracked = EventAccumulator(str(events[0].parent))
    tracked.Reload()
    scalars = set(tracked.Tags()["scalars"])
    assert {"train/reward", "train/rewards/json_format/mean", "train/rewards/brevity/mean"} <= scalars, scalars
    assert [e.step for e in tracked.Scalars("train/reward")] == list(range(1, 13))


@pytest.mark.slow
def test_kill_9_then_rerun_ends_with_the_uninterrupted_adapter(script, pushed, server, tmp_path):
    reference = pushed.out  # the uninterrupted job the delivery test read
    assert pushed.code == 0, pushed.log[-3000:]
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/grpo-cut", *STEPS]
    again = kill_9_after_steps_and_rerun(script, args, hub_env(server), tmp_path / "first.log", str(out))
    words = again.stdout + again.stderr
    assert again.returncode == 0, words[-3000:]
    assert "resuming from step" in words
    assert [s for s, _ in losses(out / "checkpoint-12")] == list(range(1, 13))
    # The same prompts, the same sampled completions (each rank's RNG restored), the same rewards and updates.
    assert_same_training(reference / "checkpoint-12", out / "checkpoint-12")
    rewards = [[h["reward"] for h in json.loads((d / "checkpoint-12" / "trainer_state.json").read_text())
                ["log_history"] if "reward" in h] for d in (reference, out)]
    assert rewards[0] == rewards[1]


@pytest.mark.slow
def test_sigterm_during_generation_gives_the_step_up_and_the_rerun_ends_as_uninterrupted(script, tmp_path):
    # Completions of up to 160 tokens: each step is 0.7-2 s on 2 CPU ranks (idle to loaded), almost all of it
    # generating. The signal is sent as soon as step 2 is logged: both ranks are then past step 2's end and step 3 is
    # generating (a fixed pause after that line missed the generation on an idle machine). Step 2 was not saved
    # (save_steps=100).
    args = ["max_steps=4", "save_steps=100", *LONG_GENERATION, *FAST]
    reference = tmp_path / "reference"
    r = run(script, [f"output_dir={reference}", *args], env())
    assert r.returncode == 0, r.stderr[-3000:]
    out, log = tmp_path / "run", tmp_path / "first.log"
    args += [f"output_dir={out}", f"store={tmp_path / 'drive'}"]
    with open(log, "w") as sink:
        agent = subprocess.Popen(torchrun_cmd(script, 2) + args, cwd=ROOT, env=env(), stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while log.read_text().count("'step_time'") < 2:  # step 2 logged: step 3 is generating
            assert agent.poll() is None, log.read_text()[-3000:]
            time.sleep(0.01)
        os.kill(agent.pid, signal.SIGTERM)  # torchrun forwards it to both ranks
        sent = time.monotonic()
        agent.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        kill_job(agent, str(out))
    # Rank 0's watcher says the outcome again once torchrun has exited: into a file (no pipe to hold open until it
    # has written, as a terminal or notebook has) that line may come a moment after the agent's exit.
    deadline = time.monotonic() + 10
    while "[kit exit 0" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = log.read_text()
    # Before: the job went on generating, scoring and training step 3, then paused at step 3.
    assert "[kit] step 3 given up during its generation (signal SIGTERM): step 2 saved now" in text, text[-3000:]
    assert "[kit exit 0" in text and "paused at step 2 of 4 (signal SIGTERM)" in text, text[-3000:]
    assert took < 20, took  # no rank left waiting for another
    assert not (out / "checkpoint-3").exists() and (tmp_path / "drive" / "checkpoints" / "checkpoint-2").is_dir()
    again = run(script, args, env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 2" in again.stdout and "complete: step 4 of 4" in again.stdout
    # The given-up step redone as the uninterrupted run did it: the saved RNG state is that of step 2's end.
    assert_same_training(reference / "checkpoint-4", out / "checkpoint-4")


@pytest.mark.slow
def test_a_lease_taken_over_during_generation_stops_both_ranks_with_nothing_more_written(script, server, tmp_path):
    # Another session's record replaces the lease while a step generates (as a takeover after missed heartbeats
    # would): at the next heartbeat the generation ends, no rank trains or saves again, exit 4 (torchrun: 1).
    from kit.checkpoints.store.hub import HubStore

    out, log = tmp_path / "run", tmp_path / "log.txt"
    args = [f"output_dir={out}", "store=hf://me/grpo-lost", "max_steps=50", "save_steps=2",
            "lease_heartbeat_seconds=0.3", *LONG_GENERATION, *FAST]
    with open(log, "w") as sink:
        agent = subprocess.Popen(torchrun_cmd(script, 2) + args, cwd=ROOT, env=hub_env(server), stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while " published: " not in log.read_text():  # step 2 is in the store: step 3 is generating
            assert agent.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        store = HubStore("hf://me/grpo-lost", token=WRITE_TOKEN, endpoint=server.url)
        store.write_text("lease.json", json.dumps({"holder": "other-host pid 7", "id": "theirs", "since": time.time(),
                                                   "heartbeat": time.time(), "ttl_s": 600}))
        agent.wait(timeout=120)
    finally:
        kill_job(agent, str(out))
    text = log.read_text()
    assert agent.returncode == 1 and text.count("exitcode  : 4") == 2, text[-3000:]  # each rank's exit 4 in torchrun's
    assert "[kit] step 3 given up during its generation (lease lost: " in text, text[-3000:]  # before: at its end
    assert "other-host pid 7" in text
    assert "writes nothing more" in text
    assert max(store.list_steps()) <= 4  # at most the one upload under way when the lease went
    assert json.loads(store.read_text("lease.json"))["id"] == "theirs"  # never overwritten by the loser


def job_with_reward(tmp_path: Path, body: str) -> Path:
    """The shipped config in a folder of its own, its rewards `r.py:ok` with `body` as r.py beside it."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "r.py").write_text(body)
    (folder / "job.yaml").write_text((ROOT / CONFIG).read_text().replace("grpo_rewards.py:json_format,brevity", "r.py:ok")
                                     .replace("data/grpo_prompts.jsonl", str(ROOT / "data" / "grpo_prompts.jsonl")))
    return folder / "job.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("body,want", [
    ("import time\ndef ok(completions, **kwargs):\n    time.sleep(3600)\n",
     "rewards: r.py:ok (a dry call with 2 rows) did not finish within 3 s"),
    ("import os\ndef ok(completions, **kwargs):\n    os._exit(0)\n", "rewards: r.py:ok called os._exit(0)"),
], ids=["never-returns", "os-exit-0"])
def test_under_torchrun_a_reward_that_hangs_or_exits_stops_every_rank_with_one_line(script, tmp_path, body, want):
    # Rank 0 dry-calls the rewards while rank 1 waits for its word: a reward that never returned left both ranks
    # waiting (rank 1 in the broadcast), and os._exit(0) ended rank 0 "successfully" with rank 1 still waiting.
    import time

    job = job_with_reward(tmp_path, body)
    started = time.monotonic()
    r = run(script, ["--config", str(job), f"output_dir={tmp_path / 'out'}", "grpo.reward_timeout=3"],
            env(), timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode != 0 and time.monotonic() - started < 150, log[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors and all(want in ln for ln in errors) and "[kit exit 2" in errors[0], log[-3000:]
    assert "trainable parameters" not in log and not any((tmp_path / "out").glob("checkpoint-*"))


@pytest.mark.slow
def test_under_torchrun_a_reward_that_fails_on_one_rank_only_is_said_in_one_line(script, tmp_path):
    # Rank 1's completions break the reward at step 2, rank 0's never do. Before, only rank 0 spoke for the job:
    # rank 1's error line was never printed, and rank 0 died in its next collective with gloo's traceback.
    job = job_with_reward(tmp_path, LATER + "    import os\n    if late and os.environ.get('RANK') == '1':\n"
                          "        raise KeyError('answer')\n    return [1.0] * len(completions)\n")
    r = run(script, ["--config", str(job), f"output_dir={tmp_path / 'out'}", "max_steps=4",
                     "eval.baseline=false"], env(), timeout=300)
    log = r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 2, log[-3000:]  # the line, and again after torchrun's report
    assert all("rewards: ok raised KeyError: 'answer' at step 2" in ln for ln in errors), errors
    assert "[rank0]" not in log and "RuntimeError" not in log, log[-3000:]  # no traceback from the rank it stopped


def test_a_rank_that_cannot_import_the_rewards_stops_with_one_line(tmp_path):
    # The other ranks import the file rank 0 checked; one that cannot (a file only rank 0's machine has) raises
    # the error on every rank (dist.gather) instead of leaving the others waiting in training.
    from kit.errors import UsageError
    from kit.train.job import Job

    (tmp_path / "job.yaml").write_text("trainer: grpo\n")
    job = Job(grpo_cfg(grpo__rewards="gone.py:ok"), SimpleNamespace(rank=1, is_main=False, world_size=2), None,
              config_path=str(tmp_path / "job.yaml"))
    with pytest.raises(UsageError, match=r"rank 1: rewards: .*gone.py not found"):
        job._rewards_on_every_rank()
    (tmp_path / "gone.py").write_text(GOOD)
    job._rewards_on_every_rank()
    assert [f.__name__ for f in job.reward_funcs] == ["ok"]


def test_the_rewards_line_names_an_instance_or_a_partial_as_trl_logs_it(tmp_path, capsys):
    # TRL 1.16 takes a callable instance (logged by its class) and a functools.partial (by its function); the
    # job's line named them through __name__, an AttributeError traceback before any model loaded.
    from types import SimpleNamespace

    from kit.train.job import Job

    (tmp_path / "r.py").write_text("import functools\nclass Judge:\n    def __call__(self, completions, **kw):\n"
                                   "        return [1.0] * len(completions)\njudge = Judge()\n"
                                   "def score(completions, w=1.0, **kw):\n    return [w] * len(completions)\n"
                                   "heavy = functools.partial(score, w=2.0)\n")
    (tmp_path / "job.yaml").write_text("trainer: grpo\n")
    cfg = grpo_cfg(grpo__rewards="r.py:judge,heavy", data__path=str(ROOT / "data" / "grpo_prompts.jsonl"))
    job = Job(cfg, SimpleNamespace(rank=0, is_main=True, world_size=1), SimpleNamespace(global_batch=8),
              config_path=str(tmp_path / "job.yaml"))
    job._check_rewards()
    out = capsys.readouterr().out
    assert "[kit] rewards: Judge, score from r.py:judge,heavy" in out, out
    assert re.search(r"judge \d+\.\d\d s; heavy \d+\.\d\d s", out), out  # each dry call's time


def test_an_epoch_of_prompts_is_num_generations_completions_of_each():
    from kit.train.job import Job

    cfg = grpo_cfg(max_steps=None, epochs=1.0)  # 4 generations, 2 completions a micro-batch, global batch 8
    plan = SimpleNamespace(per_device_batch=2, grad_accum=2, global_batch=8)
    job = Job(cfg, SimpleNamespace(rank=0, is_main=True, world_size=2), plan)
    assert job.max_steps(144) == 72  # 144 prompts x 4 completions / 8 a step (before: 18, a quarter of them)


def test_the_reasons_say_what_the_plan_chose_for_grpo():
    # On an H100 "auto" offloads activations and takes Liger for sft; GRPOConfig has no activation offloading and
    # Liger would swap in TRL's fused GRPO loss, which kit has not measured: both off, and the reasons say so.
    cfg = config.load(str(ROOT / CONFIG), ["gradient_checkpointing=on"])
    plan = make_plan(gpu_table.synthesize("1xH100"), cfg)
    assert plan.compile_layers is False and plan.kernels == "none" and plan.activation_offloading is False
    assert reason(plan, "offloading_off")["because"] == reason(plan, "kernels_none")["because"] == "grpo"
    assert "activation_offloading=on" not in words(reason(plan, "offloading_off"))  # it is refused for grpo
    said = reason(plan, "compile_off_trainer")
    assert (said["trainer"], said["measured"]) == ("grpo", False)  # measured for sft and dpo only
