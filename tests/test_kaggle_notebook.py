"""The notebook a Kaggle session runs and its metadata: what Kaggle needs, and never a token."""

from __future__ import annotations

import json

import nbformat

from kit.notebooks.schedule import kaggle_notebook


def test_the_run_notebook_is_valid_and_pins_kit_without_a_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    folder = kaggle_notebook.write(tmp_path / "push", "me/kit-resume", repo="https://github.com/me/kit",
                                   commit="a" * 40, config_yaml="model: models/tiny-qwen3\n", overrides=[], nproc=2)
    nb = nbformat.read(str(folder / kaggle_notebook.CODE_FILE), as_version=4)
    nbformat.validate(nb)
    text = (folder / kaggle_notebook.CODE_FILE).read_text() + (folder / "kernel-metadata.json").read_text()
    assert "hf_xxxxxxxx" not in text
    sources = [c.source for c in nb.cells]
    assert "KIT_COMMIT = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'" in sources[1]
    assert "_has_hf_token" in sources[2] and "git" not in sources[2]  # the token check comes before any install
    meta = json.loads((folder / "kernel-metadata.json").read_text())
    assert meta == meta | {"id": "me/kit-resume", "title": "kit-resume", "code_file": "kit-run.ipynb",
                           "kernel_type": "notebook", "is_private": True, "enable_gpu": True,
                           "enable_internet": True, "machine_shape": "NvidiaTeslaT4"}
