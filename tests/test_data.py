"""kit.train.data: formats, loss masks, splits and the duplicate check, with the tiny model's tokenizer."""

from __future__ import annotations

import json

import pytest

from kit.planning import config
from kit.train import data
from kit.errors import UsageError
from tests.scripts import ROOT


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-qwen3")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cfg_for(path, **data_kw):
    cfg = config.load(None, [f"data.path={path}", "seq_len=256", "data.eval_fraction=0"])
    for k, v in data_kw.items():
        setattr(cfg.data, k, v)
    return cfg


def trained_text(row, tok) -> str:
    return tok.decode([t for t, m in zip(row["input_ids"], row["completion_mask"]) if m])


def test_chat_masks_exactly_the_assistant_turns(tmp_path, tok):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"},
                          {"role": "assistant", "content": "see you"}]}]
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "c.jsonl", rows)), tok)
    assert prepared.format == "messages"
    # Both assistant turns with their end-of-turn token, nothing of the system or user turns.
    assert trained_text(prepared.train[0], tok).split("<|im_end|>\n") == ["hello", "see you", ""]


@pytest.mark.parametrize("row, fmt, trained", [
    ({"instruction": "turn on the lights", "input": "kitchen", "output": "ok"}, "alpaca", "ok<|im_end|>\n"),
    ({"prompt": "2+2=", "completion": "4"}, "prompt_completion", "4<|im_end|>\n"),
    ({"text": "plain words"}, "text", "plain words"),
])
def test_each_format_trains_on_its_answer_only(tmp_path, tok, row, fmt, trained):
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "d.jsonl", [row] * 3)), tok)
    assert prepared.format == fmt
    assert trained_text(prepared.train[0], tok) == trained


def test_column_mapping(tmp_path, tok):
    rows = [{"question": "q?", "answer": "a!"}] * 3
    cfg = cfg_for(write_jsonl(tmp_path / "m.jsonl", rows), columns={"prompt": "question", "completion": "answer"})
    assert trained_text(data.prepare(cfg, tok).train[0], tok) == "a!<|im_end|>\n"


def test_without_a_chat_template_instructions_use_a_plain_prompt(tmp_path, tok):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-qwen3")
    plain.chat_template = None
    rows = [{"instruction": "say ok", "output": "ok"}] * 3
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "a.jsonl", rows)), plain)
    row = prepared.train[0]
    assert plain.decode(row["input_ids"]).startswith("### Instruction:\nsay ok")
    assert trained_text(row, plain) == "ok<|im_end|>"
    chat = [{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}]
    with pytest.raises(UsageError, match="has no chat template"):
        data.prepare(cfg_for(write_jsonl(tmp_path / "c.jsonl", chat)), plain)


def test_csv_and_parquet_and_folders(tmp_path, tok):
    import datasets

    ds = datasets.Dataset.from_list([{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(6)])
    ds.to_csv(tmp_path / "d.csv")
    folder = tmp_path / "parts"
    folder.mkdir()
    ds.to_parquet(folder / "a.parquet")
    ds.to_parquet(folder / "b.parquet")
    assert len(data.prepare(cfg_for(tmp_path / "d.csv"), tok).train) == 6
    assert len(data.prepare(cfg_for(folder), tok).train) == 12


def test_a_local_split_takes_the_first_rows(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(10)])
    assert len(data.prepare(cfg_for(path, split="train[:4]"), tok).train) == 4
    assert len(data.prepare(cfg_for(path, split="train[:50%]"), tok).train) == 5
    assert len(data.prepare(cfg_for(path, split="train"), tok).train) == 10


def test_valid_rows_that_a_naive_reader_would_split_or_refuse_are_read(tmp_path, tok):
    """JSON strings may hold U+2028/U+0085 raw (ensure_ascii=False writes them so), and a CSV field may
    be longer than Python csv's default 128 KiB: Arrow and pandas read both, so kit's checks must too."""
    rows = [{"prompt": f"line one\u2028line two\x85 {i}", "completion": f"ok {i}"} for i in range(6)]
    path = tmp_path / "scraped.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert len(data.prepare(cfg_for(path), tok).train) == 6
    long = tmp_path / "long.csv"
    long.write_text('prompt,completion\n"' + "word " * 40_000 + '",short\n' + "".join(f"p{i},c{i}\n" for i in range(5)))
    assert len(data.prepare(cfg_for(long), tok).train) == 5  # the 200 KB prompt leaves no answer within seq_len


