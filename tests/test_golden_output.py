"""What a user reads, word for word: `kit plan` on a few machines, `kit bootstrap`'s verdicts and a
finished job's closing lines, each compared with a golden file under tests/golden/.

This is the one place prose is pinned; every other test asserts codes, numbers and fields. After a
deliberate wording change, regenerate the files and read the diff before committing:

    KIT_GOLDEN_UPDATE=1 python -m pytest -q tests/test_golden_output.py -m "slow or not slow"
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

from kit.cli import main
from tests.scripts import FAST, ROOT, train

GOLDEN = Path(__file__).parent / "golden"
MACHINES = ROOT / "tests" / "fixtures" / "machines"
UPDATE = os.environ.get("KIT_GOLDEN_UPDATE") == "1"


def check_golden(name: str, text: str) -> None:
    """`text` is the golden file `name`, or (KIT_GOLDEN_UPDATE=1) becomes it; a mismatch shows the diff."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: run with KIT_GOLDEN_UPDATE=1 to write it"
    want = path.read_text()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            f"golden/{name}", "now"))
        pytest.fail(f"output differs from golden/{name} (KIT_GOLDEN_UPDATE=1 rewrites it):\n{diff}",
                    pytrace=False)


def kit(capsys, *args) -> str:
    """`kit ARGS` in-process: the exit code, stdout and stderr as one text, as a user's terminal shows them."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return f"$ kit {' '.join(args)}\n[exit {code}]\n--- stdout\n{out}--- stderr\n{err}"


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)


# ---- kit plan: one GPU pair, the CPU, several nodes, a refusal -------------------------------------
@pytest.mark.parametrize("name,args", [
    ("plan_2xT4.txt", ("plan", "--gpus", "2xT4")),
    ("plan_cpu.txt", ("plan", "--gpus", "cpu")),
    ("plan_8b_qlora_2_nodes_4xH100.txt", ("plan", "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml",
                                          "--gpus", "4xH100", "--nodes", "2", "--rdzv-endpoint", "10.0.0.1:29500")),
    ("plan_8b_qlora_2xT4.txt", ("plan", "--config", "configs/qwen3-8b-qlora-kaggle-t4x2.yaml", "--gpus", "2xT4")),
    ("plan_p100_refused.txt", ("plan", "--gpus", "1xP100")),
    ("plan_8b_dpo_2xT4.txt", ("plan", "--config", "configs/qwen3-8b-dpo-kaggle-t4x2.yaml", "--gpus", "2xT4")),
    ("plan_8b_kto_2xT4.txt", ("plan", "--config", "configs/qwen3-8b-kto-kaggle-t4x2.yaml", "--gpus", "2xT4")),
    ("plan_4b_grpo_2xT4.txt", ("plan", "--config", "configs/qwen3-4b-grpo-kaggle-t4x2.yaml", "--gpus", "2xT4")),
])
def test_plan_text(capsys, name, args):
    check_golden(name, kit(capsys, *args))


# ---- kit bootstrap: a machine that trains, the CPU, a GPU the torch build cannot run ---------------
@pytest.mark.parametrize("machine", ["kaggle_t4x2", "cpu_only", "kaggle_p100", "h200"])
def test_bootstrap_text(capsys, machine):
    text = kit(capsys, "bootstrap", "--facts", str(MACHINES / f"{machine}.json"))
    check_golden(f"bootstrap_{machine}.txt", text.replace(str(MACHINES), "<machines>"))


# ---- a finished job's closing lines ------------------------------------------------------------------
def _stable(text: str, run: Path) -> str:
    """The closing lines with what changes from run to run (paths, times, losses, rates) masked."""
    text = text.replace(str(run), "<run>")
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "<n>", text)
    return text


@pytest.mark.slow
def test_a_finished_jobs_closing_lines(tmp_path):
    run = tmp_path / "run"
    c = tmp_path / "c.yaml"
    c.write_text((ROOT / "configs/default.yaml").read_text().replace("max_steps: 60", "max_steps: 2")
                 .replace("save_steps: 20", "save_steps: 2").replace("outputs/default", str(run)))
    done = train(["--config", str(c), *FAST], nproc=1)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    end_of_training = max(i for i, line in enumerate(lines) if line.startswith("{'train_runtime'"))
    closing = lines[end_of_training + 1:]
    check_golden("finished_job_closing_lines.txt", _stable("\n".join(closing) + "\n", run))

