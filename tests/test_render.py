"""kit render: deterministic output, the repo's train_ddp.py is the render of the default config."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

from tests.code_asserts import call, squeeze, words_in
from tests.scripts import ROOT, kit_cli


def kit(*args, cwd=ROOT):
    return kit_cli(args, env=dict(os.environ), cwd=cwd)  # `python -m kit ARGS`, in this process


def test_repo_train_ddp_is_the_render_of_the_default_config():
    r = kit("render", "--config", "configs/default.yaml", "--gpus", "2xT4", "--stdout")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "train_ddp.py").read_text(), "re-render train_ddp.py (see configs/default.yaml)"


def test_dash_as_the_output_prints_the_script_and_writes_no_file(tmp_path):
    for folder in ("configs", "data"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    r = kit("render", "--config", "configs/default.yaml", "--gpus", "2xT4", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "train_ddp.py").read_text()  # what --stdout prints
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs", "data"]  # no file named '-'


def test_the_script_reads_like_the_flow_it_runs():
    text = (ROOT / "train_ddp.py").read_text()
    ast.parse(text)
    assert text.split()[:4] == ['"""Fine-tune', "models/tiny-qwen3", "with", "LoRA,"]
    assert words_in(text, "torchrun", "--standalone", "--nproc_per_node=2", "train_ddp.py")
    args = call(text, "SFTConfig")
    assert args["ddp_find_unused_parameters"] == "False"
    assert args["gradient_checkpointing_kwargs"] == "{'use_reentrant': False}"
    assert args["fp16"] == "plan.precision == 'fp16'"
    order = [text.index(s) for s in ("dist.init()", "BitsAndBytesConfig(", "modeling.load(", "LoraConfig(", "modeling.add_lora(", "data.prepare(",
                                     "without_card(SFTTrainer)", "trainer = Trainer(", "trainer.train(", "job.finish(", "dist.teardown(ok, exit_code=code)")]
    assert order == sorted(order)
    finals = [ast.unparse(n.finalbody) for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Try) and n.finalbody]
    assert [squeeze(f.splitlines()[-1]) for f in finals if "dist.teardown(" in f] == ["dist.teardown(ok,exit_code=code)"]


def test_render_is_deterministic_and_keeps_a_numbered_backup_of_what_it_replaces(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "t.py"
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "1xA100", "-o", str(out)]) == 0
    first = out.read_bytes()
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "1xA100", "-o", str(out)]) == 0
    assert out.read_bytes() == first and not (tmp_path / "t.py.prev").exists()  # the same bytes: nothing kept
    capsys.readouterr()
    # Another machine's script over it: written without a flag, the replaced one kept and named.
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "2xT4", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out} (") and "t.py.prev): ddp" in printed
    assert (tmp_path / "t.py.prev").read_bytes() == first and out.read_bytes() != first
    second = out.read_bytes()
    # --force (older commands, every script's re-render line) is the same rule: an earlier backup is never replaced.
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "1xA100", "-o", str(out), "--force"]) == 0
    assert "now t.py.prev.2)" in capsys.readouterr().out
    assert (tmp_path / "t.py.prev").read_bytes() == first and (tmp_path / "t.py.prev.2").read_bytes() == second
    assert out.read_bytes() == first


def test_render_over_the_shipped_script_as_the_readme_table_says_works_in_a_fresh_clone(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    for folder in ("configs", "data", "models"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    shutil.copy(ROOT / "train_ddp.py", tmp_path / "train_ddp.py")
    monkeypatch.chdir(tmp_path)
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "1xA100", "-o", "train_ddp.py"]) == 0
    assert "now train_ddp.py.prev)" in capsys.readouterr().out
    assert (tmp_path / "train_ddp.py.prev").read_bytes() == (ROOT / "train_ddp.py").read_bytes()