def test_eval_split_and_duplicate_check(tmp_path, tok):
    unique = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(40)]
    cfg = cfg_for(write_jsonl(tmp_path / "u.jsonl", unique), eval_fraction=0.25)
    prepared = data.prepare(cfg, tok)
    assert (len(prepared.train), len(prepared.eval), prepared.eval_duplicates) == (30, 10, 0)
    dup = write_jsonl(tmp_path / "dup.jsonl", unique[:10] * 4)  # every row four times
    with pytest.raises(UsageError, match=r"of 10 eval examples are exact duplicates of train examples"):
        data.prepare(cfg_for(dup, eval_fraction=0.25), tok)
    allowed = data.prepare(cfg_for(dup, eval_fraction=0.25, allow_duplicates=True), tok)
    assert allowed.eval_duplicates == len(allowed.eval) == 10


def test_rows_without_a_trainable_token_within_seq_len_are_dropped(tmp_path, tok):
    rows = [{"prompt": "word " * 400, "completion": "late"}, {"prompt": "short", "completion": "ok"}]
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "long.jsonl", rows)), tok)
    assert (len(prepared.train), prepared.dropped_too_long) == (1, 1)
    assert all(len(r) <= 256 for r in prepared.train["input_ids"])


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("", "is empty"),
    ('{"a": 1, "b": 2}\n', "match no format"),
    ("not json at all\n", "bad.jsonl line 1: not valid JSON"),
])
def test_bad_files_are_one_line_usage_errors(tmp_path, tok, content, message):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message) as e:
        data.prepare(cfg_for(path), tok)
    assert "\n" not in str(e.value)


def test_the_embedded_dataset(tok):
    cfg = config.load(str(ROOT / "configs" / "default.yaml"))
    cfg.data.path = str(ROOT / cfg.data.path)
    prepared = data.prepare(cfg, tok)
    assert prepared.format == "messages" and len(prepared.train) + len(prepared.eval) == 424
    answer = trained_text(prepared.train[0], tok)
    assert answer.startswith('{"service":') and answer.endswith("<|im_end|>\n")


def test_conversations_that_open_with_the_assistant_or_mix_text_and_turns_train(tmp_path, tok):
    """A chat opening with the assistant (a greeting) has nothing before it to render; a conversational
    prompt may come with a plain-text completion (and the reverse): each trains on the answer only."""
    opening = [{"messages": [{"role": "assistant", "content": f"hello {i}"}, {"role": "user", "content": "hi"},
                             {"role": "assistant", "content": f"bye {i}"}]} for i in range(4)]
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "open.jsonl", opening)), tok)
    assert "hello 0" in trained_text(prepared.train[0], tok) and "bye 0" in trained_text(prepared.train[0], tok)
    for name, rows in {"turns_then_text": [{"prompt": [{"role": "user", "content": f"q{i}"}],
                                            "completion": f"answer {i}"} for i in range(3)],
                       "text_then_turns": [{"prompt": f"q{i}", "completion": [{"role": "assistant",
                                                                             "content": f"answer {i}"}]}
                                           for i in range(3)]}.items():
        prepared = data.prepare(cfg_for(write_jsonl(tmp_path / f"{name}.jsonl", rows)), tok)
        assert len(prepared.train) == 3
        assert all(trained_text(r, tok).startswith("answer ") and "q" not in trained_text(r, tok)
                   for r in prepared.train)


def test_an_eval_fraction_that_leaves_nothing_to_train_is_one_line(tmp_path, tok):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(2)]
    with pytest.raises(UsageError, match=r"data.eval_fraction=0.6 holds out 2 of the 2 usable examples"):
        data.prepare(cfg_for(write_jsonl(tmp_path / "two.jsonl", rows), eval_fraction=0.6), tok)


# ---- rows and files over the size limits (issue 33, item 9) -----------------------------------------
BIG = 20 << 20  # a 20 MB row: the report's 150 MB one grew a process to 23.7 GB until the OOM killer ended it


