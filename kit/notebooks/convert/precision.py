"""What `kit convert --precision` changes in a call besides fp16/bf16 on the training arguments.

--precision fp16 is the pre-Ampere path (T4, V100, P100): load and compute dtypes follow it (no
native bf16), and what only Ampere and newer run goes: FlashAttention 2/3 becomes SDPA, and
tf32=True (which Trainer refuses on those GPUs) becomes False. --precision bf16 moves dtypes only.
"""

from __future__ import annotations

import libcst as cst

from kit.notebooks.convert.syntax import code, kwarg, set_kwarg

PRECISIONS = {"fp16": (True, False), "bf16": (False, True), "fp32": (False, False)}  # (fp16, bf16)
DTYPE_KEYWORDS = {"torch_dtype", "dtype", "bnb_4bit_compute_dtype"}
DTYPES = {"torch.float16", "torch.bfloat16"}
AMPERE_ATTENTION = {"flash_attention_2", "flash_attention_3"}


def follow_precision(call: cst.Call, name: str, precision: str) -> tuple[cst.Call, list[str]]:
    """`call` with its dtypes (and, under fp16, its Ampere-only settings) following `precision`; the notes."""
    notes = []
    want = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(precision)
    for arg in call.args if want else ():
        if arg.keyword and arg.keyword.value in DTYPE_KEYWORDS and code(arg.value) in DTYPES - {want}:
            call = set_kwarg(call, arg.keyword.value, want)
            notes.append(f"{name}: {arg.keyword.value}={code(arg.value)} → {want} (--precision {precision})")
    if precision != "fp16":
        return call, notes
    attn = kwarg(call, "attn_implementation")
    if attn is not None and isinstance(attn.value, cst.SimpleString) and attn.value.evaluated_value in AMPERE_ATTENTION:
        call = set_kwarg(call, "attn_implementation", '"sdpa"')
        notes.append(f"{name}: attn_implementation={code(attn.value)} → \"sdpa\" (--precision fp16: FlashAttention "
                     "needs an Ampere or newer GPU; a T4 or V100 runs PyTorch's SDPA)")
    tf32 = kwarg(call, "tf32")
    if tf32 is not None and code(tf32.value) == "True":
        call = set_kwarg(call, "tf32", "False")
        notes.append(f"{name}: tf32=True → False (--precision fp16: TF32 is Ampere's; Trainer refuses it on a T4)")
    return call, notes
