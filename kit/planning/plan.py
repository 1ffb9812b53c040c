"""The planner: a pure function of (machine facts, run config) → a plan with its reasons.

    plan = make_plan(kit.machine.gpu_table.synthesize("2xT4"), kit.planning.config.load("configs/qwen3-8b-qlora-kaggle-t4x2.yaml"))
    plan.strategy, plan.precision, plan.launch   # 'ddp', 'fp16', 'torchrun --standalone --nproc_per_node=2 train_ddp.py'

Decides precision, strategy (single | ddp | fsdp | model_parallel), micro-batch, accumulation,
gradient checkpointing, backend and optimizer, each with its Reason (a code and the numbers,
`kit.planning.reasons`; `kit.report.reasons` words them). When nothing fits
or the hardware cannot run the job it raises `CannotTrain`, whose `.plan` is the strategy-"none"
plan (reasons include the cheapest change that would fit), so `kit plan --json` can still print it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from kit.errors import CannotTrain, UsageError
from kit.machine import gpu_table, verdicts
from kit.machine.command import launch_command
from kit.planning import device_rules, hostram, memory, precision, shapes, speed, tracking, trainers
from kit.planning.fit import CHECKPOINTING_FROM_PARAMS
from kit.planning.reasons import Reason, why
from kit.planning.measured import MEASURED
from kit.planning.names import check_data
from kit.planning import nodes as nodes_mod
from kit.planning.fit import (batch_for_world, cheaper_change, fit, passed_over_words, rank_budget, search,
                              training_loop)
from kit.files import GIB

CPU_MAX_PARAMS = 1e9
CPU_ASSUMED_RAM = 8 * GIB  # a CPU plan's budget where the machine's RAM is unknown (it refuses nothing then)

__all__ = ["Plan", "batch_for_world", "make_plan"]


@dataclass(frozen=True)
class Plan:
    """How to run a config on a machine (see docs/CONTRACTS.md): decided once by `make_plan`, written
    whole into train_ddp.py as its PLAN (`to_dict`, read back by `from_dict`), and changed after that
    only by the pure settling functions of `kit.planning.settle`, each change a note."""

    precision: str = "fp32"
    strategy: str = "none"          # single | ddp | fsdp | model_parallel | none
    device: str = "cuda"            # cuda | cpu
    nproc: int = 1                  # processes torchrun starts
    per_device_batch: int = 1
    grad_accum: int = 1
    global_batch: int = 1
    gradient_checkpointing: bool = False
    backend: str = "transformers"   # transformers | unsloth
    optimizer: str = "adamw_torch"
    batching: str = "padded"        # padded | grouped | padding_free | packed (kit.planning.speed)
    kernels: str = "none"           # liger | none
    activation_offloading: bool = False  # checkpointed layer inputs kept in pinned CPU memory (kit.planning.speed)
    compile_layers: bool = False    # torch.compile of each decoder layer (kit.planning.speed)
    quantization: str | None = None  # "nf4" for QLoRA / a bnb-4bit checkpoint
    prequantized: bool = False      # the base checkpoint itself is 4-bit (so any method trains on a 4-bit base)
    reference: str | None = None    # dpo/kto: adapter_disabled | precomputed | model_copy (kit.planning.trainers)
    trainer: str = "sft"            # sft | dpo | kto | grpo: the TRL trainer the script builds (cfg.trainer)
    memory: dict = field(default_factory=lambda: {"per_gpu_bytes": 0, "budget_bytes": 0, "terms": {}})
    reasons: tuple = ()             # of kit.planning.reasons.Reason, in the order decided
    launch: str = ""
    model: str = ""
    gpu: str = ""
    gpus: int = 0                   # GPUs used per node (model parallel: all of them, in one process)
    nodes: int = 1                  # machines; nproc is per node
    node_launch: tuple = ()         # with nodes > 1: one torchrun command per node
    snippets: dict = field(default_factory=dict)     # with nodes > 1: {"slurm": ..., "skypilot": ...}

    @property
    def packed_as_rows(self) -> bool:
        """Packed sequences batched as rows, each with its own block-diagonal mask (kit.train.collate)."""
        return self.batching == "packed" and self.backend == "transformers"

    @property
    def padding_free(self) -> bool:
        """Whether TRL lays a micro-batch's rows end to end as one sequence (Unsloth's packed batches too)."""
        return self.batching == "padding_free" or (self.batching == "packed" and not self.packed_as_rows)

    def to_dict(self) -> dict:
        return asdict(self)  # each Reason as {"code", "figures"}

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        """The plan `to_dict` wrote (a script's PLAN; one rendered by an older kit holds fewer keys,
        the others take their defaults).

        Raises:
            UsageError: a key that is no field of a plan (an edited PLAN).
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in names)
        if unknown:
            raise UsageError(f"the plan has unknown key(s) {', '.join(map(repr, unknown))}: re-render the script "
                             "(python -m kit render …)")
        d = {**d, "reasons": tuple(Reason.from_dict(r) for r in d.get("reasons", ()))}
        return cls(**{k: tuple(v) if k == "node_launch" else v for k, v in d.items()})


