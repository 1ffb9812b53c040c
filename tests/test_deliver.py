"""The finished job end to end: the real train_ddp.py (2 gloo ranks under torchrun, or one process),
a directory store and tests/hubserver.py with the real huggingface_hub client: baseline and final
evaluation, final/ and its push, the model card, kill -9 after the baseline, a changed base."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
import yaml

from kit.evaluation.identity import local_revision
from tests.code_asserts import words_in
from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, kill_job, kit_cli, run, torchrun_cmd, train, train_here

TINY = ROOT / "models" / "tiny-qwen3"
FINAL_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors", "eval_results.json", "samples.md",
               "kit_config.yaml", "kit_run.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def front_matter(card: str) -> dict:
    m = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    assert m, "the model card starts with YAML front matter"
    return yaml.safe_load(m.group(1))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One full job of the default config under torchrun (2 ranks) with a directory store."""
    root = tmp_path_factory.mktemp("job")
    out, store = root / "out", root / "store"
    r = train([f"output_dir={out}", f"store={store}", "max_steps=20", "save_steps=10", "eval_steps=10",
               "logging_steps=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out, store, r.stdout


@pytest.mark.slow
def test_a_full_job_evaluates_before_and_after_and_delivers_final(finished):
    out, store, stdout = finished
    final = out / "final"
    assert {p.name for p in final.iterdir()} == FINAL_FILES
    doc = json.loads((final / "eval_results.json").read_text())
    b, f = doc["baseline"]["result"], doc["final"]["result"]
    assert doc["baseline"]["step"] == 0 and doc["final"]["step"] == doc["step"] == 20
    assert b["rows_sha256"] == f["rows_sha256"] and b["rows"] == f["rows"] > 10, "the same held-out rows"
    assert f["loss"] < b["loss"], "training moved the held-out loss"
    assert doc["primary_metric"]["name"] == "exact_match"
    assert len(b["samples"]) == len(f["samples"]) == 5
    run = json.loads((out / "kit_run.json").read_text())
    assert doc["run_id"] == run["run_id"] and doc["base_revision"] == run["base_revision"] == local_revision(TINY)
    assert doc["data"]["fingerprint"].startswith("sha256:") and doc["eval_config"]["subset"] == 64
    samples = (final / "samples.md").read_text()
    assert samples.count("## Sample ") == 5 and "Before (step 0):" in samples and "After (step 20):" in samples
    # The end of the run says where things are and what to do next.
    assert f"[kit] run id: {run['run_id']}" in stdout
    [evals] = [ln for ln in stdout.splitlines() if ln.startswith("[kit] eval loss ")]
    assert re.fullmatch(r"[\d.]+ → [\d.]+", evals.split("eval loss ")[1].split(",")[0])
    assert re.search(r"match \d+ % → \d+ %", evals) and "exact match" in evals and ", perplexity " in evals
    assert f"[kit] final: {final} (adapter" in stdout
    assert f"[kit] pushed: {store / 'final'}" in stdout
    assert words_in(stdout, "[kit]", "export:", "python", "-m", "kit", "export", "--adapter", str(final))
    # The store holds the deliverable and the job's records; the checkpoints stay where they were.
    assert {p.name for p in (store / "final").iterdir()} == FINAL_FILES
    assert json.loads((store / "kit" / "baseline.json").read_text())["result"]["loss"] == b["loss"]
    assert json.loads((store / "kit" / "run.json").read_text())["run_id"] == run["run_id"]
    assert sorted(p.name for p in (store / "checkpoints").iterdir()) == ["checkpoint-10", "checkpoint-20"]
    manifest = json.loads((store / "checkpoints" / "checkpoint-20" / "kit_manifest.json").read_text())
    assert manifest["extra"] == {"run_id": run["run_id"], "base_revision": run["base_revision"]}
    session = json.loads((out / "kit_sessions.jsonl").read_text().splitlines()[-1])
    assert session["run_id"] == run["run_id"] and session["final_push"] == str(store / "final")
    assert session["primary_metric"]["name"] == "exact_match"


@pytest.mark.slow
def test_the_model_card_has_hub_metadata_and_says_how_to_use_it(finished):
    out, _, _ = finished
    card = (out / "final" / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "peft" and meta["base_model_revision"] == local_revision(TINY)
    assert {"kit", "lora", "peft", "sft"} <= set(meta["tags"])
    assert "base_model" not in meta, "a local base is no Hub id: named in the text, not in base_model"
    for words in ("models/tiny-qwen3", "data/ha_commands.jsonl", "LoRA r=16", "2 × cpu", "| result | loss",
                  "PeftModel.from_pretrained", "python -m kit export", "torchrun --standalone --nproc_per_node=2",
                  "## Limitations"):
        assert words in card, words


@pytest.mark.slow
def test_status_plots_loss_against_step_and_shows_the_run_id(finished, tmp_path):
    out, store, _ = finished
    png = tmp_path / "job.png"
    r = kit_cli(["status", "--config", "configs/default.yaml", f"output_dir={out}", f"store={store}", "--plot", str(png),
                 "--json"])
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["run_id"] == json.loads((out / "kit_run.json").read_text())["run_id"]
    assert [h["step"] for h in facts["losses"] if "eval_loss" in h] == [10, 20]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = kit_cli(["status", "--config", "configs/default.yaml", f"store={store}"]).stdout
    assert f"run id       {facts['run_id']}" in text


@pytest.mark.slow
def test_export_of_the_finished_job_loads_in_plain_transformers_and_matches(finished, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, _, _ = finished
    merged = tmp_path / "merged"
    r = kit_cli(["export", "--adapter", str(out / "final"), "-o", str(merged), "--dtype", "fp32"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verified: merged logits" in r.stdout and "match base + adapter" in r.stdout
    assert list(merged.glob("*.safetensors")) and (merged / "tokenizer.json").is_file()
    assert front_matter((merged / "README.md").read_text())["library_name"] == "transformers"
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert not hasattr(plain, "peft_config")
    both = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY), out / "final")
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with torch.no_grad():
        diff = (plain(input_ids=ids).logits - both(input_ids=ids).logits).abs().max().item()
    assert diff < 1e-4, diff


@pytest.mark.slow
def test_final_push_to_the_hub_is_one_commit_with_the_expected_files(tmp_path):
    out = tmp_path / "out"
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        env = cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        r = train([f"output_dir={out}", "store=hf://me/ha-final", "max_steps=4", "save_steps=4", *FAST], nproc=1,
                  env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        finals = [c for c in server.commit_log("me/ha-final") if c.title.startswith("kit: final")]
        assert len(finals) == 1
        assert set(finals[0].added) == {f"final/{n}" for n in FINAL_FILES} | {"README.md"}
        files = server.files("me/ha-final")
        card = files["README.md"].decode()
        assert card == files["final/README.md"].decode()
        assert front_matter(card)["base_model_revision"] == local_revision(TINY)
        assert "in `me/ha-final` (" in card and "(branch main)" in card and "this deliverable" in card
        assert "`checkpoints/`" in card
        assert words_in(r.stdout, "[kit]", "pushed:", f"{server.url}/me/ha-final/tree/main/final")
        assert {"kit/run.json", "kit/baseline.json", "checkpoints/checkpoint-4/kit_manifest.json"} <= set(files)


@pytest.mark.slow
def test_a_job_killed_after_the_baseline_resumes_without_measuring_it_again(tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    args = [f"output_dir={out}", f"store={store}", "max_steps=400", "save_steps=5", *FAST]
    log = tmp_path / "first.log"
    proc = subprocess.Popen(torchrun_cmd(nproc=1) + args, cwd=ROOT, env=cpu_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "[kit] baseline: loss" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "[kit] baseline: loss" in log.read_text(), log.read_text()[-2000:]
    kill_job(proc, str(out))
    kept = (store / "kit" / "baseline.json").read_bytes()
    shutil.rmtree(out)  # a new machine: only the store remains
    r = train_here([*args[:2], "max_steps=6", *args[3:]])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"directory {store}" in r.stdout and "[kit] baseline: kept" in r.stdout
    assert "[kit] baseline: loss" not in r.stdout
    assert (store / "kit" / "baseline.json").read_bytes() == kept
    doc = json.loads((out / "final" / "eval_results.json").read_text())
    assert doc["baseline"] == json.loads(kept)


@pytest.mark.slow
def test_a_different_base_revision_is_refused_and_nothing_is_overwritten(tmp_path):
    base, out = tmp_path / "base", tmp_path / "out"
    shutil.copytree(TINY, base)
    args = [f"model={base}", f"output_dir={out}", "save_steps=2", *FAST]
    assert train_here([*args, "max_steps=2"]).returncode == 0
    from safetensors.torch import load_file, save_file

    weights = load_file(base / "model.safetensors")
    key = next(k for k in weights if "proj" in k)
    weights[key] = weights[key] * 1.01
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    snapshot = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = train_here([*args, "max_steps=4"])
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert "trained on base revision" in errors[0] and "local-sha256:" in errors[0] and "pass --force" in errors[0]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot
    forced = train_here([*args, "max_steps=4", "--force"])
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert "--force: run" in forced.stdout


@pytest.mark.slow
def test_a_session_that_fails_mid_training_is_recorded_as_failed(tmp_path):
    # The real script with one extra callback raising at step 3: an out-of-memory error or a bad batch.
    wrapper = tmp_path / "fail.py"
    wrapper.write_text(f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from transformers import TrainerCallback
import kit.train.job

class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 3:
            raise RuntimeError("failed on purpose")

_callbacks = kit.train.job.Job.callbacks
kit.train.job.Job.callbacks = lambda self, model, dataset: _callbacks(self, model, dataset) + [Boom()]
import runpy
sys.argv = [{str(SCRIPT)!r}] + sys.argv[1:]
runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
""")
    out, store = tmp_path / "out", tmp_path / "store"
    import sys

    r = run([sys.executable, str(wrapper), f"output_dir={out}", f"store={store}", "max_steps=50", *FAST])
    assert r.returncode != 0 and "failed on purpose" in r.stderr
    record = json.loads((out / "kit_sessions.jsonl").read_text().splitlines()[-1])
    assert record["outcome"] == "failed" and record["end_step"] == 3 and record["run_id"]
    assert json.loads((store / "kit" / "sessions.jsonl").read_text().splitlines()[-1])["outcome"] == "failed"


def test_the_finished_job_reads_its_session_records_past_a_torn_or_bad_line(tmp_path, caplog):
    """The model card's facts come from kit_sessions.jsonl; a cut write's torn last line, bytes that
    are not UTF-8 or a field of the wrong type must not stop the finished job's delivery."""
    from types import SimpleNamespace

    from kit.deliver.wrapup import _sessions

    (tmp_path / "kit_sessions.jsonl").write_bytes(
        b'{"started": 1, "end_step": 2, "max_steps": 4}\n\xff\xfe\n{"started": "x"}\n'
        b'{"started": 5, "end_step": 4, "max_steps": 4}\n{"started": 9, "end')
    job = SimpleNamespace(cfg=SimpleNamespace(output_dir=str(tmp_path)))
    assert [r["end_step"] for r in _sessions(job)] == [2, 4]
    assert len([r for r in caplog.records if "ignoring it" in r.getMessage()]) == 3
    assert _sessions(SimpleNamespace(cfg=SimpleNamespace(output_dir=str(tmp_path / "none")))) == []


def test_the_printed_export_command_can_be_pasted_as_is():
    import shlex
    from types import SimpleNamespace

    from kit.deliver.wrapup import export_command

    out = "/x/my run $(rm -rf ~) 'q\""
    words = shlex.split(export_command(SimpleNamespace(output_dir=out)))
    assert words == ["python", "-m", "kit", "export", "--adapter", f"{out}/final", "-o", f"{out}/merged"]


@pytest.mark.parametrize("damage, noted", [(b'{"step": 6', True), (b"[" * 100_000, True), (b"[6]", False)],
                         ids=["torn", "deep", "list"])
def test_a_damaged_local_final_is_named_and_not_pushed(tmp_path, damage, noted):
    """A job found complete pushes a local final/ the store lacks; a damaged eval_results.json there is
    a note (or, valid JSON of the wrong shape, no step to match), never a crash of the wrap-up, and
    nothing reaches the store."""
    from types import SimpleNamespace

    from kit.checkpoints.store import open_store
    from kit.deliver import wrapup

    final = tmp_path / "out" / "final"
    final.mkdir(parents=True)
    (final / "eval_results.json").write_bytes(damage)
    store = open_store(str(tmp_path / "store"))
    job = SimpleNamespace(cfg=SimpleNamespace(output_dir=str(tmp_path / "out")), store=store)
    note = [f"note: {final / 'eval_results.json'} is unreadable; its final/ is not pushed"]
    assert wrapup.push_if_missing(job, 6) == (0, note if noted else [])
    assert store.final_step() is None


@pytest.mark.slow
def test_a_token_in_the_data_is_never_written_into_what_the_job_delivers(tmp_path):
    """Sampled answers and prompts quote the held-out data; a user's data may hold their own token (a
    pasted log). The files kit writes from them, and pushes, show it as ***."""
    token = "hf_" + "dataLEAKtoken" + "0123456789abcdef"
    rows = [json.loads(line) for line in (ROOT / "data" / "ha_commands.jsonl").read_text().splitlines()]
    for row in rows[::3]:
        row["messages"][-2]["content"] += f" (my token is {token})"
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    r = train_here([f"output_dir={out}", f"data.path={data}", "max_steps=2", "eval.samples=20", *FAST],
                   env=cpu_env(HF_TOKEN=token))
    assert r.returncode == 0, r.stderr[-3000:]
    written = [p for p in [out / "kit_baseline.json", *(out / "final").iterdir()] if p.is_file()]
    assert {p.name for p in written} >= {"kit_baseline.json", "samples.md", "eval_results.json", "README.md"}
    assert "***" in (out / "final" / "samples.md").read_text()
    for p in written:
        assert token.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_a_full_fine_tune_delivers_a_loadable_model_and_never_points_at_the_adapter_export(tmp_path):
    """method=full ended with `kit export --adapter …`, which refuses a full model; the card said the same."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    r = train_here([f"output_dir={out}", "method=full", "max_steps=3", *FAST])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kit export" not in r.stdout and "(model weights," in r.stdout and "tokenizer," in r.stdout
    use = [line for line in r.stdout.splitlines() if line.startswith("[kit] use: ")]
    assert use and f"from_pretrained({str(out / 'final')!r})" in use[0]
    card = (out / "final" / "README.md").read_text()
    assert "kit export" not in card and "AutoModelForCausalLM.from_pretrained(" in card
    model = AutoModelForCausalLM.from_pretrained(out / "final")  # what the line says works, does
    assert model.config.num_hidden_layers == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dir", "hub"])
def test_a_retargeted_job_keeps_the_earlier_final_beside_the_new_one(tmp_path, kind):
    """A corrupt newest checkpoint and max_steps=3 after a finished 4-step job: the step-4 final/ was
    replaced in place by a step-3 one, in the store and locally. Now it is kept as final-step-4/ in both."""
    from kit.checkpoints.store import open_store

    out = tmp_path / "out"
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        env = cpu_env(HF_ENDPOINT=server.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        spec = str(tmp_path / "store") if kind == "dir" else "hf://me/retarget"
        args = [f"output_dir={out}", f"store={spec}", "save_steps=1", "keep_checkpoints=3", *FAST]

        def go(extra: list[str]):  # a directory store: in this process (runpy); the Hub's client: a process
            return train_here([*args, *extra]) if kind == "dir" else train([*args, *extra], nproc=1, env=env)

        r = go(["max_steps=4"])
        assert r.returncode == 0, r.stderr[-3000:]
        step4 = {p.name: p.read_bytes() for p in (out / "final").iterdir()}
        # The newest checkpoint damaged here and in the store: the newest one that verifies is step 3.
        (out / "checkpoint-4" / "optimizer.pt").write_bytes(b"damaged")
        if kind == "dir":
            (tmp_path / "store" / "checkpoints" / "checkpoint-4" / "optimizer.pt").write_bytes(b"damaged")
        else:
            server.corrupt_stored("me/retarget", "checkpoints/checkpoint-4/optimizer.pt")
        r = go(["max_steps=3"])
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads((out / "final" / "eval_results.json").read_text())["step"] == 3
        assert {p.name: p.read_bytes() for p in (out / "final-step-4").iterdir()} == step4
        assert f"it is kept as {out / 'final-step-4'}" in r.stdout
        assert "earlier final/ was of" in r.stdout and "another step" in r.stdout and "as final-step-4/" in r.stdout
        if kind == "dir":
            kept = {p.name: p.read_bytes() for p in (tmp_path / "store" / "final-step-4").iterdir()}
        else:
            kept = {p[len("final-step-4/"):]: b for p, b in server.files("me/retarget").items()
                    if p.startswith("final-step-4/")}
        assert kept == step4
        store = open_store(spec) if kind == "dir" else None
        assert store is None or store.final_step() == 3
