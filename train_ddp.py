"""Fine-tune models/tiny-qwen3 with LoRA, written by `kit render` from configs/default.yaml.

Run it (from the folder that holds the `kit` package):

    torchrun --standalone --nproc_per_node=2 train_ddp.py # the plan: DDP over 2 GPUs (Tesla T4), fp16
    python train_ddp.py                                  # one process: one GPU, or the CPU
    python train_ddp.py --smoke                          # one optimizer step, then checks
    torchrun --standalone --nproc_per_node=2 train_ddp.py max_steps=400 save_steps=10
    python train_ddp.py --config other.yaml              # other settings, planned for this machine

The run saves a checkpoint every save_steps steps and every save_every_minutes minutes, pushes it
to the store in the background (rank 0 only), and stops cleanly before the session's deadline.
Run the same command again to resume where it stopped, from the local output_dir or the store.
Re-render after editing the config (the command that wrote this file):
    python -m kit render --config configs/default.yaml --gpus 2xT4 -o train_ddp.py --force
"""

import gc
import sys

gc.disable()  # while the libraries load: see gc.freeze() below
try:  # the mechanics (store sync, resume, lease, deadline, smoke checks) are kit's tested modules
    from kit.train import signals

    # First: SIGTERM now stops like Ctrl-C, and a rank whose torchrun is gone gets one (it pauses).
    signals.while_loading()
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, set_seed
    from trl import SFTConfig, SFTTrainer

    from kit.redaction import redact_tracebacks
    from kit.errors import KitError
    from kit.planning import settle
    from kit.report.reasons import all_words
    from kit.script import arguments
    from kit.train import callbacks, collate, data, disk, dist, last_word, modeling, output_dir, sharding, tracking
    from kit.train.job import Job
except ModuleNotFoundError as e:
    missing = (e.name or "?").split(".")[0]
    if missing == "kit":
        print("error: the kit package is not importable: run this script from the folder that holds kit/ (the kit "
              "checkout), or `pip install -e PATH_TO_KIT`", file=sys.stderr)
    elif missing == "unsloth":
        print("error: this script was written for backend=unsloth, and Unsloth is not installed here: install it, "
              "or re-render with backend=transformers", file=sys.stderr)
    else:  # peft, trl, datasets…: the [train] extra was not installed (never torch's own wheel: that stays)
        print(f"error: the Python package {missing!r} is not installed, and training needs it: run "
              "`pip install -e \".[train]\"` in the kit checkout (add qlora for bitsandbytes on a GPU)", file=sys.stderr)
    sys.exit(2)
except KeyboardInterrupt as e:  # Ctrl-C (exit 130) or SIGTERM (143) while the libraries load: nothing started yet
    print(f"interrupted{getattr(e, 'by', '')} while loading the libraries: nothing was started", file=sys.stderr)
    sys.exit(getattr(e, "exit_code", 130))
# The libraries' objects (torch, transformers, TRL: some 440,000) live as long as the process. Collected
# once and frozen, no later garbage collection scans them again; collecting as they loaded took about
# 7 full passes. Together about 1 of the 10 CPU-seconds of the tiny default's whole run (bench/script_gc.py).
gc.collect()
gc.freeze()
gc.enable()

CONFIG_PATH = 'configs/default.yaml'

# The settings of configs/default.yaml, resolved by kit 0.1.0. `--config FILE` replaces them and
# `key=value` arguments override them.
SETTINGS = {
    'model': 'models/tiny-qwen3',
    'revision': None,
    'method': 'lora',
    'trainer': 'sft',
    'backend': 'auto',
    'strategy': 'auto',
    'lora': {'r': 16, 'alpha': 32.0, 'dropout': 0.0, 'target_modules': 'all-linear'},
    'data': {
        'path': 'data/ha_commands.jsonl',
        'format': 'messages',
        'columns': {},
        'split': 'train',
        'eval_fraction': 0.1,
        'max_duplicate_fraction': 0.05,
        'allow_duplicates': False,
    },
    'eval': {
        'baseline': True,
        'final': True,
        'subset': 64,
        'metric': 'auto',
        'min_rows': 10,
        'samples': 5,
        'max_new_tokens': 64,
    },
    'seq_len': 256,
    'per_device_batch': 8,
    'global_batch': 16,
    'epochs': 1.0,
    'max_steps': 60,
    'learning_rate': 0.002,
    'lr_scheduler': 'cosine',
    'warmup_steps': 5,
    'weight_decay': 0.0,
    'optimizer': 'auto',
    'batching': 'auto',
    'kernels': 'auto',
    'activation_offloading': 'auto',
    'compile': 'auto',
    'max_grad_norm': 1.0,
    'precision': 'auto',
    'gradient_checkpointing': 'off',
    'output_dir': 'outputs/default',
    'store': None,
    'save_steps': 20,
    'save_every_minutes': 30.0,
    'keep_checkpoints': 3,
    'lease_heartbeat_seconds': 60.0,
    'squash_history_every': 0,
    'time_budget_minutes': None,
    'seed': 42,
    'logging_steps': 5,
    'report_to': 'none',
    'eval_steps': 30,
    'resume': 'auto',
}

