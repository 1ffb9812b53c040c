"""A run whose weights or loss go NaN/inf stops with one error line and exit 3, saves no NaN
checkpoint and delivers nothing (it used to train on, say "complete", exit 0 and ship a NaN adapter)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerControl, TrainerState, TrainingArguments

from kit.train import divergence
from kit.train.callbacks import Control
from tests.scripts import FAST, train, train_here


def test_finite_sees_one_nan_or_inf_among_many():
    params = [torch.randn(8, 8) for _ in range(5)]
    assert divergence.finite(params)
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = [p.clone() for p in params]
        broken[3][2, 5] = bad
        assert not divergence.finite(broken)
    assert divergence.finite([])


def test_an_overflowing_logged_gradient_norm_stops_bf16_at_once_and_fp16_after_a_run_of_logs():
    """Huge but finite gradients overflow the norm; clipping then zeroes them, so only Trainer's
    logged (pre-clip) norm shows it: lora.alpha=1e30 "completed" with an untrained adapter."""
    inf = {"loss": 6.2, "grad_norm": float("inf")}
    assert "clipping zeroed the step" in divergence.Watch().logged(inf, 5, fp16=False, logging_steps=5)
    watch = divergence.Watch()
    assert [watch.logged(inf, s, fp16=True, logging_steps=10) is None for s in (10, 20)] == [True, True]
    assert "for 30 steps (fp16" in watch.logged(inf, 30, fp16=True, logging_steps=10)
    watch = divergence.Watch()
    watch.logged(inf, 10, fp16=True, logging_steps=10)
    watch.logged({"loss": 6.1, "grad_norm": 3.0}, 20, fp16=True, logging_steps=10)  # the scaler found a scale
    assert watch.logged(inf, 30, fp16=True, logging_steps=10) is None


def _model_with_grads(grad_value: float) -> torch.nn.Module:
    model = torch.nn.Linear(4, 4)
    model.bias.requires_grad_(False)
    model.weight.grad = torch.full((4, 4), grad_value)
    return model


def test_non_finite_gradients_stop_at_once_in_bf16_and_after_a_run_of_skips_in_fp16():
    for fp16, limit in ((False, 1), (True, divergence.FP16_SKIPS)):
        watch, model = divergence.Watch(), _model_with_grads(float("inf"))
        for step in range(1, limit):
            watch.after_backward(model)
            assert watch.reason(model, step, fp16) is None  # fp16: the scaler's normal skips
        watch.after_backward(model)
        assert "NaN or inf" in watch.reason(model, limit, fp16) and "gradients" in watch.reason(model, limit, fp16)
    watch, model = divergence.Watch(), _model_with_grads(float("inf"))
    for _ in range(divergence.FP16_SKIPS - 1):
        watch.after_backward(model)
    model.weight.grad.fill_(0.5)  # one good step resets the run of skips
    watch.after_backward(model)
    assert watch.bad_grad_steps == 0 and watch.reason(model, 30, True) is None
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert "no longer finite" in watch.reason(model, 31, True) and "weights" in watch.reason(model, 31, True)


def test_a_nan_logged_loss_stops_without_saving_and_a_finite_one_does_not():
    """The fp16 case (the loss scaler keeps the weights finite while every step overflows) cannot
    run on a CPU: the callback gets Trainer's real log dict and control object."""
    ctl = Control(ctx=None, deadline=None, save_every_minutes=30, signals=None, save_cost_s=lambda: 0.0)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 12
    control.should_save = True
    fp16 = TrainingArguments(output_dir="unused", fp16=False, logging_steps=5)
    fp16.fp16 = True  # set after init: Trainer refuses fp16 without a GPU
    ctl.on_log(fp16, state, control, logs={"loss": 2.5, "grad_norm": float("inf")})  # fp16: a skipped step
    assert not control.should_training_stop and control.should_save and not ctl.diverged
    ctl.on_log(fp16, state, control, logs={"loss": float("nan"), "grad_norm": 1.0})
    assert control.should_training_stop and not control.should_save and ctl.diverged
    assert ctl.stop_reason.startswith("training diverged: ") and "loss is nan at step 12" in ctl.stop_reason


@pytest.mark.slow
@pytest.mark.parametrize("nproc, bad", [(2, "weight_decay=1e10"), (1, "lora.alpha=1e30")])
def test_a_diverging_run_stops_with_exit_3_and_delivers_nothing(tmp_path, nproc, bad):
    out = tmp_path / "out"
    args = [f"output_dir={out}", "max_steps=12", "save_steps=1", bad, *FAST]
    # Two ranks under torchrun (a rank's exit 3 as the job's exit); one process in this one (runpy).
    r = train(args, nproc=nproc) if nproc > 1 else train_here(args)
    # torchrun turns a rank's exit 3 into its own exit 1; kit's line names the 3.
    assert r.returncode == (1 if nproc > 1 else 3), r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith("error: training diverged") and " at step " in errors[0], r.stderr[-2000:]
    assert nproc == 1 or "[kit exit 3;" in errors[-1]
    assert "lower learning_rate" in errors[0]
    assert "complete:" not in r.stdout
    assert not (out / "final").exists()
    step = int(errors[0].split("at step ")[1].split(":")[0])
    assert step < 12
    saved = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert all(int(p.name.split("-")[1]) < step for p in saved)  # the diverged step itself is not saved
    for ckpt in saved:
        weights = load_file(ckpt / "adapter_model.safetensors")
        assert all(torch.isfinite(w).all() for w in weights.values()), ckpt.name
    record = json.loads((out / "kit_sessions.jsonl").read_text().splitlines()[-1])
    assert record["outcome"] == "failed" and record["error"].startswith("training diverged")
