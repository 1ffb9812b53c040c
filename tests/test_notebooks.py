"""The shipped notebooks, executed by papermill in a real `python3` kernel on the CPU with the tiny
default config: get-kit cell (a no-op in a checkout), `%run kit bootstrap` (writes train_ddp.py),
the torchrun / python training cell, and the results cell (loss curve inline, `kit status`).

Each runs in a scratch copy of the repo's entry points, because bootstrap writes train_ddp.py into
the working directory and the repo's own must stay as committed."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.scripts import ROOT

papermill = pytest.importorskip("papermill")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = ROOT / "notebooks"
SMALL = "max_steps=6 save_steps=3 eval_steps=3 logging_steps=1"


def test_notebooks_are_committed_clean():
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    # An empty glob (a moved folder) would check nothing and pass.
    assert {"colab_t4_drive.ipynb", "kaggle_t4x2_qlora.ipynb", "resume.ipynb"} <= {p.name for p in paths}
    for path in paths:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, path.name
        assert "token" not in tagged[0].source.lower().replace("never put a token", ""), path.name


def scratch(tmp: Path) -> Path:
    """A working directory that looks like a kit checkout: the notebook's cell 1 does nothing there."""
    work = tmp / "work"
    work.mkdir()
    for name in ("kit", "models", "data"):
        (work / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "kit.py", work / "kit.py")
    shutil.copytree(ROOT / "configs", work / "configs")
    return work


@pytest.fixture
def kernel_env(monkeypatch, tmp_path):
    """The kernel inherits this process's environment: CPU only, offline, the venv's tools first."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("KIT_PLATFORM", "local")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "kitcache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def execute(name: str, work: Path, out: Path, parameters: dict):
    papermill.execute_notebook(str(NOTEBOOKS / name), str(out), parameters=parameters, kernel_name="python3",
                               cwd=str(work), progress_bar=False, execution_timeout=600)
    return nbformat.read(str(out), as_version=4)


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def cell_with(nb, words: str):
    return next(c for c in nb.cells if c.cell_type == "code" and words in c.source)


def assert_results_cell(nb, complete: str):
    cell = cell_with(nb, "plots.loss_curve")
    pngs = [o for o in cell.outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(pngs) == 1, cell.outputs
    status = text_of(cell)
    assert "checkpoints" in status and f"step {complete} of {complete} (100 %) — complete" in status


@pytest.mark.slow
def test_kaggle_notebook_on_cpu(tmp_path, kernel_env):
    work = scratch(tmp_path)
    out_dir = tmp_path / "out"
    nb = execute("kaggle_t4x2_qlora.ipynb", work, tmp_path / "kaggle.ipynb", {
        "config": "configs/default.yaml", "overrides": f"{SMALL} output_dir={out_dir}", "nproc": 2})
    assert (work / "train_ddp.py").is_file()  # bootstrap wrote it, and the next cell ran it
    boot = text_of(cell_with(nb, "%run kit bootstrap"))
    # A CPU plan is written and the notebook goes on: one next step (this machine's), no GPU advice.
    assert "Wrote train_ddp.py" in boot
    assert [line for line in boot.splitlines() if line.startswith(("Next:", "Do this:"))] == [
        "Next: python train_ddp.py  (CPU: slow, fine for the tiny default)"]
    train = text_of(cell_with(nb, "!torchrun"))
    assert "[kit] plan: fp32, 2 × cpu" in train and "[kit] complete: step 6 of 6" in train
    assert_results_cell(nb, "6")
    assert (out_dir / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((out_dir / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6


@pytest.mark.slow
def test_colab_notebook_with_a_folder_store_and_a_rerun(tmp_path, kernel_env):
    work = scratch(tmp_path)
    store, out_dir = tmp_path / "drive" / "ckpts", tmp_path / "out"
    params = {"config": "configs/default.yaml", "store": str(store), "overrides": f"{SMALL} output_dir={out_dir}"}
    nb = execute("colab_t4_drive.ipynb", work, tmp_path / "colab.ipynb", params)
    assert "[kit] complete: step 6 of 6" in text_of(cell_with(nb, "!python train_ddp.py"))
    assert_results_cell(nb, "6")
    assert f"directory {store}" in text_of(cell_with(nb, "plots.loss_curve"))
    assert (store / "checkpoints" / "checkpoint-6" / "kit_manifest.json").is_file()
    # A new runtime: local files gone, Drive kept. Run all again: nothing to redo.
    shutil.rmtree(out_dir)
    again = execute("colab_t4_drive.ipynb", work, tmp_path / "colab2.ipynb", params)
    assert "[kit] already complete: step 6 of 6" in text_of(cell_with(again, "!python train_ddp.py"))


@pytest.mark.slow
def test_a_failed_training_stops_the_notebook(tmp_path, kernel_env):
    work = scratch(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # the store cannot be created under it: training exits 4
    with pytest.raises(papermill.PapermillExecutionError) as err:
        execute("colab_t4_drive.ipynb", work, tmp_path / "bad.ipynb", {
            "config": "configs/default.yaml", "store": str(blocker / "store"),
            "overrides": f"{SMALL} output_dir={tmp_path / 'out'}"})
    assert "RuntimeError" in str(err.value) and "exit code 4" in str(err.value)


@pytest.mark.slow
def test_the_get_kit_cell_asks_for_kit_repo_until_it_is_set(tmp_path, kernel_env):
    """Outside a kit checkout the notebook clones `kit_repo`: left at its placeholder it stops with
    one sentence saying what to set, rather than cloning a URL that does not exist."""
    work = tmp_path / "empty"
    work.mkdir()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        execute("kaggle_t4x2_qlora.ipynb", work, tmp_path / "out.ipynb", {})
    assert "ValueError" in str(err.value) and "set kit_repo in the first cell" in str(err.value)
    assert list(work.iterdir()) == []  # nothing cloned, nothing installed


def test_no_notebook_or_readme_holds_a_placeholder_clone_url():
    for path in [ROOT / "README.md", *NOTEBOOKS.glob("*.ipynb")]:
        assert "YOUR-FORK" not in path.read_text(), path.name
