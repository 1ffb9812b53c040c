"""The planner: a pure function of (machine facts, run config) → a plan with its reasons.

    plan = make_plan(kit.machine.gpu_table.synthesize("2xT4"), kit.planning.config.load("configs/qwen3-8b-qlora-kaggle-t4x2.yaml"))
    plan.strategy, plan.precision, plan.launch   # 'ddp', 'fp16', 'torchrun --standalone --nproc_per_node=2 train_ddp.py'

Decides precision, strategy (single | ddp | fsdp | model_parallel), micro-batch, accumulation,
gradient checkpointing, backend and optimizer, each with a plain sentence why. When nothing fits
or the hardware cannot run the job it raises `CannotTrain`, whose `.plan` is the strategy-"none"
plan (reasons include the cheapest change that would fit), so `kit plan --json` can still print it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kit.errors import CannotTrain, UsageError
from kit.machine import gpu_table, verdicts
from kit.machine.command import launch_command
from kit.planning import hostram, memory, plan_words, precision, shapes, speed, tracking, trainers
from kit.planning.measured import MEASURED
from kit.planning.names import check_data
from kit.planning import nodes as nodes_mod
from kit.planning.fit import batch_for_world, cheaper_change, fit, rank_budget, training_loop
from kit.files import GIB

CPU_MAX_PARAMS = 1e9
CPU_ASSUMED_RAM = 8 * GIB  # a CPU plan's budget where the machine's RAM is unknown (it refuses nothing then)

__all__ = ["Plan", "batch_for_world", "make_plan"]


@dataclass
class Plan:
    """How to run a config on a machine (see docs/CONTRACTS.md)."""

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
    memory: dict = field(default_factory=lambda: {"per_gpu_bytes": 0, "budget_bytes": 0, "terms": {}})
    reasons: list = field(default_factory=list)
    launch: str = ""
    model: str = ""
    gpu: str = ""
    gpus: int = 0                   # GPUs used per node (model parallel: all of them, in one process)
    nodes: int = 1                  # machines; nproc is per node
    node_launch: list = field(default_factory=list)  # with nodes > 1: one torchrun command per node
    snippets: dict = field(default_factory=dict)     # with nodes > 1: {"slurm": ..., "skypilot": ...}

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(facts, cfg, nproc: int | None = None, *, nodes: int = 1,
              rdzv_endpoint: str | None = None) -> Plan:
    """Plan `cfg` on the machine `facts` describes (a Facts or its dict); `nproc` limits the GPUs used.

    `nodes`: that many machines like `facts` (GPUs per node), started by torchrun's c10d
    rendezvous at `rdzv_endpoint` (HOST:PORT of node 0; default $MASTER_ADDR:29500).

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
    plan = Plan(model=cfg.model)
    plan.reasons.append(f"{cfg.model}: {plan_words.count(model.params)} parameters, {model.layers} layers, vocab "
                        f"{model.vocab} (from {model.source}).")
    # A tracker the machine's facts show missing: refused here, as the script refuses it at launch.
    _, tracked = tracking.choose(cfg.report_to, tracking.installed_in(facts.packages), "on the machine planned for")
    if tracked:
        plan.reasons.append(tracked)
    quantized = cfg.method == "qlora" or model.prequantized is not None
    if model.prequantized and cfg.method == "full":
        raise UsageError(f"{cfg.model} is a 4-bit checkpoint and cannot be fully fine-tuned: use method=lora, "
                         "or the unquantized model")
    if not facts.gpus:
        if nodes > 1:
            raise UsageError(f"--nodes {nodes} on CPU-only machines: multi-node training is for GPU machines")
        return _cpu_plan(facts, cfg, model, plan, nproc)

    plan.gpu, plan.gpus = _machine_gpus(facts.gpus), len(facts.gpus)  # what a refusal below was planned for
    v = verdicts.judge(facts)
    if not v.ok:
        _refuse(plan, v.summary if v.action in v.summary else f"{v.summary} {v.action}".strip())
    usable = [g for g in facts.gpus if g["index"] in v.usable_gpus]
    plan.reasons += [g["reason"] + "." for g in v.gpus if g["arch_supported"] is False]
    if v.mixed:
        names = ", ".join(sorted({g["name"] for g in usable}))
        _refuse(plan, f"mixed GPU models ({names}): every rank would run at the pace and memory of the "
                      "smallest; make only one model visible with CUDA_VISIBLE_DEVICES")
    if nproc is not None and not 1 <= nproc <= len(usable):
        raise UsageError(f"nproc {nproc}: this machine has {plan_words.things(len(usable), 'usable GPU')}")
    usable = usable[: nproc or len(usable)]
    gpu, n = usable[0], len(usable)
    plan.gpu, plan.gpus = gpu["name"], n  # the GPUs it was planned for, also when it is refused
    plan.precision = _precision(cfg, gpu, plan.reasons, plan)
    if quantized:
        plan.quantization = "nf4"
        plan.reasons.append(f"{cfg.model} is a bnb-4bit checkpoint: its base stays 4-bit, so this is QLoRA."
                            if model.prequantized and cfg.method != "qlora" else
                            "QLoRA: linear weights in 4-bit nf4 (bitsandbytes); embeddings, norms and lm_head stay "
                            "16-bit (kit does not call prepare_model_for_kbit_training: 5.7 GiB and 19 % slower "
                            "for Qwen3-8B).")
        if not (facts.packages or {}).get("bitsandbytes"):
            plan.reasons.append("bitsandbytes is not installed there: `pip install bitsandbytes` before training.")
    plan.optimizer = _optimizer(cfg, facts, gpu)
    budget = rank_budget(usable, plan.reasons)
    # A preference trainer pads its batches: the SFT batching reasons would only be taken back.
    plan.batching = speed.batching(cfg, gpu, plan.reasons if cfg.trainer == "sft" else [])
    trainers.plan_rules(cfg, plan, plan.reasons)
    loop = {**training_loop(facts), "batching": plan.batching}
    ram, why = hostram.budget(facts.ram_bytes), []
    found = fit(model, cfg, plan.precision, quantized, plan.optimizer, n, budget, loop=loop,
                nodes=nodes, ram=ram, why=why)
    plan.memory["budget_bytes"] = budget
    plan.nodes = nodes
    if found is None:
        gc = cfg.gradient_checkpointing != "off"  # show what the smallest replica would need
        est = memory.estimate(model, cfg, plan.precision, cfg.per_device_batch or 1, gc, quantized,
                              world_size=n, optimizer=plan.optimizer, **loop)
        plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                           notes=[f"one replica at micro-batch {cfg.per_device_batch or 1}"] + est.notes)
        how = " with one full replica per GPU" if cfg.strategy == "ddp" and n > 1 else ""
        where = f"{nodes} nodes of {n}× {gpu['name']}" if nodes > 1 else f"{n}× {gpu['name']}"
        passed = f" (passed over {'; '.join(why)})" if why else ""
        _refuse(plan, f"{cfg.model} ({cfg.method}, seq_len {cfg.seq_len}) does not fit on {where}{how}{passed}: "
                      + cheaper_change(model, cfg, plan.precision, plan.optimizer, n, budget, gpu["name"], loop,
                                        nodes=nodes, ram=ram))
    strategy, world, pdb, gc, est = found
    plan.strategy, plan.device, plan.gradient_checkpointing = strategy, "cuda", gc
    plan.per_device_batch, plan.grad_accum, plan.global_batch = batch_for_world(cfg, pdb, world)
    plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                       notes=est.notes)
    plan.nproc = world // nodes if strategy in ("ddp", "fsdp") else world  # per node
    plan.gpus = len(usable) if strategy == "model_parallel" else plan.nproc
    plan.reasons += [f"passed over {w}." for w in why]  # cheaper strategies that fit the GPUs but not the load
    plan.reasons += plan_words.strategy_reasons(strategy, n if strategy == "model_parallel" else world, gpu["name"],
                                                est, budget, model, cfg, gc, quantized, plan, why)
    plan.reasons.append(plan_words.host_words(model, strategy, quantized, plan.nproc, cfg, ram, nodes))
    plan.backend = trainers.backend(cfg, _backend(cfg, facts, gpu, strategy, plan.reasons), plan.reasons)
    if plan.backend == "unsloth":
        if speed.unsloth_batching(cfg, plan.batching, plan.reasons) != plan.batching and plan.batching != "packed":
            plan.batching = "padded"  # and the estimate without the padding-free mask (Unsloth is single-GPU here)
        # The estimate for what Unsloth runs: its trainer lays packed sequences end to end (kit.train.collate
        # keeps them rows only without it), and its gradient checkpointing ("unsloth") keeps each layer's input in
        # CPU memory during the step, as TRL's activation offloading does (memory.UNSLOTH).
        est = memory.estimate(model, cfg, plan.precision, pdb, gc, quantized, world_size=world,
                              optimizer=plan.optimizer, **{**loop, "batching": plan.batching}, packed_as_rows=False,
                              activation_offloading=gc and memory.UNSLOTH["offloads_checkpoints"])
        plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                           notes=est.notes)
    plan.kernels = speed.kernels(cfg, facts, gpu, plan.backend, model.model_type, plan.reasons)
    plan.activation_offloading = speed.activation_offloading(cfg, gpu, plan.backend, strategy, gc, plan.reasons)
    if plan.activation_offloading and plan.backend == "transformers" and strategy in ("single", "ddp") and gc:
        est = memory.estimate(model, cfg, plan.precision, pdb, gc, quantized, world_size=world,
                              optimizer=plan.optimizer, **{**loop, "batching": plan.batching},
                              activation_offloading=True)
        plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes, terms=est.terms,
                           notes=est.notes)
    said: list = []
    plan.compile_layers = trainers.compiled(cfg, speed.compile_layers(cfg, gpu, plan.backend, strategy, said), said)
    plan.reasons += said
    plan.launch = _launch(strategy, plan.nproc, usable, facts, gpu)
    if nodes > 1:
        run_id = "kit-" + "".join(ch if ch.isalnum() else "-" for ch in cfg.model.split("/")[-1].lower())
        plan.node_launch = nodes_mod.commands(nodes, plan.nproc, endpoint, run_id)
        plan.launch = plan.node_launch[0]
        plan.snippets = {"slurm": nodes_mod.slurm(nodes, plan.nproc, run_id),
                         "skypilot": nodes_mod.skypilot(nodes, plan.nproc, gpu_table.skypilot_name(
                             gpu["name"], gpu.get("memory_total_bytes")))}
        plan.reasons.append(f"{nodes} nodes × {plan_words.things(plan.nproc, 'GPU')} = {world} ranks, started by "
                            "torchrun's c10d "
                            f"rendezvous at {endpoint}; only global rank 0 talks to the store, each node downloads the "
                            "model and data once and keeps its own output_dir; a node that dies ends the job (non-zero "
                            "exit), and the same commands resume it.")
    return plan


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