def test_render_errors(tmp_path):
    r = kit("render", "-o", str(tmp_path / "x.py"), cwd=tmp_path)  # no configs/default.yaml here to use
    assert r.returncode == 2 and "needs --config PATH" in r.stderr and "no configs/default.yaml" in r.stderr
    r = kit("render", "--config", "configs/default.yaml", "--gpus", "2xP100", "-o", str(tmp_path / "x.py"))
    assert r.returncode == 3 and not (tmp_path / "x.py").exists()
    r = kit("render", "--config", "configs/default.yaml", "lora.rr=3", "-o", str(tmp_path / "x.py"))
    assert r.returncode == 2 and "did you mean" in r.stderr


def test_unsloth_plan_imports_unsloth_first():
    from kit.planning import config
    from kit.script import render

    cfg = config.load(str(ROOT / "configs" / "default.yaml"))
    from kit.planning.plan import Plan

    text = render.render(cfg, Plan(backend="unsloth", nproc=1, precision="bf16", strategy="single"),
                         "configs/default.yaml", "1 × H200")
    body = text.split('"""', 2)[2]
    # Before transformers, trl and peft (it patches them on import), inside the import guard.
    first = body.index("    import unsloth")
    assert first < min(body.index(f"from {lib} import") for lib in ("peft", "transformers", "trl"))
    assert body.index("try:") < first


def test_package_version_matches_setup_cfg():
    import configparser

    from kit import __version__

    meta = configparser.ConfigParser()
    meta.read(ROOT / "setup.cfg")
    assert meta["metadata"]["version"] == __version__


