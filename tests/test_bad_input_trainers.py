"""Bad input for the GRPO, DPO and KTO trainers, as a new user or a hostile one writes it: the trainer's
settings and sections through `kit plan` and `kit render`, and preference rows that teach nothing.

Same contract as tests/test_bad_input.py (its sandbox: a temp copy of the checkout, a fake token set): the
right exit code, one `error:` line naming the thing, no traceback, nothing there before changed. The reward
files are tabled in tests/test_rewards.py, the prompt rows and the rendered script in tests/test_grpo_script.py.
"""

from __future__ import annotations

import json

import pytest

from kit.cli import main
from kit.errors import UsageError
from kit.planning import config
from kit.train import preference_data
from tests.test_bad_input import check_contract, sandbox, snapshot  # noqa: F401  (sandbox: a fixture)

GRPO, DPO, KTO = "configs/grpo-tiny.yaml", "configs/dpo-tiny.yaml", "configs/kto-tiny.yaml"

PLAN_CASES = [
    # A section of another trainer does nothing: a forgotten `trainer: grpo` would have been an SFT run.
    ("grpo-config-trainer-sft", GRPO, ["trainer=sft"], r"grpo.rewards='grpo_rewards.py:json_format,brevity' is set, "
                                                       r"but trainer=sft.*set trainer=grpo"),
    ("grpo-key-default-config", None, ["grpo.num_generations=4"], r"grpo.num_generations=4 is set, but trainer=sft"),
    ("dpo-key-grpo-config", GRPO, ["dpo.beta=0.5"], r"dpo.beta=0.5 is set, but trainer=grpo"),
    ("kto-key-dpo-config", DPO, ["kto.desirable_weight=2"], r"kto.desirable_weight=2.0 is set, but trainer=dpo"),
    ("dpo-key-kto-config", KTO, ["dpo.loss_type=ipo"], r"dpo.loss_type='ipo' is set, but trainer=kto"),
    ("grpo-section-dpo-config", DPO, ["grpo={temperature: 0.7}"], r"grpo.temperature=0.7 is set, but trainer=dpo"),
    # The rewards' spec: the file must be Python, each function named once (checked before any plan).
    ("rewards-not-py", GRPO, ["grpo.rewards=rewards.txt:f"], r"'rewards.txt' is not a .py file"),
    ("rewards-twice", GRPO, ["grpo.rewards=r.py:f,g,f"], r"'f' is named twice"),
    ("rewards-empty-list", GRPO, ["grpo.rewards=r.py:"], r"grpo.rewards.*must be a string"),
    ("rewards-no-names", GRPO, ["grpo.rewards=r.py:,"], r"is not FILE.py:NAME"),
    # GRPO's own settings.
    ("typo", GRPO, ["grpo.num_generation=8"], r"did you mean 'grpo.num_generations'"),
    ("generations-0", GRPO, ["grpo.num_generations=0"], r"'grpo.num_generations' .*must be > 0"),
    ("generations-1", GRPO, ["grpo.num_generations=1"], r"num_generations=1: .*at least 2"),
    ("generations-negative", GRPO, ["grpo.num_generations=-4"], r"must be > 0"),
    ("generations-bool", GRPO, ["grpo.num_generations=true"], r"must be an integer"),
    ("generations-float", GRPO, ["grpo.num_generations=2.5"], r"must be an integer"),
    ("generations-huge", GRPO, ["grpo.num_generations=99999999999"], r"must be at most"),
    ("temperature-0", GRPO, ["grpo.temperature=0"], r"'grpo.temperature' .*must be > 0"),
    ("temperature-nan", GRPO, ["grpo.temperature=.nan"], r"must be a finite number"),
    ("beta-negative", GRPO, ["grpo.beta=-0.1"], r"'grpo.beta' .*must be >= 0"),
    ("completion-past-context", GRPO, ["grpo.max_completion_length=2000"],
     r"seq_len=128 \+ grpo.max_completion_length=2000 is longer than .*max_position_embeddings=1024"),
    ("completion-0", GRPO, ["grpo.max_completion_length=0"], r"'grpo.max_completion_length' .*must be > 0"),
    ("loss-unknown", GRPO, ["grpo.loss_type=ppo"], r"expected one of dapo\|grpo\|dr_grpo\|bnpo"),
    ("reward-timeout-0", GRPO, ["grpo.reward_timeout=0"], r"'grpo.reward_timeout' .*must be > 0"),
    ("reward-timeout-inf", GRPO, ["grpo.reward_timeout=.inf"], r"'grpo.reward_timeout' .*must be a finite number"),
    ("section-not-mapping", GRPO, ["grpo=8"], r"config key 'grpo' .*must be a mapping"),
]


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize("config_file,argv,want", [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES])
def test_trainer_settings_a_user_gets_wrong_are_one_line_exit_2(sandbox, capfd, command, config_file, argv, want):
    before = snapshot(sandbox)
    args = [command, *(["--config", config_file] if config_file else []), *argv]
    args += ["--gpus", "1xT4"] if command == "plan" else ["-o", "train_x.py"]
    code = main(args)
    out, err = capfd.readouterr()
    check_contract(sandbox, before, code, out, err, 2, want)
    assert not (sandbox / "train_x.py").exists()


