"""Hostile text: values that hold newlines, quotes, escape sequences or bidi overrides, values of
100 kB, and inputs with far more items than a real one.

What a user relies on: a value given to kit lands in the generated script exactly (a Python literal,
never text pasted into code), kit never prints such a value raw (a forged line, a recoloured
terminal, a name that reads backwards), a command kit prints pastes back to the same values, and an
absurd input is one `error:` line, exit 2, quickly. In-process through `kit.cli.main`, in the same
sandbox as tests/test_bad_input.py.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import time

import pytest
import yaml

from kit.cli import build_parser, main
from kit.errors import shown
from kit.machine.command import shell_word
from tests.test_bad_input import T4X2, check_contract, sandbox, snapshot  # noqa: F401  (sandbox: a fixture)

# Every character a terminal must not get raw, but newline (kit's own lines) and tab.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
HOSTILE = ['a"b', "it's", "'''", 'x"""+__import__("os").system("id")+"""', "back\\slash\\", "N\\N{BULLET}",
           "r\u202egnp.exe", "z\u200bw\u2066i\u2069", "$HOME ${x} `id`", "-dash", "ünï 名"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def no_raw(text: str) -> None:
    assert not RAW.search(text), f"raw {RAW.search(text).group()!r} in: {text[max(0, RAW.search(text).start() - 80):][:200]!r}"


# ---- (a) what goes into the generated script --------------------------------------------------
def _literals(source: str) -> dict:
    tree = ast.parse(source)  # the script compiles
    return {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") in ("SETTINGS", "PLAN", "CONFIG_PATH")}


@pytest.mark.parametrize("value", HOSTILE)
def test_every_string_setting_lands_in_the_script_exactly(sandbox, capsys, value):
    """Each free-text setting (and the config's own path, and the GPU name the plan names) holding
    `value`: the script compiles, SETTINGS and CONFIG_PATH equal the inputs, and no raw control or
    bidi character is anywhere in it (main wrote a bidi override raw into the docstring)."""
    model = sandbox / "models" / f"m{value}"
    shutil.copytree(sandbox / "models" / "tiny-qwen3", model)
    data = sandbox / "data" / f"d{value}.jsonl"
    shutil.copy(sandbox / "data" / "ha_commands.jsonl", data)
    settings = {"model": f"models/m{value}", "revision": value, "output_dir": f"outputs/o{value}",
                "store": str(sandbox / f"store{value}"), "resume": f"ckpt/{value}",
                "data": {"path": f"data/d{value}.jsonl", "columns": {value: "text"}},
                "lora": {"target_modules": ["q_proj", value]}}
    cfg_path = sandbox / f"c{value}.yaml"
    cfg_path.write_text(yaml.safe_dump(settings, allow_unicode=True))
    facts = json.loads(json.dumps(T4X2))
    for g in facts["gpus"]:
        g["name"] = f"Tesla T4 {value}"
    (sandbox / "f.json").write_text(json.dumps(facts))
    code, out, err = run(["render", "--config", cfg_path.name, "--facts", "f.json", "-o", "t.py"], capsys)
    assert code == 0, err
    source = (sandbox / "t.py").read_text()
    got = _literals(source)
    assert got["CONFIG_PATH"] == cfg_path.name
    s = got["SETTINGS"]
    assert (s["model"], s["revision"], s["output_dir"], s["store"], s["resume"]) == (
        settings["model"], value, settings["output_dir"], settings["store"], settings["resume"])
    assert s["data"]["path"] == settings["data"]["path"] and s["data"]["columns"] == {value: "text"}
    assert s["lora"]["target_modules"] == ["q_proj", value]
    no_raw(source)
    no_raw(out + err)


@pytest.mark.parametrize("key", ["model", "revision", "output_dir", "store", "resume", "data.path", "data.split",
                                 "lora.target_modules"])
@pytest.mark.parametrize("bad", ["a\x00b", "a\nb", "a\x1b[31mb", "a\x85b", "a\rb"])
def test_a_control_character_in_a_setting_is_refused_by_name(sandbox, capsys, key, bad):
    """From the command line: a NUL, a newline (main folded it into a space: `data.path=a b`),
    ESC, a C1 control or a CR is one error line naming the key, the value shown escaped."""
    before = snapshot(sandbox)
    code, out, err = run(["render", "--config", "configs/default.yaml", f"{key}={bad}", "-o", "t.py"], capsys)
    check_contract(sandbox, before, code, out, err, 2, re.escape(f"'{key}'") + ".*control character")
    no_raw(out + err)
    # in a file too (a list item or a mapping's value as well)
    value = [bad] if key == "lora.target_modules" else bad
    top, _, leaf = key.partition(".")
    (sandbox / "c.yaml").write_text(yaml.safe_dump({top: {leaf: value}} if leaf else {top: value}))
    code, out, err = run(["plan", "--config", "c.yaml", "--gpus", "1xT4"], capsys)
    check_contract(sandbox, before | {"c.yaml": snapshot(sandbox)["c.yaml"]}, code, out, err, 2, "control character")


def test_an_override_means_its_text_not_what_yaml_makes_of_it(sandbox, capsys):
    from kit.planning import config

    assert config.load(None, ["store=/x #1", "revision=v2 # note"]).store == "/x #1"  # main: '/x' (a comment)
    assert config.load(None, ["revision=v2 # note"]).revision == "v2 # note"
    assert config.load(None, ["output_dir=#run1"]).output_dir == "#run1"  # main: null ('must not be null')
    split_list = "lora.target_modules=[q_proj,\n v_proj]"
    assert config.load(None, [split_list]).lora.target_modules == ["q_proj", "v_proj"]
    before = snapshot(sandbox)
    code, out, err = run(["plan", "--gpus", "1xT4", "lora.target_modules=[q\nproj]"], capsys)  # main: 'q proj'
    check_contract(sandbox, before, code, out, err, 2, "line break")


# ---- (b) what kit prints -------------------------------------------------------------------------
FORGED = "Tesla T4\nerror: FORGED line\x1b[31m red\u202etxt.exe\u200b"


def test_untrusted_text_never_reaches_the_terminal_raw(sandbox, capsys):
    """A facts file's GPU name and platform, an output_dir, a config path, an override key and the
    store's session records, each holding a newline, ESC, OSC, a bidi override and a zero-width
    space, through plan, bootstrap, status and errors: nothing raw, and no forged line."""
    facts = json.loads(json.dumps(T4X2))
    for g in facts["gpus"]:
        g["name"] = FORGED
    facts["platform_detected_by"] = "x\x1b]0;owned\x07"
    (sandbox / "f.json").write_text(json.dumps(facts))
    out_dir = sandbox / "outputs" / "o\u202eexe"
    out_dir.mkdir(parents=True)
    record = {"run_id": "r\nerror: FORGED", "host": "h\x1b[2J", "outcome": "paused\u202e", "gpu_name": FORGED,
              "start_step": 0, "end_step": 2, "max_steps": 4, "started": 1.7e9, "ended": 1.7e9 + 60,
              "world_size": 1, "gpu_count": 1}
    (out_dir / "kit_sessions.jsonl").write_text(json.dumps(record) + "\n" + "{torn \x1b[31m\n")
    od = "output_dir=outputs/o\u202eexe"
    runs = [["plan", "--config", "configs/default.yaml", "--facts", "f.json", od],
            ["bootstrap", "--config", "configs/default.yaml", "--facts", "f.json", od, "-o", "t.py"],
            ["status", "--config", "configs/default.yaml", od],
            ["plan", "--config", "nope\n\x1b[31m\u202e.yaml"],
            ["plan", "--gpus", "1xT4", "k\x1b[31m\u202e\nerror: FORGED=1"],
            ["plan", "--gpus", "1xT4", "method=\u202el\x1b[0m"],
            ["render", "--config", "configs/default.yaml", "-o", "d\nerror: FORGED\x1b[31m/"],
            ["render", "--config", "configs/default.yaml", "-o", "d\nerror: FORGED\u202e.py"]]
    for argv in runs:
        code, out, err = run(argv, capsys)
        no_raw(out + err)
        assert not any(line.startswith("error: FORGED") for line in (out + err).splitlines()), argv
        if code:
            assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
    code, out, err = run(["render", "--config", "configs/default.yaml", "-o", "e\nerror: FORGED\u202e.py"], capsys)
    assert code == 0 and "wrote e\\nerror: FORGED" in out and "FORGED\\u202e.py: " in out, out
    code, out, err = run(["status", "--config", "configs/default.yaml", od], capsys)
    assert "h\\x1b[2J" in out and "paused\\u202e" in out  # the session line, shown escaped


@pytest.fixture(scope="module")
def libraries_loaded():
    """The training libraries imported before a test captures output: their loggers keep the stderr
    they were first imported under, and a test's capture is closed when it ends (a later test's
    log line then became a 'Logging error' traceback in that test's stderr)."""
    import datasets  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401


def test_the_scripts_notes_and_data_errors_show_paths_escaped(libraries_loaded, sandbox, capfd):
    """The generated script's own lines: a data file whose name holds a bidi override and a zero-width space,
    and a bad row: the error names it escaped, and no note of kit's holds a raw one."""
    from tests.test_bad_input import run_script_in_process

    name = "data/d\u202eexe\u200b.jsonl"
    (sandbox / name).write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    before = snapshot(sandbox)
    code = run_script_in_process(sandbox, ["output_dir=outputs/o\u2066x", f"data.path={name}", "max_steps=1"])
    out, err = capfd.readouterr()
    check_contract(sandbox, before, code, out, err, 2, re.escape("d\\u202eexe\\u200b.jsonl line 2"),
                   one_line_stderr=False)
    kits = [line for line in (out + err).split("\n") if line.startswith(("[kit]", "error:"))]  # not the libraries'
    no_raw("\n".join(kits))


def test_shown_escapes_and_bounds():
    assert shown("a\nb\x1b[31m\u202e\u200b\x85\udc80") == "a\\nb\\x1b[31m\\u202e\\u200b\\x85\\udc80"
    assert shown("ok: ünï 名 ~/x y") == "ok: ünï 名 ~/x y"
    assert shown("x" * 100_000) == "x" * 200 + "… (100,000 characters)"
    assert shown("it's\n", quote=True) == '"it\'s\\n"'
    assert shown("a\nb", keep="\n") == "a\nb"


# ---- 14: a value shown bounded; commands that paste back -----------------------------------------
@pytest.mark.parametrize("argv,want", [
    (["plan", "--gpus", "1xT4", "k" * 100_000 + "=1"], "unknown config key 'k{200}'… \\(100,000 characters\\)"),
    (["plan", "--gpus", "1xT4", "method=" + "m" * 100_000], "'method'.*'m{200}'… \\(100,000 characters\\)"),
    (["plan", "--gpus", "1xT4", "lora=" + "x" * 100_000], "'lora'.*… \\(100,000 characters\\)"),
    (["plan", "--gpus", "1xT4", "=" + "v" * 100_000], "not KEY=VALUE"),
])
def test_a_huge_value_is_echoed_bounded(sandbox, capsys, argv, want):
    before = snapshot(sandbox)
    code, out, err = run(argv, capsys)
    check_contract(sandbox, before, code, out, err, 2, want)
    assert len(err) < 1200, len(err)  # main echoed all 100,000 characters


BIG = "x" * 100_000


@pytest.mark.parametrize("argv,want", [
    (["plan", "--config", BIG], "cannot read config x{100}"),
    (["plan", "--facts", BIG], "facts file"),
    (["plan", "--gpus", BIG], "--gpus"),
    (["plan", "--gpus", "1xT4", "--nodes", "2", "--rdzv-endpoint", BIG], "rendezvous endpoint"),
    (["convert", BIG, "-o", "x.py"], "notebook"),
    (["status", "--config", "configs/default.yaml", "--plot", BIG], ""),
    (["plan", "--gpus", "1xT4", "model=" + "m" * 5000], "'model'.*5000 bytes long"),  # main: an OSError from stat()
    (["plan", "--gpus", "1xT4", "store=hf://a/" + "s" * 5000], "'store'.*bytes long"),
    (["plan", "--gpus", "1xT4", "learning_rate=1" + "0" * 400], "'learning_rate'.*finite.*… \\(401 characters\\)"),
])
def test_a_huge_argument_is_one_bounded_line(sandbox, capsys, argv, want):
    """Wherever a message echoes it, a 100 kB argument comes back cut (main: the whole of it, or a
    400-digit learning rate as 'a bug in kit')."""
    before = snapshot(sandbox)
    code, out, err = run(argv, capsys)
    check_contract(sandbox, before, code, out, err, 2, want)
    assert len(err) < 1500, len(err)


def bash_words(command: str) -> list[str]:
    """The argv bash makes of a printed command line (it reads $'…' quoting, which shlex does not)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, text=True, check=True)
    return done.stdout.split("\0")[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("path", ["--help", "-o", "-rf x", "out/\u202eexe", "it's $(id)", "a\\b"])
def test_a_printed_command_pastes_back_to_the_same_values(path):
    """The export command a finished job prints (main: `--adapter --help/final`, which kit export reads as
    its --help flag and fails), the render command plan prints, the launch command: each value comes back
    exactly through kit's own parser, and through bash."""
    from kit.deliver.wrapup import export_command
    from kit.machine.command import launch_command
    from kit.planning import config
    from kit.script.render import rerender_command

    cfg = config.load(None, [f"output_dir={path}"]) if "\\" not in path else config.RunConfig(output_dir=path)
    words = bash_words(export_command(cfg))
    args = build_parser("export").parse_args(words[3:])
    assert args.adapter in (f"{path}/final", f"./{path}/final") and args.output in (f"{path}/merged", f"./{path}/merged")
    cmd = rerender_command(f"{path}.yaml", ["--gpus", "2xT4"], [f"output_dir={path}"], output=f"{path}.py")
    args = build_parser("render").parse_args(bash_words(cmd)[3:])
    assert args.config in (f"{path}.yaml", f"./{path}.yaml") and args.overrides == [f"output_dir={path}"]
    assert bash_words(launch_command(2, script=f"{path}.py"))[-1] in (f"{path}.py", f"./{path}.py")
    for word in (export_command(cfg), cmd):
        no_raw(word)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("value", ["r\u202egnp.exe", "tab\there", "nl\nx", "esc\x1b[31m", "q'uo\"te\\", "$HOME"])
def test_a_shell_word_with_unsafe_characters_reads_back_in_bash(value):
    word = shell_word(value)
    no_raw(word)
    got = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, check=True).stdout
    assert got == value


