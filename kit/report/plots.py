"""PNG plots of a job: the loss curve of a checkpoint, and progress across notebook sessions.

matplotlib is imported inside each function with the Agg backend, so importing this module
costs nothing and works on a headless scheduler. Files are written to a temp name and renamed,
so a reader (a notebook showing it, a web page) never sees half a PNG.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import UsageError
from kit.files import atomic_path, check_output, parse_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_target(out_png, flag: str = "--plot") -> Path:
    """Refuse, before any work, a place the PNG cannot go or a file it must not replace.

    The name must end in .png; its folder must exist and be writable; a file already there is
    replaced only when it is a PNG (most likely an earlier plot), never a user's other file.
    """
    out = check_output(out_png, flag, "progress.png")
    if out.suffix.lower() != ".png":
        raise UsageError(f"{flag} {out}: kit writes a PNG: give a file name ending in .png")
    if out.exists() and not _is_png(out):
        raise UsageError(f"{flag} {out}: a file that is not a PNG is already there; kit replaces only a PNG "
                         "(an earlier plot): choose another name")
    return out


def _is_png(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(PNG_MAGIC)) == PNG_MAGIC
    except OSError as err:
        raise UsageError(f"cannot read {path} to check it is a PNG: {err.strerror or err}") from None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)  # keep an inline backend a notebook already chose
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_png) -> Path:
    try:
        out = check_target(out_png, "plot")
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    except OSError as err:  # a folder that refuses files even to root (/proc), a full disk
        raise UsageError(f"cannot write the plot {out_png}: {err.strerror or err}") from None
    finally:
        fig.clf()
        _pyplot().close(fig)
    return out


def log_history(ckpt_or_state) -> list[dict]:
    """The Trainer's `log_history` from a checkpoint folder or a `trainer_state.json` path.

    Raises:
        UsageError: no readable trainer_state.json there.
    """
    path = Path(ckpt_or_state)
    if path.is_dir():
        path = path / "trainer_state.json"
    try:
        state = parse_json(path.read_bytes())
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read the training log {path}: {getattr(err, 'strerror', None) or err}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise UsageError(f"{path} has no log_history: is it a Hugging Face Trainer state?")
    return history


def loss_curve(ckpt_or_state, out_png) -> Path:
    """Draw train loss (and eval loss, if logged) against step.

    Example:
        >>> from IPython.display import Image
        >>> Image(filename=str(loss_curve("outputs/default/checkpoint-60", "outputs/default/loss.png")))
    Returns:
        The PNG's path.
    Raises:
        UsageError: no trainer_state.json, or it logged no loss.
    """
    history = log_history(ckpt_or_state)
    if not _losses(history)[0] and not _losses(history)[1]:
        raise UsageError(f"{ckpt_or_state}: the training log holds no loss yet (logging_steps too large?)")
    fig, ax = _pyplot().subplots(figsize=(7, 4))
    _draw_loss(ax, history, f"loss, {Path(ckpt_or_state).name}")
    return _save(fig, out_png)


def job_plot(history: list[dict], sessions: list[dict], out_png, max_steps: int | None = None,
             goodput: dict | None = None, rewards: list[dict] | None = None) -> Path:
    """Two panels: train and eval loss against step (the newest checkpoint's log), progress across sessions;
    a third, goodput per session, when `goodput` (`kit.checkpoints.goodput.ledger()`) has rows. A GRPO job's
    first panel is its mean reward and each reward function's against step (`rewards`:
    `kit.checkpoints.status.reward_history()`): its loss says nothing of how it goes.

    Raises:
        UsageError: neither a logged loss nor a recorded session: nothing to draw yet.
    """
    runs = _runs(sessions)
    has_loss = any(_losses(history)) or bool(rewards)
    if not has_loss and not runs:
        raise UsageError("no sessions recorded yet and no checkpoint with a logged loss: nothing to plot "
                         "(run the job once first)")
    rows = [r for r in (goodput or {}).get("sessions", []) if r.get("goodput") is not None]
    if rows:
        fig, (top, bottom, bars) = _pyplot().subplots(3, 1, figsize=(8, 9.5), gridspec_kw={"height_ratios": [3, 3, 2]})
        _goodput_bars(bars, rows, goodput)
    else:
        fig, (top, bottom) = _pyplot().subplots(2, 1, figsize=(8, 7))
    if rewards:
        _draw_rewards(top, rewards)
    elif has_loss:
        _draw_loss(top, history, "loss against step")
    else:
        top.text(0.5, 0.5, "no loss logged yet", ha="center", va="center", transform=top.transAxes)
        top.set_axis_off()
    if runs:
        _draw_progress(bottom, runs, max_steps)
    else:
        bottom.text(0.5, 0.5, "no session recorded yet", ha="center", va="center", transform=bottom.transAxes)
        bottom.set_axis_off()
    fig.tight_layout()
    return _save(fig, out_png)


def _losses(history: list[dict]) -> tuple[list, list]:
    train = [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h and "step" in h]
    return train, evals


def _draw_loss(ax, history: list[dict], title: str) -> None:
    train, evals = _losses(history)
    if train:
        ax.plot(*zip(*train), label="train loss", color="tab:blue", linewidth=1.4)
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval loss", color="tab:orange", linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def _draw_rewards(ax, rewards: list[dict]) -> None:
    steps = [r["step"] for r in rewards]
    ax.plot(steps, [r["reward"] for r in rewards], label="mean reward", color="black", linewidth=1.6)
    for name in rewards[-1]["rewards"]:
        points = [(r["step"], r["rewards"][name]) for r in rewards if name in r["rewards"]]
        ax.plot(*zip(*points), label=name, linewidth=1.0, alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("mean reward of each step's completions")
    ax.grid(alpha=0.3)
    ax.legend()


def _runs(sessions: list[dict]) -> list[dict]:
    return sorted((s for s in sessions if s.get("started") and s.get("ended")), key=lambda s: s["started"])


def progress(sessions: list[dict], out_png, max_steps: int | None = None, goodput: dict | None = None) -> Path:
    """Draw step against wall time: one segment per session, cutoffs and resumes marked.

    Args:
        sessions: session records (`kit.train.job` writes them: started, ended, start_step, end_step,
            max_steps, outcome), in any order.
        out_png: where to write the PNG.
        max_steps: the goal, drawn as a dashed line (default: the records' max_steps).
        goodput: `kit.checkpoints.goodput.ledger()` of these sessions: adds a panel of goodput per session.
    Raises:
        UsageError: no session has been recorded yet.
    """
    runs = _runs(sessions)
    if not runs:
        raise UsageError("no sessions recorded yet: nothing to plot (run the job once first)")
    rows = [r for r in (goodput or {}).get("sessions", []) if r.get("goodput") is not None]
    if rows:
        fig, (ax, bars) = _pyplot().subplots(2, 1, figsize=(8, 6.5), gridspec_kw={"height_ratios": [3, 2]})
        _goodput_bars(bars, rows, goodput)
    else:
        fig, ax = _pyplot().subplots(figsize=(8, 4))
    _draw_progress(ax, runs, max_steps)
    if rows:
        fig.tight_layout()
    return _save(fig, out_png)


def _draw_progress(ax, runs: list[dict], max_steps: int | None) -> None:
    from datetime import datetime, timezone

    max_steps = max_steps or next((s["max_steps"] for s in reversed(runs) if s.get("max_steps")), None)

    def t(x):
        return datetime.fromtimestamp(x, tz=timezone.utc)

    labelled: set[str] = set()

    def mark(x, y, style, label, **kw):
        ax.plot([x], [y], style, label=None if label in labelled else label, zorder=3, **kw)
        labelled.add(label)

    for i, s in enumerate(runs, 1):
        x0, x1 = t(s["started"]), t(s["ended"])
        y0, y1 = s.get("start_step") or 0, s.get("end_step") or 0
        ax.plot([x0, x1], [y0, y1], "-", color="tab:blue", linewidth=2.2,
                label=None if "session" in labelled else "session")
        labelled.add("session")
        ax.annotate(f"#{i}", (x0, y0), textcoords="offset points", xytext=(0, 6), fontsize=8)
        if y0 > 0 and s.get("outcome") != "already complete":
            mark(x0, y0, "^", "resume", color="tab:green", markersize=8)
        outcome = s.get("outcome", "")
        if outcome == "already complete":  # a run that found nothing left to do: no cut to mark
            continue
        if outcome == "complete":
            mark(x1, y1, "*", "complete", color="gold", markersize=13, markeredgecolor="black")
        elif outcome:  # paused by the budget or a signal, killed, failed: the session was cut here
            color = "tab:red" if outcome == "paused" else "black"
            mark(x1, y1, "X", f"cutoff ({outcome})", color=color, markersize=8)
    if max_steps:
        ax.axhline(max_steps, linestyle="--", color="grey", linewidth=1, label=f"max_steps {max_steps}")
    ax.set_xlabel("wall time (UTC)")
    ax.set_ylabel("step")
    ax.set_title(f"progress across {len(runs)} session{'s' if len(runs) != 1 else ''}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    import matplotlib.dates as mdates

    # Sessions can be seconds or days apart: let matplotlib pick the ticks, then label them briefly.
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _goodput_bars(ax, rows: list[dict], led: dict) -> None:
    """Per session: the share of its time that trained steps that stayed, setup, and steps lost."""
    xs = list(range(1, len(rows) + 1))
    spans = [r["span_s"] for r in rows]
    good = [100 * r["goodput"] for r in rows]
    setup = [100 * (r["setup_s"] or 0) / s for r, s in zip(rows, spans)]
    lost = [100 * r["time_lost_s"] / s for r, s in zip(rows, spans)]
    ax.bar(xs, good, color="tab:green", label="useful training")
    ax.bar(xs, setup, bottom=good, color="tab:orange", label="setup")
    ax.bar(xs, lost, bottom=[g + u for g, u in zip(good, setup)], color="tab:red", label="steps lost at the cut")
    ax.set_xticks(xs, [f"#{x}" for x in xs])
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of the session")
    total = led.get("goodput")
    ax.set_title(f"goodput per session (job: {100 * total:.1f} %)" if total is not None else "goodput per session")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
