"""The mechanics around `trainer.train()`, so the generated script only shows the flow.

`Job.start()`: rank 0 opens the store, takes its lease, and picks the checkpoint to resume from
(local, then store); every rank learns the decision from one broadcast. `Job.callbacks()`:
saves by steps and minutes, manifests, background upload, the deadline. `Job.finish()`: rank 0
waits for the last upload, records the session and prints the outcome. Only rank 0 ever touches
the network.
"""

from __future__ import annotations

import atexit
import math
import os

from kit.train import dist
from kit.checkpoints import fingerprint, resume, session_records
from kit.train.output_dir import check_output_dir, lock as lock_output_dir
from kit.train.callbacks import Checkpoints, Control, Meter, ResumedBatch
from kit.train.deadline import process_started, session_deadline
from kit.train.disk import Room
from kit.train.signals import StopSignals
from kit.errors import KitError
from kit.evaluation import stage

class Job:
    def __init__(self, cfg, ctx, plan, *, notes=(), smoke: bool = False, force: bool = False,
                 steps_given: bool = False, config_path: str | None = None):
        self.cfg, self.ctx, self.plan, self.smoke, self.force = cfg, ctx, plan, smoke, force
        self.notes = list(notes)  # how the plan was settled for this rank, said once the job starts
        self.config_path = config_path  # trainer grpo: its reward file is found from this config's folder
        self.reward_funcs: list | None = None  # trainer grpo: the reward functions (kit.train.rewards.checked)
        self.steps_given = steps_given  # max_steps from the command line: the target (resume.current_target)
        self.store = self.sync = self.lease = self._dir_lock = None
        self.decision = resume.Decision()
        self.signals = StopSignals()
        self.deadline = session_deadline(cfg.time_budget_minutes)
        self.started = process_started()  # the launch: imports are setup too
        # What the end of the job reads (kit.train.finish): the stop decisions and the step timings of
        # training (kit.train.callbacks), and the step it trains to (`max_steps`).
        self.control: Control | None = None
        self.meter: Meter | None = None
        self.target_step: int | None = None
        self._checkpoints = self._smoke = None
        self._device_facts: dict | None = None
        self._rate_checked = False
        self.stored_step: int | None = None  # the newest checkpoint this session got into the store
        self.run: dict = {}  # run id and base revision (kit.evaluation.identity), rank 0's copy on every rank
        self.baseline = self.eval_inputs = None
        self.exit_code = 0  # of a job found complete: 4 when pushing its pending final/ failed
        self._recorded = False

    # -- words ------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        if self.ctx.is_main:
            from kit.errors import shown
            from kit.redaction import redact

            # Notes name paths, models and data values: shown escaped (kit.errors.shown), never raw.
            print(f"[kit] {shown(redact(message), limit=None, keep=chr(10) + chr(9))}", flush=True)

    # -- start ------------------------------------------------------------------------------
    @property
    def resume_from(self) -> str | None:
        return self.decision.resume_from

    @property
    def complete(self) -> bool:
        return self.decision.complete

    def start(self) -> None:
        # The decisions, not the estimate and its reasons (free GPU memory read a moment apart may differ).
        decided = {k: v for k, v in self.plan.to_dict().items() if k not in ("memory", "reasons")}
        dist.same_on_every_rank(decided, "the plan")
        if self.smoke:
            if self.cfg.trainer == "grpo":  # every rank checks: the same one line on each, nothing to wait for
                self._check_rewards()
            from kit.train.smoke import Folder

            self._smoke_folder = Folder(self.ctx, self.cfg)
            self.log(f"smoke: one optimizer step in {self._smoke_folder.path}")
            return
        outcome = None
        if self.ctx.is_main:
            try:
                check_output_dir(self.cfg.output_dir)  # before any model, data or store is touched
                if self.cfg.trainer == "grpo":  # prompts, then the reward functions dry-called on two of them
                    self._check_rewards()
                elif self.cfg.trainer != "sft":  # a wrong shape for the trainer: one line, before any model loads
                    from kit.train.preference_data import load

                    load(self.cfg)
                self._dir_lock = lock_output_dir(self.cfg.output_dir)  # held until this process ends
                self._open_store()
                decision = resume.choose(self.cfg, self.store, self.ctx.world_size, self.force, self.steps_given)
                outcome = ("ok", (decision, stage.open_run(self.cfg, self.store)))
            except KitError as e:
                outcome = ("error", (type(e), str(e)))
        kind, value = dist.broadcast(outcome)
        if kind == "error":  # every rank raises the same one-line error, so the job exits cleanly
            self.release()
            raise value[0](value[1])
        self.decision, self.run = value
        if self.cfg.trainer == "grpo":
            self._rewards_on_every_rank()
        self.log(f"run id: {self.run['run_id']}")
        self._localize()
        for w in self.decision.warnings:
            self.log(f"warning: {w}")
        self.log(f"plan: {self.plan.precision}, {self.ctx.world_size} × {self.ctx.device.type}, "
                 f"batch {self.plan.per_device_batch} × accumulation {self.plan.grad_accum} × "
                 f"{self.ctx.world_size} = {self.plan.global_batch}; deadline: {self._deadline_words()}")
        for note in self.notes:
            self.log(note)
        if self.decision.complete:
            self.log(f"already complete: step {self.decision.step} of {self.decision.max_steps} "
                     f"({self.decision.resume_from})")
            if self.ctx.is_main:
                self.target_step = self.decision.max_steps
                self._push_final_if_missing()
                self.record(self.decision.step, "already complete")
            self.release()
            self.signals.finished(self.exit_code)  # the outcome is said: a late signal keeps its exit code
            return
        if self.decision.resume_from:
            self.log(f"resuming from step {self.decision.step} ({self.decision.source}: {self.decision.resume_from})")
        self.signals.install()

    def _config_folder(self):
        from pathlib import Path

        return Path(self.config_path).parent if self.config_path else Path(".")

    def _check_rewards(self) -> None:
        """Trainer grpo: the prompt rows' shape (kit.train.prompt_data), then the reward functions
        loaded and dry-called with two of them (kit.train.rewards); each problem one line, exit 2."""
        from kit.train import prompt_data
        from kit.train.rewards import checked, load_rewards, reward_name

        prompts = prompt_data.load(self.cfg)
        self._enough_prompts(len(prompts))  # every row, before the eval split: the exact count is checked later
        rows = prompt_data.dry_rows(prompts)
        notes: list[str] = []
        seconds = self.cfg.grpo.reward_timeout
        self.reward_funcs = checked(load_rewards(self.cfg.grpo.rewards, base=self._config_folder(), rows=rows,
                                                 notes=notes, seconds=seconds), seconds)
        self.log(f"rewards: {', '.join(reward_name(f) for f in self.reward_funcs)} from {self.cfg.grpo.rewards} "
                 f"(dry-called with {len(rows['prompt'])} rows: {'; '.join(notes)}; TRL runs them on every rank, "
                 "each on its own completions)")

    def _enough_prompts(self, n_prompts: int) -> None:
        """Trainer grpo: UsageError when the prompts do not fill one generation batch (kit.planning.grpo)."""
        from kit.errors import UsageError
        from kit.planning.grpo import prompts_problem

        problem = prompts_problem(n_prompts, self.plan.global_batch, self.cfg.grpo.num_generations)
        if problem:
            raise UsageError(f"{self.cfg.data.path}: {problem}")

    def _rewards_on_every_rank(self) -> None:
        """Rank 0 checked and dry-called the reward functions; the other ranks import the same file. A rank
        that cannot is one line on every rank (each raises it), not a rank left waiting in training."""
        from kit.train.rewards import checked, load_rewards

        problem = None
        if self.reward_funcs is None:
            try:
                seconds = self.cfg.grpo.reward_timeout
                self.reward_funcs = checked(load_rewards(self.cfg.grpo.rewards, base=self._config_folder(),
                                                         seconds=seconds), seconds)
            except KitError as e:
                problem = (type(e), f"rank {self.ctx.rank}: {e}")
        problems = [p for p in dist.gather(problem) if p is not None]
        if problems:
            self.release()
            raise problems[0][0](problems[0][1])

    def _localize(self) -> None:
        """On several nodes each keeps its own output_dir: resume from this node's copy of the
        checkpoint rank 0 chose, the files it lacks sent by rank 0 (kit.train.dist.share_folder)."""
        chosen = self.decision.resume_from
        if not chosen or self.decision.source == "path" or not dist.multi_node():
            return
        here = os.path.join(self.cfg.output_dir, os.path.basename(chosen))
        got = dist.share_folder(chosen, here)
        if got:
            print(f"[kit] rank {self.ctx.rank}: {len(got)} file(s) of {os.path.basename(chosen)} received from rank 0",
                  flush=True)
        self.decision.resume_from = here

    def _deadline_words(self) -> str:
        left = self.deadline.seconds_left()
        return "none" if math.isinf(left) else f"{left / 60:.1f} min left ({self.deadline.source})"

    def _open_store(self) -> None:
        if not self.cfg.store:
            return
        from kit.checkpoints.lease import Lease
        from kit.checkpoints.store import connect
        from kit.checkpoints.sync import BackgroundSync

        self.store = connect(self.cfg.store)  # the same one-line checks as `kit status`
        self.lease = Lease(self.store, heartbeat_s=self.cfg.lease_heartbeat_seconds).acquire()
        self.lease.keep_alive()
        if self.lease.took_over:
            self._record_cut(self.lease.took_over)
        atexit.register(self.release)  # also on a crash; only kill -9 leaves the lease to go stale
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # upload bars from the sync thread would interleave with training's
        self.sync = BackgroundSync(self.store, keep=self.cfg.keep_checkpoints, on_event=self._sync_event,
                                   squash_every=self.cfg.squash_history_every)
        self.log(f"store: {self.store.describe()}")

    def _sync_event(self, event: dict) -> None:
        if event["event"] == "published":
            self.stored_step = max(self.stored_step or 0, event["step"])
            if self.lease is not None:
                self.lease.progress["stored_step"] = self.stored_step
                # So a cut right after this is recorded from here; at most one extra beat per half interval.
                self.lease.beat_soon(unless_within_s=self.lease.heartbeat_s / 2)
        if event["event"] in ("published", "superseded", "failed", "retrying", "paced", "squashed", "squash failed"):
            self.log(f"store: step {event['step']} {event['event']}: {event['detail']}")

    def _push_final_if_missing(self) -> None:
        from kit.deliver import wrapup

        try:
            code, lines = wrapup.push_if_missing(self, self.decision.step)
        except KitError as e:
            code, lines = e.exit_code, [f"error: final/ could not be pushed: {e}"]
        for line in lines:
            self.log(line)
        self.exit_code = code

    # -- evaluation -------------------------------------------------------------------------
    def evaluate_before(self, model, tokenizer, dataset) -> None:
        """Tie the run to the base weights just loaded, then the baseline: once per job, kept in the store.

        Rank 0 measures on the model before any step (LoRA starts as a no-op, so this is the base
        model); the other ranks wait for its outcome and raise the same error if there is one.
        """
        self.eval_inputs = (tokenizer, dataset)
        if self.smoke:
            return
        if getattr(self.plan, "strategy", "ddp") == "fsdp" and self.ctx.world_size > 1:
            # kit's evaluation runs on rank 0 alone; an FSDP model needs every rank for each forward.
            self.cfg.eval_skip_reason = ("the model is sharded with FSDP and kit evaluates on rank 0 alone: "
                                         "evaluate the exported model instead (kit export)")
        outcome = None
        if self.ctx.is_main:
            try:
                self.baseline, notes = stage.before(self.run, self.cfg, model, tokenizer, dataset, self.store,
                                                    self.plan.per_device_batch, self.force,
                                                    reward_funcs=getattr(self, "reward_funcs", None))
                outcome = ("ok", notes)
            except KitError as e:
                outcome = ("error", (type(e), str(e)))
        kind, value = dist.broadcast(outcome)
        if kind == "error":
            self.release()
            raise value[0](value[1])
        for note in value:
            self.log(note)

    # -- training ---------------------------------------------------------------------------
    def max_steps(self, n_train: int, plan=None) -> int:
        """The step the job trains to, for `n_train` train rows batched as `plan` says (default: the job's plan)."""
        plan = plan or self.plan
        if self.cfg.trainer == "grpo":
            self._enough_prompts(n_train)  # the train split, after over-long prompts left out
            # GRPO's batches count completions: each training prompt is answered num_generations times an epoch.
            n_train *= self.cfg.grpo.num_generations
        if self.smoke:
            self.target_step = 1
        elif self.cfg.max_steps:
            # A job extended past the config's max_steps keeps its current target (resume.current_target).
            self.target_step = self.decision.max_steps or self.cfg.max_steps
        else:
            per_step = plan.per_device_batch * self.ctx.world_size
            self.target_step = max(1, math.ceil(self.cfg.epochs * math.ceil(n_train / per_step) / plan.grad_accum))
        if not self.smoke and n_train < plan.global_batch:
            # Every step would see the same few examples: say so, with the numbers, before training.
            self.log(f"warning: {n_train} training example(s), fewer than one global batch of "
                     f"{plan.global_batch} ({plan.per_device_batch} per device × {plan.grad_accum} "
                     f"accumulation × {self.ctx.world_size} process(es)): each of the {self.target_step} steps "
                     f"repeats all of them ({self.target_step} epochs); add data, or lower global_batch / "
                     "per_device_batch")
        return self.target_step

    def settled(self, plan, notes=()) -> None:
        """The plan settled for the data and the job's length (`kit.planning.settle`): the one the
        callbacks, the closing lines and the session record report; each note logged."""
        self.plan = plan
        for note in notes:
            self.log(note)

    def _save_cost_s(self) -> float:
        upload = (self.sync.last_upload_s or 0.0) if self.sync is not None else 0.0
        seal = self._checkpoints.last_seal_s if self._checkpoints else 0.0
        return upload + seal

    def callbacks(self, model, dataset) -> list:
        room = Room(model)  # the next checkpoint's size, checked against the disk before each save
        self.control = Control(self.ctx, self.deadline, self.cfg.save_every_minutes, self.signals,
                                self._save_cost_s, say=self.log, halt=self._lease_lost, room=room)
        self._checkpoints = Checkpoints(self.ctx, fingerprint.of_job(self.cfg), self.sync,
                                        extra={k: self.run.get(k) for k in ("run_id", "base_revision")},
                                        keep=self.cfg.keep_checkpoints, room=room)
        self.meter = Meter(self.ctx.device, self.plan.global_batch * dataset.mean_tokens, self._on_step)
        if self.ctx.is_main and not self.smoke:
            # A session that dies once training began (an exception, not kill -9) is recorded too.
            # Registered after the lease's release, so it runs first, while the lease is still held.
            atexit.register(self._record_if_unfinished)
        out = [self.control, self._checkpoints, self.meter,
               ResumedBatch(self.resume_from, self.log)]
        if self.smoke:
            from kit.train.smoke import Smoke

            self._smoke = Smoke(model, self.cfg.method)
            out.append(self._smoke)
        return out

    def stop_generation_on_request(self, trainer) -> None:
        """Trainer grpo: a stop asked for while a step generates gives that step up at the next token, every rank
        together, instead of waiting for the generation, scoring and training to end (kit.train.generation_stop)."""
        if self.smoke:
            return
        from kit.train.generation_stop import GenerationStop

        GenerationStop(self.ctx, self.control, self.signals, self.deadline, self._save_cost_s,
                       say=self.log, halt=self._lease_lost).attach(trainer)

    def _lease_lost(self) -> str | None:
        lost = self.lease.lost if self.lease is not None else None
        return f"lease lost: {lost}" if lost else None

    def _on_step(self, step: int) -> None:
        # What the next heartbeat carries: a session cut with kill -9 writes no record, so the one
        # that takes its lease over writes it from this (`_record_cut`).
        if self.lease is not None:
            first = "step" not in self.lease.progress
            began = self.meter.began_at if self.meter else None
            self.lease.progress.update(step=step, started=self.started, start_step=self.decision.step or 0,
                                       setup_s=round(began - self.started, 1) if began else None,
                                       max_steps=self.target_step, **self._devices())
            if first:
                self.lease.beat_soon()
        if self.store is not None and not self._rate_checked and self.meter and len(self.meter.step_ends) > 12:
            self._rate_checked = True  # once, from the first steps' speed (the log says it before the cut does)
            from kit.checkpoints.store.pacing import checkpoint_rate_warning

            ends = self.meter.step_ends
            per_hour = self.store.pacer.per_hour
            words = per_hour and checkpoint_rate_warning(self.cfg.save_steps, (ends[-1] - ends[2]) / (len(ends) - 3),
                                                         self.cfg.lease_heartbeat_seconds, per_hour)
            if words:
                self.log(f"warning: {words}")

    def _devices(self) -> dict:
        if self._device_facts is None:
            device = self.ctx.device
            name = device.type
            if device.type == "cuda":
                import torch

                name = torch.cuda.get_device_name(device)
            self._device_facts = {"gpu_name": name, "gpu_count": self.ctx.world_size if device.type == "cuda" else 0,
                                  "world_size": self.ctx.world_size}
        return self._device_facts

    # -- finish -----------------------------------------------------------------------------
    def finish(self, trainer) -> int:
        """Wait for the last upload, record the session, say how it ended. Returns the exit code."""
        from kit.train.finish import finish

        return finish(self, trainer)

    def _record_if_unfinished(self) -> None:
        if not self._recorded:
            m = self.meter
            step = m.first_step - 1 + len(m.step_ends) - 1 if m is not None and m.first_step else self.decision.step
            self.record(step, "failed", {"error": "the session ended without finishing (see its log)"})

    def smoke_report(self) -> tuple[bool, list[str]]:
        """A smoke run's checks after its one step (kit.train.smoke): (all passed, the lines to say); its
        temporary folder removed."""
        ok, lines = self._smoke.report(self.ctx)
        self._smoke_folder.remove()
        return ok, lines

    def record(self, step: int, outcome: str, measured: dict | None = None) -> None:
        """Rank 0: this session's record (kit.checkpoints.session_records), ended at `step` with `outcome`."""
        self._recorded = True
        began = self.meter.began_at if self.meter else None
        record = session_records.of_session(
            run_id=self.run.get("run_id"), started=self.started, start_step=self.decision.step, end_step=step,
            max_steps=self.target_step, outcome=outcome, setup_s=round(began - self.started, 1) if began else None,
            stored_step=self.stored_step if self.store is not None else step, devices=self._devices(),
            measured=measured)
        session_records.append(self.cfg.output_dir, self.store, record)

    def _record_cut(self, lease: dict) -> None:
        record = session_records.of_cut(lease)
        if record is not None:
            session_records.append(self.cfg.output_dir, self.store, record)

    def release(self) -> None:
        """The store's lease and the output_dir lock given back (each once; also at exit)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self._dir_lock is not None:  # the OS would drop it at exit; a notebook's process lives on
            os.close(self._dir_lock)
            self._dir_lock = None