# ---- 14: empty configs, absurd list sizes ------------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    ("", "is empty"), ("# just a comment\n\n   # and another\n", "is empty"), ("{}\n", "is empty"),
    ("- model: x\n", "must be a mapping.*YAML list"), ("0\n", "must be a mapping.*YAML int"),
    ("''\n", "must be a mapping.*YAML str"), ("[]\n", "must be a mapping"), ("false\n", "must be a mapping"),
])
def test_a_config_without_settings_is_refused(sandbox, capsys, text, want):
    """main planned the built-in defaults for an empty or comment-only file (and for `0`, `[]`, `''`)."""
    (sandbox / "c.yaml").write_text(text)
    before = snapshot(sandbox)
    for command in (["plan", "--gpus", "1xT4"], ["render", "-o", "t.py"]):
        code, out, err = run([*command, "--config", "c.yaml"], capsys)
        check_contract(sandbox, before, code, out, err, 2, want)


def test_facts_with_more_gpus_than_a_machine_holds_are_refused_quickly(sandbox, capsys):
    before = snapshot(sandbox)
    gpu = T4X2["gpus"][0]
    for n in (17, 100_000):  # main planned 17; 100,000 took minutes (steps that compare GPUs pairwise)
        facts = dict(json.loads(json.dumps(T4X2)), gpus=[dict(gpu, index=i) for i in range(n)], gpu_count=n)
        (sandbox / "f.json").write_text(json.dumps(facts))
        began = time.monotonic()
        code, out, err = run(["plan", "--facts", "f.json"], capsys)
        check_contract(sandbox, before | {"f.json": snapshot(sandbox)["f.json"]}, code, out, err, 2,
                       f"lists {n:,} GPUs; kit plans for at most 16")
        assert time.monotonic() - began < 20
    facts = dict(json.loads(json.dumps(T4X2)))
    facts["torch"] = dict(facts["torch"], arch_list=["sm_75"] * 1000)
    (sandbox / "f.json").write_text(json.dumps(facts))
    code, out, err = run(["plan", "--facts", "f.json"], capsys)
    assert code == 2 and "1,000 entries in" in err and "torch.arch_list" in err


@pytest.mark.parametrize("override,want", [
    ("lora.target_modules=[" + ", ".join(f"m{i}" for i in range(300)) + "]", "'lora.target_modules'.*lists 300 names"),
    ("data.columns={" + ", ".join(f"c{i}: text" for i in range(300)) + "}", "'data.columns'.*lists 300 names"),
])
def test_list_settings_are_capped(sandbox, capsys, override, want):
    before = snapshot(sandbox)
    code, out, err = run(["plan", "--gpus", "1xT4", override], capsys)
    check_contract(sandbox, before, code, out, err, 2, want)


def test_overrides_are_capped(sandbox, capsys):
    before = snapshot(sandbox)
    began = time.monotonic()
    code, out, err = run(["plan", "--gpus", "1xT4", *["max_steps=5"] * 100_000], capsys)  # main: a minute, then a plan
    check_contract(sandbox, before, code, out, err, 2, "100,000 key=value overrides; a run has at most 1,000")
    assert time.monotonic() - began < 30
