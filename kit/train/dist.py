"""Everything distributed, in one place: who am I, which device, agree, and tear down.

The same code runs under `torchrun` (RANK/LOCAL_RANK/WORLD_SIZE set), under plain `python`, and
in a notebook cell: without a process group every helper acts as the only rank (torchtune's
`get_world_size_and_rank` does the same).

    ctx = dist.init()            # pins the device from LOCAL_RANK, starts nccl (GPU) or gloo (CPU)
    ok, code = False, 1
    try:
        code = ...train...
        ok = True
    finally:
        dist.teardown(ok, code)  # barrier only if this rank got here cleanly, destroy, exit with code
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from kit.files import env_seconds, write_atomic

# Long enough for rank 0 to download a checkpoint or finish a final upload while the others wait
# at a barrier; short enough that a lost peer ends the job instead of hanging a session.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
# Forming the group: torchrun starts every rank at once (and on several nodes, only once all agents
# met), so the ranks meet within seconds of their imports. A rank launched alone with WORLD_SIZE=2,
# or a MASTER_ADDR nobody answers on, waited the whole DEFAULT_TIMEOUT.
RENDEZVOUS_S = 180.0  # KIT_RENDEZVOUS_S overrides it


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when there is no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# What torchrun sets, and what accelerate (inside Trainer) reads as integers too: set but not a
# whole number (empty included), accelerate's int() raised a traceback once kit had written files.
LAUNCHER_INTS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK",
                 "MV2_COMM_WORLD_LOCAL_RANK")
PRECISIONS = ("no", "fp16", "bf16", "fp8")  # accelerate's ACCELERATE_MIXED_PRECISION values


def env_int(name: str, default: int) -> int:
    """An integer that torchrun (or the user) set in the environment; a UsageError when it is not one."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        from kit.errors import UsageError

        raise UsageError(f"environment variable {name}={value!r} is not a whole number >= 0: torchrun sets it; "
                         f"unset it to run one process")
    return number