class _Draft:
    """The plan while `make_plan` decides it, field by field; `freeze` is the Plan it comes to."""

    def __init__(self, **values):
        self.__dict__.update({f.name: getattr(Plan(), f.name) for f in fields(Plan)}, **values)
        self.reasons, self.node_launch = list(self.reasons), list(self.node_launch)
        self.memory = dict(self.memory)

    def said(self, *reasons) -> None:
        """Collect the Reasons a decision returned, in order (None: it had nothing to say)."""
        self.reasons += [r for r in reasons if r is not None]

    def freeze(self) -> Plan:
        return Plan.from_dict(dict(self.__dict__))


def make_plan(facts, cfg, nproc: int | None = None, *, nodes: int = 1,
              rdzv_endpoint: str | None = None) -> Plan:
    """Plan `cfg` on the machine `facts` describes (a Facts or its dict); `nproc` limits the GPUs used.

    `nodes`: that many machines like `facts` (GPUs per node), started by torchrun's c10d
    rendezvous at `rdzv_endpoint` (HOST:PORT of node 0; default $MASTER_ADDR:29500).

    One pass: the speed choices (backend, batching, kernels, activation offloading, compiled layers)
    are made for each candidate strategy and checkpointing the search tries, and the memory of each
    is estimated for exactly those choices; the first that fits is the plan, with that estimate.
    Each decision returns its value and its Reason(s); they are collected here, in order.

    Raises:
        CannotTrain: the hardware cannot run it or it does not fit (`.plan` holds the "none" plan).
        UsageError: the model is unknown, the batch sizes do not divide, nproc exceeds the GPUs.
    """
    nodes_mod.check_nodes(nodes, nproc=nproc)
    endpoint = nodes_mod.check_endpoint(rdzv_endpoint or f"$MASTER_ADDR:{nodes_mod.DEFAULT_PORT}")
    facts = _as_facts(facts)
    model = shapes.model_facts(cfg.model, cfg.revision)
    # What the script would find only after loading the model: before any plan.
    shapes.check_seq_len(cfg, model.max_position)
    check_data(cfg.data.path)
    trainers.check(cfg)  # settings the trainer's TRL trainer cannot run: before any plan
    plan = _Draft(model=cfg.model, trainer=cfg.trainer, prequantized=model.prequantized is not None,
                  reference=trainers.reference(cfg)[0])
    plan.said(why("model", model=cfg.model, params=model.params, layers=model.layers, vocab=model.vocab,
                  source=model.source))
    # A tracker the machine's facts show missing: refused here, as the script refuses it at launch.
    plan.said(tracking.choose(cfg.report_to, tracking.installed_in(facts.packages), "on the machine planned for")[1])
    quantized = cfg.method == "qlora" or model.prequantized is not None
    if model.prequantized and cfg.method == "full":
        raise UsageError(f"{cfg.model} is a 4-bit checkpoint and cannot be fully fine-tuned: use method=lora, "
                         "or the unquantized model")
    if not facts.gpus:
        if nodes > 1:
            raise UsageError(f"--nodes {nodes} on CPU-only machines: multi-node training is for GPU machines")
        return _cpu_plan(facts, cfg, model, plan, nproc, quantized)

    plan.gpu, plan.gpus = _machine_gpus(facts.gpus), len(facts.gpus)  # what a refusal below was planned for
    v = verdicts.judge(facts)
    if not v.ok:
        _refuse(plan, v.summary if v.action in v.summary else f"{v.summary} {v.action}".strip())
    usable = [g for g in facts.gpus if g["index"] in v.usable_gpus]
    plan.said(*(why("gpu_unsupported", verdict=g["reason"]) for g in v.gpus if g["arch_supported"] is False))
    if v.mixed:
        names = ", ".join(sorted({g["name"] for g in usable}))
        _refuse(plan, f"mixed GPU models ({names}): every rank would run at the pace and memory of the "
                      "smallest; make only one model visible with CUDA_VISIBLE_DEVICES")
    if nproc is not None and not 1 <= nproc <= len(usable):
        raise UsageError(f"nproc {nproc}: this machine has {len(usable)} usable GPU{'' if len(usable) == 1 else 's'}")
    usable = usable[: nproc or len(usable)]
    gpu, n = usable[0], len(usable)
    plan.gpu, plan.gpus = gpu["name"], n  # the GPUs it was planned for, also when it is refused
    plan.precision = _precision(cfg, gpu, plan)
    if quantized:
        plan.quantization = "nf4"
        plan.said(why("qlora_prequantized", model=cfg.model) if model.prequantized and cfg.method != "qlora" else
                  why("qlora", saved_gib=5.7, slower_pct=19))
        if not (facts.packages or {}).get("bitsandbytes"):
            plan.said(why("bitsandbytes_missing"))
    plan.optimizer = _optimizer(cfg, facts, gpu)
    budget, held = rank_budget(usable)
    plan.said(held)
    plan.batching, batching_said = speed.batching(cfg, gpu)
    # A preference trainer pads its batches: the SFT batching reason would only be taken back.
    plan.said(batching_said if cfg.trainer == "sft" else None)
    plan.batching, trainer_said = trainers.plan_rules(cfg, plan.batching)
    plan.said(*trainer_said)
    loop = training_loop(facts)
    chosen = {}  # (strategy, checkpointing) -> (the speed choices for it, their Reasons); the same pure rules each time

    def choices(strategy: str, gc: bool) -> tuple[dict, list]:
        if (strategy, gc) not in chosen:
            chosen[strategy, gc] = _speed(cfg, facts, gpu, model, plan.batching, strategy, gc)
        return chosen[strategy, gc]

    ram = hostram.budget(facts.ram_bytes)
    found, passed_over = search(model, cfg, plan.precision, quantized, plan.optimizer, n, budget, loop=loop,
                                nodes=nodes, ram=ram,
                                speed=lambda strategy, gc: _as_run(choices(strategy, gc)[0], strategy, gc))
    plan.memory["budget_bytes"] = budget
    plan.nodes = nodes
    if found is None:
        gc = cfg.gradient_checkpointing != "off"  # show what the smallest replica would need
        est = memory.estimate(model, cfg, plan.precision, cfg.per_device_batch or 1, gc, quantized,
                              world_size=n, optimizer=plan.optimizer, **loop, batching=plan.batching)
        plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                           notes=[f"one replica at micro-batch {cfg.per_device_batch or 1}"] + est.notes)
        how = " with one full replica per GPU" if cfg.strategy == "ddp" and n > 1 else ""
        where = f"{nodes} nodes of {n}× {gpu['name']}" if nodes > 1 else f"{n}× {gpu['name']}"
        passed = f" (passed over {'; '.join(map(passed_over_words, passed_over))})" if passed_over else ""
        _refuse(plan, f"{cfg.model} ({cfg.method}, seq_len {cfg.seq_len}) does not fit on {where}{how}{passed}: "
                      + cheaper_change(model, cfg, plan.precision, plan.optimizer, n, budget, gpu["name"],
                                        {**loop, "batching": plan.batching}, nodes=nodes, ram=ram))
    strategy, world, pdb, gc, est = found
    plan.strategy, plan.device, plan.gradient_checkpointing = strategy, "cuda", gc
    plan.per_device_batch, plan.grad_accum, plan.global_batch = batch_for_world(cfg, pdb, world)
    plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                       notes=est.notes)
    plan.nproc = world // nodes if strategy in ("ddp", "fsdp") else world  # per node
    plan.gpus = len(usable) if strategy == "model_parallel" else plan.nproc
    # Cheaper strategies that fit the GPUs but not the load.
    plan.said(*passed_over)
    plan.said(*_strategy_reasons(strategy, n if strategy == "model_parallel" else world, gpu["name"], est, budget,
                                 model, cfg, gc, quantized, plan, {r["strategy"] for r in passed_over}))
    plan.said(_host_reason(model, strategy, quantized, plan.nproc, cfg, ram, nodes))
    # The speed choices the estimate above was made for, with their reasons.
    values, speed_said = choices(strategy, gc)
    for key, value in values.items():
        setattr(plan, key, value)
    unsloth_batching = next((r for r in speed_said if r.code == "batching_unsloth"), None)
    if unsloth_batching is not None:  # Unsloth's batching reason takes the planner's place
        plan.reasons = [r for r in plan.reasons if not r.code.startswith("batching_")]
    plan.said(*speed_said)
    plan.launch = _launch(strategy, plan.nproc, usable, facts, gpu)
    if nodes > 1:
        run_id = "kit-" + "".join(ch if ch.isalnum() else "-" for ch in cfg.model.split("/")[-1].lower())
        plan.node_launch = nodes_mod.commands(nodes, plan.nproc, endpoint, run_id)
        plan.launch = plan.node_launch[0]
        plan.snippets = {"slurm": nodes_mod.slurm(nodes, plan.nproc, run_id),
                         "skypilot": nodes_mod.skypilot(nodes, plan.nproc, gpu_table.skypilot_name(
                             gpu["name"], gpu.get("memory_total_bytes")))}
        plan.said(why("nodes", nodes=nodes, nproc=plan.nproc, world=world, endpoint=endpoint))
    return plan.freeze()


