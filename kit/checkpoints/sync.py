"""Publish checkpoints in the background while training goes on.

Only rank 0 creates a :class:`BackgroundSync` (the other ranks never touch the store); it never
calls ``torch.distributed``. ``submit()`` snapshots the checkpoint by hard-linking its files into
a private staging folder — HF Trainer's ``save_total_limit`` rotation may delete the original
while it uploads — and returns at once. One worker thread publishes, one checkpoint at a time.

Unlike HF Trainer's ``hub_strategy="checkpoint"`` (which silently skips a push while the previous
one runs), a newer submission *replaces a queued one that has not started*, and says so in the
log and in ``on_event``; the one in flight is never cancelled. Timeouts, dropped connections,
429 and 5xx are retried with backoff; a refusal (401/403/404) is recorded in ``errors`` and raised
by ``wait()``, but never stops training.

Example (rank 0 only)::

    sync = BackgroundSync(store, keep=3, on_event=print)
    sync.submit(Path("outputs/checkpoint-200"), 200)    # returns in milliseconds
    ...
    sync.close(timeout=budget_s)                          # the final checkpoint always goes
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kit.errors import StoreError
from kit.checkpoints.leftovers import STAGING, owned_name
from kit.checkpoints.manifest import MANIFEST_NAME, write_manifest
from kit.checkpoints.store.base import Store, TransientStoreError
from kit.retry import retry

log = logging.getLogger("kit.checkpoints.sync")


class SyncEvent(dict):
    """An ``on_event`` payload: a dict (event, step, detail, time) that prints as one log line."""

    def __str__(self) -> str:
        return f"sync: step {self['step']} {self['event']} ({self['detail']})"


@dataclass
class _Job:
    step: int
    source: Path
    staged: Path
    nbytes: int
    manifest_args: tuple | None = None  # (world_size, fingerprint, extra) to build it in the worker


class BackgroundSync:
    """A single background uploader for one store. Create it on rank 0 only."""

    def __init__(self, store: Store, keep: int, *, retries: int = 5,
                 backoff: tuple[float, ...] = (1, 2, 4, 8, 16),
                 on_event: Callable[[dict], None] | None = None, squash_every: int = 0):
        self.store, self.keep, self.retries = store, keep, retries
        self.squash_every = squash_every  # compact the store's history after every N publishes; 0 never
        self.backoff = tuple(backoff) or (0.0,)
        self.on_event = on_event
        self.errors: list[StoreError] = []
        self.published: list[int] = []
        self.superseded: list[int] = []
        self.last_upload_s: float | None = None
        self.last_upload_bytes: int | None = None
        self._reported = 0
        self._cv = threading.Condition()
        self._pending: _Job | None = None
        self._inflight: _Job | None = None
        self._closing = False
        self._paced_step: int | None = None
        self._thread = threading.Thread(target=self._run, name="kit-sync", daemon=True)
        self._thread.start()

    # ---- producer side (the training loop) ----------------------------------------------------
    def submit(self, ckpt_dir: Path, step: int, *, world_size: int = 1, fingerprint: dict | None = None,
               extra: dict | None = None) -> None:
        """Queue ``ckpt_dir`` for publishing; returns at once (hard links only, no hashing here).

        If the checkpoint has no kit manifest and ``fingerprint`` is given, the worker writes the
        manifest into its staged copy, so hashing a large checkpoint never blocks training. The
        local folder is then left without one: write it yourself if local resume needs it.
        """
        ckpt_dir = Path(ckpt_dir)
        try:
            staged, nbytes = _stage(ckpt_dir, step)
        except OSError as err:
            self._fail(step, StoreError(f"could not snapshot {ckpt_dir} for upload: {err}"))
            return
        manifest_args = None if fingerprint is None else (world_size, dict(fingerprint), extra)
        job = _Job(step, ckpt_dir, staged, nbytes, manifest_args)
        with self._cv:
            if self._closing:
                shutil.rmtree(staged, ignore_errors=True)
                raise StoreError("BackgroundSync is closed; submit before close()")
            old, self._pending = self._pending, job
            self._cv.notify_all()
        self._emit("submitted", step, f"{nbytes} bytes staged")
        if old is not None:
            shutil.rmtree(old.staged, ignore_errors=True)
            self.superseded.append(old.step)
            log.warning("checkpoint %d was still waiting to upload; step %d supersedes it "
                        "(the upload in flight continues)", old.step, step)
            self._emit("superseded", old.step, f"replaced by step {step} before its upload started")

    def drop_pending(self) -> None:
        """Forget the queued checkpoint (not the one uploading now): the store is no longer ours."""
        with self._cv:
            if self._pending is not None:
                self.superseded.append(self._pending.step)
                shutil.rmtree(self._pending.staged, ignore_errors=True)
                self._pending = None
                self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything submitted is published (or failed). False on timeout.

        Raises:
            StoreError: the first failure not yet reported (401/403/404, or retries exhausted).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._pending is not None or self._inflight is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
            new = self.errors[self._reported:]
            self._reported = len(self.errors)
        if new:
            raise new[0]
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Publish what is queued (blocking up to ``timeout``), then stop the worker.

        Returns True when everything submitted is in the store; failures are in ``errors``.
        """
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        try:
            done = self.wait(timeout)
        except StoreError as err:
            log.error("checkpoint upload failed: %s", err)
            done = False
        self._thread.join(0 if not done else timeout)
        return done and not self.errors

    @property
    def busy(self) -> bool:
        with self._cv:
            return self._pending is not None or self._inflight is not None

    def stats(self) -> dict:
        """Numbers the deadline planner can use: last upload seconds, bytes, and bytes/s."""
        rate = (self.last_upload_bytes / self.last_upload_s
                if self.last_upload_s and self.last_upload_bytes else None)
        return {"last_upload_s": self.last_upload_s, "last_upload_bytes": self.last_upload_bytes,
                "bytes_per_s": rate, "published": list(self.published),
                "superseded": list(self.superseded), "errors": [str(e) for e in self.errors]}

    # ---- worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closing:
                    self._cv.wait()
                if self._pending is None:
                    return
                # The store's commit budget (the Hub's ~128/h): hold the queued checkpoint back;
                # a newer one submitted meanwhile supersedes it. The last one, at close, goes at once.
                wait = 0.0 if self._closing else self.store.pacer.wait_s()
                if wait > 0:
                    if self._pending.step != self._paced_step:  # say it once per checkpoint held back
                        self._paced_step = self._pending.step
                        self._emit("paced", self._pending.step, f"held up to {wait:.0f} s: the store's commit budget")
                    self._cv.wait(wait)
                    continue
                job, self._pending, self._inflight = self._pending, None, self._pending
            try:
                self._publish(job)
            finally:
                shutil.rmtree(job.staged, ignore_errors=True)
                with self._cv:
                    self._inflight = None
                    self._cv.notify_all()

    def _publish(self, job: _Job) -> None:
        if job.manifest_args is not None and not (job.staged / MANIFEST_NAME).exists():
            try:
                write_manifest(job.staged, job.step, *job.manifest_args)
            except OSError as err:
                self._fail(job.step, StoreError(f"could not write the manifest of step {job.step}: {err}"))
                return
        n, t0 = 0, time.monotonic()

        def attempt() -> None:
            nonlocal n, t0
            n += 1
            self._emit("started" if n == 1 else "retrying", job.step, f"attempt {n}")
            t0 = time.monotonic()
            self.store.publish(job.staged, job.step, self.keep)

        pauses = [self.backoff[min(i, len(self.backoff) - 1)] for i in range(self.retries)]
        try:
            retry(attempt, pauses=pauses, transient=(TransientStoreError,), what=f"uploading step {job.step}",
                  log=log)
        except TransientStoreError as err:
            self._fail(job.step, StoreError(f"step {job.step} not published after {self.retries + 1} attempts: {err}"))
            return
        except StoreError as err:
            self._fail(job.step, err)
            return
        except Exception as err:  # a bug must not kill the uploader thread silently: record it
            log.exception("unexpected error publishing step %d", job.step)
            self._fail(job.step, StoreError(f"step {job.step}: unexpected {type(err).__name__}: {err}"))
            return
        self.last_upload_s = time.monotonic() - t0  # of the attempt that landed
        self.last_upload_bytes = job.nbytes
        self.published.append(job.step)
        log.info("published step %d to %s in %.1f s (%d bytes)", job.step, self.store.describe(),
                 self.last_upload_s, job.nbytes)
        self._emit("published", job.step, f"{self.last_upload_s:.1f} s, {job.nbytes} bytes")
        self._maybe_squash(job.step)

    def _maybe_squash(self, step: int) -> None:
        """Squash the history here, in the worker, between two publishes: it never races one.

        Not while closing: the main thread then reads and writes job records, which a squash
        would un-pin. A failed squash is only a warning — the checkpoint is published.
        """
        if not self.squash_every or len(self.published) % self.squash_every or self._closing:
            return
        try:
            if self.store.compact_history():
                self._emit("squashed", step, f"history squashed after {len(self.published)} publishes")
        except StoreError as err:
            log.warning("squashing the history of %s failed (%s); the checkpoints are unaffected",
                        self.store.describe(), err)
            self._emit("squash failed", step, str(err))

    def _fail(self, step: int, err: StoreError) -> None:
        self.errors.append(err)
        log.error("checkpoint %d was not published: %s (training continues)", step, err)
        self._emit("failed", step, str(err))

    def _emit(self, kind: str, step: int, detail: str) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(SyncEvent(event=kind, step=step, detail=detail, time=time.time()))
        except Exception:  # a broken callback must not stop uploads; it is logged, not hidden
            log.exception("on_event callback raised for %s of step %d", kind, step)


def _stage(ckpt_dir: Path, step: int) -> tuple[Path, int]:
    """Hard-link (or copy, across filesystems) every file of ``ckpt_dir`` into a private folder."""
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"{ckpt_dir} is not a folder")
    # The owner in the name lets the next run remove it after a kill (kit.checkpoints.leftovers).
    staged = ckpt_dir.parent / STAGING / f"{owned_name(f'checkpoint-{step}')}-{uuid.uuid4().hex[:8]}"
    staged.mkdir(parents=True)
    nbytes = 0
    try:
        for src in sorted(ckpt_dir.rglob("*")):
            if not src.is_file():
                continue
            dst = staged / src.relative_to(ckpt_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:  # EXDEV, EPERM, a filesystem without hard links
                shutil.copy2(src, dst)
            nbytes += dst.stat().st_size
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged, nbytes