def _refuse(plan: Plan, message: str):
    plan.strategy = "none"
    plan.reasons.append(message if message.endswith(".") else message + ".")
    err = CannotTrain(message)
    err.plan = plan
    raise err


def _cpu_plan(facts, cfg, model, plan: Plan, nproc) -> Plan:
    plan.device, plan.gpu, plan.nproc = "cpu", "cpu", nproc or 1
    plan.reasons.append("CPU-only: training will be CPU-slow; fine for the tiny default.")
    if model.params > CPU_MAX_PARAMS:
        _refuse(plan, f"{cfg.model} has {model.params / 1e9:.1f}B parameters: too big to train on a CPU; "
                      "use a GPU machine (Kaggle T4×2, Colab T4) or a model under 1B")
    if cfg.method == "qlora" or model.prequantized:
        _refuse(plan, "4-bit QLoRA needs a GPU (bitsandbytes): use method=lora on the CPU")
    if cfg.backend == "unsloth" and cfg.trainer == "sft":  # the script would refuse it too (kit.planning.adapt)
        _refuse(plan, "backend=unsloth needs a CUDA GPU: use backend=auto (or transformers) on the CPU")
    try:
        plan.precision, _ = precision.choose(cfg.precision, "cpu")
    except CannotTrain as e:
        _refuse(plan, str(e))
    if cfg.strategy == "model_parallel":
        _refuse(plan, "strategy model_parallel splits the layers over GPUs, and this machine has none: use "
                      "strategy=auto")
    if cfg.strategy == "fsdp" and plan.nproc < 2:
        _refuse(plan, "strategy fsdp on one CPU process has nothing to shard over (FSDP on the CPU is for checking "
                      "the script, over gloo): use --nproc 2 or more, or strategy=auto")
    plan.optimizer = "adamw_torch" if cfg.optimizer in ("auto", "adamw_8bit", "paged_adamw_8bit") else cfg.optimizer
    ram = facts.ram_bytes or CPU_ASSUMED_RAM  # ranks on a CPU share the machine's memory
    plan.batching = speed.batching(cfg, None, plan.reasons if cfg.trainer == "sft" else [])
    trainers.plan_rules(cfg, plan, plan.reasons)
    speed.activation_offloading(cfg, None, "transformers", "single", False, plan.reasons)  # its reason; off here
    speed.compile_layers(cfg, None, "transformers", "single", plan.reasons)  # its reason when configured; off here
    if cfg.optimizer == "adamw_torch_fused":
        plan.optimizer = "adamw_torch"  # the fused kernel is CUDA's
    loop = {**training_loop(facts), "batching": plan.batching}
    found = fit(model, cfg, plan.precision, False, plan.optimizer, plan.nproc, ram // plan.nproc, device="cpu",
                loop=loop)
    while found is None and not facts.ram_bytes and ram < CPU_ASSUMED_RAM * 2**10:
        ram *= 2  # unknown RAM refuses nothing: the smallest budget that fits, said to be unchecked
        found = fit(model, cfg, plan.precision, False, plan.optimizer, plan.nproc, ram // plan.nproc, device="cpu",
                    loop=loop)
    if found is None:
        _refuse(plan, f"{cfg.model} at seq_len {cfg.seq_len} needs more than the {ram / GIB:.1f} GiB of RAM here "
                      f"for {plan_words.things(plan.nproc, 'process', 'processes')}: use a GPU machine, fewer "
                      "processes or shorter sequences")
    plan.strategy, _, b, plan.gradient_checkpointing, est = found
    plan.per_device_batch, plan.grad_accum, plan.global_batch = batch_for_world(cfg, b, plan.nproc)
    unknown = [] if facts.ram_bytes else [f"the machine's RAM is not known: {ram / GIB:.0f} GiB assumed, not checked"]
    plan.memory.update(per_gpu_bytes=est.total_bytes, allocated_bytes=est.allocated_bytes,
                       budget_bytes=ram // plan.nproc, terms=est.terms, notes=unknown + est.notes)
    plan.reasons.append(f"precision {plan.precision} on the CPU; " +
                        (f"{plan.nproc} processes over gloo" if plan.nproc > 1 else "one process") +
                        (", FSDP-sharded (checks the script's FSDP path; no memory saved: the ranks share one RAM)."
                         if plan.strategy == "fsdp" else "."))
    plan.launch = launch_command(plan.nproc)
    return plan


def _precision(cfg, gpu, reasons, plan) -> str:
    try:
        chosen, why = precision.choose(cfg.precision, "cuda", gpu["vendor"], gpu["capability"], gpu["name"])
    except CannotTrain as e:
        _refuse(plan, str(e))
    reasons.append(why + ".")
    return chosen


def _optimizer(cfg, facts, gpu=None) -> str:
    if cfg.optimizer != "auto":
        return cfg.optimizer
    # LoRA's optimizer state is tiny; 8-bit Adam pays off only for full fine-tuning.
    has_bnb = bool((facts.packages or {}).get("bitsandbytes"))
    if cfg.method == "full" and has_bnb:
        return "adamw_8bit"
    return "adamw_torch_fused" if speed.fused_adamw(cfg, gpu) else "adamw_torch"


def _backend(cfg, facts, gpu, strategy, reasons) -> str:
    has_unsloth = bool((facts.packages or {}).get("unsloth"))
    if cfg.backend == "transformers":
        return "transformers"
    if cfg.backend == "unsloth":
        if strategy != "single":
            reasons.append("backend unsloth as configured, on several GPUs: Unsloth's multi-GPU support is "
                           "limited; use backend=transformers if it fails.")
        return "unsloth"
    if has_unsloth and gpu["vendor"] == "nvidia" and strategy == "single":
        dpo = MEASURED["unsloth_dpo"]
        reasons.append("backend unsloth: installed and one NVIDIA GPU (measured in one run on an H200 for Qwen3-8B "
                       "QLoRA, seq_len 2048 × 4: 1.20× the tokens/s of kit's plain stack with Liger, 10,358 against "
                       "8,631, and 86 % of its memory, 8.32 against 9.65 GiB; on chat-length rows padding-free, "
                       f"1.60× its trained tokens/s, {MEASURED['unsloth_backend_vs_direct']:.3f}× Unsloth driven directly "
                       "on the same batches" + (
                           f"; trainer dpo: {dpo['vs_trl']:.2f}× the tokens/s of TRL's DPOTrainer driven directly, "
                           f"{dpo['tokens_per_s']:,} against {dpo['trl_tokens_per_s']:,}, where kit's plain stack with "
                           f"Liger gave {dpo['plain_vs_trl']:.2f}× in the same run (H100, Qwen3-8B QLoRA, 2 pairs × "
                           f"1,024 tokens), at {dpo['peak_gib']} against {dpo['trl_peak_gib']} GiB"
                           if cfg.trainer == "dpo" else "")
                       + "; the memory estimate is Unsloth's: its checkpointing keeps each layer's input in CPU "
                       "memory).")
        return "unsloth"
    if has_unsloth and strategy != "single":
        reasons.append("backend transformers: Unsloth is installed but its multi-GPU support is limited.")
    return "transformers"


def _launch(strategy, world, usable, facts, gpu) -> str:
    used = usable if strategy != "single" else [gpu]
    # Hide the GPUs the plan does not use, or Trainer would wrap the model in DataParallel.
    visible = [g["index"] for g in used] if len(used) < len(facts.gpus) else None
    # Trainer runs FSDP only in a process group, so even one FSDP process starts under torchrun.
    return launch_command(world, torchrun=strategy == "fsdp" or (strategy == "ddp" and world > 1),
                          visible=visible, vendor=gpu["vendor"])
