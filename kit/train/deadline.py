"""When this session began and when it ends, and whether it is time to stop.

Kaggle and Colab stop a session after a fixed time counted from its start (Kaggle: 12 h), not
from our script's start. The session start is the start of the container's first process
(PID 1), which those platforms start with the session; elsewhere nothing stops the machine, so a
`time_budget_minutes` counts from this run's start.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from kit.machine import platforms

# A margin for what we cannot measure (process exit, a slow last log line): 60 s, or a tenth of a
# budget shorter than 10 minutes.
SAFETY_S = 60.0


def process_started() -> float:
    """Wall-clock time this session's process was launched: under torchrun, the launcher's start.

    A session's setup starts at the launch, not when kit's code first runs: importing torch,
    transformers, peft and trl alone takes seconds that the GPU is held for. Linux only (/proc);
    elsewhere, now.
    """
    pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()  # torchrun's agent is the parent
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def container_start(proc: str = "/proc") -> float | None:
    """Epoch seconds at which PID 1 started, or None when /proc can't tell."""
    try:
        with open(f"{proc}/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        with open(f"{proc}/1/stat") as f:
            # Field 22 (starttime, in clock ticks since boot) counts from after the command name,
            # which may hold spaces: split after its closing parenthesis.
            fields = f.read().rsplit(")", 1)[1].split()
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


@dataclass
class Deadline:
    at: float | None  # epoch seconds; None: no deadline
    source: str       # words: where the budget and its start came from
    safety_s: float = SAFETY_S

    def seconds_left(self, now: float | None = None) -> float:
        return float("inf") if self.at is None else self.at - (time.time() if now is None else now)

    def near(self, needed_s: float, now: float | None = None) -> bool:
        """True when less than `needed_s` (+ a safety margin) is left."""
        return self.seconds_left(now) <= needed_s + self.safety_s


def session_deadline(budget_minutes: float | None, platform: str | None = None,
                     now: float | None = None) -> Deadline:
    """The deadline for a run starting `now` under `budget_minutes` (None: the platform's)."""
    now = time.time() if now is None else now
    platform = platform or platforms.detect()[0]
    hosted = platform in ("kaggle", "colab")
    start = (container_start() or now) if hosted else now
    start_words = "the session start" if hosted and start != now else "this run's start"
    if budget_minutes is not None:
        return Deadline(start + budget_minutes * 60, f"time_budget_minutes={budget_minutes:g} from {start_words}",
                        min(SAFETY_S, budget_minutes * 6))
    hours = platforms.defaults(platform).session_hours
    if hours is None:
        return Deadline(None, f"no session limit known on {platform}")
    return Deadline(start + hours * 3600, f"{platform}'s {hours:g} h session limit from {start_words}")