def _big_text(n: int) -> str:
    return ("the quick brown fox jumps over the lazy dog " * (n // 44 + 1))[:n]


def _write_big(path, fmt: str, n: int):
    """A valid data file of format `fmt` whose third row holds an `n`-character completion."""
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(4)]
    rows[2]["completion"] = _big_text(n)
    if fmt == "jsonl":
        write_jsonl(path, rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "completion"])
            w.writerows([r["prompt"], r["completion"]] for r in rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("fmt, where", [("jsonl", "line 3"), ("json", "item 3 of its JSON array"),
                                        ("csv", "row 4"), ("parquet", "row 3"), ("folder", "b.jsonl line 3")])
def test_a_row_over_the_limit_is_refused_before_datasets_reads_it(tmp_path, monkeypatch, fmt, where):
    """One error naming the file, the row and the limit; no datasets cache copy; the scan's own memory stays
    bounded (the JSONL line is read no further than the limit)."""
    import tracemalloc

    from kit.train import data_source

    cache = tmp_path / "cache"
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(cache))
    if fmt == "folder":
        (tmp_path / "parts").mkdir()
        write_jsonl(tmp_path / "parts" / "a.jsonl", [{"prompt": "q", "completion": "a"}] * 3)
        _write_big(tmp_path / "parts" / "b.jsonl", "jsonl", BIG)
        path = tmp_path / "parts"
    else:
        path = _write_big(tmp_path / f"d.{fmt}", fmt, BIG if fmt == "jsonl" else 3 << 20)
    cfg = config.load(None, [f"data.path={path}", "seq_len=64"])
    tracemalloc.start()
    try:
        with pytest.raises(UsageError) as e:
            data_source.load_located(cfg.data, cfg.seq_len)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert where in msg and "over the 1.0 MiB" in msg and "limit for seq_len=64" in msg, msg
    assert not cache.exists() or not any(cache.rglob("*.arrow")), "datasets wrote a cache copy"
    if fmt in ("jsonl", "folder"):
        assert peak < 8 << 20, f"the scan held {peak / 2**20:.0f} MiB of a 20 MiB line"


def test_the_row_limit_follows_seq_len_within_its_floor_and_cap():
    from kit.train.data_limits import ROW_CAP, ROW_FLOOR, row_limit

    assert row_limit(64) == ROW_FLOOR == 1 << 20
    assert row_limit(32768) == 32768 * 64
    assert row_limit(1 << 20) == ROW_CAP == 8 << 20


def test_rows_within_the_limit_load_as_before(tmp_path):
    from kit.train import data_source

    path = _write_big(tmp_path / "d.jsonl", "jsonl", 900_000)  # under the 1 MiB floor
    cfg = config.load(None, [f"data.path={path}", "seq_len=64"])
    assert len(data_source.load_located(cfg.data, cfg.seq_len)[0]) == 4


@pytest.mark.parametrize("fmt, factor", [("jsonl", 4), ("json", 12)])
def test_a_file_larger_than_memory_allows_is_refused(tmp_path, monkeypatch, fmt, factor):
    """The machine's available memory is what cannot be made small here: it is set to 64 MiB (a 23 GB box
    would need a file of gigabytes); the file and its scan are real."""
    from kit.train import data_limits, data_source

    rows = [{"prompt": f"q{i}", "completion": _big_text(4000)} for i in range(5000)]  # ~20 MB, rows of 4 kB
    path = tmp_path / f"d.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, rows)
    else:
        path.write_text(json.dumps(rows))
    monkeypatch.setattr(data_limits, "available_memory", lambda: 64 << 20)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = config.load(None, [f"data.path={path}", "seq_len=64"])
    with pytest.raises(UsageError, match=r"d\.%s is 19\.\d MiB; loading and tokenizing it takes ~\d+\.\d MiB of memory "
                                         r"on each of 2 processes, and this machine has 64\.0 MiB available" % fmt):
        data_source.load_located(cfg.data, cfg.seq_len)
    cfg = config.load(None, [f"data.path={path}", "seq_len=64", "data.split=train[:1%]"])  # a slice bounds it
    assert len(data_source.load_located(cfg.data, cfg.seq_len)[0]) == 50
