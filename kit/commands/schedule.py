"""`kit schedule`: resume a job with papermill, once or until it is complete.

    kit schedule --config configs/default.yaml --store hf://me/ha-ckpts --nproc 2
    kit schedule --config configs/default.yaml --loop --every 30 --max-runs 20
    kit schedule --config configs/default.yaml --print-cron

Each run executes notebooks/resume.ipynb in a real kernel, keeps its output notebook as
runs/<UTC timestamp>-<n>.ipynb and prints one outcome line. The store must be reachable before
anything runs (exit 4 otherwise). A token is never accepted as a parameter (exit 2).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from kit import config

DEFAULT_NOTEBOOK = "notebooks/resume.ipynb"


def add_arguments(parser) -> None:
    config.add_config_arguments(parser)
    parser.add_argument("--notebook", default=DEFAULT_NOTEBOOK, metavar="IPYNB",
                        help=f"the resume notebook papermill runs (default: {DEFAULT_NOTEBOOK})")
    parser.add_argument("--runs-dir", default="runs", metavar="DIR",
                        help="where each run's output notebook is kept (default: runs/)")
    parser.add_argument("--loop", action="store_true", help="run again and again until the job is complete")
    parser.add_argument("--every", type=float, default=30.0, metavar="MINUTES",
                        help="minutes between runs with --loop, and the cron/systemd period (default: 30)")
    parser.add_argument("--max-runs", type=int, default=None, metavar="N", help="stop --loop after N runs")
    parser.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                        help="each run's time_budget_minutes (default: the config's)")
    parser.add_argument("--run-timeout", type=float, default=None, metavar="MINUTES",
                        help="interrupt a run's training after MINUTES: it saves and pauses, like a cutoff "
                             "(a guard against a hung run; default: none)")
    parser.add_argument("--store", default=None, metavar="STORE",
                        help="checkpoint store, hf://owner/name or a directory (default: the config's)")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="processes per run: torchrun with N > 1, plain python with 1 (default: 1)")
    parser.add_argument("--print-cron", action="store_true",
                        help="only print a crontab line and a systemd service/timer pair for this schedule")
    parser.add_argument("-v", "--verbose", action="store_true", help="stream each run's cell output")


def _repeat_command(args) -> list[str]:
    """This schedule as one run per invocation, for cron/systemd (they do the repeating)."""
    from kit.schedule import python_command

    cmd = python_command() + ["schedule"]
    if args.config:
        cmd += ["--config", args.config]
    if args.notebook != DEFAULT_NOTEBOOK:
        cmd += ["--notebook", args.notebook]
    cmd += ["--runs-dir", args.runs_dir, "--nproc", str(args.nproc)]
    if args.time_budget is not None:
        cmd += ["--time-budget", f"{args.time_budget:g}"]
    if args.run_timeout is not None:
        cmd += ["--run-timeout", f"{args.run_timeout:g}"]
    if args.store:
        cmd += ["--store", args.store]
    return cmd + list(args.overrides or [])


def run(args) -> int:
    from kit import schedule
    from kit.errors import UsageError

    # First, before anything can echo them: no token among the parameters.
    schedule.refuse_tokens([*(args.overrides or []), *([f"store={args.store}"] if args.store else []),
                            *([f"config={args.config}"] if args.config else [])])
    for name, value in (("--every", args.every), ("--max-runs", args.max_runs), ("--nproc", args.nproc),
                        ("--time-budget", args.time_budget), ("--run-timeout", args.run_timeout)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be positive, got {value:g}")
    overrides = list(args.overrides or []) + ([f"store={args.store}"] if args.store else [])
    cfg = config.load(args.config, overrides)  # bad keys/values fail here, before any run
    runs_dir = Path(args.runs_dir)
    units = schedule.unattended(_repeat_command(args), Path.cwd(), args.every, runs_dir)
    if args.print_cron:
        print(units)
        return 0
    if args.verbose:  # papermill streams cell output through its logger
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s")
    notebook = schedule.check_notebook(Path(args.notebook))
    where = schedule.check_store(cfg)
    print(f"schedule: {notebook} → {runs_dir}/; store: {where or f'none (local {cfg.output_dir})'}; "
          f"{'until complete' if args.loop else 'one run'}", flush=True)
    print(units, flush=True)
    parameters = {
        "config": args.config or "",
        "time_budget_minutes": args.time_budget,
        "store": args.store,
        "nproc": args.nproc,
        "overrides": shlex.join(args.overrides or []),
    }
    run_timeout_s = None if args.run_timeout is None else max(1, round(args.run_timeout * 60))
    plan = schedule.Plan(notebook=notebook.resolve(), runs_dir=runs_dir, parameters=parameters,
                         run_timeout_s=run_timeout_s)
    return schedule.loop(plan, repeat=args.loop, every_minutes=args.every, max_runs=args.max_runs,
                         verbose=args.verbose)
