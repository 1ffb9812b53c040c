"""Unattended schedules: the crontab line and systemd units that run `kit schedule` again and again."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def unattended(command: list[str], cwd: Path, every_minutes: float, runs_dir: Path) -> str:
    """A crontab line and a systemd service/timer pair that run `command` every `every_minutes`.

    The token is read from a private env file, never written into the units or the crontab.
    """
    every = max(1, round(every_minutes))
    cron_when = f"*/{every} * * * *" if every < 60 else f"0 */{max(1, every // 60)} * * *"
    env_file = "~/.config/kit/hf.env"
    cmd = shlex.join(command)
    log = shlex.quote(str(Path(runs_dir).resolve() / "schedule.log"))
    return "\n".join([
        f"# Unattended: every {every} min (the runs folder's lock skips a run while one is going).",
        f"# Put HF_TOKEN=... in {env_file} (chmod 600); it is never a parameter.",
        "# crontab -e:",
        f"{cron_when} cd {shlex.quote(str(cwd))} && set -a && . {env_file} && set +a && {cmd} >> {log} 2>&1",
        "# ~/.config/systemd/user/kit-schedule.service:",
        "[Unit]\nDescription=kit: resume the fine-tuning job\n[Service]\nType=oneshot",
        f"WorkingDirectory={cwd}\nEnvironmentFile=%h/.config/kit/hf.env\nExecStart={cmd}",
        "# ~/.config/systemd/user/kit-schedule.timer (then: systemctl --user enable --now kit-schedule.timer):",
        f"[Unit]\nDescription=kit: resume every {every} min\n[Timer]\nOnBootSec=2min\n"
        f"OnUnitActiveSec={every}min\nPersistent=true\n[Install]\nWantedBy=timers.target",
    ])


def python_command() -> list[str]:
    return [sys.executable, "-m", "kit"]