def _speed(cfg, facts, gpu, model, batching: str, strategy: str, gc: bool) -> tuple[dict, list]:
    """The speed choices for one candidate of the search (its strategy and checkpointing), and their
    Reasons: the backend, the batching as that backend runs it, Liger's kernels, activation
    offloading and compiled layers, and what the trainer overrides of them."""
    backend, backend_said = _backend(cfg, facts, gpu, strategy)
    backend, trainer_said = trainers.backend(cfg, backend)
    batching_said = None
    if backend == "unsloth":  # Unsloth's trainer lays packed sequences end to end (kit.train.collate)
        batching, batching_said = speed.unsloth_batching(cfg, batching)
    kernels, kernels_said = speed.kernels(cfg, facts, gpu, backend, model.model_type)
    offloading, offloading_said = speed.activation_offloading(cfg, gpu, backend, strategy, gc)
    compiled, compile_said = speed.compile_layers(cfg, gpu, backend, strategy)
    compiled, trainer_compile_said = trainers.compiled(cfg, compiled)  # a trainer's own reason replaces the planner's
    said = [r for r in (backend_said, trainer_said, batching_said, kernels_said, offloading_said,
                        trainer_compile_said or compile_said) if r is not None]
    return ({"backend": backend, "batching": batching, "kernels": kernels, "activation_offloading": offloading,
             "compile_layers": compiled}, said)


