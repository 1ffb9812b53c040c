"""The command that starts `train_ddp.py` on some of this machine's GPUs: written here once.

    launch_command(2)                                  # 'torchrun --standalone --nproc_per_node=2 train_ddp.py'
    launch_command(1)                                  # 'python train_ddp.py'
    launch_command(1, torchrun=True)                   # FSDP: Trainer shards only in a process group
    launch_command(1, visible=[1], vendor="nvidia")    # 'CUDA_VISIBLE_DEVICES=1 python train_ddp.py'
"""

from __future__ import annotations


def launch_command(nproc: int, *, torchrun: bool | None = None, visible: list[int] | None = None,
                   vendor: str = "nvidia", script: str = "train_ddp.py") -> str:
    """torchrun for several processes (or when `torchrun` says so), plain python for one.

    `visible`: the GPU indexes the job may see, when it must not see all of them (GPUs this torch
    build cannot run, or more than the plan uses: Trainer would wrap the model in DataParallel).
    """
    use_torchrun = nproc > 1 if torchrun is None else torchrun
    command = f"torchrun --standalone --nproc_per_node={nproc} {script}" if use_torchrun else f"python {script}"
    if visible is not None:
        var = "HIP_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"
        command = f"{var}={','.join(str(i) for i in visible)} {command}"
    return command
