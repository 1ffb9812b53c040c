"""`kit convert NOTEBOOK.ipynb -o train_ddp.py`: the command around `kit.notebooks.convert`."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from kit.errors import KitError, UsageError, shown
from kit.files import check_output, regular_file, write_atomic
from kit.machine.command import launch_argv, launch_command

DRY_RANKS = 2  # the dry run's torchrun: two ranks on the CPU, so rank guards and barriers really run
DRY_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
DRY_TIMEOUT_S = 1200  # two steps of a tiny model take a minute or two; a dry run past this is stuck


def add_arguments(parser) -> None:
    parser.add_argument("notebook", help="the training notebook (.ipynb) to convert")
    parser.add_argument("-o", "--output", default="train_ddp.py", help="script to write (default: train_ddp.py)")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    parser.add_argument("--precision", choices=("auto", "fp16", "bf16", "fp32"), default="auto",
                        help="training precision to set; auto keeps the notebook's (default: auto)")
    parser.add_argument("--keep-global-batch", action="store_true",
                        help="divide gradient_accumulation_steps by the GPU count, so N GPUs train on the "
                             "notebook's global batch (default: each GPU adds a batch: N times larger)")
    parser.add_argument("--dry-run", action="store_true",
                        help="swap Hub models and datasets for kit's tiny local model and data and stop after "
                             "2 steps: run the whole converted script cheaply before spending GPU hours")
    parser.add_argument("--dry-run-model", type=Path, default=None, metavar="DIR",
                        help="with --dry-run: the local model to use (default: models/tiny-qwen3)")
    parser.add_argument("--dry-run-data", type=Path, default=None, metavar="FILE",
                        help="with --dry-run: a chat-format JSONL file like data/ha_commands.jsonl")
    parser.add_argument("--run", action="store_true",
                        help="with --dry-run: run the converted script at once under torchrun, 2 ranks on the CPU, "
                             "and exit with its result (without it, kit prints that command)")
    parser.add_argument("--dry-run-push", action="store_true",
                        help="with --dry-run: let its Hub writes through, to the Hub HF_ENDPOINT names (a test "
                             "server); by default a dry run skips them, so it never overwrites your real repos")


def run(args) -> int:
    """Convert, write the script atomically, print the change list; 0 on success."""
    out = check_output(args.output, "-o", "train_ddp.py")  # a folder, FIFO, missing folder: before any work
    # Checked before converting, so a refused run never touches an existing file.
    if out.exists() and Path(args.notebook).exists() and out.resolve() == Path(args.notebook).resolve():
        raise UsageError(f"-o {out}: that is the notebook itself: write the script to another file")
    if out.exists() and not args.force:
        raise UsageError(f"-o {out}: exists: pass --force to overwrite it, or choose another -o")
    if (args.dry_run_model or args.dry_run_data or args.dry_run_push or args.run) and not args.dry_run:
        raise UsageError("--dry-run-model/--dry-run-data/--dry-run-push/--run only make sense with --dry-run: add it")
    if args.dry_run_model is not None and not (args.dry_run_model / "config.json").is_file():
        raise UsageError(f"--dry-run-model {args.dry_run_model}: no config.json there: give a local model folder")
    if args.dry_run_data is not None and regular_file(args.dry_run_data, f"--dry-run-data {args.dry_run_data}") is None:
        raise UsageError(f"--dry-run-data {args.dry_run_data}: no such file: give a chat-format .jsonl file")
    try:
        from kit.notebooks.convert import convert_notebook, format_changes
    except ImportError as e:
        raise UsageError(f"kit convert needs libcst and nbformat ({e}): pip install libcst nbformat") from None

    conversion = convert_notebook(args.notebook, args.precision, script_name=out.name,
                                  keep_global_batch=args.keep_global_batch, dry_run=args.dry_run,
                                  dry_run_model=args.dry_run_model and args.dry_run_model.resolve(),
                                  dry_run_data=args.dry_run_data and args.dry_run_data.resolve(),
                                  dry_run_push=args.dry_run_push)
    from kit.auth import refuse_token

    # A notebook cell may hold a literal token (`login("hf_…")`): it must not land in a script.
    refuse_token(conversion.source, f"the script converted from {args.notebook}")
    # Temp file + rename in the same folder: a crash never leaves half a script behind.
    _write(out, conversion.source)
    print(format_changes(conversion, shown(Path(args.notebook).name), shown(str(out))))
    if args.dry_run:
        argv = launch_argv(DRY_RANKS, script=str(out), python="python")
        command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in DRY_ENV.items()), *map(shlex.quote, argv)])
        if args.run:
            print(f"dry run: {command}", flush=True)
            return _run_dry(out)
        print(f"dry run, exactly: {command}   (or convert with --run to have kit run it)")
    print(f"next: {next_step(args.notebook, str(args.output), args.dry_run)}")
    return 0


def _run_dry(out: Path) -> int:
    """The converted script under torchrun, 2 ranks on the CPU, its output passed through; 0 when it
    exits 0, else one error line with its exit code (it is stopped after DRY_TIMEOUT_S)."""
    import sys

    import kit

    env = dict(os.environ, **DRY_ENV)
    here = str(Path(kit.__file__).resolve().parent.parent)  # the script imports kit's stand-ins
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    argv = launch_argv(DRY_RANKS, script=str(out), python=sys.executable)
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=DRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise KitError(f"the dry run of {out} ran past {DRY_TIMEOUT_S} s and was stopped: a rank is waiting for "
                       "another (its output above shows where)") from None
    except KeyboardInterrupt:
        _stop(proc)
        raise
    if code != 0:
        raise KitError(f"the dry run of {out} exited {code}: its traceback is above; fix the notebook (or the "
                       "script) and convert again")
    print(f"dry run: {out} ran to the end on {DRY_RANKS} CPU ranks (exit 0)")
    return 0


def _stop(proc: subprocess.Popen) -> None:
    """torchrun forwards SIGTERM to its ranks; whatever is left after a grace period is killed."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def next_step(notebook: str, script: str, dry_run: bool) -> str:
    """What to run now: the written script under torchrun; before GPU hours, the dry run of it first."""
    run = launch_command(2, script=shlex.quote(script))
    if dry_run:
        return f"{run}  (the dry run: 2 ranks, on the CPU without a GPU; use your GPU count on a GPU machine)"
    dry = str(Path(script).with_name(Path(script).stem + "_dry_run.py"))
    return (f"{run}  (one rank per GPU); to try it first on the CPU: kit convert {shlex.quote(notebook)} -o "
            f"{shlex.quote(dry)} --dry-run && {launch_command(2, script=shlex.quote(dry))}")


def _write(out: Path, source: str) -> None:
    """The script, atomically; a folder that refuses it (read-only, full) is a one-line error, nothing left."""
    try:
        write_atomic(out, source)
    except OSError as e:
        raise UsageError(f"-o {out}: cannot write the script there ({e.strerror or e}): choose another -o") from None
