"""GRPO reward functions from the user's file: every bad file, name, signature or return is one line,
exit 2, before a model loads; good ones come back in the order named."""

import types

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


F = "def f(completions, **kw):\n"
# What else a hostile or new user's file can be: each one line, exit 2, naming the file or the function.
HOSTILE = [
    ("twice", "my_rewards.py:format,format", GOOD, "'format' is named twice"),
    ("not-py", "my_rewards.txt:format", GOOD, "'my_rewards.txt' is not a .py file"),
    ("a-class", "my_rewards.py:f", "class f:\n    def __init__(self, completions, **kw):\n        pass\n", "is a class"),
    ("alias", "my_rewards.py:format,g", GOOD + "g = format\n", "have one name, 'format'"),
    ("two-lambdas", "my_rewards.py:a,b", "a = lambda completions, **kw: [1.0] * len(completions)\nb = a.__class__("
     "(lambda completions, **kw: [0.0] * len(completions)).__code__, {})\n", "have one name, '<lambda>'"),
    ("two-partials", "my_rewards.py:a,b", "import functools\ndef score(completions, w=1.0, **kw):\n    return [w] * "
     "len(completions)\na = functools.partial(score, w=1.0)\nb = functools.partial(score, w=2.0)\n",
     "have one name, 'score'"),
    ("exit-at-import", "my_rewards.py:f", "import sys\nsys.exit(3)\n", "failed to import: SystemExit: 3"),
    ("exit-in-call", "my_rewards.py:f", F + "    raise SystemExit(0)\n", "my_rewards.py:f raised SystemExit"),
    ("nul-byte", "my_rewards.py:f", F + "    return [0.0]\x00\n", "failed to import: SyntaxError"),
    ("mutates", "my_rewards.py:f", F + "    completions.clear()\n    return [1.0, 1.0]\n",
     "changed its argument 'completions' in place"),
    ("mutates-column", "my_rewards.py:f", F + "    kw['answer'][0] = 'x'\n    return [1.0, 1.0]\n",
     "changed its argument 'answer' in place"),
    ("returns-none", "my_rewards.py:f", F + "    return None\n", "returned NoneType, not a list of 2"),
    ("returns-dict", "my_rewards.py:f", F + "    return {'a': 1.0, 'b': 2.0}\n", "returned dict, not a list"),
    ("returns-set", "my_rewards.py:f", F + "    return {1.0, 2.0}\n", "returned set, not a list"),
    ("returns-inf", "my_rewards.py:f", F + "    return [float('inf'), 1.0]\n", "advantages would be NaN"),
    ("past-float32", "my_rewards.py:f", F + "    return [1e39, 1.0]\n", "float32's range"),
    ("huge-int", "my_rewards.py:f", F + "    return [10 ** 400, 1]\n", "float32's range"),
    ("nested", "my_rewards.py:f", F + "    return [[1.0], [0.0]]\n", "for one completion"),
    ("complex", "my_rewards.py:f", F + "    return [1j, 1j]\n", "returned complex values"),
    ("sync-returns-coroutine", "my_rewards.py:f", "async def g():\n    return 1\n" + F + "    return g()\n",
     "returned coroutine"),
]


