"""`kit convert NOTEBOOK.ipynb -o train_ddp.py`: the command around `kit.notebooks.convert`."""

from __future__ import annotations

import shlex
from pathlib import Path

from kit.errors import UsageError, shown
from kit.files import check_output, regular_file, write_atomic
from kit.machine.command import launch_command


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
    if (args.dry_run_model or args.dry_run_data or args.dry_run_push) and not args.dry_run:
        raise UsageError("--dry-run-model/--dry-run-data/--dry-run-push only make sense with --dry-run: add it")
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
    print(f"next: {next_step(args.notebook, str(args.output), args.dry_run)}")
    return 0


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
