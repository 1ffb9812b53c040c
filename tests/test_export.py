"""kit export's refusals and kit's final push without a token, in-process through `kit.cli.main`:
one line, the right exit code, nothing written. The adapter is a real PEFT adapter of the tiny model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit import cli
from kit.deliver import export, gguf, wrapup
from kit.errors import StoreError
from kit.evaluation.identity import local_revision
from kit.checkpoints.store import DirStore
from kit.checkpoints.store.hub import HubStore
from tests.hubserver import WRITE_TOKEN, hub  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A LoRA adapter of the tiny model with non-zero B (so merging changes weights), and its run record."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("adapter") / "final"
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(TINY),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(folder)
    (folder / "kit_run.json").write_text(json.dumps({"run_id": "r1", "base_revision": local_revision(TINY)}))
    return folder


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_export_merges_and_verifies_in_bf16(adapter, tmp_path, capsys):
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--json"]) == 0
    text = capsys.readouterr().out
    report = json.loads(text[text.index("{\n"):])
    assert report["top1_agreement"] >= export.MIN_TOP1_AGREEMENT
    assert report["max_abs_logit_diff"] <= report["tolerance"] == pytest.approx(0.03 * report["max_abs_logit"])
    assert report["plan"]["recorded_revision"] == report["plan"]["base_revision"]
    from safetensors import safe_open

    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        assert {f.get_tensor(k).dtype.__str__() for k in f.keys()} == {"torch.bfloat16"}
        assert not any("lora" in k for k in f.keys())


def test_export_refuses_when_the_disk_is_too_small(adapter, tmp_path, monkeypatch, capsys):
    # The free-space reading is patched (no tiny filesystem can be mounted here): the check is what is tested.
    monkeypatch.setattr(export, "free_bytes", lambda path: 1000)
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out)]) == 3
    line = _error(capsys)
    assert "export needs ~0.3 GB free where" in line and "only 0.0 GB is" in line and "/tmp" in line
    assert not out.exists() and not list(tmp_path.glob(".merged*"))


def test_export_refuses_a_base_not_available_offline(adapter, tmp_path, monkeypatch, capsys):
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    cfg = json.loads((moved / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "nobody/not-cached-model"
    (moved / "adapter_config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "merged")]) == 2
    line = _error(capsys)
    assert "base model 'nobody/not-cached-model' is not available" in line and "HF_HUB_OFFLINE" in line
    assert not (tmp_path / "merged").exists()


def test_export_refuses_another_base_revision_unless_forced(adapter, tmp_path, capsys):
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    (moved / "kit_run.json").write_text(json.dumps({"run_id": "r1", "base_revision": "local-sha256:0000"}))
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "m1")]) == 2
    assert "was trained on base revision local-sha256:0000" in _error(capsys)
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "m2"), "--force"]) == 0
    assert "warning: --force: adapter" in capsys.readouterr().out


@pytest.mark.parametrize("case, words", [
    ("no-adapter", "has no adapter_config.json: a full model (nothing to merge)"),
    ("exists", "exists and is not empty"),
    ("bad-gguf", "--gguf q4_weird: not a llama.cpp type"),
    ("no-llama", "GGUF needs llama.cpp's convert_hf_to_gguf.py, not found in"),
    ("push", "--push me/x: give a Hub repo as hf://owner/name"),
])
def test_export_bad_input_is_one_line_exit_2(adapter, tmp_path, capsys, case, words):
    out = tmp_path / "merged"
    args = ["export", "--adapter", str(adapter), "-o", str(out)]
    if case == "no-adapter":
        args[2] = str(TINY)
    elif case == "exists":
        out.mkdir()
        (out / "mine.txt").write_text("keep")
    elif case == "bad-gguf":
        args += ["--gguf", "q4_weird"]
    elif case == "no-llama":
        args += ["--gguf", "Q4_K_M", "--llama-cpp", str(tmp_path / "nowhere")]
    else:
        args += ["--push", "me/x"]
    assert cli.main(args) == 2
    assert words in _error(capsys)
    assert (out / "mine.txt").read_text() == "keep" if case == "exists" else not out.exists()


def test_gguf_types_are_llama_cpp_names():
    assert gguf.check_type("Q8_0") == "q8_0" and gguf.check_type("q4_k_m") == "Q4_K_M"
    assert gguf.gguf_bytes("q8_0", 16_000) == 8_500
    assert gguf.gguf_bytes("Q4_K_M", 16_000) == 4_900 + 16_000, "K-quants read an f16 GGUF first"


def test_final_push_without_a_token_exits_4_keeps_final_and_the_rerun_pushes(hub, tmp_path):  # noqa: F811
    final = tmp_path / "out" / "final"
    final.mkdir(parents=True)
    (final / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    (final / "eval_results.json").write_text(json.dumps({"step": 4}))
    job = SimpleNamespace(store=HubStore("me/no-token", token="", endpoint=hub.url),
                          cfg=SimpleNamespace(output_dir=str(tmp_path / "out")))
    lines: list[str] = []
    code, record = wrapup.push(job, final, lines)
    assert code == 4 and record["final_push"].startswith("failed: ")
    assert lines[0].startswith("error: final/ was not pushed to hf://me/no-token: ") and "token" in lines[0]
    assert WRITE_TOKEN not in lines[0] and final.is_dir()
    with pytest.raises(StoreError, match="token"):
        job.store.publish_final(final)
    # Run again with a token: the job is complete, and the final/ the store lacks is pushed then.
    job.store = HubStore("me/no-token", token=WRITE_TOKEN, endpoint=hub.url)
    code, lines = wrapup.push_if_missing(job, 4)
    assert code == 0 and lines == [f"pushed: {hub.url}/me/no-token/tree/main/final"]
    assert job.store.final_step() == 4
    assert wrapup.push_if_missing(job, 4) == (0, []), "already there: nothing to push"


def test_a_directory_store_takes_final_whole(tmp_path):
    src = tmp_path / "final"
    src.mkdir()
    (src / "eval_results.json").write_text(json.dumps({"step": 7}))
    store = DirStore(tmp_path / "store")
    assert store.final_step() is None
    assert store.publish_final(src) == str(tmp_path / "store" / "final")
    assert store.final_step() == 7 and not list((tmp_path / "store").glob(".tmp-final-*"))


def test_export_push_is_one_commit_of_the_merged_folder(adapter, hub, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--push", "hf://me/merged"]) == 0
    assert f"pushed: {hub.url}/me/merged" in capsys.readouterr().out
    commits = [c for c in hub.commit_log("me/merged") if c.title == "kit: merged model"]
    assert len(commits) == 1
    assert set(commits[0].added) == {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors",
                                                                          "tokenizer.json"}
    assert WRITE_TOKEN not in capsys.readouterr().out
