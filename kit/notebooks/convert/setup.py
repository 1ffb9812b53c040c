"""Distributed or device setup a notebook does outside its Trainer, which torchrun and the Trainer do
for every rank already: made rank-correct, or removed with the reason.

- `os.environ["CUDA_VISIBLE_DEVICES"] = "0"` (or `%env`, `setdefault`, `putenv`) and the variables
  torchrun sets itself (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): on every rank they
  would put all ranks on one GPU, or give every rank the same place in the group. Removed.
- `torch.cuda.set_device(…)`: the rank block already set each rank's own GPU. Removed.
- `Accelerator(fsdp_plugin=…, mixed_precision=…)` before the Trainer: accelerate keeps that state for
  the whole process, and the Trainer's own Accelerator then inherits it (FSDP-wrapping a 4-bit model
  meant for DDP). The state-setting arguments go; `accelerator.device`/`is_main_process` still work.
  `accelerator.prepare_model(model)` / `prepare(…)`: the Trainer wraps the model for DDP itself, so the
  call becomes its arguments.
- An install run from Python (`os.system("pip install …")`, `subprocess.run([... "pip", "install" ...])`),
  at any depth: every rank would install into one environment at once. Removed and listed with the
  shell lines to run before launching.

After training rank 0 runs alone, and all of this is left as it is there.
"""

from __future__ import annotations

import libcst as cst

from kit.notebooks.convert.cells import is_install
from kit.notebooks.convert.syntax import call_name, code, drop_kwarg, kwarg

TORCHRUN_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
DEVICE_VARIABLES = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
SHELL_CALLS = {"os.system", "os.popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
               "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput"}
# Accelerator(...) arguments that set accelerate's process-wide state, which the Trainer's Accelerator inherits.
STATE_ARGUMENTS = ("fsdp_plugin", "deepspeed_plugin", "megatron_lm_plugin", "torch_tp_plugin", "parallelism_config",
                   "mixed_precision", "cpu", "dynamo_backend", "dynamo_plugin", "gradient_accumulation_steps")
PREPARE = {"prepare", "prepare_model"}


def _env_name(node: cst.BaseExpression) -> str | None:
    """`"CUDA_VISIBLE_DEVICES"` of `os.environ["CUDA_VISIBLE_DEVICES"]`, if `node` is one."""
    if isinstance(node, cst.Subscript) and code(node.value).endswith("os.environ") and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return index.value.evaluated_value
    return None


def _env_why(name: str) -> str:
    if name in DEVICE_VARIABLES:
        return (f"on every rank it would hide each rank's own GPU (all would train on one, or fail at set_device); "
                f"torchrun gives each rank its GPU: to choose GPUs, put {name}=0,1 before the torchrun command")
    return f"torchrun sets {name} for each rank; the notebook's value would give every rank the same place"


def removed_setup(small: cst.BaseSmallStatement) -> str | None:
    """Why `small` goes (a reason for the change list), or None to keep it."""
    if isinstance(small, cst.Assign):
        names = [_env_name(t.target) for t in small.targets]
        name = next((n for n in names if n in DEVICE_VARIABLES | TORCHRUN_VARIABLES), None)
        if name is not None:
            return f"`{code(small).strip()[:60]}` removed: {_env_why(name)}"
        return None
    value = getattr(small, "value", None)
    if not (isinstance(small, cst.Expr) and isinstance(value, cst.Call)):
        return None
    name = call_name(value)
    if name.endswith(("os.environ.setdefault", "os.putenv")) and value.args and isinstance(
            value.args[0].value, cst.SimpleString):
        var = value.args[0].value.evaluated_value
        if var in DEVICE_VARIABLES | TORCHRUN_VARIABLES:
            return f"`{code(value)[:60]}` removed: {_env_why(var)}"
    if name == "torch.cuda.set_device" or name.endswith(".cuda.set_device"):
        return (f"`{code(value)[:60]}` removed: the rank block already set each rank's own GPU (LOCAL_RANK); "
                "this would move every rank to one GPU")
    return None


def install_command(call: cst.Call) -> str | None:
    """The shell command of an install run from Python (`os.system("pip install x")`), else None."""
    if call_name(call) not in SHELL_CALLS and call_name(call) != "pip.main" or not call.args:
        return None
    first = call.args[0].value
    if isinstance(first, (cst.List, cst.Tuple)):
        words = [e.value.evaluated_value if isinstance(e.value, cst.SimpleString) else
                 ("python" if code(e.value) == "sys.executable" else "…") for e in first.elements]
        text = " ".join(str(w) for w in words)
    elif isinstance(first, cst.SimpleString):
        text = str(first.evaluated_value)
    else:
        text = code(first)
        text = text.lstrip("frbuFRBU").strip("'\"")  # an f-string: shown as written
    if call_name(call) == "pip.main":
        text = "pip " + text
    parts = [p.strip() for p in text.replace("&&", ";").split(";")]
    return text if any(is_install("!" + p) for p in parts) else None


def unprepared(call: cst.Call, accelerators: frozenset[str]) -> tuple[cst.BaseExpression, str] | None:
    """`accelerator.prepare_model(model)` as `model` (several arguments: their tuple), with the reason."""
    if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in PREPARE or not call.args:
        return None
    owner = code(call.func.value)
    if owner not in accelerators and "accelerator" not in owner.lower():
        return None
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    values = [a.value for a in call.args]
    new = values[0] if len(values) == 1 else cst.Tuple([cst.Element(v) for v in values])
    return new, (f"{call_name(call)}({', '.join(code(v) for v in values)}) → {code(new)}: the Trainer wraps the model "
                 "for DDP itself (and builds its own optimizer and data loaders); prepared by accelerate first, it "
                 "would be wrapped twice")


def plain_accelerator(call: cst.Call) -> tuple[cst.Call, str] | None:
    """`Accelerator(fsdp_plugin=…, mixed_precision=…)` without the arguments that set process-wide state."""
    if call_name(call).rsplit(".", 1)[-1] != "Accelerator":
        return None
    dropped = [k for k in STATE_ARGUMENTS if kwarg(call, k) is not None]
    if not dropped:
        return None
    for k in dropped:
        call = drop_kwarg(call, k)
    return call, (f"Accelerator(): {', '.join(dropped)} removed: accelerate keeps them for the whole process, and "
                  "the Trainer's own Accelerator would inherit them (an FSDP plugin FSDP-wraps the model meant for "
                  "DDP); torchrun and TrainingArguments set up the distributed run")