@pytest.mark.parametrize("spec,body,words", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_reward_files_are_one_line_exit_2(tmp_path, spec, body, words):
    (tmp_path / spec.split(":")[0]).write_text(body)
    with pytest.raises(UsageError) as e:
        rewards.load_rewards(spec, base=tmp_path, rows=ROWS)
    assert e.value.exit_code == EXIT_USAGE
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_folder_named_as_the_file_is_said_to_be_one(tmp_path):
    (tmp_path / "my_rewards.py").mkdir()
    with pytest.raises(UsageError, match="my_rewards.py is a folder"):
        rewards.load_rewards("my_rewards.py:f", base=tmp_path, rows=ROWS)


# What TRL 1.16's GRPOTrainer takes (it awaits async rewards, names a partial or an instance by its function or
# class, turns None into NaN and the rest through torch.tensor(..., dtype=float32)): kit takes the same.
ACCEPTED = [
    ("async", "async def f(completions, **kw):\n    return [1.0, 0.0]\n", "f", [1.0, 0.0]),
    ("instance", "class Judge:\n    def __call__(self, completions, **kw):\n        return [1.0, 0.0]\nf = Judge()\n",
     "Judge", [1.0, 0.0]),
    ("async-instance", "class Judge:\n    async def __call__(self, completions, **kw):\n        return [1.0, 0.0]\n"
     "f = Judge()\n", "Judge", [1.0, 0.0]),
    ("partial", "import functools\ndef score(completions, w=1.0, **kw):\n    return [w, 0.0]\n"
     "f = functools.partial(score, w=2.0)\n", "score", [2.0, 0.0]),
    ("generator", F + "    return (1.0 for _ in completions)\n", "f", [1.0, 1.0]),
    ("numpy", "import numpy as np\n" + F + "    return np.array([0.5, 1.0])\n", "f", [0.5, 1.0]),
    ("tensor", "import torch\n" + F + "    return torch.tensor([0.5, 1.0])\n", "f", [0.5, 1.0]),
    ("0-d-tensors", "import torch\n" + F + "    return [torch.tensor(0.5), torch.tensor(1.0)]\n", "f", [0.5, 1.0]),
    ("bools", F + "    return [c.startswith(' ') for c in completions]\n", "f", [1.0, 1.0]),
    ("ints", F + "    return [1, 0]\n", "f", [1.0, 0.0]),
    ("dataclass", "from dataclasses import dataclass\n@dataclass\nclass W:\n    w: float = 0.5\n"
     + F + "    return [W().w] * len(completions)\n", "f", [0.5, 0.5]),
]


@pytest.mark.parametrize("body,name,want", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_what_trl_accepts_kit_accepts(tmp_path, body, name, want):
    (tmp_path / "my_rewards.py").write_text(body)
    notes = []
    [func] = rewards.load_rewards("my_rewards.py:f", base=tmp_path, rows=ROWS, notes=notes)
    assert rewards.reward_name(func) == name and notes[0].startswith("f ") and " s" in notes[0]
    assert rewards.values(rewards.call(func, {"completions": [" a", " b"], "prompts": ["p", "q"]}), 2) == want


def test_none_and_nan_are_not_applicable_as_in_trl_and_the_note_says_so(tmp_path):
    (tmp_path / "my_rewards.py").write_text(F + "    return [None, float('nan')]\n")
    notes = []
    [func] = rewards.load_rewards("my_rewards.py:f", base=tmp_path, rows=ROWS, notes=notes)
    assert "None for 2 of 2" in notes[0] and "not applicable" in notes[0]
    got = rewards.values(func(completions=["a", "b"]), 2)
    assert all(v != v for v in got)  # NaN, as TRL stores None: left out of the row's sum and of the mean


HANG = "import time\n" + F + "    time.sleep(3600)\n"
EXITS = "import os\n" + F + "    os._exit(0)\n"
PROCESS_CASES = [
    ("never-returns", HANG, "my_rewards.py:f (a dry call with 2 rows) did not finish within 1 s"),
    ("spins", F + "    while True:\n        pass\n", "did not finish within 1 s"),
    ("import-never-returns", "import time\ntime.sleep(3600)\n", "importing my_rewards.py did not finish within 1 s"),
    ("os-exit-in-call", EXITS, "my_rewards.py:f called os._exit(0)"),
    ("os-exit-at-import", "import os\nos._exit(0)\n", "failed to import: called os._exit(0)"),
]


@pytest.mark.parametrize("body,words", [c[1:] for c in PROCESS_CASES], ids=[c[0] for c in PROCESS_CASES])
def test_a_reward_that_hangs_or_ends_the_process_is_one_line_exit_2(tmp_path, body, words):
    # In a process of its own: a hang is bounded by a watchdog that ends the process (the user's code cannot be
    # unwound), and os._exit, before kit guards it, ends the process with exit 0 and no word.
    import subprocess
    import sys

    (tmp_path / "my_rewards.py").write_text(body)
    code = ("import sys\nfrom pathlib import Path\nfrom kit.errors import KitError\nfrom kit.train import rewards\n"
            "rewards.CALL_SECONDS = 1\n"
            "try:\n    rewards.load_rewards('my_rewards.py:f', base=Path(sys.argv[1]), rows={'prompt': ['a', 'b']})\n"
            "except KitError as e:\n    print(f'error: {e}', file=sys.stderr)\n    sys.exit(e.exit_code)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == EXIT_USAGE and len(errors) == 1 and words in errors[0], (r.returncode, r.stderr[-2000:])


def test_without_data_a_required_parameter_is_taken_for_a_column(tmp_path):
    assert rewards.load_rewards("my_rewards.py:correct", base=write(tmp_path, GOOD))


def test_what_a_reward_prints_never_shows_the_token(tmp_path, monkeypatch, capfd):
    token = "hf_" + "rewardPRINTSthisTOKEN" + "0123456789"
    monkeypatch.setenv("HF_TOKEN", token)
    (tmp_path / "my_rewards.py").write_text("import os\nprint('import', os.environ['HF_TOKEN'])\n" + F
                                            + "    print('call', os.environ['HF_TOKEN'])\n    return [1.0] * len(completions)\n")
    [func] = rewards.checked(rewards.load_rewards("my_rewards.py:f", base=tmp_path, rows=ROWS))
    func(completions=["a", "b"], prompts=["p", "q"], trainer_state=None)  # as TRL calls it at a step
    out, err = capfd.readouterr()
    assert token not in out + err and out.count("***") == 3  # the import, the dry call, the step


@pytest.mark.parametrize("body,words", [
    (F + "    raise ValueError('no answer')\n", "f raised ValueError: no answer at step 5 (on 2 completions; it passed"),
    (F + "    raise SystemExit(1)\n", "f raised SystemExit: 1 at step 5"),
    ("import os\n" + F + "    os._exit(0)\n", "f called os._exit(0) at step 5"),
    (F + "    return [float('-inf'), 0.0]\n", "f returned -inf (infinite"),
    ("async def f(completions, **kw):\n    return [None]\n", "f returned 1 values for 2 completions at step 5"),
])
def test_a_reward_that_fails_at_a_step_is_one_line_naming_it_and_the_step(tmp_path, body, words):
    (tmp_path / "my_rewards.py").write_text(body)
    module = rewards.import_file(tmp_path / "my_rewards.py")
    [func] = rewards.checked([module.f], seconds=30)
    with pytest.raises(UsageError) as e:
        rewards.call(func, {"completions": ["a", "b"], "prompts": ["p", "q"],
                            "trainer_state": types.SimpleNamespace(global_step=4)})
    assert e.value.exit_code == EXIT_USAGE and words in str(e.value) and "\n" not in str(e.value)


def test_a_reward_that_hangs_at_a_step_is_one_line_exit_2(tmp_path):
    import subprocess
    import sys

    (tmp_path / "my_rewards.py").write_text(HANG)
    code = ("import sys, types\nfrom pathlib import Path\nfrom kit.train import rewards\n"
            "module = rewards.import_file(Path(sys.argv[1]) / 'my_rewards.py')\n"
            "[f] = rewards.checked([module.f], seconds=1)\n"
            "f(completions=['a', 'b'], trainer_state=types.SimpleNamespace(global_step=6))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == EXIT_USAGE and len(errors) == 1, (r.returncode, r.stderr[-2000:])
    assert "rewards: f at step 7 (on 2 completions; it passed the dry call) did not finish within 1 s" in errors[0]


def test_async_rewards_awaited_together_leave_os_exit_as_it_was(tmp_path):
    # TRL gathers async rewards on one event loop: their guarded calls interleave on one thread (a starts first and
    # ends first). Each guard restoring what it found left os._exit replaced after training's rewards, an exit raising in that thread.
    import asyncio
    import os

    real = os._exit
    (tmp_path / "my_rewards.py").write_text(
        "import asyncio\nasync def a(completions, **kw):\n    await asyncio.sleep(0.01)\n    return [1.0] * len(completions)\n"
        "async def b(completions, **kw):\n    await asyncio.sleep(0.1)\n    return [0.0] * len(completions)\n")
    funcs = rewards.checked(rewards.load_rewards("my_rewards.py:a,b", base=tmp_path, rows=ROWS))

    async def both():
        return await asyncio.gather(*(f(completions=["x", "y"]) for f in funcs))

    assert asyncio.run(both()) == [[1.0, 1.0], [0.0, 0.0]]
    assert os._exit is real
