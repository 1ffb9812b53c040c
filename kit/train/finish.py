"""How a training session ends: the last upload, delivery, the session record, the words.

    code = finish(job, trainer)   # Job.finish; returns the process's exit code
"""

from __future__ import annotations

import sys

from kit.errors import EXIT_CANNOT_TRAIN, EXIT_STORE, CannotTrain, shown, under_torchrun
from kit.train.callbacks import meter_words

FINAL_UPLOAD_TIMEOUT_S = 600.0


def finish(job, trainer) -> int:
    """Wait for the last upload, record the session, say how it ended. Returns the exit code."""
    job.signals.uninstall()
    if job.smoke:
        ok, lines = job.smoke_report()
        for line in lines:
            job.log(line)
        if ok:
            return 0
        if job.ctx.is_main:  # a check failed, not kit: exit 3 (this config cannot train here), one error line
            print(f"error: {shown(lines[-1], limit=None)}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_TRAIN
    step = trainer.state.global_step
    if job.control.halted:  # another session took the store over: leave it to that one
        if job.ctx.is_main:
            if job.sync is not None:
                job.sync.drop_pending()
                job.sync.close(timeout=FINAL_UPLOAD_TIMEOUT_S)
            job.lease = None  # not ours: nothing to release
        job.signals.finished(EXIT_STORE)
        if job.ctx.is_main:
            print(f"error: stopped at step {step}: {shown(job.control.stop_reason, limit=None)}; this session writes "
                  "nothing more to the store", file=sys.stderr, flush=True)
        return EXIT_STORE
    if job.control.diverged:  # NaN/inf: nothing to deliver; the checkpoints before it stay
        if job.ctx.is_main:
            if job.sync is not None:
                job.sync.close(timeout=FINAL_UPLOAD_TIMEOUT_S)
            job.record(step, "failed", {"error": job.control.stop_reason})
            job.release()
        raise CannotTrain(job.control.stop_reason)  # every rank: one error line, exit 3
    paused = job.control.stop_reason is not None and step < job.target_step
    outcome = "paused" if paused else "complete"
    code, closing = 0, []
    if job.ctx.is_main:
        measured = job.meter.summary()
        words = meter_words(measured)
        if words:
            job.log(words)
        if job.sync is not None:
            job.sync.close(timeout=FINAL_UPLOAD_TIMEOUT_S)
        behind = store_behind(job, step)
        if not paused:
            from kit.deliver import wrapup

            code, closing, delivered = wrapup.deliver(job, trainer, step)
            measured = {**measured, **delivered}
        job.record(step, outcome, measured)
        job.release()
        if behind:
            code = EXIT_STORE
    job.signals.finished(code)  # every rank: the outcome is decided, and said next; a late signal keeps the code
    if job.ctx.is_main:
        if paused:
            after = ""
            signalled = job.control.stop_reason.startswith("signal") and under_torchrun()
            if signalled:
                after = ("; torchrun's SignalException traceback and exit 1 that follow are its reaction to "
                         "the same signal: the checkpoint is saved")
            said = (f"paused at step {step} of {job.target_step} ({job.control.stop_reason}) — "
                    f"run the same command to continue")
            job.log(said + after)
            if signalled:  # torchrun's traceback comes after the ranks end: say the outcome again, last
                from kit.redaction import redact
                from kit.train.last_word import repeat_after_torchrun

                repeat_after_torchrun(f"[kit] {redact(said)} [kit exit 0; the SignalException traceback and "
                                      f"exit 1 above are torchrun's own reaction to the signal]")
        else:
            job.log(f"complete: step {step} of {job.target_step}; checkpoint in "
                    f"{job.cfg.output_dir}/checkpoint-{step}")
            for line in closing:
                job.log(line)
        if behind:  # the next session, on a fresh machine, would resume from the store's older step
            from kit.redaction import redact

            print(f"error: {shown(redact(behind), limit=None)}", file=sys.stderr, flush=True)
    return code


def store_behind(job, step: int) -> str | None:
    """Why the store lacks this session's last checkpoint (its uploads failed), None when it has it."""
    if job.store is None or step <= job.decision.step or (job.stored_step or 0) >= step:
        return None
    errors = job.sync.errors if job.sync is not None else []
    newest = max(job.stored_step or 0, job.decision.step) or None
    why = f": {errors[-1]}" if errors else ""
    return (f"the store {job.store.describe()} is behind: its newest checkpoint is "
            f"{f'step {newest}' if newest else 'none'}, this session ended at step {step}, as its uploads failed{why}. "
            f"Keep {job.cfg.output_dir} (it holds checkpoint-{step}), fix the store and run the same command: it "
            "resumes from there; a fresh machine would resume from the store's older step")