# What `kit plan` chose for 2 × Tesla T4 (assumed: --gpus 2xT4), whole (`--config FILE` plans again). It is settled below, by the
# planner's own rules, for the device and processes this runs on, the data and the job's length; each change is a
# printed note.
PLAN = {
    'precision': 'fp16',
    'strategy': 'ddp',
    'device': 'cuda',
    'nproc': 2,
    'per_device_batch': 8,
    'grad_accum': 1,
    'global_batch': 16,
    'gradient_checkpointing': False,
    'backend': 'transformers',
    'optimizer': 'adamw_torch',
    'batching': 'padding_free',
    'kernels': 'none',
    'activation_offloading': False,
    'compile_layers': False,
    'quantization': None,
    'prequantized': False,
    'reference': None,
    'trainer': 'sft',
    'memory': {
        'per_gpu_bytes': 578485478,
        'budget_bytes': 15637086208,
        'terms': {
            'weights': 213760,
            'lora_params_fp32': 131072,
            'lora_grads_fp32': 131072,
            'optimizer_states': 262144,
            'ddp_buckets': 131072,
            'activations': 12845056,
            'loss_tile': 2097152,
            'loss_hidden_copy': 262144,
            'loss_hidden_grad': 786432,
            'packed_attention_mask': 20971520,
            'allocator_slack': 3783142,
            'cuda_context': 536870912,
        },
        'allocated_bytes': 37831424,
        'notes': [
            'padding_free batches: one 2048-token sequence per micro-batch under a block-diagonal attention mask',
        ],
    },
    'reasons': (
        {
            'code': 'model',
            'figures': {
                'model': 'models/tiny-qwen3',
                'params': 106880,
                'layers': 2,
                'vocab': 512,
                'source': 'local',
            },
        },
        {
            'code': 'precision_no_bf16',
            'figures': {'gpu': 'Tesla T4', 'arch': 'sm_75', 'fp16_vs_bf16': 0.968},
        },
        {
            'code': 'batching_padding_free',
            'figures': {
                'padding_free_vs_padded': 1.146,
                'packed_vs_padded': 2.896,
                'unmeasured_arch': 'sm_75',
            },
        },
        {
            'code': 'strategy',
            'figures': {
                'strategy': 'ddp',
                'n': 2,
                'nodes': 1,
                'gpu': 'Tesla T4',
                'est_gib': 0.5387565847486258,
                'budget_gib': 14.56317138671875,
                'configured': 'auto',
                'ddp_passed': False,
                'fsdp_passed': False,
                'layers': 2,
            },
        },
        {
            'code': 'checkpointing',
            'figures': {'on': False, 'because': 'config', 'params': 106880},
        },
        {
            'code': 'batch',
            'figures': {
                'per_device_batch': 8,
                'configured': True,
                'grad_accum': 1,
                'global_batch': 16,
            },
        },
        {
            'code': 'host_ram',
            'figures': {
                'load_gib': 5.0003981590271,
                'first_rank_reads': False,
                'ranks': 2,
                'per_rank_gib': 2.50019907951355,
                'weights_gib': 0.0001990795135498047,
                'nodes': 1,
                'ram_gib': 28.215729903429747,
            },
        },
        {
            'code': 'kernels_none',
            'figures': {
                'because': 'arch',
                'model_type': 'qwen3',
                'arch': 'sm_75',
                'ratio': 1.294,
            },
        },
        {
            'code': 'offloading_off',
            'figures': {
                'because': 'no_checkpointing',
                'trainer': 'sft',
                'strategy': 'ddp',
                'arch': 'sm_75',
                'dpo_ratio': 0.875,
                'kto_tokens_per_s': 3064,
            },
        },
        {
            'code': 'compile_off',
            'figures': {'because': 'arch', 'strategy': 'ddp', 'arch': 'sm_75'},
        },
    ),
    'launch': 'torchrun --standalone --nproc_per_node=2 train_ddp.py',
    'model': 'models/tiny-qwen3',
    'gpu': 'Tesla T4',
    'gpus': 2,
    'nodes': 1,
    'node_launch': (),
    'snippets': {},
}


