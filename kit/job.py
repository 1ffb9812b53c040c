"""The mechanics around `trainer.train()`, so the generated script only shows the flow.

`Job.start()`: rank 0 opens the store, takes its lease, and picks the checkpoint to resume from
(local, then store); every rank learns the decision from one broadcast. `Job.callbacks()`:
saves by steps and minutes, manifests, background upload, the deadline. `Job.finish()`: rank 0
waits for the last upload, records the session and prints the outcome. Only rank 0 ever touches
the network.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import socket
import sys
import tempfile
import time

from kit import dist, fingerprint, resume
from kit.callbacks import Checkpoints, Control, Meter, StopSignals, meter_words
from kit.deadline import session_deadline
from kit.errors import KitError

FINAL_UPLOAD_TIMEOUT_S = 600.0


class Job:
    def __init__(self, cfg, ctx, plan, *, smoke: bool = False, force: bool = False):
        self.cfg, self.ctx, self.plan, self.smoke, self.force = cfg, ctx, plan, smoke, force
        self.store = self.sync = self.lease = None
        self.decision = resume.Decision()
        self.signals = StopSignals()
        self.deadline = session_deadline(cfg.time_budget_minutes)
        self.started = time.time()
        self._control = self._checkpoints = self._smoke = self._meter = None
        self._max_steps = None

    # -- words ------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        if self.ctx.is_main:
            print(f"[kit] {message}", flush=True)

    # -- start ------------------------------------------------------------------------------
    @property
    def resume_from(self) -> str | None:
        return self.decision.resume_from

    @property
    def complete(self) -> bool:
        return self.decision.complete

    def start(self) -> None:
        if self.smoke:
            self._start_smoke()
            return
        outcome = None
        if self.ctx.is_main:
            try:
                self._open_store()
                outcome = ("ok", resume.choose(self.cfg, self.store, self.ctx.world_size, self.force))
            except KitError as e:
                outcome = ("error", (type(e), str(e)))
        kind, value = dist.broadcast(outcome)
        if kind == "error":  # every rank raises the same one-line error, so the job exits cleanly
            self._release()
            raise value[0](value[1])
        self.decision = value
        for w in self.decision.warnings:
            self.log(f"warning: {w}")
        self.log(f"plan: {self.plan.precision}, {self.ctx.world_size} × {self.ctx.device.type}, "
                 f"batch {self.plan.per_device_batch} × accumulation {self.plan.grad_accum} × "
                 f"{self.ctx.world_size} = {self.plan.global_batch}; deadline: {self._deadline_words()}")
        for note in self.plan.notes:
            self.log(note)
        if self.decision.complete:
            self.log(f"already complete: step {self.decision.step} of {self.decision.max_steps} "
                     f"({self.decision.resume_from})")
            if self.ctx.is_main:
                self._max_steps = self.decision.max_steps
                self._record(self.decision.step, "already complete")
            self._release()
        elif self.decision.resume_from:
            self.log(f"resuming from step {self.decision.step} ({self.decision.source}: {self.decision.resume_from})")
        self.signals.install()

    def _deadline_words(self) -> str:
        left = self.deadline.seconds_left()
        return "none" if math.isinf(left) else f"{left / 60:.1f} min left ({self.deadline.source})"

    def _start_smoke(self) -> None:
        # One step into a fresh folder: never touches output_dir, its checkpoints or the store.
        folder = dist.broadcast(tempfile.mkdtemp(prefix="kit-smoke-") if self.ctx.is_main else None)
        self.cfg.output_dir, self.cfg.logging_steps, self.cfg.save_steps = folder, 1, 10**9
        self.cfg.save_every_minutes = 10**9
        self.cfg.eval_steps = None
        self.cfg.warmup_steps = 0  # a warmup would make the one step's learning rate 0
        self.log(f"smoke: one optimizer step in {folder}")

    def _open_store(self) -> None:
        if not self.cfg.store:
            return
        from kit.lease import Lease
        from kit.store import connect
        from kit.sync import BackgroundSync

        self.store = connect(self.cfg.store)  # the same one-line checks as `kit status`
        self.lease = Lease(self.store).acquire()
        self.lease.keep_alive()
        atexit.register(self._release)  # also on a crash; only kill -9 leaves the lease to go stale
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # upload bars from the sync thread would interleave with training's
        self.sync = BackgroundSync(self.store, keep=self.cfg.keep_checkpoints, on_event=self._sync_event,
                                   squash_every=self.cfg.squash_history_every)
        self.log(f"store: {self.store.describe()}")

    def _sync_event(self, event: dict) -> None:
        if event["event"] in ("published", "superseded", "failed", "retrying", "squashed", "squash failed"):
            self.log(f"store: step {event['step']} {event['event']}: {event['detail']}")

    # -- training ---------------------------------------------------------------------------
    def max_steps(self, n_train: int) -> int:
        if self.smoke:
            self._max_steps = 1
        elif self.cfg.max_steps:
            self._max_steps = self.cfg.max_steps
        else:
            per_step = self.plan.per_device_batch * self.ctx.world_size
            self._max_steps = max(1, math.ceil(self.cfg.epochs * math.ceil(n_train / per_step) / self.plan.grad_accum))
        return self._max_steps

    def _save_cost_s(self) -> float:
        upload = (self.sync.last_upload_s or 0.0) if self.sync is not None else 0.0
        seal = self._checkpoints.last_seal_s if self._checkpoints else 0.0
        return upload + seal

    def callbacks(self, model, dataset) -> list:
        self._control = Control(self.ctx, self.deadline, self.cfg.save_every_minutes, self.signals,
                                self._save_cost_s)
        self._checkpoints = Checkpoints(self.ctx, fingerprint.of_job(self.cfg), self.sync)
        self._meter = Meter(self.ctx.device, self.plan.global_batch * dataset.mean_tokens)
        out = [self._control, self._checkpoints, self._meter]
        if self.smoke:
            from kit.smoke import Smoke

            self._smoke = Smoke(model, self.cfg.method)
            out.append(self._smoke)
        return out

    # -- finish -----------------------------------------------------------------------------
    def finish(self, trainer) -> int:
        """Wait for the last upload, record the session, say how it ended. Returns the exit code."""
        self.signals.uninstall()
        if self.smoke:
            ok, lines = self._smoke.report(self.ctx)
            for line in lines:
                self.log(line)
            return 0 if ok else 1
        step = trainer.state.global_step
        paused = self._control.stop_reason is not None and step < trainer.state.max_steps
        outcome = "paused" if paused else "complete"
        if self.ctx.is_main:
            measured = self._meter.summary()
            words = meter_words(measured)
            if words:
                self.log(words)
            if self.sync is not None:
                self.sync.close(timeout=FINAL_UPLOAD_TIMEOUT_S)
            self._record(step, outcome, measured)
            self._release()
            if paused:
                self.log(f"paused at step {step} of {trainer.state.max_steps} ({self._control.stop_reason}) — "
                         "run the same command to continue")
            else:
                self.log(f"complete: step {step} of {trainer.state.max_steps}; checkpoint in "
                         f"{self.cfg.output_dir}/checkpoint-{step}")
        return 0

    def _record(self, step: int, outcome: str, measured: dict | None = None) -> None:
        record = {"host": socket.gethostname(), "started": self.started, "ended": time.time(),
                  "start_step": self.decision.step, "end_step": step, "max_steps": self._max_steps,
                  "world_size": self.ctx.world_size, "outcome": outcome, **(measured or {})}
        line = json.dumps(record) + "\n"
        os.makedirs(self.cfg.output_dir, exist_ok=True)
        with open(os.path.join(self.cfg.output_dir, "kit_sessions.jsonl"), "a") as f:
            f.write(line)
        if self.store is not None:
            try:  # one writer per store (the lease), so read-then-write loses nothing
                self.store.write_text("kit/sessions.jsonl", (self.store.read_text("kit/sessions.jsonl") or "") + line)
            except KitError as e:  # the checkpoint is what matters; a lost record is only a warning
                print(f"[kit] warning: could not record the session in the store: {e}", file=sys.stderr)

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None