def _strategy_reasons(strategy, n, gpu_name, est, budget, model, cfg, gc, quantized, plan,
                      passed=frozenset()) -> tuple[Reason, ...]:
    """Why this strategy, this checkpointing, this batch; `passed`: the cheaper strategies passed over
    for something other than GPU memory in training (host RAM while loading, FSDP's 4-bit load peak)."""
    said = [why("strategy", strategy=strategy, n=n, nodes=plan.nodes, gpu=gpu_name, est_gib=est.total_bytes / GIB,
                budget_gib=budget / GIB, configured=cfg.strategy, ddp_passed="ddp" in passed,
                fsdp_passed="fsdp" in passed, layers=model.layers)]
    if strategy == "fsdp" and quantized:
        said.append(why("fsdp_qlora", precision=plan.precision,
                        load_gib=memory.fsdp_qlora_load_bytes(model, plan.precision) / GIB))
    elif strategy == "fsdp":
        said.append(why("fsdp_16bit"))
    because = ("config" if cfg.gradient_checkpointing != "auto" else
               "big" if model.params >= CHECKPOINTING_FROM_PARAMS else "needed" if gc else "small")
    said.append(why("checkpointing", on=gc, because=because, params=model.params))
    said.append(why("batch", per_device_batch=plan.per_device_batch, configured=bool(cfg.per_device_batch),
                    grad_accum=plan.grad_accum, global_batch=plan.global_batch))
    return tuple(said)