def init(timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> Context:
    """Read RANK/LOCAL_RANK/WORLD_SIZE, pin this rank's device and start the process group."""
    for name in LAUNCHER_INTS:
        env_int(name, 0)
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if precision is not None and precision.lower() not in PRECISIONS:
        from kit.errors import UsageError

        raise UsageError(f"environment variable ACCELERATE_MIXED_PRECISION={precision[:20]!r} is not one of "
                         f"{', '.join(PRECISIONS)}: unset it (kit sets the precision itself)")
    rank = env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", 0)
    world_size = env_int("WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size or local_rank >= world_size:
        from kit.errors import UsageError

        raise UsageError(f"environment: RANK {rank} / LOCAL_RANK {local_rank} is not a rank of WORLD_SIZE "
                         f"{world_size}: torchrun sets them; unset them to run one process")
    if torch.cuda.is_available():
        # Pin before anything touches CUDA, or every rank opens a context on GPU 0.
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world_size == 1:
        return Context(rank, local_rank, 1, device, None)
    if not tdist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        with _bounded_rendezvous(rank, world_size, _rendezvous_address()):
            tdist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    return Context(rank, local_rank, world_size, device, backend)


def _rendezvous_address() -> str:
    """MASTER_ADDR:MASTER_PORT, checked: torch's own errors are tracebacks."""
    from kit.errors import UsageError

    addr = os.environ.get("MASTER_ADDR", "").strip()
    port = os.environ.get("MASTER_PORT", "").strip()
    if not addr or not port:
        missing = " and ".join(n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if not v)
        raise UsageError(f"environment: WORLD_SIZE={os.environ.get('WORLD_SIZE')} but {missing} not set: launch "
                         "with torchrun (it sets them all), or unset WORLD_SIZE and RANK to run one process")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"environment variable MASTER_PORT={port!r} is not a port number (1-65535)")
    return f"{addr}:{port}"


@contextlib.contextmanager
def _bounded_rendezvous(rank: int, world_size: int, address: str):
    """End the process (one line, exit 2) if the group has not formed within RENDEZVOUS_S."""
    import threading

    from kit.errors import EXIT_USAGE, shown

    wait_s = env_seconds("KIT_RENDEZVOUS_S", RENDEZVOUS_S)

    def give_up():
        print(f"error: rank {rank} of WORLD_SIZE {world_size} waited {wait_s:.0f} s at {shown(address)} for the "
              "other ranks, which never came: launch with torchrun (it starts every rank), or unset WORLD_SIZE "
              "and RANK to run one process", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_USAGE)  # the main thread is inside torch's rendezvous: nothing else ends it

    timer = threading.Timer(wait_s, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def barrier() -> None:
    if tdist.is_available() and tdist.is_initialized():
        if tdist.get_backend() == "nccl":
            tdist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            tdist.barrier()


@contextlib.contextmanager
def local_main_first():
    """Run the block on each node's first rank, then on the node's other ranks.

    What the block downloads (model, tokenizer, data) is fetched once per node into the node's
    cache; the others read it from there. Every rank passes one barrier, so it is safe in any
    world size, one node or many.
    """
    local_rank = env_int("LOCAL_RANK", 0)
    if local_rank != 0:
        barrier()
    yield  # no barrier after a failure: the failed rank exits and torchrun ends the job
    if local_rank == 0:
        barrier()


def multi_node() -> bool:
    """More ranks in the job than on this node (torchrun sets LOCAL_WORLD_SIZE)."""
    return env_int("WORLD_SIZE", 1) > env_int("LOCAL_WORLD_SIZE", env_int("WORLD_SIZE", 1))


def share_folder(src: str, dest: str) -> list[str]:
    """Copy rank 0's folder `src` to `dest` on the other nodes: the files `dest` lacks there.

    Each node keeps its own output_dir, and only global rank 0 saves the model and talks to the
    store, so a checkpoint to resume from is complete on node 0 alone. Its files go over the
    process group, one file per broadcast, to each node's first rank. Returns the names written
    here. A no-op on one node.
    """
    if not multi_node() or not (tdist.is_available() and tdist.is_initialized()):
        return []
    from pathlib import Path

    rank, local_rank = tdist.get_rank(), env_int("LOCAL_RANK", 0)
    src_p, dest_p = Path(src), Path(dest)
    files = broadcast(sorted(p.relative_to(src_p).as_posix() for p in src_p.rglob("*") if p.is_file())
                      if rank == 0 else None)
    lacking = [] if rank == 0 or local_rank != 0 else [f for f in files if not (dest_p / f).is_file()]
    wanted = sorted({f for names in gather(lacking) for f in names})
    written = []
    for name in wanted:
        data = broadcast((src_p / name).read_bytes() if rank == 0 else None)
        if name in lacking:
            target = dest_p / name
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data)
            written.append(name)
    return written


def broadcast(obj, src: int = 0):
    """Rank `src`'s `obj` on every rank (a picklable object). Also a barrier."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return [obj]
    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def same_on_every_rank(fields: dict, what: str) -> None:
    """Refuse, on every rank alike, when the ranks settled `fields` differently.

    Each rank plans for itself (a `--config` at launch plans from each rank's own probe). Ranks
    that disagree on batch or accumulation make different numbers of collective calls per step,
    and the job would hang in NCCL instead of failing: so they stop here, before any training.

    Raises:
        KitError: (exit 3) naming the first rank that differs from rank 0 and how.
    """
    from kit.errors import KitError

    everyone = gather(fields)
    for rank, theirs in enumerate(everyone[1:], start=1):
        diff = [f"{k} {everyone[0].get(k)!r} vs {theirs.get(k)!r}" for k in sorted(set(everyone[0]) | set(theirs))
                if everyone[0].get(k) != theirs.get(k)]
        if diff:
            raise KitError(f"rank {rank} settled {what} differently from rank 0 ({'; '.join(diff)}): the machine "
                           "changed while the ranks planned (e.g. another process took GPU memory); run again", 3)


def any_true(flags: list[bool], device: torch.device) -> list[bool]:
    """Element-wise OR of `flags` over all ranks, so every rank takes the same decision.

    One tiny all-reduce; call it once per step, never per parameter.
    """
    if not (tdist.is_available() and tdist.is_initialized()):
        return list(flags)
    t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def teardown(ok: bool, exit_code: int | None = None) -> None:
    """Leave the process group. Always call it, from a `finally`.

    `ok`: this rank finished cleanly. Only then do we wait at a barrier for the others; a rank
    that failed must not wait for peers that may be stuck in a collective with it. It exits
    non-zero, and torchrun then stops the whole job instead of letting it hang.

    `exit_code`: with `ok` in a distributed run, the process ends right here with this code, its
    output flushed, without the interpreter's teardown. That teardown can hang a rank whose work
    is done: the gloo process group still referenced by DDP is destroyed while its peer has gone
    (pytorch/pytorch#75097). Seen here about once in a hundred 2-rank CPU runs: the checkpoint and
    the session record written, "complete" printed, and the process never exiting.
    """
    if not (tdist.is_available() and tdist.is_initialized()):
        return
    try:
        if ok:
            barrier()
    finally:
        tdist.destroy_process_group()
    if ok and exit_code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
