"""GGUF through llama.cpp's own tools, never a converter of kit's: `convert_hf_to_gguf.py` writes the
file, `llama-quantize` makes the K-quants. Types are named as llama.cpp names them.

Get llama.cpp (the converter is a Python script; llama-quantize is a C++ binary to build):

    git clone --depth 1 https://github.com/ggml-org/llama.cpp
    pip install -r llama.cpp/requirements/requirements-convert_hf_to_gguf.txt
    cmake -S llama.cpp -B llama.cpp/build && cmake --build llama.cpp/build --target llama-quantize -j

then `kit export ... --gguf Q4_K_M --llama-cpp llama.cpp` (or set LLAMA_CPP_DIR).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kit.errors import KitError, UsageError

CONVERTER = "convert_hf_to_gguf.py"
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "tq1_0", "tq2_0")  # convert_hf_to_gguf.py --outtype
QUANTIZE_TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "Q5_0", "Q5_1",
                  "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")  # llama-quantize
BITS = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "tq1_0": 1.7, "tq2_0": 2.1, "Q2_K": 3.0, "Q3_K_S": 3.5,
        "Q3_K_M": 3.9, "Q3_K_L": 4.3, "Q4_0": 4.6, "Q4_1": 5.0, "Q4_K_S": 4.6, "Q4_K_M": 4.9, "Q5_0": 5.5,
        "Q5_1": 6.0, "Q5_K_S": 5.5, "Q5_K_M": 5.7, "Q6_K": 6.6, "IQ4_NL": 4.6, "IQ4_XS": 4.3}
HOW_TO = ("git clone --depth 1 https://github.com/ggml-org/llama.cpp && pip install -r "
          "llama.cpp/requirements/requirements-convert_hf_to_gguf.txt, then pass --llama-cpp llama.cpp")
TIMEOUT_S = 3 * 3600


def check_type(qtype: str) -> str:
    """The llama.cpp name of `qtype` (converter types lower case, llama-quantize types upper case)."""
    if qtype.lower() in OUTTYPES:
        return qtype.lower()
    if qtype.upper() in QUANTIZE_TYPES:
        return qtype.upper()
    raise UsageError(f"--gguf {qtype}: not a llama.cpp type; converter types: {', '.join(OUTTYPES)}; "
                     f"llama-quantize types: {', '.join(QUANTIZE_TYPES)}")


def gguf_bytes(qtype: str, sixteen_bit_bytes: int) -> int:
    """Disk for the GGUF file, plus the f16 intermediate llama-quantize reads."""
    size = int(sixteen_bit_bytes * BITS[qtype] / 16)
    return size + (sixteen_bit_bytes if qtype in QUANTIZE_TYPES else 0)


def find_llama_cpp(explicit: str | None) -> Path:
    """`--llama-cpp DIR` when given (and only it: a wrong flag is not quietly replaced), else
    $LLAMA_CPP_DIR, ./llama.cpp or ~/llama.cpp."""
    places = [explicit] if explicit else [os.environ.get("LLAMA_CPP_DIR"), "llama.cpp", str(Path.home() / "llama.cpp")]
    for cand in places:
        if cand and (Path(cand) / CONVERTER).is_file():
            return Path(cand)
    where = f" in {explicit}" if explicit else ""
    raise UsageError(f"GGUF needs llama.cpp's {CONVERTER}, not found{where}: {HOW_TO} (or set LLAMA_CPP_DIR)")


def check_tools(qtype: str, llama: Path) -> None:
    """Before the merge: a K-quant also needs a built llama-quantize (the merge takes minutes to hours)."""
    if qtype not in OUTTYPES:
        _quantizer(llama)


def _quantizer(llama: Path) -> str:
    for cand in (llama / "build" / "bin" / "llama-quantize", llama / "llama-quantize"):
        if cand.is_file():
            return str(cand)
    found = shutil.which("llama-quantize")
    if found:
        return found
    raise UsageError(f"{llama} has no built llama-quantize (needed for K-quants): cmake -S {llama} -B {llama}/build "
                     f"&& cmake --build {llama}/build --target llama-quantize, or use --gguf q8_0")


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise KitError(f"{Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name} ran over {TIMEOUT_S} s", 1) from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KitError(f"{Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name} failed: {last[0][:300]}", 1)


def convert(merged_dir: Path, qtype: str, llama: Path) -> Path:
    """`merged_dir/<name>-<type>.gguf` written by llama.cpp's own tools."""
    out = Path(merged_dir) / f"{Path(merged_dir).name}-{qtype}.gguf"
    converter = [sys.executable, str(llama / CONVERTER), str(merged_dir)]
    if qtype in OUTTYPES:
        _run(converter + ["--outfile", str(out), "--outtype", qtype])
        return out
    quantize = _quantizer(llama)
    f16 = out.with_name(out.stem + ".f16.tmp.gguf")
    try:
        _run(converter + ["--outfile", str(f16), "--outtype", "f16"])
        _run([quantize, str(f16), str(out), qtype])
    finally:
        f16.unlink(missing_ok=True)
    return out
