"""Kit's outcome as the last line of a torchrun job, after torchrun's own last words.

On Ctrl-C (SIGINT) or SIGTERM, torchrun's agent (torch.distributed.elastic) raises
`SignalException` in itself, forwards the signal to each rank's process group, waits for the
ranks, then lets the exception end it: a traceback and exit 1, printed *after* everything the
ranks said. The ranks meanwhile paused cleanly (checkpoint saved, exit 0). Nothing inside a rank
can change what the agent prints or returns, so rank 0 leaves a tiny watcher behind that waits
for the agent to exit and then prints kit's outcome line once more: the last line the user sees
is kit's, naming kit's exit code. Under `python train_ddp.py` there is no agent and nothing to do.

Example (rank 0, under torchrun):
    >>> repeat_after_torchrun("[kit] paused at step 40 of 60 … [kit exit 0]")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAIT_S = 60.0  # torchrun's agent gives its ranks 30 s to stop by default, then kills them

# Polls the agent's pid (the rank's parent) and prints once it has exited, or gives up silently.
# An exited agent stays a zombie until its parent reaps it, and a parent that reads the pipe to
# its end first (subprocess.communicate, a notebook's `!torchrun`) reaps it only after this
# watcher lets go of the pipe: so a zombie counts as exited (state Z in /proc/PID/stat).
_WATCHER = """
import os, sys, time
pid, line, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
out = sys.stderr if sys.argv[4] == "stderr" else sys.stdout
claim = sys.argv[5] if len(sys.argv) > 5 else ""
def gone():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (not Linux): ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
while time.monotonic() < deadline:
    if gone():
        print(line, file=out, flush=True)
        break
    time.sleep(0.02)
if claim:
    try:
        os.unlink(claim)
    except FileNotFoundError:
        pass
"""


def say_error(err) -> None:
    """The job's one `error:` line for a KitError; under torchrun, said again after its report.

    Under torchrun the first rank to stop with a KitError says it (`claim_error`) and the others
    stay quiet: an error every rank hits is one line, and one that only some rank hits (a reward
    function failing on that rank's completions, a file only its node lacks) is still said, where
    before only rank 0 spoke and such a line was lost behind torchrun's report. torchrun answers
    a rank's exit 2, 3 or 4 with its own exit 1 and a ChildFailedError report printed after the
    rank's line: the repeat makes the last line name kit's code.
    """
    from kit.errors import exit_words

    claim = claim_error()
    if claim is False:  # another rank of this launch said it
        return
    _end_progress_bars()
    # Another rank's progress bar (rank 0 draws them) may be mid-line on the terminal both write to.
    fresh_line = "\n" if os.environ.get("RANK", "0") != "0" else ""
    print(f"{fresh_line}error: {err}{exit_words(err.exit_code)}", file=sys.stderr, flush=True)
    repeat_after_torchrun(f"error: {err} [kit exit {err.exit_code}; torchrun's exit 1 and its ChildFailedError "
                          f"report above pass it on]", stream="stderr", claim=claim if isinstance(claim, Path) else None)


def _claim_path() -> Path | None:
    """The file whose creation claims the job's error line, one per torchrun launch on this machine
    (its run id, its agent's pid and restart count); None outside torchrun."""
    from kit.errors import under_torchrun

    if not under_torchrun():
        return None
    launch = "-".join(os.environ.get(k, "0") for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"))
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in launch)[:120]
    return Path(tempfile.gettempdir()) / f"kit-error-{os.getppid()}-{safe}"


def claim_error() -> Path | bool:
    """Whether this rank says the job's error line: True alone; under torchrun the claim file's path
    when this rank is the first to create it, False when another rank did. Where the file cannot be
    made (no writable temporary folder), rank 0 speaks, as it always did."""
    path = _claim_path()
    if path is None:
        return True
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return os.environ.get("RANK", "0") == "0"
    return path


def another_rank_said_it(wait_s: float = 3.0) -> bool:
    """Whether another rank of this torchrun launch said the job's error line, waiting up to `wait_s`
    for it (that rank leaves the process group, which fails this rank's collective, just before it
    speaks): a crash here after it is its consequence, and its traceback says nothing new."""
    path = _claim_path()
    if path is None:
        return False
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _end_progress_bars() -> None:
    """Close the progress bars still drawn (Trainer's, when an error stops training mid-step), so the error
    line starts a line of its own instead of trailing a bar."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        bar.close()


def repeat_after_torchrun(line: str, stream: str = "stdout", claim: Path | None = None) -> bool:
    """Print `line` again on this process's stdout (or stderr) once torchrun's agent has exited.

    Returns False (and does nothing) when this rank was not started by torchrun. `claim`: the error
    claim file (`claim_error`), removed by the watcher once the agent has gone. The watcher runs
    in its own session, so the agent's kill of the rank's process group does not take it along;
    it holds the rank's stdout open, so a reader of the pipe (a notebook's `!torchrun`, papermill,
    subprocess) sees the line before end of file.
    """
    from kit.errors import shown, under_torchrun

    line = shown(line, limit=None)  # it may name output_dir: no raw control or bidi character
    agent = os.getppid()
    if not under_torchrun() or agent <= 1:
        if claim is not None:
            claim.unlink(missing_ok=True)
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    subprocess.Popen([sys.executable, "-c", _WATCHER, str(agent), line, str(WAIT_S), stream, str(claim or "")],
                     stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return True
