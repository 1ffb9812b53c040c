"""The stop rules `kit schedule` applies after each session, locally and on Kaggle (pure)."""

from __future__ import annotations

from kit.notebooks.schedule import stops
from kit.notebooks.schedule.stops import Next, Session, Stop, decide


DONE = "complete: step 60 of 60"
CUT = "failed: kernel error: exceeded the maximum run time"


def test_complete_stops_with_success():
    d = decide(Session(DONE, 40, 60), used_hours=1)
    assert isinstance(d, Stop) and d.ok and d.reason == f"complete ({DONE})"
    assert decide(Session("failed: kernel error", 40, 60), used_hours=1, complete=True).ok  # the store says so


def test_a_missing_token_stops_with_the_instruction():
    d = decide(Session("failed: missing HF_TOKEN: attach a Kaggle secret named HF_TOKEN", None, None), used_hours=0)
    assert isinstance(d, Stop) and not d.ok and "no Hugging Face token" in d.reason
    assert d.reason.endswith("secret named HF_TOKEN")


def test_no_progress_stops_and_quotes_the_log():
    d = decide(Session("paused at step 40 of 60", 40, 40), used_hours=1, log_tail="loading\nOSError: disk full\n")
    assert not d.ok and "no progress (" in d.reason and "stayed at step 40): " in d.reason
    assert "paused at step 40 of 60;" in d.reason and d.reason.endswith("ends: OSError: disk full")


def test_a_cut_after_progress_goes_on_and_a_paused_one_too():
    d = decide(Session(CUT, 20, 80), used_hours=1)
    assert isinstance(d, Next) and d == Next(f"cut at step 80 ({CUT})")
    assert decide(Session("paused at step 80 of 200", 20, 80), used_hours=1) == Next("paused at step 80 of 200")


def test_the_next_session_must_fit_in_the_quota():
    d = decide(Session("paused at step 80 of 200", 20, 80, hours=11.5), used_hours=23, max_hours=30, next_hours=11.5)
    assert d == Stop(stops.quota_words(23, 30, 11.5), ok=False)
    assert "23.00 h used of" in d.reason and "--max-gpu-hours 30, " in d.reason and "up to 11.50 h" in d.reason
    assert isinstance(decide(Session("paused at step 80 of 200", 20, 80), used_hours=10, max_hours=30,
                             next_hours=11.5), Next)


def test_step_of_reads_the_outcome_words():
    for words, step in [("paused at step 40 of 60", 40), ("already complete: step 60 of 60 (hf://x)", 60),
                        ("failed (exit code 1): boom", None)]:
        assert stops.step_of(words) == step, words
