"""Facts about the whole notebook that the per-cell rewrites need, read once from its `ast`.

Where training happens (the last top-level statement that trains, and the last one that needs
every rank), which names are trainers, which functions the notebook defines that train or
evaluate, the notebook's own seed, whether it talks to the Hub, and what it writes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from kit.notebooks.convert.logins import HF_SECRET_WORDS

# Statements are numbered (cell, index of the top-level statement in the cell).
Where = tuple[int, int]
DEFAULT_SEED = 42
COLLECTIVE_METHODS = {"train", "evaluate", "predict"}
HUB_WRITES = {"push_to_hub", "push_to_hub_merged", "push_to_hub_gguf", "upload_folder", "upload_file",
              "create_repo"}
SECRET_GETTERS = {"get_secret", "userdata.get"}
TRACKERS = ("wandb.", "trackio.", "mlflow.", "comet_ml.")  # tracker calls: rank 0's, like prints


def calls_of(node: ast.AST):
    """The calls a statement makes when it runs: not those inside the functions it defines."""
    stack = [node]
    while stack:
        here = stack.pop()
        if here is not node and isinstance(here, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                  ast.Lambda)):
            continue
        if isinstance(here, ast.Call):
            yield ast.unparse(here.func), here
        stack.extend(ast.iter_child_nodes(here))


@dataclass
class Facts:
    trainers: set[str] = field(default_factory=set)
    train_funcs: set[str] = field(default_factory=set)  # notebook functions that train
    collective_funcs: set[str] = field(default_factory=set)  # ... that train, evaluate or predict
    statements: list[tuple[Where, ast.stmt]] = field(default_factory=list)
    last_train: Where | None = None
    last_collective: Where | None = None
    seed: int = DEFAULT_SEED
    seed_from: str = ""  # where the seed came from; "" when kit chose it
    uses_hub: bool = False  # pushes, logs in or reads a Hub token
    secret_names: frozenset[str] = frozenset()  # names assigned from a Kaggle/Colab secret getter
    reads: list[Where] = field(default_factory=list)  # statements that load something back
    together: frozenset[str] = frozenset()  # functions every rank calls together (`together_functions`)
    trackers: tuple[str, ...] = TRACKERS  # and `run.` where the notebook set `run = wandb.init(...)`

    def is_training(self, func: str, call: ast.Call) -> bool:
        if func == "unsloth_train" or func in self.train_funcs:
            return True
        if func == "notebook_launcher" and call.args and ast.unparse(call.args[0]) in self.train_funcs:
            return True
        return func.endswith(".train") and self._is_trainer(func[: -len(".train")])

    def is_collective(self, func: str, call: ast.Call) -> bool:
        """A call every rank must make together: the Trainer's train/evaluate/predict."""
        if self.is_training(func, call) or func in self.collective_funcs:
            return True
        owner, _, method = func.rpartition(".")
        return method in COLLECTIVE_METHODS and self._is_trainer(owner)

    def _is_trainer(self, owner: str) -> bool:
        return "trainer" in owner.lower() or owner in self.trainers

    def after_training(self, where: Where) -> bool:
        """True past the last statement that needs every rank: rank 0 runs it alone."""
        return self.last_collective is not None and where > self.last_collective

    def read_after(self, where: Where) -> bool:
        return any(r > where for r in self.reads)


READERS = ("from_pretrained", "load_dataset", "load_from_disk", "read_csv", "read_json", "open", "load")


