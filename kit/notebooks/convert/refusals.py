"""What `kit convert` refuses, because the script would hang or mean something else under torchrun.

Each refusal is one line naming the cell, the line and why, and what to do instead (exit 2,
nothing written).
"""

from __future__ import annotations

import ast

from kit.notebooks.convert.cells import TRAINING_WORDS
from kit.notebooks.convert.facts import Facts, vllm_refusal
from kit.notebooks.convert.rewards import reward_problem
from kit.errors import UsageError
from kit.notebooks.convert.syntax import clip
from kit.machine.command import launch_command

IPYTHON_NAMES = {"get_ipython", "Out", "In", "_oh", "_ih", "_dh", "_", "__", "___", "_i", "_ii", "_iii"}


def check_convertible(trees: list[tuple[int, ast.Module]], facts: Facts) -> None:
    """Refuse what cannot run unattended under torchrun; refuse a notebook that does not train."""
    nodes = [n for _, t in trees for n in ast.walk(t)]
    stored = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    stored |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    problems = []
    for cell, tree in trees:
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 0)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if any(m.split(".")[0] == "ipywidgets" for m in mods):
                    problems.append((cell, line, "ipywidgets need a notebook front end, and under "
                                                 "torchrun nobody can click them: use constants or flags"))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in stored and (
                    node.id in IPYTHON_NAMES or (node.id[:1] == "_" and node.id.lstrip("_i").isdigit())):
                problems.append((cell, line, f"`{node.id}` is IPython's interactive state, which a "
                                             "script does not have: assign the value to a name"))
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "input":
                problems.append((cell, line, "input() waits for keyboard input that no torchrun rank "
                                             "can get: use a constant or os.environ"))
    if (vllm := vllm_refusal(trees, facts)) is not None:
        problems.append(vllm)
    if (reward := reward_problem(trees)) is not None:
        problems.append(reward)
    if problems:
        cell, line, what = min(problems)
        raise UsageError(f"cell {cell}, line {line}: {what}; then convert again")
    if facts.last_train is None and (accel := _accelerate_loop(trees)) is not None:
        raise UsageError(f"cell {accel[0]}, line {accel[1]}: this notebook trains in its own loop through accelerate's "
                         "Accelerator, which is already a multi-GPU program: put that function in a .py file and "
                         "run `accelerate launch --num_processes 2 FILE.py` (kit converts Trainer code only)")
    if facts.last_train is None:
        raise UsageError(_why_no_training(trees))


def _why_no_training(trees: list[tuple[int, ast.Module]]) -> str:
    """The refusal of a notebook that does not train through a Trainer: which cell, and what it does instead."""
    found: dict[str, tuple[int, int, str]] = {}
    for cell, tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            short = func.rsplit(".", 1)[-1]
            where = (cell, node.lineno, clip(func, 40))
            if short == "backward" and isinstance(node.func, ast.Attribute):
                found.setdefault("loop", where)
            elif short == "step" and "optim" in func.lower():
                found.setdefault("step", where)
            elif short == "fit" and isinstance(node.func, ast.Attribute):
                found.setdefault("fit", where)
            elif short.endswith("Trainer"):
                found.setdefault("trainer", where)
    if "loop" in found or "step" in found:
        cell, line, func = found.get("loop") or found["step"]
        return (f"cell {cell}, line {line}: this notebook trains in its own PyTorch loop (`{func}()`), not through "
                "a Hugging Face Trainer: under torchrun each rank would train its own copy on all the data, and "
                "kit does not add DistributedDataParallel or a DistributedSampler to a hand-written loop: port the "
                "loop to transformers' Trainer, or to accelerate and run `accelerate launch`")
    if "fit" in found:
        cell, line, func = found["fit"]
        return (f"cell {cell}, line {line}: `{func}()` trains outside a Hugging Face Trainer (Keras, Lightning, "
                "scikit-learn…), which kit does not convert: Lightning runs DDP itself (Trainer(strategy=\"ddp\")); "
                "kit converts Trainer code only")
    if "trainer" in found:
        cell, line, func = found["trainer"]
        return (f"cell {cell}, line {line}: `{func}(…)` builds a trainer, but no cell calls its train(): add "
                "`trainer.train()` where the notebook trains, and convert again")
    code = [cell for cell, tree in trees if tree.body]
    cells = f"cells {code[0]}-{code[-1]}" if len(code) > 1 else f"cell {code[0]}" if code else "no cell holds code"
    return (f"{cells}: no training found (no Trainer's train() call, no training loop): kit convert turns a "
            "notebook that trains into a torchrun script")


def check_launched(launches: list[tuple[int, str, str]], written: dict) -> None:
    """A notebook with no training in its cells that launches a script it did not write: the script
    trains, and it is a script already (its cells hold nothing to convert)."""
    outside = [(cell, line, script) for cell, line, script in launches if script not in written]
    if outside:
        trains = [x for x in outside if TRAINING_WORDS.search(x[2])]
        cell, line, script = (trains or outside)[0]  # the training launch, before a merge or an eval
        if script.endswith(".py"):
            raise UsageError(f"no cell trains; cell {cell} launches {script} (`{clip(line, 60)}`): a script that "
                             "trains is one already, so run that command in a terminal (kit converts training "
                             "done in cells)")
        what = f"the module {script[3:]}" if script.startswith("-m ") else f"`{script}`"
        raise UsageError(f"cell {cell}: `{clip(line, 60)}` trains through {what}, a training program that starts "
                         "and distributes its own processes from its config; no cell of the notebook trains, so "
                         "there is nothing for kit to convert: run that command in a terminal, with the number "
                         "of GPUs in its config or launcher")


def check_written_script(name: str, cell: int, launch: tuple[int, str] | None, tree: ast.Module) -> None:
    """A `%%writefile` script the notebook launches but that kit cannot convert: say what it is."""
    imports = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    names = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    how = f", which cell {launch[0]} launches with `{launch[1][:60]}`" if launch else ""
    if "Accelerator" in names or "init_process_group" in {n.rsplit(".", 1)[-1] for n in names}:
        raise UsageError(f"cell {cell}: the notebook writes {name}{how}: that script runs its own distributed "
                         f"loop (Accelerator/init_process_group), so it is already a multi-GPU program: write "
                         f"it out and run `{launch_command(2, script=name)}` or `accelerate "
                         "launch` as it is")
    raise UsageError(f"cell {cell}: the notebook writes {name}{how}, but no Trainer's train() call was found "
                     "in it or in the notebook: kit converts Trainer code only")


def _accelerate_loop(trees: list[tuple[int, ast.Module]]) -> tuple[int, int] | None:
    """(cell, line) of the notebook's `Accelerator(...)` or `notebook_launcher(...)`, if it has one."""
    for cell, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).rsplit(".", 1)[-1] in (
                    "Accelerator", "notebook_launcher"):
                return cell, node.lineno
    return None