def main(argv: list[str]) -> int:
    args = arguments.parse(argv, CONFIG_PATH)
    cfg, plan, notes = arguments.settings(SETTINGS, PLAN, args)  # --config FILE: its settings, planned here
    ctx = dist.init()  # LOCAL_RANK -> this rank's device; nccl on GPUs, gloo on the CPU
    ok, code = False, 1
    try:
        # The plan settled for this device, the number of processes and what is installed here.
        plan, rank_notes = settle.for_rank(plan, cfg, settle.RankFacts.of(ctx))
        job = Job(cfg, ctx, plan, notes=all_words(notes + rank_notes), smoke=args.smoke, force=args.force,
                  steps_given=arguments.steps_given(args), config_path=args.config or CONFIG_PATH)
        job.start()  # rank 0 finds the newest complete checkpoint (local, then store); all ranks agree
        if job.complete:  # nothing to train; a final/ the store lacks is pushed
            ok, code = True, job.exit_code
            return code

        set_seed(cfg.seed)  # the same LoRA init on every rank and in every run
        # QLoRA: the base's linear weights in 4-bit nf4 (bitsandbytes), the rest 16-bit. No
        # prepare_model_for_kbit_training: its fp32 upcast cost 5.7 GiB and 19 % of the speed (Qwen3-8B).
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=modeling.compute_dtype(plan),  # bf16, or fp16 where bf16 is not native
            **modeling.quant_storage(plan),  # fsdp only: the 4-bit bytes stored as a float dtype, so they shard
        ) if cfg.method == "qlora" else None
        with dist.local_main_first():  # downloads once per node; the node's other ranks read the cache
            # Pinned to this rank's GPU (device_map={"": local_rank}); 16-bit FSDP loads on the CPU.
            model, tokenizer = modeling.load(cfg, plan, ctx, quantization)
            # LoRA on every linear projection of the decoder (or the config's target_modules).
            lora = LoraConfig(
                r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                target_modules=modeling.target_modules(cfg, model), bias="none", task_type="CAUSAL_LM",
            ) if cfg.method != "full" else None
            model = modeling.add_lora(model, cfg, plan, lora)
            dataset = data.prepare(cfg, tokenizer, pack=plan.batching == "packed")
        job.log(modeling.trainable_summary(model))
        job.log(dataset.summary())
        job.evaluate_before(model, tokenizer, dataset)  # the baseline: once per job, kept in the store
        # Padding-free batches for short rows only; packed ones where that folds gradient accumulation.
        packed = data.packed(dataset, cfg.seq_len) if settle.may_pack(plan, cfg, dataset.mean_tokens) else None
        plan, notes = settle.for_data(plan, cfg, data.row_stats(dataset, packed))
        if packed is not None and plan.batching == "packed":
            dataset, notes = packed, [*notes, packed.summary()]
        max_steps = job.max_steps(len(dataset.train), plan)
        # Compiled layers ("auto") only where the job is long enough to repay compiling them.
        plan, compile_notes = settle.for_steps(plan, cfg, max_steps - job.decision.step)
        job.settled(plan, all_words(notes + compile_notes))  # each note logged; the closing lines report this plan

        # Strategy (DDP over 2 GPUs (Tesla T4), fp16). ddp: a full replica per rank. fsdp: FSDP2 shards the
        # frozen base, the LoRA weights, their gradients and Adam states over all ranks, each
        # decoder layer a unit, checkpoints still plain PEFT adapters. model_parallel: the layers
        # split over the GPUs in this one process (never under torchrun). See kit/train/sharding.py.
        strategy = sharding.trainer_args(plan, model, ctx)

        training_args = SFTConfig(
            output_dir=cfg.output_dir,
            max_steps=max_steps,
            per_device_train_batch_size=plan.per_device_batch,
            per_device_eval_batch_size=plan.per_device_batch,
            gradient_accumulation_steps=plan.grad_accum,
            learning_rate=cfg.learning_rate,
            lr_scheduler_type=cfg.lr_scheduler,
            warmup_steps=cfg.warmup_steps,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            optim=plan.optimizer,
            bf16=plan.precision == "bf16",
            fp16=plan.precision == "fp16",  # AMP with loss scaling: T4 and V100 have no native bf16
            gradient_checkpointing=plan.gradient_checkpointing and plan.strategy != "fsdp",  # FSDP does its own
            gradient_checkpointing_kwargs={"use_reentrant": False},
            # Trainer turns this on for a PeftModel; with gradient checkpointing DDP then fails with
            # "Expected to mark a variable ready only once" (huggingface/peft#313, trl#921).
            ddp_find_unused_parameters=False,
            # kit.train.data has truncated (or packed) every row to seq_len already; TRL refuses max_length
            # with padding-free batches.
            max_length=None if plan.padding_free else cfg.seq_len,
            # Rows laid end to end with no pad tokens; position_ids restart at each row, from which
            # the attention builds a block-diagonal mask, so rows never attend to each other.
            # (Packed sequences stay rows of their own: kit.train.collate.)
            padding_free=plan.padding_free,
            use_liger_kernel=plan.kernels == "liger",  # Triton RMSNorm, SwiGLU and RoPE
            # Compiled layers: inductor fuses the norms itself (Liger's RMSNorm kernel inside them warned).
            liger_kernel_config={"rms_norm": False} if plan.compile_layers else None,
            # The layer inputs kept for backward wait in pinned CPU memory during the step.
            activation_offloading=plan.activation_offloading,
            **collate.sampler_args(plan),  # batching "grouped": batches of rows of similar length
            completion_only_loss=True,  # the loss masks come from kit.train.data
            save_strategy="steps",
            save_steps=cfg.save_steps,
            # kit keeps the newest keep_checkpoints checkpoint-<step> folders itself (and no other folder
            # of output_dir): Trainer's rotation counted any checkpoint-* folder, a user's included.
            save_total_limit=None,
            logging_steps=cfg.logging_steps,
            eval_strategy="steps" if cfg.eval_steps and dataset.eval is not None else "no",
            eval_steps=cfg.eval_steps,
            # Each rank its own dropout masks. grpo: one seed, so every rank's sampler draws the same prompt groups
            # (TRL's GRPOTrainer then offsets the seed of each rank's sampling itself).
            seed=cfg.seed + (ctx.rank if cfg.trainer != "grpo" else 0),
            data_seed=cfg.seed,  # one shuffle for all ranks, so their shards don't overlap
            # Experiment tracking (report_to: none in the settings): rank 0 alone logs, the other ranks
            # "none"; the tracked run is kit's run id, so a resumed job continues it. See kit/train/tracking.py.
            report_to=tracking.report_to(cfg, ctx, job.run.get("run_id")),  # None: a smoke run, untracked
            run_name=job.run.get("run_id"),
            disable_tqdm=not ctx.is_main,
            use_cpu=ctx.device.type == "cpu",
            **strategy,
        )
        # TRL writes its model card to output_dir/README.md at every save, over a README.md of the user's: this
        # subclass writes none (kit's card is final/README.md, once the job is evaluated).
        Trainer = output_dir.without_card(SFTTrainer)
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=dataset.train,
            eval_dataset=dataset.eval,
            processing_class=tokenizer,
            # Packed sequences as rows, each under its own block-diagonal mask, where the plan packs them
            # (kit.train.collate); None: TRL's own collator, padded or padding-free as the config says.
            data_collator=collate.collator(plan, tokenizer),
            callbacks=job.callbacks(model, dataset),  # saves, deadline, upload, speed and memory
        )
        modeling.settle_adapter_dtype(trainer.model, plan)  # fp16 loss scaling needs fp32 LoRA weights
        if plan.compile_layers:  # torch.compile of each decoder layer, compiled at the first steps
            compiled = modeling.compile_layers(trainer.model)  # rounding as eager does, so the same losses
            job.log(f"compile: {compiled} decoder layers through torch.compile" if compiled else
                    "compile off: this torch's inductor cannot round as eager does (emulate_precision_casts)")
        # A checkpoint the other strategy wrote resumes through a converted copy (same numbers).
        # Resumed at max_steps (cut in its wrap-up): no step more. A disk that fills up during a save: one
        # line and exit 4, the partial checkpoint removed, the ones before it kept (kit.train.disk).
        with callbacks.at_target_only_wrap_up(), disk.full_disk_stops(cfg.output_dir):
            trainer.train(resume_from_checkpoint=sharding.resumable(trainer, job.resume_from, plan, ctx))
        modeling.eager_layers(trainer.model)  # the final evaluation generates: eager, no compiling per length
        code = job.finish(trainer)  # rank 0: last upload, final evaluation, final/ and its push, closing lines
        ok = True
        return code
    finally:
        # Barrier only when this rank finished cleanly, destroy_process_group, and under torchrun
        # exit with `code` at once: interpreter teardown can hang a finished gloo rank.
        dist.teardown(ok, exit_code=code)


if __name__ == "__main__":
    redact_tracebacks()  # a crash prints its traceback, but never the HF token
    try:
        sys.exit(main(sys.argv[1:]))
    except KitError as e:  # bad config, data, store or hardware: one line and its exit code
        last_word.say_error(e)  # the first rank to stop says it; under torchrun again after torchrun's report
        sys.exit(e.exit_code)
    except Exception:  # a collective whose peer stopped with its error line: that line says why, not a traceback
        if not last_word.another_rank_said_it():
            raise
        sys.exit(1)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM outside training (evaluation, wrap-up); in training it pauses
        print(f"interrupted{getattr(e, 'by', '')}: stopped; every checkpoint already saved is kept, and the same "
              "command resumes", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 130))
