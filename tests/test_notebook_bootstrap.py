"""`%run kit bootstrap` in a real Jupyter kernel: what it shows, what it leaves in the namespace,
and that the kernel never imports torch (so it can hold no CUDA context for torchrun to fight)."""

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from tests.scripts import cells_until_one_fails  # noqa: E402  (after the skip: it runs nbclient)

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    "%run kit bootstrap --facts tests/fixtures/machines/kaggle_t4x2.json",
    "print('T4X2', type(facts).__name__, facts.gpu_count, verdicts.ok, verdicts.bf16)",
    "%run kit bootstrap",  # this machine, for real: CPU only here, so it names the default config next
    "import sys\nprint('HERE', facts.gpu_count == len(facts.gpus), verdicts.ok, 'torch' in sys.modules)",
    "import torch\nprint('CUDA_INITIALIZED', torch.cuda.is_initialized())",
]


def _texts(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
        else:
            parts.append(json.dumps(out.get("data", {})))
    return "".join(parts)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    cache = tmp_path_factory.mktemp("kitcache")
    old = os.environ.get("KIT_CACHE_DIR")
    os.environ["KIT_CACHE_DIR"] = str(cache)  # the kernel inherits this process's environment
    try:
        # "python3" is the kernel of the interpreter running the tests (jupyter_client maps its
        # "python" to sys.executable), so the kernel sees the same packages.
        client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=True,
                                         resources={"metadata": {"path": str(ROOT)}})
        client.execute()
    finally:
        if old is None:
            os.environ.pop("KIT_CACHE_DIR", None)
        else:
            os.environ["KIT_CACHE_DIR"] = old
    return nb


@pytest.mark.slow
def test_html_table_and_next_command_in_a_notebook(executed):
    cell = executed.cells[0]
    html = [o["data"]["text/html"] for o in cell.outputs if o.output_type == "display_data"]
    assert len(html) == 1 and "<table>" in html[0] and "Tesla T4" in html[0] and "sm_75" in html[0]
    text = _texts(cell)
    assert "2× Tesla T4 (sm_75) can train" in text
    assert "Next: torchrun --standalone --nproc_per_node=2 train_ddp.py" in text


@pytest.mark.slow
def test_facts_and_verdicts_left_in_the_namespace(executed):
    assert "T4X2 Facts 2 True False" in _texts(executed.cells[1])


@pytest.mark.slow
def test_bootstrap_of_this_machine_in_the_kernel(executed):
    text = _texts(executed.cells[2])
    here = _texts(executed.cells[3]).split()
    assert here[:2] == ["HERE", "True"]
    if here[2] == "False":  # no GPU here: said, and no failure (the default job trains on the CPU)
        assert "SystemExit" not in text and "CommandFailed" not in text
        assert "CPU-slow" in text and "Next: kit bootstrap --config configs/default.yaml" in text


@pytest.mark.slow
def test_kernel_never_imported_torch_nor_started_cuda(executed):
    assert _texts(executed.cells[3]).split()[3] == "False"  # torch not in sys.modules after bootstrap
    assert "CUDA_INITIALIZED False" in _texts(executed.cells[4])


# ---- a failed bootstrap stops "Run all", and the script left there does not train another job ------------
@pytest.mark.slow
def test_a_failed_bootstrap_stops_the_notebook_and_the_next_cell_trains_nothing(tmp_path):
    """The Kaggle cells on a machine without a GPU: the 8B bootstrap fails (exit 3). papermill and
    "Run all" must stop at that cell (the kernel's reply says error), and the `train_ddp.py` there —
    the shipped tiny default's — must refuse to start rather than train the tiny demo."""
    import subprocess
    import shutil
    import sys

    script = tmp_path / "train_ddp.py"
    shutil.copy(ROOT / "train_ddp.py", script)
    cells = [f"%run kit bootstrap --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml -o {script}",
             "print('THE NEXT CELL RAN')"]
    env = {"KIT_CACHE_DIR": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": "", "KIT_PLATFORM": "local"}
    nb, failed = cells_until_one_fails(cells, ROOT, env)
    assert "CommandFailed" in str(failed) and "exit code 3" in str(failed)
    text = _texts(nb.cells[0])
    if "too big to train on a CPU" not in text:
        pytest.skip("this machine has a GPU that can train the 8B job: no failure to see here")
    assert nb.cells[1].outputs == []  # never ran
    assert script.read_bytes() == (ROOT / "train_ddp.py").read_bytes()  # nothing a user edited is touched
    # The next cell, `!torchrun … train_ddp.py`: one line naming the failed bootstrap, no training.
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode != 0
    assert "is not the job last asked for: `kit bootstrap --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml` failed" \
        in done.stderr
    assert "[kit] step" not in done.stdout and not (tmp_path / "outputs").exists()
