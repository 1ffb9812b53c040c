"""The generated train_ddp.py, run for real on the tiny default: torchrun with 2 gloo ranks on
the CPU, plain python, smoke mode, a failing rank, and bad input."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.scripts import FAST, ROOT, SCRIPT, losses, run, torchrun_cmd, train, train_here


def _tree_digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_torchrun_two_ranks_train_save_and_tear_down(tmp_path):
    out = tmp_path / "run"
    r = train([f"output_dir={out}", "max_steps=8", "save_steps=4", *FAST])
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "destroy_process_group() was not called" not in log
    # Only rank 0 talks: one outcome line, not one per rank.
    assert log.count("[kit] complete: step 8 of 8") == 1
    assert "2 × cpu" in log
    for step in (4, 8):
        ckpt = out / f"checkpoint-{step}"
        names = {p.name for p in ckpt.iterdir()}
        # Both ranks' RNG states (each rank writes its own), everything else once, sealed by rank 0.
        assert {"rng_state_0.pth", "rng_state_1.pth", "adapter_model.safetensors", "optimizer.pt",
                "kit_manifest.json", "trainer_state.json"} <= names
    trace = losses(out / "checkpoint-8")
    assert [s for s, _ in trace] == list(range(1, 9))
    assert trace[-1][1] < trace[0][1], f"loss did not go down: {trace}"
    # The speed the user is told, and what the session record keeps of it: the median of steps
    # 3-8 (two warm-up steps left out), tokens = global batch 16 × the data's mean length.
    assert log.count("[kit] speed: ") == 1 and "(median of steps 3-8)" in log
    record = json.loads((out / "kit_sessions.jsonl").read_text().splitlines()[-1])
    assert record["steps_timed"] == 6 and record["timed_from_step"] == 3 and record["step_s"] > 0
    mean_tokens = float(re.search(r"examples of (\d+) tokens on average", log).group(1))
    assert record["tokens_per_s"] == pytest.approx(16 * mean_tokens / record["step_s"], rel=0.02)


@pytest.mark.slow
def test_single_process_python(tmp_path):
    out = tmp_path / "run"
    r = train_here([f"output_dir={out}", "max_steps=4", "save_steps=2", *FAST])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "1 × cpu" in r.stdout and "accumulation 2" in r.stdout  # global batch 16 kept with 1 process
    assert (out / "checkpoint-4" / "rng_state.pth").exists()


def test_the_script_freezes_the_loaded_libraries_and_leaves_garbage_collection_on(tmp_path):
    """The script loads the libraries with the garbage collector off, then collects once and freezes what they
    made, so that no later collection scans them again. Left off, a long job's reference cycles would pile up.
    Run in this process (runpy), whose collector the test can read."""
    import gc

    gc.unfreeze()  # what an earlier in-process run froze
    try:
        r = train_here([f"output_dir={tmp_path / 'run'}", "max_steps=1", "save_steps=1", *FAST])
        assert r.returncode == 0, r.stderr[-3000:]
        assert gc.isenabled()
        assert gc.get_freeze_count() > 100_000  # torch's, transformers' and TRL's objects
    finally:
        gc.enable()
        gc.unfreeze()


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_job_without_a_hang(tmp_path):
    # A wrapper that runs the real script with one extra callback raising on rank 1 at step 2,
    # standing in for an out-of-memory error or a bad batch on one GPU.
    wrapper = tmp_path / "fail_rank1.py"
    wrapper.write_text(f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from transformers import TrainerCallback
import kit.train.job

class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if os.environ["RANK"] == "1" and state.global_step == 2:
            raise RuntimeError("rank 1 failed on purpose")

_callbacks = kit.train.job.Job.callbacks
kit.train.job.Job.callbacks = lambda self, model, dataset: _callbacks(self, model, dataset) + [Boom()]
import runpy
sys.argv = [{str(SCRIPT)!r}] + sys.argv[1:]
runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
""")
    started = time.monotonic()
    r = run(torchrun_cmd(wrapper) + [f"output_dir={tmp_path / 'run'}", "max_steps=50", *FAST], timeout=120)
    took = time.monotonic() - started
    assert r.returncode != 0
    assert "rank 1 failed on purpose" in r.stderr
    assert took < 60, f"the job took {took:.0f} s to end after a rank failed"