def _host_reason(model, strategy, quantized, ranks, cfg, ram, nodes: int = 1) -> Reason:
    """Host RAM while the model loads (kit.planning.hostram), against what the machine has."""
    load = hostram.node_load_bytes(model, strategy, quantized, ranks if strategy != "model_parallel" else 1,
                                   full_method=cfg.method == "full")
    return Reason("host_ram", {**load.figures(), "nodes": nodes, "ram_gib": ram / GIB if ram else None})


def _as_run(choice: dict, strategy: str, gc: bool) -> dict:
    """memory.estimate's keywords for what `choice` runs: its batching (packed sequences as rows only on
    the plain stack) and the layer inputs checkpointing keeps in CPU memory: TRL's activation offloading
    (one replica per GPU: where it was measured), or Unsloth's own checkpointing (memory.UNSLOTH)."""
    plain = choice["backend"] == "transformers"
    offloaded = (choice["activation_offloading"] and strategy in ("single", "ddp") if plain else
                 memory.UNSLOTH["offloads_checkpoints"])
    return {"batching": choice["batching"], "packed_as_rows": plain, "activation_offloading": gc and offloaded}


def _machine_gpus(gpus: list[dict]) -> str:
    """The GPU name of a machine, or its mix: "Tesla T4", "1× Tesla T4 + 1× NVIDIA L4"."""
    names = [g["name"] for g in gpus]
    kinds = list(dict.fromkeys(names))
    return kinds[0] if len(kinds) == 1 else " + ".join(f"{names.count(k)}× {k}" for k in kinds)


def _as_facts(facts):
    if isinstance(facts, dict):
        from kit.machine.probe import Facts

        try:
            return Facts.from_dict(facts)
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"facts are not in kit's probe format: {e}") from None
    return facts


def _refuse(plan: _Draft, message: str):
    plan.strategy = "none"
    plan.said(why("refused", message=message if message.endswith(".") else message + "."))
    err = CannotTrain(message)
    err.plan = plan.freeze()
    raise err


def _cpu_plan(facts, cfg, model, plan: _Draft, nproc, quantized: bool) -> Plan:
    plan.device, plan.gpu, plan.nproc = "cpu", "cpu", nproc or 1
    if model.params > CPU_MAX_PARAMS:
        _refuse(plan, f"{cfg.model} has {model.params / 1e9:.1f}B parameters: too big to train on a CPU; "
                      "use a GPU machine (Kaggle T4×2, Colab T4) or a model under 1B")
    refusal = device_rules.no_gpu_refusal(cfg, quantized)  # the script refuses the same at launch
    if refusal:
        _refuse(plan, refusal)
    try:
        plan.precision, _ = precision.choose(cfg.precision, "cpu")
    except CannotTrain as e:
        _refuse(plan, str(e))
    if cfg.strategy == "model_parallel":
        _refuse(plan, device_rules.MODEL_PARALLEL_WITHOUT_GPU)
    if cfg.strategy == "fsdp" and plan.nproc < 2:
        _refuse(plan, "strategy fsdp on one CPU process has nothing to shard over (FSDP on the CPU is for checking "
                      "the script, over gloo): use --nproc 2 or more, or strategy=auto")
    plan.said(why("cpu_only"))  # after the refusals: a refused plan says no "fine for the tiny default"
    plan.optimizer, swapped = device_rules.cpu_optimizer("adamw_torch" if cfg.optimizer == "auto" else cfg.optimizer)
    ram = facts.ram_bytes or CPU_ASSUMED_RAM  # ranks on a CPU share the machine's memory
    plan.batching, batching_said = speed.batching(cfg, None)
    plan.said(batching_said if cfg.trainer == "sft" else None)
    plan.batching, trainer_said = trainers.plan_rules(cfg, plan.batching)
    plan.said(*trainer_said)
    # Off on the CPU; said where the config asked for them.
    plan.activation_offloading, offloading_said = speed.activation_offloading(cfg, None, "transformers", "single",
                                                                              False)
    plan.compile_layers, compile_said = speed.compile_layers(cfg, None, "transformers", "single")
    plan.said(offloading_said, compile_said)
    loop = {**training_loop(facts), "batching": plan.batching}
    found = fit(model, cfg, plan.precision, False, plan.optimizer, plan.nproc, ram // plan.nproc, device="cpu",
                loop=loop)
    while found is None and not facts.ram_bytes and ram < CPU_ASSUMED_RAM * 2**10:
        ram *= 2  # unknown RAM refuses nothing: the smallest budget that fits, said to be unchecked
        found = fit(model, cfg, plan.precision, False, plan.optimizer, plan.nproc, ram // plan.nproc, device="cpu",
                    loop=loop)
    if found is None:
        processes = f"{plan.nproc} process" + ("es" if plan.nproc != 1 else "")
        _refuse(plan, f"{cfg.model} at seq_len {cfg.seq_len} needs more than the {ram / GIB:.1f} GiB of RAM here "
                      f"for {processes}: use a GPU machine, fewer processes or shorter sequences")
    plan.strategy, _, b, plan.gradient_checkpointing, est = found
    plan.per_device_batch, plan.grad_accum, plan.global_batch = batch_for_world(cfg, b, plan.nproc)
    unknown = [] if facts.ram_bytes else [f"the machine's RAM is not known: {ram / GIB:.0f} GiB assumed, not checked"]
    plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes,
                       budget_bytes=ram // plan.nproc, terms=est.terms, notes=unknown + est.notes)
    plan.said(why("cpu_processes", precision=plan.precision, nproc=plan.nproc, fsdp=plan.strategy == "fsdp"))
    plan.said(swapped if cfg.optimizer != "auto" else None)
    plan.launch = launch_command(plan.nproc)
    return plan.freeze()


