"""trainer=dpo and kto end to end: the rendered script under real torchrun (2 gloo ranks, CPU, the tiny
model), the test Hub (tests/hubserver.py) as the store, kill -9 and resume, a wrong data shape; full
fine-tuning and a time budget, whose point is not the ranks, in one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, elsewhere_env as env, hub_env, kit_cli, losses, train, train_here, \
    two_ranks as run
from tests.test_resume import assert_same_training, kill_9_after_steps_and_rerun

STEPS = ["max_steps=12", "save_steps=3", "keep_checkpoints=2", *FAST]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    """train_dpo.py and train_kto.py, rendered by `kit render` from the shipped configs for 2 CPU ranks."""
    folder = tmp_path_factory.mktemp("scripts")
    out = {}
    for trainer in ("dpo", "kto"):
        script = folder / f"train_{trainer}.py"
        r = kit_cli(["render", "--config", f"configs/{trainer}-tiny.yaml", "-o", str(script)], env=env())
        assert r.returncode == 0, r.stderr
        out[trainer] = script
    return out


@pytest.fixture
def server():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as s:
        yield s


@pytest.fixture(scope="module")
def uninterrupted(scripts, tmp_path_factory):
    """trainer -> (its output_dir, the run, the Hub it pushed to): each trainer's job under two ranks to its
    end, once, with the test Hub as its store. The tests that read the finished job (what it delivered and
    pushed; the adapter a killed and rerun job must end with) share that one launch."""
    done = {}
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
        def finished(trainer: str):
            if trainer not in done:
                out = tmp_path_factory.mktemp(f"{trainer}-uninterrupted") / "run"
                out.mkdir()
                (out / "README.md").write_text("# my notes\n")  # the trainer's saves write no card over it
                r = run(scripts[trainer], [f"output_dir={out}", f"store=hf://me/{trainer}-tiny", *STEPS], hub_env(hub))
                done[trainer] = out, r, hub
            return done[trainer]

        yield finished


@pytest.mark.slow
@pytest.mark.parametrize("trainer, trainer_class", [("dpo", "DPOTrainer"), ("kto", "KTOTrainer")])
def test_two_ranks_train_deliver_and_push_once(uninterrupted, trainer, trainer_class):
    out, r, server = uninterrupted(trainer)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert log.count("[kit] complete: step 12 of 12") == 1 and "2 × cpu" in log
    assert (out / "README.md").read_text() == "# my notes\n"
    assert log.count("[kit] pushed: ") == 1  # final/ once, by rank 0
    results = json.loads((out / "final" / "eval_results.json").read_text())
    before, after = results["baseline"]["result"], results["final"]["result"]
    assert results["primary_metric"]["name"] == "preference_accuracy"
    assert before["metric"]["value"] == 0 and before["reward_margin"] == 0  # the policy is the reference
    assert after["reward_margin"] > 0 and after["metric"]["value"] > 0.5, after
    assert len(after["samples"]) == 5
    card = (out / "final" / "README.md").read_text()
    assert f"TRL {trainer_class}" in card and "preference accuracy" in card
    assert "ref" not in {p.name for p in (out / "final").iterdir()}  # the trained adapter alone
    pushed = server.files(f"me/{trainer}-tiny")
    assert "final/adapter_model.safetensors" in pushed and "final/eval_results.json" in pushed
    trainer_logs = json.loads((out / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/margins" in h or "rewards/chosen_sum" in h or "kl" in h for h in trainer_logs)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["dpo", "kto"])
def test_kill_9_then_rerun_ends_with_the_uninterrupted_adapter(scripts, uninterrupted, server, tmp_path, trainer):
    script = scripts[trainer]
    reference, r, _ = uninterrupted(trainer)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "run"
    args = [f"output_dir={out}", f"store=hf://me/{trainer}-cut", *STEPS]
    again = kill_9_after_steps_and_rerun(script, args, hub_env(server), tmp_path / "first.log", str(out))
    words = again.stdout + again.stderr
    assert again.returncode == 0, words[-3000:]
    assert "resuming from step" in words
    assert [s for s, _ in losses(out / "checkpoint-12")] == list(range(1, 13))
    assert_same_training(reference / "checkpoint-12", out / "checkpoint-12")


@pytest.mark.slow
@pytest.mark.parametrize("trainer, data, words", [
    ("dpo", "data/ha_commands.jsonl", "needs columns prompt, chosen, rejected"),
    ("kto", "data/prefs_tiny.jsonl", "set trainer=dpo"),
])
def test_a_wrong_data_shape_is_one_line_exit_2_before_the_model_loads(scripts, tmp_path, trainer, data, words):
    r = run(scripts[trainer], [f"output_dir={tmp_path / 'run'}", f"data.path={data}"], env(), timeout=200)
    assert r.returncode == 1, r.stderr[-2000:]  # torchrun's own code for a failed rank
    # kit's one line (rank 0), torchrun's ChildFailedError report, then kit's line again, last.
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 2 and all(words in e for e in errors), r.stderr[-2000:]
    assert "[kit exit 2" in errors[0] and r.stderr.strip().splitlines()[-1] == errors[1]
    assert "UsageError" not in r.stderr  # no traceback of kit's: torchrun's report is about the exit code
    assert "Loading weights" not in r.stdout + r.stderr and "trainable parameters" not in r.stdout


@pytest.mark.slow
def test_full_fine_tuning_scores_against_a_frozen_copy_of_the_start(scripts, tmp_path):
    out = tmp_path / "run"
    # One process, in this one (runpy): the frozen copy is the point, not the ranks.
    r = train_here([f"output_dir={out}", "method=full", "learning_rate=0.0002", *STEPS], env=env(),
                   script=scripts["dpo"])
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    results = json.loads((out / "final" / "eval_results.json").read_text())
    before, after = results["baseline"]["result"], results["final"]["result"]
    assert before["reward_margin"] == 0 and after["reward_margin"] > 0, after  # against the baseline's log-probs
    assert (out / "final" / "model.safetensors").is_file()
    # Several processes with precompute_ref_log_probs=on: one line, exit 2 (TRL's cache file is per process).
    r = run(scripts["dpo"], [f"output_dir={tmp_path / 'pre'}", "method=full", "dpo.precompute_ref_log_probs=on",
                             *STEPS], env(), timeout=200)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert r.returncode == 1 and errors and "one process only" in errors[-1], r.stderr[-2000:]


@pytest.mark.slow
def test_a_time_budget_pauses_a_dpo_job_and_a_fresh_machine_finishes_it(scripts, server, tmp_path):
    out = tmp_path / "run"
    args = [f"output_dir={out}", "store=hf://me/dpo-budget", "max_steps=120", "save_steps=10", "keep_checkpoints=2",
            *FAST]
    # One process (`python train_dpo.py`): the budget and the resume elsewhere are the point, not the ranks; a
    # process of its own, as the budget counts from the process's start.
    first = train([*args, "time_budget_minutes=0.07"], nproc=1, env=hub_env(server), script=scripts["dpo"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "paused at step" in first.stdout and "run the same command to continue" in first.stdout
    paused = int(first.stdout.split("paused at step ")[1].split()[0])
    assert 0 < paused < 120
    shutil.rmtree(out)  # a new session elsewhere: the checkpoint and the baseline come from the store
    second = train(args, nproc=1, env=hub_env(server), script=scripts["dpo"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {paused} (store" in second.stdout and "baseline: kept from" in second.stdout
    assert "complete: step 120 of 120" in second.stdout
    assert [s for s, _ in losses(out / "checkpoint-120")] == list(range(1, 121))
