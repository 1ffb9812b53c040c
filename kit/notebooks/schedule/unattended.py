"""Unattended schedules: the crontab line and systemd units that run `kit schedule` again and again.

A crontab line means exactly the interval asked for, or is not written: `*/N` in the minute
field repeats every N minutes only when N divides 60 (`*/45` fires at :00 and :45, 15 min apart),
and `0 */H` in the hour field every H hours only when H divides 24. 90 minutes has no crontab
line at all. `--print-cron` with such an interval is refused, naming the nearest that cron can keep.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kit.errors import UsageError
from kit.machine.command import shell_join, shell_word

CRON_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)  # `*/N * * * *`: N divides 60
CRON_HOURS = (1, 2, 3, 4, 6, 8, 12, 24)  # `0 */H * * *`: H divides 24 (24: `0 0 * * *`)
CRON_INTERVALS = CRON_MINUTES + tuple(60 * h for h in CRON_HOURS)  # in minutes, ascending


def cron_when(every_minutes: float) -> str | None:
    """The crontab schedule that runs every `every_minutes` minutes, or None when cron cannot say it."""
    if every_minutes in CRON_MINUTES:
        return f"*/{int(every_minutes)} * * * *"
    hours = every_minutes / 60
    if hours in CRON_HOURS:
        return "0 0 * * *" if hours == 24 else f"0 */{int(hours)} * * *"
    return None


def nearest_intervals(every_minutes: float) -> list[int]:
    """The intervals (minutes) cron can keep just below and just above `every_minutes`."""
    below = [m for m in CRON_INTERVALS if m < every_minutes]
    above = [m for m in CRON_INTERVALS if m > every_minutes]
    return below[-1:] + above[:1]


def check_cron(every_minutes: float) -> None:
    """UsageError unless a crontab line can run every `every_minutes` minutes."""
    if cron_when(every_minutes) is None:
        near = " or ".join(f"--every {m}" for m in nearest_intervals(every_minutes))
        raise UsageError(f"--every {every_minutes:g}: cron cannot run a job every {every_minutes:g} min (minutes "
                         f"must divide 60, hours divide 24); the nearest it can: {near}")


def unattended(command: list[str], cwd: Path, every_minutes: float, runs_dir: Path) -> str:
    """A crontab line and a systemd service/timer pair that run `command` every `every_minutes`.

    The token is read from a private env file, never written into the units or the crontab.
    An interval cron cannot keep gets a comment instead of a crontab line; one that is not a whole
    number of minutes gets no timer either.
    """
    every = f"{every_minutes:g}"
    env_file = "~/.config/kit/hf.env"
    cmd = shell_join(command)
    log = shell_word(str(Path(runs_dir).resolve() / "schedule.log"))
    when = cron_when(every_minutes)
    lines = [f"# Unattended: every {every} min (the runs folder's lock skips a run while one is going).",
             f"# Put HF_TOKEN=... in {env_file} (chmod 600); it is never a parameter."]
    if when:
        line = f"cd {shell_word(str(cwd))} && set -a && . {env_file} && set +a && {cmd} >> {log} 2>&1"
        lines += ["# crontab -e:", f"{when} {line.replace('%', chr(92) + '%')}"]  # cron reads a bare % as a newline
    else:
        near = " or ".join(map(str, nearest_intervals(every_minutes)))
        lines.append(f"# (no crontab line: cron cannot run every {every} min; it can every {near} min)")
    if float(every_minutes).is_integer():
        lines += _systemd(cwd, cmd, int(every_minutes))
    return "\n".join(lines)


def _systemd(cwd: Path, cmd: str, every: int) -> list[str]:
    cwd, cmd = str(cwd).replace("%", "%%"), cmd.replace("%", "%%")  # systemd reads %d, %h… as specifiers
    return [
        "# ~/.config/systemd/user/kit-schedule.service:",
        "[Unit]\nDescription=kit: resume the fine-tuning job\n[Service]\nType=oneshot",
        f"WorkingDirectory={cwd}\nEnvironmentFile=%h/.config/kit/hf.env\nExecStart={cmd}",
        "# ~/.config/systemd/user/kit-schedule.timer (then: systemctl --user enable --now kit-schedule.timer):",
        f"[Unit]\nDescription=kit: resume every {every} min\n[Timer]\nOnBootSec=2min\n"
        f"OnUnitActiveSec={every}min\nPersistent=true\n[Install]\nWantedBy=timers.target",
    ]


def python_command() -> list[str]:
    return [sys.executable, "-m", "kit"]
