"""`kit schedule`: resume a job with papermill, once or until it is complete.

    kit schedule --config configs/default.yaml --store hf://me/ha-ckpts --nproc 2
    kit schedule --config configs/default.yaml --loop --every 30 --max-runs 20
    kit schedule --config configs/default.yaml --print-cron
    kit schedule --kaggle me/kit-resume --config configs/qwen3-8b-qlora-kaggle-t4x2.yaml --loop

Each run executes notebooks/resume.ipynb in a real kernel, keeps its output notebook as
runs/<UTC timestamp>-<n>.ipynb and prints one outcome line. The store must be reachable before
anything runs (exit 4 otherwise). A token is never accepted as a parameter (exit 2).

With `--kaggle USER/SLUG` each run is a Kaggle session instead: the run notebook is pushed with
the official `kaggle` package, polled, and its output fetched into runs/ (`kit/notebooks/schedule/`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from kit.errors import shown
from kit.machine.command import shell_word
from kit.planning import config

DEFAULT_NOTEBOOK = "notebooks/resume.ipynb"
WEEK_MIN, YEAR_MIN = 7 * 24 * 60, 365 * 24 * 60


def positive(top: float, kind=float):
    """An argparse `type`: a finite number (of `kind`: float or int) above 0 and at most `top`.

    nan, inf and numbers beyond `top` (which would overflow a sleep or make no sense in a crontab)
    fail parsing, as one line, exit 2.
    """
    import argparse
    import math

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {text!r}") from None
        if not (math.isfinite(value) and 0 < value <= top):
            raise argparse.ArgumentTypeError(f"must be a number above 0 and at most {top:g}, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _shown(value: float) -> str:
    """A number as the command line needs it again: exact (`:g` would round 1234.5678 to 1234.57)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def add_arguments(parser) -> None:
    config.add_config_arguments(parser, config.default_config())
    parser.add_argument("--notebook", default=DEFAULT_NOTEBOOK, metavar="IPYNB",
                        help=f"the resume notebook papermill runs (default: {DEFAULT_NOTEBOOK})")
    parser.add_argument("--runs-dir", default="runs", metavar="DIR",
                        help="where each run's output notebook is kept (default: runs/)")
    parser.add_argument("--loop", action="store_true", help="run again and again until the job is complete")
    parser.add_argument("--every", type=positive(WEEK_MIN), default=30.0, metavar="MINUTES",
                        help="minutes between runs with --loop, and the cron/systemd period (default: 30; --print-cron "
                             "needs one cron can keep: a divisor of 60 min, or of 24 h)")
    parser.add_argument("--max-runs", type=positive(10**6, int), default=None, metavar="N", help="stop --loop after N runs")
    parser.add_argument("--time-budget", type=positive(YEAR_MIN), default=None, metavar="MINUTES",
                        help="each run's time_budget_minutes (default: the config's)")
    parser.add_argument("--run-timeout", type=positive(YEAR_MIN), default=None, metavar="MINUTES",
                        help="interrupt a run's training after MINUTES: it saves and pauses, like a cutoff "
                             "(a guard against a hung run; default: none)")
    parser.add_argument("--store", default=None, metavar="STORE",
                        help="checkpoint store, hf://owner/name or a directory (default: the config's)")
    parser.add_argument("--nproc", type=positive(1024, int), default=None, metavar="N",
                        help="processes per run: torchrun with N > 1, plain python with 1 (default: 1; 2 "
                             "with --kaggle, one per T4)")
    parser.add_argument("--print-cron", action="store_true",
                        help="only print a crontab line and a systemd service/timer pair for this schedule")
    parser.add_argument("-v", "--verbose", action="store_true", help="stream each run's cell output")
    kaggle = parser.add_argument_group('on Kaggle (needs `pip install -e ".[kaggle]"` in the kit checkout and '
                                       'Kaggle API credentials)')
    kaggle.add_argument("--kaggle", metavar="USER/SLUG", default=None,
                        help="run each session as a version of this private Kaggle notebook on 2×T4")
    kaggle.add_argument("--kit-repo", metavar="URL", default=None,
                        help="where the Kaggle session clones kit from (default: this checkout's `origin`)")
    kaggle.add_argument("--max-gpu-hours", type=positive(24 * 365), default=30.0, metavar="H",
                        help="stop before a session would take the week's GPU hours past H (default: 30, "
                             "Kaggle's weekly quota)")
    kaggle.add_argument("--poll", type=positive(3600), default=None, metavar="SECONDS",
                        help="ask Kaggle for the session's status this often (default: 10 s, backing off to 60 s)")