def gather(trees: list[tuple[int, ast.Module]]) -> Facts:
    facts = Facts()
    defs: dict[str, ast.AST] = {}
    for cell, tree in trees:
        for i, stmt in enumerate(tree.body):
            facts.statements.append(((cell, i), stmt))
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[stmt.name] = stmt
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func).endswith("Trainer"):
                facts.trainers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    # A function that calls a training function trains too: iterate until nothing new is found.
    for kind, test in (("train_funcs", facts.is_training), ("collective_funcs", facts.is_collective)):
        found = getattr(facts, kind)
        while True:
            new = {name for name, d in defs.items() if name not in found and any(
                test(f, c) for n in d.body for f, c in calls_of(n))}
            if not new:
                break
            found |= new
    for where, stmt in facts.statements:
        calls = list(calls_of(stmt))
        if any(facts.is_training(f, c) for f, c in calls):
            facts.last_train = where
        if any(facts.is_collective(f, c) for f, c in calls):
            facts.last_collective = where
        if any(f.rsplit(".", 1)[-1] in READERS for f, _ in calls):
            facts.reads.append(where)
    facts.together = together_functions(trees)
    facts.trackers = TRACKERS + tuple(dict.fromkeys(
        f"{ast.unparse(t)}." for _, tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Call) and ast.unparse(n.value.func).startswith(TRACKERS)
        for t in n.targets if isinstance(t, (ast.Name, ast.Attribute))))
    facts.seed, facts.seed_from = _seed([t for _, t in trees])
    facts.uses_hub = _uses_hub([t for _, t in trees])
    facts.secret_names = frozenset(
        t.id for _, tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
        and ast.unparse(n.value.func).endswith(tuple(SECRET_GETTERS)) for t in n.targets if isinstance(t, ast.Name))
    return facts


KIT_MODULES = {"torch": "torch", "os": "os"}  # names kit's rewrites inside the cells use, and their module


def rebound_modules(trees: list[tuple[int, ast.Module]]) -> frozenset[str]:
    """Of `KIT_MODULES`, the names the notebook binds to something else somewhere (`torch = None`,
    `import torch as th; torch = ...`, `def f(torch)`, `for os in ...`): there kit's rewrites use
    the rank block's `_kit_torch`/`_kit_os` instead."""
    found = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                found.add(node.id)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Import):
                found |= {a.asname for a in node.names if a.asname and a.name != KIT_MODULES.get(a.asname)}
            elif isinstance(node, ast.ImportFrom):
                found |= {a.asname or a.name for a in node.names}
    return frozenset(found & set(KIT_MODULES))


RANK_WORDS = re.compile(r"(?i)rank|is_main|process_zero|main_process|process_index")


def rank_dependent(test: str) -> bool:
    """A condition that may differ between ranks (`is_main`, `trainer.is_world_process_zero()`, RANK)."""
    return bool(RANK_WORDS.search(test))


def together_functions(trees: list[tuple[int, ast.Module]]) -> frozenset[str]:
    """The notebook's top-level functions that every rank calls together, and only so: each use of the
    name is a direct call (`f(...)`, `x = f(...)`, `notebook_launcher(f, ...)`) in a top-level
    statement, or in a block of one that every rank enters (no `if` on the rank, no `while`, no
    `except`), or in another such function. A barrier inside one is reached by every rank; in a
    function passed as a value (a callback), called under a rank test or inside `print(f())`, it may not be."""
    defs = {s.name: s for _, t in trees for s in t.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls: dict[str, list[str | None]] = {name: [] for name in defs}  # name -> the function each call is in

    def direct(stmt: ast.stmt) -> str | None:
        value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id == "notebook_launcher" and value.args and isinstance(value.args[0], ast.Name):
                return value.args[0].id
            return value.func.id
        return None

    def block(stmts: list[ast.stmt], where: str | None, together: bool) -> None:
        for stmt in stmts:
            name = direct(stmt)
            skip = None
            if name in calls:
                calls[name].append(where if together else "")
                skip = stmt.value.args[0] if name != getattr(stmt.value.func, "id", "") else stmt.value.func
            for part in _own_parts(stmt):  # any other use of the name: not a call every rank makes together
                for node in ast.walk(part):
                    if isinstance(node, ast.Name) and node.id in calls and node is not skip \
                            and isinstance(node.ctx, ast.Load):
                        calls[node.id].append("")
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                block(stmt.body, stmt.name if where is None and stmt.name in defs else "", True)
            elif isinstance(stmt, ast.ClassDef):
                block(stmt.body, "", True)
            elif isinstance(stmt, ast.If):
                here = together and not rank_dependent(ast.unparse(stmt.test))
                block(stmt.body, where, here)
                block(stmt.orelse, where, here)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                block(stmt.body, where, together)
                block(getattr(stmt, "orelse", []), where, together)
            elif isinstance(stmt, ast.While):
                block(stmt.body, where, False)
                block(stmt.orelse, where, False)
            elif isinstance(stmt, ast.Try):
                block(stmt.body, where, together)
                block(stmt.orelse, where, together)
                for h in stmt.handlers:
                    block(h.body, where, False)
                block(stmt.finalbody, where, False)

    for _, tree in trees:
        block(tree.body, None, True)
    found: set[str] = set()
    while True:  # a call from inside another such function counts once that function does
        new = {n for n, ws in calls.items() if n not in found and ws and all(w is None or w in found for w in ws)}
        if not new:
            return frozenset(found)
        found |= new


def _own_parts(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions of `stmt` itself, without the statements in its blocks (walked on their own)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*stmt.decorator_list, stmt.args] + ([stmt.returns] if stmt.returns else [])
    if isinstance(stmt, ast.ClassDef):
        return [*stmt.decorator_list, *stmt.bases, *stmt.keywords]
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.target, stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return list(stmt.items)
    if isinstance(stmt, ast.Try):
        return [h.type for h in stmt.handlers if h.type is not None]
    return [stmt]


def _seed(trees: list[ast.Module]) -> tuple[int, str]:
    """The notebook's own seed, best source first: the training arguments' `seed=`, `set_seed(N)`,
    a `SEED = N` setting, then any other `seed=`/`random_state=` (Unsloth's LoRA `random_state`)."""
    found: list[tuple[int, int, str]] = []  # (rank, value, where)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                for k in node.keywords:
                    if k.arg in ("seed", "random_state") and isinstance(k.value, ast.Constant) \
                            and isinstance(k.value.value, int) and not isinstance(k.value.value, bool):
                        rank = 0 if func.endswith(("Config", "Arguments")) else 3
                        found.append((rank, k.value.value, f"{func}({k.arg}={k.value.value})"))
                if func.endswith("set_seed") and node.args and isinstance(node.args[0], ast.Constant) \
                        and isinstance(node.args[0].value, int):
                    found.append((1, node.args[0].value, f"set_seed({node.args[0].value})"))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, int) and not isinstance(node.value.value, bool) \
                    and any(isinstance(t, ast.Name) and t.id.lower() in ("seed", "random_seed") for t in node.targets):
                found.append((2, node.value.value, f"{ast.unparse(node.targets[0])} = {node.value.value}"))
    if not found:
        return DEFAULT_SEED, ""
    _, value, where = min(found, key=lambda f: f[0])
    return value, where


