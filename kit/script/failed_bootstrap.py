"""A script left in place by a `kit bootstrap --config C` that failed: it must not train another job.

`%run kit bootstrap --config configs/qwen3-8b….yaml` on a machine that cannot train it leaves the
`train_ddp.py` that was there — in a fresh clone the tiny default's — and the next cell,
`!torchrun … train_ddp.py`, would train that instead. So when bootstrap fails and the script at
`-o` is not the asked job's, bootstrap writes a note beside it, `train_ddp.py.bootstrap-failed`,
and the script refuses to start while the note is there (`kit.script.arguments.parse` checks it).
The script itself is not touched: nothing a user edited is replaced or moved by a failed command.
The next script kit writes there (`kit render`, a bootstrap that succeeds) removes the note.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from kit.errors import KitError, UsageError

SUFFIX = ".bootstrap-failed"


def note_path(script: Path | str) -> Path:
    script = Path(script)
    return script.with_name(script.name + SUFFIX)


def settings_of(script: Path) -> dict | None:
    """The SETTINGS dict written into a kit script, or None (not a kit script, unreadable, edited past reading)."""
    try:
        tree = ast.parse(script.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "SETTINGS"):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                return None
            return value if isinstance(value, dict) else None
    return None


def same_job(written: dict | None, asked: dict) -> bool:
    """Whether a script's SETTINGS are the `asked` job's: compared as whole configs, since a script
    holds only its own trainer's section (an SFT script has no `dpo:`) and the rest at its defaults."""
    if written is None:
        return False
    from kit.planning import config

    try:
        return config.to_dict(config.from_dict(written, source="the script's SETTINGS")) == asked
    except KitError:  # settings this kit cannot read: not the job asked for
        return False


def leave_note(script: Path, asked: dict | None, why: str) -> Path | None:
    """After a failed bootstrap: the note beside `script` when it is there and is not the job asked for
    (`asked`: that job's settings, None when they could not be read). Returns the note's path, or None
    when there is no script there or it is the asked job's own."""
    from kit.files import regular_file, write_atomic

    if not os.path.lexists(script) or regular_file(script, f"-o {script}") is None:
        return None
    if asked is not None and same_job(settings_of(script), asked):
        return None  # the job asked for: running it is what the user wants
    note = note_path(script)
    try:
        write_atomic(note, why.replace("\n", " ") + "\n", mode=0o644)
    except OSError as e:
        raise UsageError(f"{why} (and {note} could not be written to stop {script} from running another job: "
                         f"{e.strerror or e}; do not run {script})") from None
    return note


def clear(script: Path) -> None:
    """A new script was written at `script`: an earlier failure's note no longer applies."""
    note = note_path(script)
    if os.path.lexists(note):
        note.unlink()


def check(script: Path | str) -> None:
    """Refuse to start `script` while a failed bootstrap's note is beside it (one line, exit 2)."""
    note = note_path(script)
    if not note.is_file():
        return
    try:
        why = note.read_text(encoding="utf-8", errors="replace").strip()[:2000]
    except OSError as e:
        why = f"(the note could not be read: {e.strerror or e})"
    raise UsageError(f"{script} is not the job last asked for: {why}. Fix that and run kit bootstrap again (it "
                     f"writes the asked job's script), or delete {note} to run this script as it is")
