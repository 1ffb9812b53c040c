"""The notebook a Kaggle session runs and its metadata: what Kaggle needs, and never a token."""

from __future__ import annotations

import json


from kit.notebooks.schedule import kaggle_notebook
from tests.code_asserts import assigns


def test_the_run_notebook_is_valid_and_pins_kit_without_a_token(tmp_path, monkeypatch):
    import nbformat

    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    folder = kaggle_notebook.write(tmp_path / "push", "me/kit-resume", repo="https://github.com/me/kit",
                                   commit="a" * 40, config_yaml="model: models/tiny-qwen3\n", overrides=[], nproc=2)
    nb = nbformat.read(str(folder / kaggle_notebook.CODE_FILE), as_version=4)
    nbformat.validate(nb)
    text = (folder / kaggle_notebook.CODE_FILE).read_text() + (folder / "kernel-metadata.json").read_text()
    assert "hf_xxxxxxxx" not in text
    sources = [c.source for c in nb.cells]
    assert ("KIT_COMMIT", repr("a" * 40)) in assigns(sources[1])
    assert "_has_hf_token" in sources[2] and "git" not in sources[2]  # the token check comes before any install
    meta = json.loads((folder / "kernel-metadata.json").read_text())
    assert meta == meta | {"id": "me/kit-resume", "title": "kit-resume", "code_file": "kit-run.ipynb",
                           "kernel_type": "notebook", "is_private": True, "enable_gpu": True,
                           "enable_internet": True, "machine_shape": "NvidiaTeslaT4"}


# ---- the outcome line comes from the session record, not from the printed log (#16) ----------
def _cells(tmp_path):
    import nbformat

    kaggle_notebook.write(tmp_path / "push", "me/kit-resume", repo="r", commit="a" * 40, config_yaml="",
                          overrides=[], nproc=1)
    return nbformat.read(str(tmp_path / "push" / kaggle_notebook.CODE_FILE), as_version=4).cells


def _record(out, **fields):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kit_sessions.jsonl", "a") as f:
        f.write(json.dumps({"started": 100.0, "end_step": 40, "max_steps": 60, "outcome": "paused", **fields}) + "\n")


def _run_outcome_cell(tmp_path, returncode, log):
    """The notebook's last cell, executed as the kernel would after the training cell (its globals)."""
    scope = {"WORK": tmp_path, "json": json, "began": 50.0, "returncode": returncode, "log": log}
    source = _cells(tmp_path)[-1].source
    try:
        exec(compile(source, "outcome-cell", "exec"), scope)
    except RuntimeError as e:
        return json.loads((tmp_path / kaggle_notebook.OUTCOME_FILE).read_text()), str(e)
    return json.loads((tmp_path / kaggle_notebook.OUTCOME_FILE).read_text()), None


def test_the_outcome_cell_words_the_session_record_not_the_log(tmp_path):
    _record(tmp_path / "out", end_step=40)
    # The log says something else (an older kit's words, a line quoted from a dataset): the record wins.
    result, raised = _run_outcome_cell(tmp_path, 0, ["[kit] complete: step 60 of 60\n"])
    assert result["outcome"] == "paused at step 40 of 60" and raised is None
    assert result["session"]["end_step"] == 40 and result["returncode"] == 0


def test_the_outcome_cell_needs_no_printed_line_for_a_complete_job(tmp_path):
    _record(tmp_path / "out", end_step=60, outcome="complete")
    result, raised = _run_outcome_cell(tmp_path, 0, ["training output without kit's closing words\n"])
    assert result["outcome"] == "complete: step 60 of 60" and raised is None


def test_a_failed_training_is_failed_with_its_last_line_and_raises(tmp_path):
    _record(tmp_path / "out", outcome="failed", error="boom")
    told = "error: store hf://me/x refused the token"
    result, raised = _run_outcome_cell(tmp_path, 4, ["…\n", told + "\n", "\n"])
    assert result["outcome"] == f"failed (exit code 4): {told}"
    assert raised.startswith("training failed") and raised.endswith("exit code 4")


def test_an_exit_0_without_this_sessions_record_is_a_failure(tmp_path):
    _record(tmp_path / "out", started=10.0)  # an earlier session's record (before `began`)
    with open(tmp_path / "out" / "kit_sessions.jsonl", "a") as f:
        f.write('{"started": 60.0, "outc')  # a torn line: not a record
    result, raised = _run_outcome_cell(tmp_path, 0, ["[kit] paused at step 40 of 60\n"])
    assert result["outcome"].startswith("failed: training exited") and "exited 0" in result["outcome"]
    assert "no session record in " in result["outcome"]
    assert result["session"] is None and raised


def test_the_run_notebook_launches_through_the_one_command_builder(tmp_path):
    from kit.machine.command import launch_argv

    train = _cells(tmp_path)[4].source
    assert "launch_argv(NPROC)" in train and "torch.distributed.run" not in train
    assert launch_argv(1, python="py") == ["py", "train_ddp.py"]
    assert launch_argv(2, python="py") == ["py", "-m", "torch.distributed.run", "--standalone",
                                           "--nproc_per_node=2", "train_ddp.py"]
    assert launch_argv(1, torchrun=True, python="py")[1:3] == ["-m", "torch.distributed.run"]
