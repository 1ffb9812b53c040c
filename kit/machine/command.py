"""The command that starts `train_ddp.py` on some of this machine's GPUs: written here once.

    launch_command(2)                                  # 'torchrun --standalone --nproc_per_node=2 train_ddp.py'
    launch_command(1)                                  # 'python train_ddp.py'
    launch_command(1, torchrun=True)                   # FSDP: Trainer shards only in a process group
    launch_command(1, visible=[1], vendor="nvidia")    # 'CUDA_VISIBLE_DEVICES=1 python train_ddp.py'
    launch_argv(2)                                     # [sys.executable, '-m', 'torch.distributed.run', …]

`launch_command` is the words shown to a person; `launch_argv` the same command as an argv for a
program to run (the notebooks), with this interpreter and torchrun as its module, so neither a
`python` nor a `torchrun` on PATH is needed. `shell_word` / `shell_join` are the one way kit writes
a value (a path, an override) into a command it prints for a person to paste.
"""

from __future__ import annotations

import shlex
import sys

from kit.errors import shown


def shell_word(value, *, path: bool = False) -> str:
    """`value` as one word of a printed shell command that a shell reads back exactly.

    Quoted as `shlex.quote` does (a space, `$(…)` or a quote stays literal); a value holding a character
    a terminal must not get raw (a newline, ESC, a bidi override: `kit.errors.shown`) is written in
    bash's `$'…'` quoting with that character escaped, so the line is safe to print and still pastes
    back to the same value. A `path` that starts with `-` (`output_dir=--help`) is written `./--help`:
    every program then reads it as a file, not as an option (`kit export --adapter --help/final` failed).

        shell_word("my run")                 # "'my run'"
        shell_word("--help/final", path=True)  # './--help/final'
        shell_word("a\u202eb")               # "$'a\\u202eb'"
    """
    text = str(value)
    if path and text.startswith("-"):
        text = "./" + text
    if shown(text, limit=None) == text:
        return shlex.quote(text)
    return "$'" + shown(text.replace("\\", "\\\\").replace("'", "\\'"), limit=None) + "'"


def shell_join(words) -> str:
    """`words` as a printed command line, each one `shell_word`-quoted (paths given as `./-…` already)."""
    return " ".join(shell_word(w) for w in words)


def launch_command(nproc: int, *, torchrun: bool | None = None, visible: list[int] | None = None,
                   vendor: str = "nvidia", script: str = "train_ddp.py") -> str:
    """torchrun for several processes (or when `torchrun` says so), plain python for one.

    `visible`: the GPU indexes the job may see, when it must not see all of them (GPUs this torch
    build cannot run, or more than the plan uses: Trainer would wrap the model in DataParallel).
    """
    use_torchrun = _torchrun(nproc, torchrun)
    script = shell_word(script, path=True)
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