def live_nodes(tree: ast.AST):
    """`ast.walk`, without what cannot run: the body of `if False:`/`if 0:` (Unsloth's notebooks keep
    their save, merge and GGUF cells that way) and the `else:` of `if True:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, ast.Constant):
            stack.append(node.test)
            stack.extend(node.body if node.test.value else node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _uses_hub(trees: list[ast.Module]) -> bool:
    for tree in trees:
        for node in live_nodes(tree):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                short = func.rsplit(".", 1)[-1]
                if short in HUB_WRITES or short in ("login", "notebook_login", "interpreter_login"):
                    return True
                if (short == "get_secret" or func.endswith("userdata.get")) and _names_hf_secret(node):
                    return True
                # hub_model_id alone names a repo that only push_to_hub=True ever writes to
                if any(k.arg == "push_to_hub" and ast.unparse(k.value) not in ("False", "None") for k in node.keywords):
                    return True
    return False


def _names_hf_secret(call: ast.Call) -> bool:
    """A secret lookup that may be the Hub token: its name says HF/HUGGING, or is not a literal."""
    if not call.args or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        return True
    return any(w in call.args[0].value.upper() for w in HF_SECRET_WORDS)


def vllm_refusal(trees: list[tuple[int, ast.Module]], facts: Facts) -> tuple[int, int, str] | None:
    """vLLM that cannot run inside a torchrun rank: (cell, line, why), or None.

    A vLLM `LLM(...)` before the end of training would start one engine per rank inside the
    process group; after it, rank 0 runs it alone with no process group left. (Unsloth's
    `fast_inference=True` and TRL's `use_vllm=True` are converted to transformers generation:
    `kit.notebooks.convert.vllm_off`.)
    """
    for (cell, i), stmt in facts.statements:
        if facts.after_training((cell, i)):
            break
        for func, call in calls_of(stmt):
            if func in ("LLM", "vllm.LLM"):
                return (cell, call.lineno, "vLLM's LLM() before training ends would start one engine per torchrun "
                                           "rank inside its process group: move it after training, where "
                                           "rank 0 runs it alone, or run it in its own notebook")
    return None