def _repeat_command(args) -> list[str]:
    """This schedule as one run per invocation, for cron/systemd (they do the repeating)."""
    from kit.notebooks.schedule.unattended import python_command

    cmd = python_command() + ["schedule"]
    if args.config:
        cmd += ["--config", args.config]
    if args.notebook != DEFAULT_NOTEBOOK:
        cmd += ["--notebook", args.notebook]
    if args.kaggle:  # each tick waits for its session; the runs folder's lock skips a tick meanwhile
        cmd += ["--kaggle", args.kaggle, "--max-gpu-hours", _shown(args.max_gpu_hours)]
        cmd += ["--kit-repo", args.kit_repo] if args.kit_repo else []
    cmd += ["--runs-dir", args.runs_dir, "--nproc", str(args.nproc or (2 if args.kaggle else 1))]
    if args.time_budget is not None:
        cmd += ["--time-budget", _shown(args.time_budget)]
    if args.run_timeout is not None:
        cmd += ["--run-timeout", _shown(args.run_timeout)]
    if args.store:
        cmd += ["--store", args.store]
    return cmd + list(args.overrides or [])


def run(args) -> int:
    from kit.checkpoints import session_records
    from kit.notebooks.schedule import loop as schedule

    # First, before anything can echo them: no token among the parameters.
    schedule.refuse_tokens([*(args.overrides or []), *([f"store={args.store}"] if args.store else []),
                            *([f"config={args.config}"] if args.config else [])])
    if args.kaggle:
        from kit.notebooks.schedule import kaggle_api

        kaggle_api.check_slug(args.kaggle)
        kaggle_api.require_credentials()  # none: one line, exit 2, before anything else
    overrides = list(args.overrides or []) + ([f"store={args.store}"] if args.store else [])
    cfg = config.load(args.config, overrides)  # bad keys/values fail here, before any run
    from kit.notebooks.schedule.runs_lock import check_runs_dir
    from kit.notebooks.schedule.unattended import check_cron, unattended

    runs_dir = check_runs_dir(Path(args.runs_dir))
    units = unattended(_repeat_command(args), Path.cwd(), args.every, runs_dir)
    if args.print_cron:  # a line that fails every run is no line: the inputs it names are checked first
        check_cron(args.every)
        if not args.kaggle:
            schedule.check_notebook(Path(args.notebook))
            _check_script(args.config, cfg)
        if cfg.store and not cfg.store.startswith("hf://"):  # a Hub store is checked where the line runs
            schedule.check_store(cfg)
        print(units)
        return 0
    if args.kaggle:
        return _run_kaggle(args, cfg)
    if args.verbose:  # papermill streams cell output through its logger
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s")
    notebook = schedule.check_notebook(Path(args.notebook))
    _check_script(args.config, cfg)
    where = schedule.check_store(cfg)
    print(f"schedule: {shown(notebook)} → {shown(runs_dir)}/; store: {where or f'none (local {cfg.output_dir})'}; "
          f"{'until complete' if args.loop else 'one run'}", flush=True)
    print(units, flush=True)
    parameters = {
        "config": args.config or "",
        "time_budget_minutes": args.time_budget,
        "store": args.store,
        "nproc": args.nproc or 1,
        "overrides": shlex.join(args.overrides or []),
    }
    run_timeout_s = None if args.run_timeout is None else max(1, round(args.run_timeout * 60))
    plan = schedule.Plan(notebook=notebook.resolve(), runs_dir=runs_dir, parameters=parameters,
                         run_timeout_s=run_timeout_s, sessions=Path(cfg.output_dir).resolve() / session_records.LOCAL)
    return schedule.loop(plan, repeat=args.loop, every_minutes=args.every, max_runs=args.max_runs,
                         verbose=args.verbose)


