"""kit export's refusals and kit's final push without a token, in-process through `kit.cli.main`:
one line, the right exit code, nothing written. The adapter is a real PEFT adapter of the tiny model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit import cli
from kit.deliver import export, gguf, merge_check, wrapup
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


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_export_in_fp32_and_fp16_passes_its_own_check(adapter, tmp_path, capsys, dtype):
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--dtype", dtype, "--json"]) == 0
    text = capsys.readouterr().out
    assert "verified: merged logits" in text and "match base + adapter" in text
    report = json.loads(text[text.index("{\n"):])
    assert report["rms_logit_error"] <= report["tolerance"]


def test_export_merges_and_verifies_in_bf16(adapter, tmp_path, capsys):
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--json"]) == 0
    text = capsys.readouterr().out
    report = json.loads(text[text.index("{\n"):])
    assert report["top1_agreement"] >= merge_check.MIN_TOP1_AGREEMENT and report["top1_positions_counted"] > 0
    assert report["rms_logit_error"] <= report["tolerance"] < 1.3 * report["rms_noise_16bit_unmerged"]
    assert report["plan"]["recorded_revision"] == report["plan"]["base_revision"]
    from safetensors import safe_open

    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        assert {f.get_tensor(k).dtype.__str__() for k in f.keys()} == {"torch.bfloat16"}
        assert not any("lora" in k for k in f.keys())


def _wrong_merge(peft_model, how: str):
    """`peft_model` merged the way a broken export would: the result a check must refuse."""
    import torch

    for name, module in peft_model.named_modules():
        if hasattr(module, "scaling") and hasattr(module, "lora_A"):
            for k in module.scaling:
                module.scaling[k] *= {"scaling_2x": 2.0, "dropped": 0.0}.get(how, 1.0)
                if how == "v_proj_missing" and name.endswith("v_proj"):
                    module.scaling[k] = 0.0
    merged = peft_model.merge_and_unload()
    if how == "merged_4bit":  # the update rounded into 4-bit weights: 16 levels per block of 64 (absmax)
        for name, p in merged.named_parameters():
            if p.dim() == 2 and ".layers." in name:
                blocks = p.data.float().reshape(-1, 64)
                scale = blocks.abs().amax(1, keepdim=True) / 7
                p.data = (torch.round(blocks / scale).clamp(-8, 7) * scale).reshape(p.shape).to(p.dtype)
    return merged


@pytest.mark.parametrize("how", ["dropped", "scaling_2x", "v_proj_missing", "merged_4bit", "correct"])
def test_verify_refuses_each_wrong_merge_and_passes_a_correct_one(adapter, tmp_path, how):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kit.errors import KitError

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16), adapter).eval()
    prompts = export.prompts_for(adapter, AutoTokenizer.from_pretrained(adapter))
    same_dtype = merge_check.logits(model, prompts)
    with merge_check.fp32_compute(model):
        reference = merge_check.logits(model, prompts)
    _wrong_merge(model, how).save_pretrained(tmp_path / how)
    if how == "correct":
        assert export.verify(tmp_path / how, prompts, reference, same_dtype, "bf16")["passed"]
        return
    with pytest.raises(KitError, match=r"^the merged model does not match base \+ adapter: RMS logit error") as e:
        export.verify(tmp_path / how, prompts, reference, same_dtype, "bf16")
    assert "\n" not in str(e.value) and e.value.exit_code == 1


def test_export_of_a_merge_that_drops_the_adapter_exits_1_and_keeps_nothing(adapter, tmp_path, monkeypatch, capsys):
    from peft.tuners.lora import LoraModel

    monkeypatch.setattr(LoraModel, "merge_and_unload", LoraModel.unload)  # a merge that loses the update
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out)]) == 1
    err = capsys.readouterr().err  # above the error: transformers' loading progress bars
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("error: the merged model") and "not match base + adapter" in last
    assert not out.exists() and not list(tmp_path.glob(".merged.tmp-*"))


def test_fp32_compute_matches_an_fp32_model_and_restores_linear(adapter):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    forward = torch.nn.Linear.forward
    sixteen = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16), adapter)
    fp32 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16).float(), adapter)
    with merge_check.fp32_compute(sixteen):
        got = merge_check.logits(sixteen, [[1, 2, 3, 4, 5]])
    assert torch.nn.Linear.forward is forward
    want = merge_check.logits(fp32, [[1, 2, 3, 4, 5]])
    assert got[0].dtype == torch.float32 and torch.allclose(got[0], want[0], atol=1e-4)
    assert not torch.allclose(merge_check.logits(sixteen, [[1, 2, 3, 4, 5]])[0], want[0], atol=1e-4)


def test_export_refuses_when_the_disk_is_too_small(adapter, tmp_path, monkeypatch, capsys):
    # The free-space reading is patched (no tiny filesystem can be mounted here): the check is what is tested.
    monkeypatch.setattr(export, "free_bytes", lambda path: 1000)
    out = tmp_path / "merged"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out)]) == 3
    line = _error(capsys)
    assert "export needs ~0.3 GB" in line and "only 0.0 GB is" in line and "/tmp" in line
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
    assert "'nobody/not-cached-model'" in line and "is not available" in line and "HF_HUB_OFFLINE" in line
    assert not (tmp_path / "merged").exists()


def test_export_refuses_another_base_revision_unless_forced(adapter, tmp_path, capsys):
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    (moved / "kit_run.json").write_text(json.dumps({"run_id": "r1", "base_revision": "local-sha256:0000"}))
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "m1")]) == 2
    line = _error(capsys)
    assert "trained on base revision" in line and "local-sha256:0000" in line
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "m2"), "--force"]) == 0
    out = capsys.readouterr().out
    assert "warning: --force: " in out and "adapter" in out.split("warning: --force: ")[1]


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


@pytest.fixture
def no_merge(monkeypatch):
    """Every refusal below comes before any work: a merge (or a download) would be a failure."""
    def fail(*args, **kwargs):
        raise AssertionError("the merge ran before the input was checked")
    monkeypatch.setattr(export, "merge", fail)
    monkeypatch.setattr(export, "resolve_base", fail)


def _broken_copy(adapter, tmp_path, name: str, content) -> Path:
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    target = moved / name
    if content is None:
        target.unlink()
    elif content == "dir":
        target.unlink()
        target.mkdir()
    else:
        target.write_bytes(content)
    return moved


@pytest.mark.parametrize("name, content, words", [
    ("adapter_config.json", b"{bad", "adapter config"),
    ("adapter_config.json", b"{bad", "is not valid JSON"),
    ("adapter_config.json", b"\xff\xfe", "is not UTF-8 text"),
    ("adapter_config.json", b"[1, 2]", "holds a JSON list, not an object"),
    ("adapter_config.json", b'{"r": 1' + b"0" * 5000 + b"}", "is not usable JSON (a number over 4,300 digits)"),
    ("adapter_config.json", b"[" * 100_000 + b"]" * 100_000, "is not usable JSON (nested too deeply"),
    ("adapter_config.json", b'{"base_model_name_or_path": 5}', "base_model_name_or_path is 5, not a string"),
    ("adapter_config.json", b'{"base_model_name_or_path": "x/y", "revision": []}', "revision is [], not a string"),
    ("adapter_config.json", "dir", "adapter_config.json: is a directory"),
    ("adapter_model.safetensors", None, "has no adapter_model.safetensors: the adapter's weights are missing"),
    ("adapter_model.safetensors", "dir", "adapter_model.safetensors: is a directory"),
    ("adapter_model.safetensors", b"\x05", "is not a readable safetensors file"),
    ("adapter_model.safetensors", b"\xff" * 16, "is not a readable safetensors file"),
    ("tokenizer_config.json", None, "has no tokenizer"),
    ("kit_run.json", b"{bad", "run record"),
    ("kit_run.json", b'{"base_revision": 5}', "base_revision is 5, not a string"),
    ("eval_results.json", b"{bad", "eval results"),
    ("README.md", b"\xff", "model card"),
])
def test_a_corrupt_adapter_folder_is_one_line_exit_2(adapter, tmp_path, capsys, no_merge, name, content, words):
    moved = _broken_copy(adapter, tmp_path, name, content)
    if name == "tokenizer_config.json":
        (moved / "tokenizer.json").unlink()
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "merged")]) == 2
    assert words in _error(capsys)
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("change, words", [
    ({"r": 0}, "r 0 is not a rank >= 1"), ({"r": "sixteen"}, "r 'sixteen' is not a rank"),
    ({"peft_type": "IA3"}, "peft_type 'IA3': kit merges LoRA adapters only"),
    ({"lora_alpha": "x"}, "lora_alpha 'x' is not a number"), ({"target_modules": []}, "target_modules [] is not"),
])
def test_an_adapter_config_kit_cannot_merge_is_refused_first(adapter, tmp_path, capsys, no_merge, change, words):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    moved = _broken_copy(adapter, tmp_path, "adapter_config.json", json.dumps({**cfg, **change}).encode())
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "merged")]) == 2
    assert words in _error(capsys)


@pytest.mark.parametrize("how", ["targets", "shape"])
def test_an_adapter_that_does_not_fit_its_base_is_one_line_and_keeps_nothing(adapter, tmp_path, capsys, how):
    """Found only when PEFT loads it onto the base: target modules the base lacks, a tensor of another shape."""
    from safetensors.torch import load_file, save_file

    moved = _broken_copy(adapter, tmp_path, "kit_run.json", (adapter / "kit_run.json").read_bytes())
    if how == "targets":
        cfg = json.loads((moved / "adapter_config.json").read_text())
        (moved / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["nonexistent_proj"]}))
    else:
        tensors = load_file(moved / "adapter_model.safetensors")
        name = sorted(tensors)[0]
        save_file({**tensors, name: tensors[name].new_zeros(3, 3)}, moved / "adapter_model.safetensors")
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "merged"), "--base", str(TINY)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(err) == 1 and err[0].startswith(f"error: --adapter {moved} ") and "does not load onto" in err[0], err
    assert ("nonexistent_proj" if how == "targets" else "size mismatch") in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]


def test_an_adapter_that_is_a_file_or_missing_is_named(tmp_path, capsys, no_merge):
    (tmp_path / "file").write_text("x")
    for adapter, words in [(tmp_path / "file", "is not a folder"), (tmp_path / "gone", "does not exist")]:
        assert cli.main(["export", "--adapter", str(adapter), "-o", str(tmp_path / "merged")]) == 2
        assert f"--adapter {adapter} {words}" in _error(capsys)


def test_an_output_that_cannot_be_a_new_folder_is_refused_first(adapter, tmp_path, capsys, no_merge):
    (tmp_path / "afile").write_text("keep")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "afile")
    cases = [(tmp_path / "afile", "exists and is not a folder"), (tmp_path / "fifo", "exists and is not a folder"),
             (tmp_path / "link", "exists and is not a folder"), (tmp_path / "afile" / "m", "afile is not a folder"),
             (Path("/proc/kit-merged"), "cannot write in /proc")]
    for out, words in cases:
        assert cli.main(["export", "--adapter", str(adapter), "-o", str(out)]) == 2
        assert words in _error(capsys), out
    assert (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("base, words", [
    ("/nonexistent", "--base /nonexistent: folder /nonexistent does not exist: give a local model folder"),
    ("./nope", "--base ./nope: folder nope does not exist"),
    ("~/kit-no-such-model", "--base ~/kit-no-such-model: folder "),
    ("a/b/c", "--base a/b/c: folder a/b/c does not exist"),
    ("FILE", "is not a folder"),
])
def test_a_base_path_that_is_no_folder_is_named_as_base(adapter, tmp_path, capsys, no_merge, base, words):
    (tmp_path / "file").write_text("x")
    base = str(tmp_path / "file") if base == "FILE" else base
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(tmp_path / "m"), "--base", base]) == 2
    line = _error(capsys)
    assert words in line and "Hub" not in line.split(":")[1] and "the adapter's base model" not in line


def test_an_adapter_whose_base_folder_moved_says_pass_base(adapter, tmp_path, capsys, no_merge):
    moved = _broken_copy(adapter, tmp_path, "adapter_config.json", json.dumps(
        {**json.loads((adapter / "adapter_config.json").read_text()),
         "base_model_name_or_path": "/gone/tiny"}).encode())
    assert cli.main(["export", "--adapter", str(moved), "-o", str(tmp_path / "m")]) == 2
    line = _error(capsys)
    assert "base model '/gone/tiny':" in line and "folder /gone/tiny does" in line and "pass --base" in line


def test_a_base_with_a_corrupt_safetensors_header_is_one_line(adapter, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(TINY, base)
    (base / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{not json")
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(tmp_path / "m"), "--base", str(base),
                     "--force"]) == 2
    line = _error(capsys)
    assert "model.safetensors is not" in line and "readable safetensors" in line


@pytest.mark.parametrize("push", ["hf://bad!!/x", "hf://a/b/c", "hf://", "hf://-x/y"])
def test_a_bad_push_target_is_refused_before_any_work(adapter, tmp_path, capsys, monkeypatch, push):
    monkeypatch.setattr(export, "prepare", lambda *a, **k: pytest.fail("prepared before --push was checked"))
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(tmp_path / "m"), "--push", push]) == 2
    line = _error(capsys)
    assert f"--push {push}: " in line and "not a valid Hub repo id" in line


@pytest.mark.parametrize("env, want, code", [
    ({}, "no Hugging Face token", 4),
    ({"HF_TOKEN": WRITE_TOKEN, "HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE", 4),
], ids=["no-token", "offline"])
def test_a_push_that_cannot_happen_is_refused_before_the_merge(adapter, hub, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                               env, want, code):
    """--push without a token (or offline) used to merge for minutes, then fail at the upload."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # Only the environment's token: a developer's own `hf auth login` file must not make "no token" push.
    monkeypatch.setattr("kit.checkpoints.store.hub.find_token", lambda: os.environ.get("HF_TOKEN"))
    monkeypatch.setattr(export, "prepare", lambda *a, **k: pytest.fail("merged before --push was checked"))
    out = tmp_path / "m"
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--push", "hf://me/merged"]) == code
    assert want in _error(capsys) and not out.exists()


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
    assert lines[0].startswith("error: final/ was not") and "hf://me/no-token: " in lines[0]
    assert "token" in lines[0].split("hf://me/no-token: ")[1]
    assert WRITE_TOKEN not in lines[0] and final.is_dir()
    with pytest.raises(StoreError, match="token"):
        job.store.publish_final(final)
    # Run again with a token: the job is complete, and the final/ the store lacks is pushed then.
    job.store = HubStore("me/no-token", token=WRITE_TOKEN, endpoint=hub.url)
    code, lines = wrapup.push_if_missing(job, 4)
    assert code == 0 and [ln.split() for ln in lines] == [["pushed:", f"{hub.url}/me/no-token/tree/main/final"]]
    assert job.store.final_step() == 4
    assert wrapup.push_if_missing(job, 4) == (0, []), "already there: nothing to push"


