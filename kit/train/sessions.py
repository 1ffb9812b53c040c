"""The session records a training job writes: one JSON line per session, locally and in the store.

    of_job(job, step, outcome, measured)  # this session's record, at its end (or when it fails)
    of_cut(lease)                         # the record of a session cut by kill -9, from its lease
    append(output_dir, store, record)     # `output_dir/kit_sessions.jsonl` and the store's `kit/sessions.jsonl`
    process_started()                     # when this session began: the launch, before any import

The fields are in docs/CONTRACTS.md (session records); `kit status` and `kit schedule` read them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from kit.errors import KitError

LOCAL = "kit_sessions.jsonl"
IN_STORE = "sessions.jsonl"


def process_started() -> float:
    """Wall-clock time this session's process was launched: under torchrun, the launcher's start.

    A session's setup starts at the launch, not when kit's code first runs: importing torch,
    transformers, peft and trl alone takes seconds that the GPU is held for. Linux only (/proc);
    elsewhere, now.
    """
    pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()  # torchrun's agent is the parent
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def of_job(job, step: int, outcome: str, measured: dict | None = None) -> dict:
    began = job._meter.began_at if job._meter else None
    return {"run_id": job.run.get("run_id"), "host": socket.gethostname(), "started": job.started,
            "ended": time.time(),
            "start_step": job.decision.step, "end_step": step, "max_steps": job._max_steps,
            "world_size": job.ctx.world_size, "outcome": outcome,
            "setup_s": round(began - job.started, 1) if began else None,
            "stored_step": job.stored_step if job.store is not None else step,
            **job._devices(), **(measured or {})}


def of_cut(lease: dict) -> dict | None:
    """The record of the session whose lease we took over: it was cut (kill -9) and recorded nothing.

    Its last heartbeat is all we know: ``ended`` and ``end_step`` are as of then, at most one
    heartbeat interval (``lease_heartbeat_seconds``) before the cut. None for a lease from before
    training began (or an older kit): nothing to account.
    """
    progress = lease.get("progress") or {}
    if not isinstance(progress, dict) or "step" not in progress:
        return None
    return {"host": str(lease.get("holder", "?")).rpartition(" pid ")[0] or "?",
            "started": progress.get("started"), "ended": lease.get("heartbeat"),
            "start_step": progress.get("start_step"), "end_step": progress.get("step"),
            "max_steps": progress.get("max_steps"), "world_size": progress.get("world_size"),
            "outcome": "cut", "setup_s": progress.get("setup_s"),
            "stored_step": progress.get("stored_step"), "gpu_name": progress.get("gpu_name"),
            "gpu_count": progress.get("gpu_count"), "from": "its last lease heartbeat"}


def append(output_dir, store, record: dict) -> None:
    line = json.dumps(record) + "\n"
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, LOCAL), "a") as f:
        f.write(line)
    if store is not None:
        try:
            store.append_text(IN_STORE, line)
        except KitError as e:  # the checkpoint is what matters; a lost record is only a warning
            print(f"[kit] warning: could not record the session in the store: {e}", file=sys.stderr)
