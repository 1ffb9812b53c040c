"""GRPO reward functions from the user's file: every bad file, name, signature or return is one line,
exit 2, before a model loads; good ones come back in the order named."""

import pytest

from kit.errors import EXIT_USAGE, UsageError
from kit.train import rewards

GOOD = '''
def correct(completions, answer, **kwargs):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

def format(completions, **kwargs):
    return [0.5 for _ in completions]

def chat(prompts, completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]
'''

ROWS = {"prompt": ["what is 2+2?", "what is 3+3?", "spare"], "answer": ["4", "6", "x"]}


def write(tmp_path, body, name="my_rewards.py"):
    (tmp_path / name).write_text(body)
    return tmp_path


def test_named_functions_load_in_order_after_a_dry_call(tmp_path):
    funcs = rewards.load_rewards("my_rewards.py:format,correct", base=write(tmp_path, GOOD), rows=ROWS)
    assert [f.__name__ for f in funcs] == ["format", "correct"]


def test_chat_prompts_get_message_completions(tmp_path):
    rows = {"prompt": [[{"role": "user", "content": "hi"}]] * 2}
    assert rewards.load_rewards("my_rewards.py:chat", base=write(tmp_path, GOOD), rows=rows)


def test_a_file_named_like_a_stdlib_module_is_the_users(tmp_path):
    write(tmp_path, GOOD, name="json.py")
    assert rewards.load_rewards(str(tmp_path / "json.py") + ":format", base=tmp_path / "elsewhere", rows=ROWS)


@pytest.mark.parametrize("spec,body,words", [
    ("my_rewards.py", GOOD, "not FILE.py:NAME"),
    ("my_rewards.py:", GOOD, "not FILE.py:NAME"),
    (":correct", GOOD, "not FILE.py:NAME"),
    ("my_rewards.py:cor rect", GOOD, "not FILE.py:NAME"),
    ("missing.py:correct", GOOD, "missing.py not found"),
    ("my_rewards.py:nope", GOOD, "has no function 'nope'"),
    ("my_rewards.py:THRESHOLD", "THRESHOLD = 3\n", "is a int, not a function"),
    ("my_rewards.py:f", "def f(completions):\n    return [0.0] * len(completions)\n", "no **kwargs"),
    ("my_rewards.py:f", "def f(completions, weights, **kw):\n    return [0.0]\n", "'weights' has no default and is not a column"),
    ("my_rewards.py:f", "def f(c, /, **kw):\n    return [0.0]\n", "'c' is positional-only"),
    ("my_rewards.py:f", "import no_such_module_kit\n", "failed to import: ModuleNotFoundError"),
    ("my_rewards.py:f", "def f(:\n", "failed to import: SyntaxError"),
    ("my_rewards.py:f", "def f(completions, **kw):\n    raise KeyError('answer')\n", "f raised KeyError"),
    ("my_rewards.py:f", "def f(completions, **kw):\n    return [1.0]\n", "returned 1 values for 2 completions"),
    ("my_rewards.py:f", "def f(completions, **kw):\n    return 1.0\n", "returned float, not a list"),
    ("my_rewards.py:f", "def f(completions, **kw):\n    return ['1', '2']\n", "returned str values"),
])
def test_bad_reward_is_one_line_exit_2(tmp_path, spec, body, words):
    with pytest.raises(UsageError) as e:
        rewards.load_rewards(spec, base=write(tmp_path, body), rows=ROWS)
    assert e.value.exit_code == EXIT_USAGE
    assert words in str(e.value) and "\n" not in str(e.value)


def test_none_rewards_are_allowed(tmp_path):
    body = "def f(completions, **kw):\n    return [None, 1]\n"
    assert rewards.load_rewards("my_rewards.py:f", base=write(tmp_path, body), rows=ROWS)


def test_without_data_a_required_parameter_is_taken_for_a_column(tmp_path):
    assert rewards.load_rewards("my_rewards.py:correct", base=write(tmp_path, GOOD))