def test_a_directory_store_takes_final_whole(tmp_path):
    src = tmp_path / "final"
    src.mkdir()
    (src / "eval_results.json").write_text(json.dumps({"step": 7}))
    store = DirStore(tmp_path / "store")
    assert store.final_step() is None
    assert store.publish_final(src) == (str(tmp_path / "store" / "final"), None)
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


def test_a_base_whose_weights_do_not_match_its_config_is_one_line(adapter, tmp_path, capsys):
    """A --base folder whose config.json was edited (or whose weights are another model's): exit 2 and
    one line, not 'a bug in kit' (exit 1) pointing at a report transformers printed elsewhere."""
    base = tmp_path / "base"
    shutil.copytree(TINY, base)
    cfg = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**cfg, "vocab_size": 256}))
    assert cli.main(["export", "--adapter", str(adapter), "-o", str(tmp_path / "merged"), "--base", str(base)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(err) == 1 and err[0].startswith(f"error: base model {base} ") and "does not load (" in err[0], err
    assert "shapes differ from" in err[0] and err[0].endswith("give another --base")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_a_disk_that_fills_up_during_the_export_is_one_line_and_keeps_nothing(adapter, tmp_path):
    """The free-space check passed (another writer filled the disk since, or the estimate was short): the
    merged model's write hits ENOSPC. Exit 3 as for too little disk, naming the folder and its free space,
    no half-written folder left."""
    import dataclasses

    from kit.errors import CannotTrain
    from tests.smalldisk import tmpfs

    plan = export.prepare(adapter, tmp_path / "merged")
    with tmpfs(tmp_path / "small", "128k") as small:
        with pytest.raises(CannotTrain) as e:
            export.merge(dataclasses.replace(plan, out=str(small / "merged")))
        assert e.value.exit_code == 3
        assert f"out of disk space in {small} (" in str(e.value) and "nothing was kept" in str(e.value)
        assert list(small.iterdir()) == []