def test_plans_that_fit_only_sharded_render_an_fsdp_script(tmp_path):
    # Qwen3-8B LoRA in 16-bit fits 2×T4 only sharded: the script trains it with FSDP.
    out = tmp_path / "x.py"
    r = kit("render", "--config", "configs/default.yaml", "model=Qwen/Qwen3-8B", "method=lora", "seq_len=512",
            "gradient_checkpointing=auto", "per_device_batch=null", "global_batch=null", "--gpus", "2xT4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "fsdp over 2" in r.stdout
    text = out.read_text()
    assert "'strategy': 'fsdp'" in text and "FSDP over 2 GPUs (" in text and "(Tesla T4), fp16" in text
    assert words_in(text, "torchrun", "--standalone", "--nproc_per_node=2", str(out))


def test_plans_that_do_not_fit_at_all_are_refused(tmp_path):
    out = tmp_path / "x.py"
    r = kit("render", "--config", "configs/default.yaml", "model=meta-llama/Llama-3.1-70B", "method=qlora",
            "--gpus", "2xT4", "-o", str(out))
    assert r.returncode == 3, r.stderr
    assert "does not fit on 2× Tesla" in r.stderr and "cheapest change" in r.stderr and "a machine with 2×" in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_the_script_says_in_one_line_how_to_get_kit_when_it_is_not_importable(tmp_path):
    """Copied away from the checkout with no kit installed: one line and exit 2, no traceback.
    (kit is installed editable in this venv, so the test hides it the way a missing package looks.)"""
    script = tmp_path / "train_ddp.py"
    script.write_text((ROOT / "train_ddp.py").read_text())
    hide_kit = "import sys; sys.modules['kit'] = None; sys.argv = ['train_ddp.py']; exec(open('train_ddp.py').read())"
    r = subprocess.run([sys.executable, "-c", hide_kit], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: the kit package") and "not importable" in line
    assert "(the kit checkout)" in line and line.endswith("-e PATH_TO_KIT`")


def test_paths_and_values_with_quotes_backslashes_and_spaces_still_give_a_script_that_parses(tmp_path):
    """A config name, an -o name or an override holding `\"\"\"`, `\\N` or a space: the docstring and
    the literals escape them, the script parses, CONFIG_PATH is the path, and the printed next
    command can be pasted into a shell as is."""
    import shlex

    cfg = tmp_path / 'we"""ird\\N dir'
    cfg.mkdir()
    config = cfg / "c.yaml"
    config.write_text((ROOT / "configs" / "default.yaml").read_text())
    out = tmp_path / 'o"""\\N x.py'
    r = kit("render", "--config", str(config), "--gpus", "cpu", "-o", str(out), 'output_dir=o"""x\\')
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    assert str(config) in doc and "output_dir=o\"\"\"x\\" in doc  # the docstring reads as the real names
    consts = {t.targets[0].id: t.value.value for t in tree.body
              if isinstance(t, ast.Assign) and isinstance(t.value, ast.Constant) and isinstance(t.targets[0], ast.Name)}
    assert consts["CONFIG_PATH"] == str(config)
    next_line = r.stdout.splitlines()[-1]
    assert shlex.split(next_line.removeprefix("next: ")) == ["python", str(out)]


def test_the_script_redacts_the_token_from_a_crash_traceback(tmp_path):
    """A crash still shows its traceback, in the main thread and in a thread, never the token."""
    token = "hf_" + "crashTRACEBACKtoken" + "0123456789ab"
    code = ("import os, threading\nfrom kit.redaction import redact_tracebacks\nredact_tracebacks()\n"
            "t = threading.Thread(target=lambda: 1 / int(os.environ['HF_TOKEN'][:0] or 'x' + os.environ['HF_TOKEN']))\n"
            "t.start(); t.join()\nraise RuntimeError('bad ' + os.environ['HF_TOKEN'])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HF_TOKEN": token, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1
    assert "RuntimeError: bad ***" in r.stderr and "Exception in thread" in r.stderr and "ValueError" in r.stderr
    assert r.stderr.count("Traceback") == 2 and token not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("hidden, backend, want", [
    ("peft", "auto", "error: the Python package 'peft' is not installed, and training needs it: run `pip install -e"),
    ("trl", "auto", "error: the Python package 'trl' is not installed"),
    ("unsloth", "unsloth", "error: this script was written for backend=unsloth, and Unsloth is not installed here"),
])
def test_a_missing_training_library_is_one_line_naming_the_install(tmp_path, hidden, backend, want):
    """The [train] extra not installed (or Unsloth absent where the script was rendered for it): was
    a ModuleNotFoundError traceback. The package is hidden the way a missing one looks."""
    script = tmp_path / "train_ddp.py"
    r = kit("render", "--config", "configs/default.yaml", "--gpus", "2xT4", f"backend={backend}", "-o", str(script))
    assert r.returncode == 0, r.stderr
    hide = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.modules[{hidden!r}] = None; "
            "sys.argv = ['train_ddp.py']; exec(open('train_ddp.py').read())")
    r = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(want), r.stderr


def test_a_replaced_file_that_is_not_utf8_is_kept_byte_for_byte(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "train_ddp.py"
    out.write_bytes(b"\xff\xfe# mine")
    assert main(["render", "--config", "configs/default.yaml", "--gpus", "cpu", "-o", str(out)]) == 0
    assert (tmp_path / "train_ddp.py.prev").read_bytes() == b"\xff\xfe# mine"
    assert "now train_ddp.py.prev)" in capsys.readouterr().out


def test_a_script_written_under_another_name_names_itself(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "t8b.py"
    assert main(["render", "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4", "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["next:", "torchrun", "--standalone",
                                                               "--nproc_per_node=2", str(out)]
    text = out.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert "train_ddp.py" not in doc
    assert words_in(doc, "torchrun", "--standalone", "--nproc_per_node=2", str(out), "#", "the", "plan:")
    assert f"python {out} --smoke" in doc and f"-o {out} --force" in doc


@pytest.mark.parametrize("config", ["default", "dpo-tiny", "kto-tiny", "grpo-tiny"])
def test_every_kit_module_the_script_imports_is_used(config):
    r = kit("render", "--config", f"configs/{config}.yaml", "--stdout")
    assert r.returncode == 0, r.stderr
    tree = ast.parse(r.stdout)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("kit") for alias in node.names}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported and imported <= used, sorted(imported - used)