def test_a_dumped_config_keeps_every_section_at_its_defaults_and_plans(sandbox, capfd):
    # What `to_dict` writes holds every trainer's section; at their defaults they are no one's settings.
    dumped = config.dump_yaml(config.load(DPO))
    (sandbox / "dumped.yaml").write_text(dumped)
    assert "grpo:" in dumped and main(["plan", "--config", "dumped.yaml", "--gpus", "1xT4"]) == 0


def _rows(tmp_path, rows, trainer, *overrides):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return config.load(None, [f"trainer={trainer}", f"data.path={path}", *overrides])


def test_pairs_whose_answers_are_equal_are_refused_as_duplicates_are(tmp_path):
    # DPO's loss on a pair with chosen == rejected is log 2 whatever the model, its gradient 0: a file of them
    # trained for the whole budget and moved nothing.
    ties = [{"prompt": f"turn on light {i}", "chosen": "light.turn_on", "rejected": "light.turn_on"} for i in range(20)]
    with pytest.raises(UsageError) as e:
        preference_data.load(_rows(tmp_path, ties, "dpo"))
    assert e.value.exit_code == 2 and "20 of 20 pairs have the same chosen and rejected" in str(e.value)
    assert "d.jsonl line 1" in str(e.value) and "data.allow_duplicates" in str(e.value)
    one = [dict(r, rejected="light.turn_off") if i else r for i, r in enumerate(ties)]  # 1 of 20: within 5 %
    assert len(preference_data.load(_rows(tmp_path, one, "dpo"))[0]) == 20
    mapped = [{"q": r["prompt"], "good": r["chosen"], "bad": r["rejected"]} for r in ties]
    with pytest.raises(UsageError, match="the same good and bad"):
        preference_data.load(_rows(tmp_path, mapped, "dpo", "data.columns={prompt: q, chosen: good, rejected: bad}"))
    assert len(preference_data.load(_rows(tmp_path, ties, "dpo", "data.allow_duplicates=true"))[0]) == 20


@pytest.mark.parametrize("label", [True, False])
def test_kto_rows_of_one_label_are_taken_as_trl_takes_them(tmp_path, label):
    # TRL 1.16's KTOTrainer trains on desirable rows only (or undesirable only): the missing side's loss is an
    # empty tensor, and it warns only that the weights are outside its suggested range. kit takes them too.
    rows = [{"prompt": f"p{i}", "completion": f"a{i}", "label": label} for i in range(12)]
    ds, fmt = preference_data.load(_rows(tmp_path, rows, "kto"))
    assert len(ds) == 12 and fmt == "unpaired_preference"


@pytest.mark.parametrize("name,text", [
    ("bom.jsonl", "\ufeff" + "".join(json.dumps({"prompt": f"turn on light {i}", "answer": "x"}) + "\n"
                                     for i in range(6))),
    ("bom-crlf.jsonl", "\ufeff" + "".join(json.dumps({"prompt": f"turn on light {i}", "answer": "x"}) + "\r\n"
                                          for i in range(6))),
    ("bom.json", "\ufeff" + json.dumps([{"prompt": f"turn on light {i}", "answer": "x"} for i in range(6)])),
])
def test_a_file_saved_with_a_byte_order_mark_reads_as_without(tmp_path, name, text):
    # Windows Notepad's "UTF-8" starts the file with a byte-order mark; Arrow reads past it, kit's line scan
    # refused line 1 as "not valid JSON".
    from kit.train import prompt_data

    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    ds = prompt_data.load(config.load(GRPO, [f"data.path={path}"]))
    assert len(ds) == 6 and ds[0]["prompt"] == "turn on light 0" and ds[5]["answer"] == "x"
