"""kit.evaluation in-process, on the real tiny model and the real HA data: what is measured, the
skips with their reasons, the run identity and the base revision it ties the adapter to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kit.planning import config
from kit.train import data
from kit.errors import UsageError
from kit.evaluation import heldout, identity, results, stage

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    model = AutoModelForCausalLM.from_pretrained(TINY)
    return model, tok


def _cfg(tmp_path, *overrides):
    return config.load(str(ROOT / "configs" / "default.yaml"), [f"output_dir={tmp_path / 'out'}", *overrides])


@pytest.mark.slow
def test_baseline_measures_loss_metric_and_five_samples_on_fixed_rows(tiny, tmp_path):
    model, tok = tiny
    cfg = _cfg(tmp_path)
    ds = data.prepare(cfg, tok)
    run = stage.open_run(cfg, None)
    first, notes = stage.before(run, cfg, model, tok, ds, None, batch_size=8, force=False)
    r = first["result"]
    assert r["rows"] == min(cfg.eval.subset, len(ds.eval)) and r["loss"] > 0 and r["perplexity"] > 1
    assert r["metric"]["name"] == "exact_match" and r["metric"]["of"] == r["rows"]
    assert len(r["samples"]) == 5 and all(s["prompt"] and s["reference"] for s in r["samples"])
    assert "<|im_start|>assistant" in r["samples"][0]["prompt"] and r["samples"][0]["reference"].startswith("{")
    assert notes[-1].startswith("baseline: loss ")
    # The same rows, the same numbers: the final evaluation is comparable with the baseline.
    again = stage.measure(cfg, model, tok, ds, 4, "final")
    assert again["rows"] == first["rows"] and again["result"]["rows_sha256"] == r["rows_sha256"]
    assert again["result"]["loss"] == pytest.approx(r["loss"], rel=1e-5)
    assert [s["output"] for s in again["result"]["samples"]] == [s["output"] for s in r["samples"]]


@pytest.mark.slow
def test_a_kept_baseline_is_not_measured_again(tiny, tmp_path):
    model, tok = tiny
    cfg = _cfg(tmp_path)
    ds = data.prepare(cfg, tok)
    run = stage.open_run(cfg, None)
    first, _ = stage.before(run, cfg, model, tok, ds, None, batch_size=8, force=False)
    kept, notes = stage.before(stage.open_run(cfg, None), cfg, model, tok, ds, None, batch_size=8, force=False)
    assert kept == first and any(n.startswith("baseline: kept from ") for n in notes)


def test_no_held_out_data_is_a_recorded_skip(tiny, tmp_path):
    model, tok = tiny
    cfg = _cfg(tmp_path, "data.eval_fraction=0")
    ds = data.prepare(cfg, tok)
    assert ds.eval is None
    record, notes = stage.before(stage.open_run(cfg, None), cfg, model, tok, ds, None, batch_size=8, force=False)
    assert record["skipped"].startswith("no held-out data (") and "eval_fraction is 0" in record["skipped"]
    assert record["result"] is None
    assert json.loads((Path(cfg.output_dir) / results.BASELINE_LOCAL).read_text())["skipped"] == record["skipped"]
    assert "skipped: no held-out" in notes[-1]


def test_baseline_off_is_a_recorded_skip(tiny, tmp_path):
    model, tok = tiny
    cfg = _cfg(tmp_path, "eval.baseline=false")
    record = stage.measure(cfg, model, tok, data.prepare(cfg, tok), 8, "baseline")
    assert record["skipped"] == "eval.baseline is false"


def test_an_eval_split_too_small_for_the_metric_keeps_the_loss_and_says_why(tiny, tmp_path):
    model, tok = tiny
    cfg = _cfg(tmp_path, "eval.subset=3")
    record = stage.measure(cfg, model, tok, data.prepare(cfg, tok), 8, "baseline")
    r = record["result"]
    assert r["rows"] == 3 and r["loss"] > 0
    assert r["metric"]["name"] is None and set(r["metric"]) == {"name", "skipped"}
    assert "has 3 rows" in r["metric"]["skipped"] and "eval.min_rows=10" in r["metric"]["skipped"]
    assert len(r["samples"]) == 3


def test_plain_text_has_no_task_metric_and_exact_match_on_it_is_refused(tiny, tmp_path):
    model, tok = tiny
    rows = tmp_path / "text.jsonl"
    rows.write_text("".join(json.dumps({"text": f"the kitchen light number {i} is on and the door is shut"}) + "\n"
                            for i in range(60)))
    cfg = _cfg(tmp_path, f"data.path={rows}", "data.format=text")
    ds = data.prepare(cfg, tok)
    r = stage.measure(cfg, model, tok, ds, 8, "baseline")["result"]
    assert r["metric"]["name"] is None and set(r["metric"]) == {"name", "skipped"}
    assert "no reference answer" in r["metric"]["skipped"]
    assert len(r["samples"]) == 5 and all(s["prompt"] for s in r["samples"])
    strict = _cfg(tmp_path, f"data.path={rows}", "data.format=text", "eval.metric=exact_match")
    with pytest.raises(UsageError, match="eval.metric=exact_match needs prompts with reference answers"):
        stage.before(stage.open_run(strict, None), strict, model, tok, ds, None, batch_size=8, force=False)
    assert not Path(strict.output_dir).exists(), "a refused start writes nothing"


def test_the_reference_answer_is_the_first_loss_span():
    prompt, answer = heldout.split_answer([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1])
    assert prompt == [1, 2] and answer == [3, 4]


def test_eval_config_is_checked():
    with pytest.raises(UsageError, match="eval.metric"):
        config.load(None, ["eval.metric=bleu"])
    with pytest.raises(UsageError, match="'eval.subset' .*must be > 0"):
        config.load(None, ["eval.subset=0"])
    with pytest.raises(UsageError, match="did you mean 'eval.samples'"):
        config.load(None, ["eval.sample=3"])


def test_base_revision_of_a_local_folder_changes_with_its_weights(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(TINY, base)
    before = identity.base_revision(str(base))
    assert before.startswith("local-sha256:") and before == identity.base_revision(str(base))
    from safetensors.torch import load_file, save_file

    weights = load_file(base / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    assert identity.base_revision(str(base)) != before
    assert identity.base_revision("someone/model").startswith("unknown (")

    class Config:
        _commit_hash = "a" * 40

    assert identity.base_revision("someone/model", Config()) == "hub:" + "a" * 40


def test_a_different_base_revision_is_refused_unless_forced():
    assert identity.check_same_base(None, "local-sha256:1", "run x", False) is None
    assert identity.check_same_base("local-sha256:1", "local-sha256:1", "run x", False) is None
    with pytest.raises(UsageError, match="run x was trained on base revision local-sha256:1, but the base model "
                                         "now is local-sha256:2.*--force"):
        identity.check_same_base("local-sha256:1", "local-sha256:2", "run x", False)
    assert identity.check_same_base("local-sha256:1", "local-sha256:2", "run x", True).startswith("--force: ")


def test_results_words_and_primary_metric():
    b = {"result": {"loss": 6.0, "perplexity": 403.4, "rows": 40,
                    "metric": {"name": "exact_match", "value": 0.0, "correct": 0, "of": 40}}}
    f = {"result": {"loss": 1.0, "perplexity": 2.72, "rows": 40,
                    "metric": {"name": "exact_match", "value": 0.5, "correct": 20, "of": 40}}}
    assert results.primary(b, f) == {"name": "exact_match", "baseline": 0.0, "final": 0.5, "higher_is_better": True}
    line = results.change_line({"baseline": b, "final": f})
    assert line.startswith("eval loss 6 → 1, ") and "perplexity 403.4 → 2.72" in line
    assert "exact match 0 % → 50 %" in line and line.endswith("(on 40 held-out rows)")
    skipped = {"skipped": "no held-out data (data.eval_fraction is 0)", "result": None}
    assert results.primary(skipped, skipped)["name"] == "eval_loss"
    assert "skipped: no held-out" in results.change_line({"baseline": skipped, "final": skipped})


def test_an_evaluation_that_fails_is_a_recorded_skip_not_a_lost_job(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    cfg = _cfg(tmp_path)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(heldout, "_generate", out_of_memory)  # stands in for a T4 running out of memory
    record = stage.measure(cfg, model, tok, data.prepare(cfg, tok), 8, "final")
    assert record["skipped"].startswith("the evaluation failed: ")
    assert "RuntimeError: CUDA out" in record["skipped"] and record["skipped"].endswith("allocate 2.00 GiB")
    assert record["result"] is None
