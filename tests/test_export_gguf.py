"""`kit export --gguf`: kit runs llama.cpp's own converter on the verified 16-bit export.

llama.cpp is not installed in CI, so two tests put a stand-in `convert_hf_to_gguf.py` in a folder
(the only mock here: a real subprocess that checks the arguments kit passes, which are those of
llama.cpp's converter — checked by hand against llama.cpp as vendored in llama-cpp-python 0.3.36).
The third runs the real converter when LLAMA_CPP_DIR points at a llama.cpp checkout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kit import cli
from kit.deliver import gguf
from tests.test_export import adapter  # noqa: F401  (fixture: a real PEFT adapter of the tiny model)

STAND_IN = '''\
import sys
args = sys.argv[1:]
folder, out, kind = args[0], args[args.index("--outfile") + 1], args[args.index("--outtype") + 1]
assert (__import__("pathlib").Path(folder) / "config.json").is_file(), "not a model folder"
if {fail!r}:
    print("Traceback (most recent call last):", file=sys.stderr)
    print("NotImplementedError: BPE pre-tokenizer was not recognized", file=sys.stderr)
    sys.exit(1)
open(out, "wb").write(b"GGUF" + kind.encode())
'''


def _llama(tmp_path: Path, fail: bool) -> Path:
    folder = tmp_path / "llama.cpp"
    folder.mkdir()
    (folder / gguf.CONVERTER).write_text(STAND_IN.format(fail=fail))
    return folder


def _error_line(capsys) -> str:
    """The one error line (stderr also carries transformers' progress bars), and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0], err[-2000:]
    return lines[0]


def _merged_is_whole(out: Path) -> None:
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors")), sorted(os.listdir(out))
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary folder was left behind"


def test_gguf_is_written_next_to_the_merged_weights(adapter, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "merged"
    code = cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--gguf", "Q8_0",
                     "--llama-cpp", str(_llama(tmp_path, fail=False)), "--json"])
    text = capsys.readouterr().out
    assert code == 0, text
    report = json.loads(text[text.index("{\n"):])
    assert Path(report["gguf"]) == out / "merged-q8_0.gguf"
    assert (out / "merged-q8_0.gguf").read_bytes() == b"GGUFq8_0", "kit passes the converter's own type name"
    _merged_is_whole(out)


def test_a_failing_converter_is_one_line_and_the_16_bit_export_is_kept(adapter, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "merged"
    code = cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--gguf", "q8_0",
                     "--llama-cpp", str(_llama(tmp_path, fail=True))])
    err = _error_line(capsys)
    assert code == 1
    assert err.startswith("error: convert_hf_to_gguf.py failed: NotImplementedError: BPE"), err
    assert f"the verified 16-bit export in {out} is complete and kept" in err
    _merged_is_whole(out)
    assert not list(out.glob("*.gguf"))


@pytest.mark.skipif(not (Path(os.environ.get("LLAMA_CPP_DIR", "/nonexistent")) / gguf.CONVERTER).is_file(),
                    reason="llama.cpp's convert_hf_to_gguf.py is not here (set LLAMA_CPP_DIR to run this)")
def test_the_real_converter_maps_the_export_and_refuses_the_tiny_tokenizer(adapter, tmp_path, capsys):  # noqa: F811
    """The real converter reads kit's merged folder, maps every tensor and then identifies the
    vocabulary by a hash of known tokenizers: the tiny model's own trained tokenizer is not one
    (a real Qwen3's is), so this is the refusal a user with an unusual tokenizer would see."""
    out = tmp_path / "merged"
    code = cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--gguf", "q8_0"])
    err = _error_line(capsys)
    assert code == 1
    assert "BPE pre-tokenizer was not recognized" in err and "is complete and kept" in err, err
    _merged_is_whole(out)


def test_llama_cpp_dir_comes_from_the_flag_alone_when_given(tmp_path, monkeypatch):
    import kit.errors

    found = _llama(tmp_path, fail=False)
    monkeypatch.setenv("LLAMA_CPP_DIR", str(found))
    assert gguf.find_llama_cpp(None) == found  # no flag: $LLAMA_CPP_DIR
    # A wrong --llama-cpp is an error even where $LLAMA_CPP_DIR would do: it is not quietly replaced.
    with pytest.raises(kit.errors.UsageError, match=f"not found in {tmp_path / 'nowhere'}"):
        gguf.find_llama_cpp(str(tmp_path / "nowhere"))


def test_a_k_quant_without_llama_quantize_is_refused_before_the_merge(adapter, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr("shutil.which", lambda name: None)
    out = tmp_path / "merged"
    code = cli.main(["export", "--adapter", str(adapter), "-o", str(out), "--gguf", "Q4_K_M",
                     "--llama-cpp", str(_llama(tmp_path, fail=False))])
    assert code == 2 and "has no built llama-quantize" in _error_line(capsys)
    assert not out.exists(), "refused before the merge"