def _check_script(config_path: str | None, cfg) -> None:
    """Each run resumes ./train_ddp.py: without one, or with one rendered for another trainer (an SFT script
    for a GRPO config refuses to start in every run), say so now (exit 2), not after a kernel has started."""
    from kit.errors import UsageError
    from kit.files import regular_file
    from kit.script.failed_bootstrap import settings_of

    how = f"kit bootstrap --config {shell_word(config_path, path=True)}" if config_path else "kit bootstrap --config CONFIG"
    script = Path("train_ddp.py")
    if regular_file(script, "train_ddp.py") is None:
        raise UsageError(f"no train_ddp.py in {Path.cwd()}: each scheduled run resumes it; run `{how}` here first")
    written = (settings_of(script) or {}).get("trainer", "sft")  # a script kit cannot read: it says so itself
    if written != cfg.trainer:
        raise UsageError(f"train_ddp.py in {Path.cwd()} was rendered for trainer={written}, and the config asks "
                         f"for trainer={cfg.trainer}: each scheduled run would refuse to start; run `{how}` here "
                         "first")


def _git(*argv: str) -> str | None:
    import subprocess

    import kit

    try:
        done = subprocess.run(["git", "-C", kit.CHECKOUT, *argv],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _run_kaggle(args, cfg) -> int:
    """Prepare the run notebook, then push → poll → fetch → decide, once or until a stop rule."""
    from kit.notebooks.schedule import loop as schedule
    from kit.errors import UsageError

    if not (cfg.store or "").startswith("hf://"):
        raise UsageError(f"--kaggle needs a Hub store (store=hf://USER/NAME), not {cfg.store!r}: a Kaggle "
                         "session's files are gone when it ends")
    repo = args.kit_repo or _git("remote", "get-url", "origin")
    commit = _git("rev-parse", "HEAD")
    if not repo or not commit:
        raise UsageError("--kit-repo: this kit is not a git checkout with an `origin` remote; say where the "
                         "Kaggle session clones kit from (--kit-repo https://github.com/YOU/kit)")
    if _git("status", "--porcelain", "--untracked-files=no"):
        print(f"warning: uncommitted changes are not on Kaggle: the session runs kit {commit[:12]}", flush=True)
    where = schedule.check_store(cfg)  # unreachable or refused: exit 4 before any push
    extra = [f"time_budget_minutes={_shown(args.time_budget)}"] if args.time_budget is not None else []
    from kit.notebooks.schedule.runs_lock import RunsLock

    runs_dir = Path(args.runs_dir)
    with RunsLock(runs_dir):  # a second schedule of this runs folder (a cron tick) refuses at once
        return _kaggle_sessions(args, cfg, runs_dir, repo, commit, where, extra)


def _kaggle_sessions(args, cfg, runs_dir: Path, repo: str, commit: str, where: str, extra: list[str]) -> int:
    from kit.checkpoints import status
    from kit.notebooks.schedule import kaggle_notebook, kaggle_run

    folder = kaggle_notebook.write(runs_dir / "kaggle-push", args.kaggle, repo=repo, commit=commit,
                                   config_yaml=config.dump_yaml(cfg), overrides=extra, nproc=args.nproc or 2)
    print(f"schedule: Kaggle notebook {args.kaggle} (kit {commit[:12]} from {repo}) → {runs_dir}/; store: {where}; "
          f"{'until complete' if args.loop else 'one session'}", flush=True)

    def progress() -> tuple[int | None, bool]:
        facts = status.gather(cfg)
        return facts["latest_step"], facts["complete"]

    job = kaggle_run.KaggleJob(ref=args.kaggle, folder=folder, runs_dir=runs_dir, progress=progress,
                               poll_s=(args.poll,) if args.poll else kaggle_run.POLL_S)
    return kaggle_run.loop(job, repeat=args.loop, max_hours=args.max_gpu_hours)