def _precision(cfg, gpu, plan) -> str:
    try:
        chosen, said = precision.choose(cfg.precision, "cuda", gpu["vendor"], gpu["capability"], gpu["name"])
    except CannotTrain as e:
        _refuse(plan, str(e))
    plan.said(said)
    return chosen


def _optimizer(cfg, facts, gpu=None) -> str:
    if cfg.optimizer != "auto":
        return cfg.optimizer
    # LoRA's optimizer state is tiny; 8-bit Adam pays off only for full fine-tuning.
    has_bnb = bool((facts.packages or {}).get("bitsandbytes"))
    if cfg.method == "full" and has_bnb:
        return "adamw_8bit"
    return "adamw_torch_fused" if speed.fused_adamw(cfg, gpu) else "adamw_torch"


def _backend(cfg, facts, gpu, strategy) -> tuple[str, Reason | None]:
    has_unsloth = bool((facts.packages or {}).get("unsloth"))
    if cfg.backend == "transformers":
        return "transformers", None
    if cfg.backend == "unsloth":
        return "unsloth", why("backend_unsloth_configured_multi_gpu") if strategy != "single" else None
    if has_unsloth and gpu["vendor"] == "nvidia" and strategy == "single":
        dpo = MEASURED["unsloth_dpo"]
        figures = {"vs_direct": MEASURED["unsloth_backend_vs_direct"], "trainer": cfg.trainer}
        if cfg.trainer == "dpo":
            figures.update(dpo_vs_trl=dpo["vs_trl"], dpo_tokens_per_s=dpo["tokens_per_s"],
                           trl_tokens_per_s=dpo["trl_tokens_per_s"], plain_vs_trl=dpo["plain_vs_trl"],
                           peak_gib=dpo["peak_gib"], trl_peak_gib=dpo["trl_peak_gib"])
        return "unsloth", Reason("backend_unsloth", figures)
    if has_unsloth and strategy != "single":
        return "transformers", why("backend_plain_multi_gpu")
    return "transformers", None


def _launch(strategy, world, usable, facts, gpu) -> str:
    used = usable if strategy != "single" else [gpu]
    # Hide the GPUs the plan does not use, or Trainer would wrap the model in DataParallel.
    visible = [g["index"] for g in used] if len(used) < len(facts.gpus) else None
    # Trainer runs FSDP only in a process group, so even one FSDP process starts under torchrun.
    return launch_command(world, torchrun=strategy == "fsdp" or (strategy == "ddp" and world > 1),
                          visible=visible, vendor=gpu["vendor"])