@pytest.mark.slow
def test_smoke_passes_on_the_default():
    r = train(["--smoke"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for rung in ("loss finite and non-zero", "grad norm > 0 at step 1", "LoRA weights changed",
                 "frozen base weights unchanged"):
        assert f"[ok] {rung}" in r.stdout
    assert "rank 0: cpu, rank 1: cpu" in r.stdout
    assert "smoke passed" in r.stdout


@pytest.mark.slow
def test_smoke_fails_when_nothing_learns():
    r = train_here(["--smoke", "learning_rate=0", "warmup_steps=0"])
    assert r.returncode == 3  # the check failed (this config does not train here), not kit
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: smoke FAILED at rung 'LoRA weights changed': LoRA weights unchanged"), r.stderr[-2000:]
    assert "[FAIL] LoRA weights changed" in r.stdout
    assert "smoke FAILED at rung 'LoRA weights changed': LoRA weights unchanged" in r.stdout


@pytest.mark.slow
def test_smoke_leaves_earlier_output_alone(tmp_path):
    out = tmp_path / "run"
    assert train_here([f"output_dir={out}", "max_steps=2", "save_steps=2", *FAST]).returncode == 0
    before = _tree_digest(out)
    assert train_here(["--smoke", f"output_dir={out}"]).returncode == 0
    assert _tree_digest(out) == before


def _error_line(r) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[-1]


@pytest.fixture(scope="module")
def _finished_run_once(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    r = train_here([f"output_dir={out}", "max_steps=2", "save_steps=2", *FAST])
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture
def finished_run(_finished_run_once, tmp_path):
    """An output folder holding a finished 2-step run, to prove bad input never touches it: trained
    once per module, copied for each test (a test that fails may have changed it)."""
    out = tmp_path / "run"
    shutil.copytree(_finished_run_once, out)
    return out


@pytest.mark.parametrize("change, words", [
    # the data is judged by its content (kit.checkpoints.fingerprint), so the message names sizes and hashes
    ("data.path=data/other.jsonl", ["was written for a different job", "data: data/other.jsonl (dataset "
                                    "'data/other.jsonl') is not the data the checkpoint was trained on (", "pass --force"]),
    # a shape change cannot be forced (it would fail with a size mismatch inside torch)
    ("lora.r=8", ["has other tensor shapes", "lora.r: 16 (checkpoint) != 8", "cannot be resumed, even with --force"]),
])
@pytest.mark.slow
def test_a_checkpoint_of_another_job_is_refused_and_kept(finished_run, change, words):
    before = _tree_digest(finished_run)
    r = train_here([f"output_dir={finished_run}", "max_steps=4", change])
    assert r.returncode == 2
    line = _error_line(r)
    assert all(w in line for w in words), line
    assert _tree_digest(finished_run) == before


@pytest.mark.slow
def test_resume_never_refuses_to_overwrite_checkpoints(finished_run):
    before = _tree_digest(finished_run)
    r = train_here([f"output_dir={finished_run}", "max_steps=4", "resume=never"])
    assert r.returncode == 2
    assert "holds checkpoints" in _error_line(r)
    assert _tree_digest(finished_run) == before


@pytest.mark.slow
def test_smoke_qlora_on_cpu_is_refused():
    r = train_here(["--smoke", "method=qlora"])
    assert r.returncode == 3
    assert "method=qlora needs a CUDA GPU" in _error_line(r)


@pytest.mark.slow
def test_checkpoint_adapter_loads_in_plain_peft(tmp_path):
    """What kit saves is a standard PEFT adapter: plain transformers + peft can load it."""
    out = tmp_path / "run"
    assert train_here([f"output_dir={out}", "max_steps=2", "save_steps=2", *FAST]).returncode == 0
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(ROOT / "models" / "tiny-qwen3")
    model = PeftModel.from_pretrained(base, out / "checkpoint-2")
    saved = load_file(out / "checkpoint-2" / "adapter_model.safetensors")
    assert saved and any("lora_B" in k for k in saved)
    assert model.peft_config["default"].r == 16
