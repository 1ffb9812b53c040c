"""The command that starts `train_ddp.py` on some of this machine's GPUs: written here once.

    launch_command(2)                                  # 'torchrun --standalone --nproc_per_node=2 train_ddp.py'
    launch_command(1)                                  # 'python train_ddp.py'
    launch_command(1, torchrun=True)                   # FSDP: Trainer shards only in a process group
    launch_command(1, visible=[1], vendor="nvidia")    # 'CUDA_VISIBLE_DEVICES=1 python train_ddp.py'
    launch_argv(2)                                     # [sys.executable, '-m', 'torch.distributed.run', …]

`launch_command` is the words shown to a person; `launch_argv` the same command as an argv for a
program to run (the notebooks), with this interpreter and torchrun as its module, so neither a
`python` nor a `torchrun` on PATH is needed.
"""

from __future__ import annotations

import sys


def launch_command(nproc: int, *, torchrun: bool | None = None, visible: list[int] | None = None,
                   vendor: str = "nvidia", script: str = "train_ddp.py") -> str:
    """torchrun for several processes (or when `torchrun` says so), plain python for one.

    `visible`: the GPU indexes the job may see, when it must not see all of them (GPUs this torch
    build cannot run, or more than the plan uses: Trainer would wrap the model in DataParallel).
    """
    use_torchrun = _torchrun(nproc, torchrun)
    command = f"torchrun --standalone --nproc_per_node={nproc} {script}" if use_torchrun else f"python {script}"
    if visible is not None:
        var = "HIP_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"
        command = f"{var}={','.join(str(i) for i in visible)} {command}"
    return command


def launch_argv(nproc: int, *, torchrun: bool | None = None, script: str = "train_ddp.py",
                python: str | None = None) -> list[str]:
    """`launch_command` as an argv: `python -m torch.distributed.run …` (= torchrun) or `python script`."""
    python = python or sys.executable
    if _torchrun(nproc, torchrun):
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={int(nproc)}", script]
    return [python, script]


def _torchrun(nproc: int, torchrun: bool | None) -> bool:
    return nproc > 1 if torchrun is None else torchrun
