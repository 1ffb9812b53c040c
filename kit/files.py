"""Reading and writing kit's local files: one atomic writer, one reader of UTF-8 inputs and of JSON, GiB.

Every file kit writes where a reader (another rank, the next session, a user's editor) might look
goes through `atomic_path`/`write_atomic`: a temp file beside the target, then `os.replace`, so a
crash or a kill leaves the old file or the new one, never half of one. The temp file sits in the
target's folder (a rename across filesystems is a copy) and is removed when the write fails.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import uuid
from pathlib import Path

from kit.errors import UsageError

GIB = 2**30


@contextlib.contextmanager
def atomic_path(path, *, mode: int | None = None):
    """Yield a temp path beside `path`; once the block ends without error it becomes `path`.

    For writers that want a file name rather than a file object (matplotlib's `savefig`).
    `mode` sets the final file's permissions (e.g. 0o644 for a script a user runs).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path, data: str | bytes, *, fsync: bool = False, mode: int | None = None,
                 mkdir: bool = False) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically and return the path.

    `fsync`: flush to the device before the rename, for files that must survive a power cut or a
    VM being taken away (checkpoint manifests, store records), not only a killed process.
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, mode=mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return path


def size_words(n: int) -> str:
    """1536 → "1.5 KiB"; 150_000_000 → "143.1 MiB"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def free_bytes(path) -> int:
    """Free bytes on the filesystem that will hold `path` (its nearest existing parent)."""
    import shutil

    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def is_disk_full(e: BaseException, folder=None) -> bool:
    """Whether `e`, or an error it wraps, is a disk running full: OSError ENOSPC or EDQUOT, a message saying so
    (safetensors' SafetensorError "No space left on device (os error 28)"), or torch's zip writer failing
    ("file write failed") where `folder`'s disk has under a MiB left."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
            return True
        if folder is not None and "file write failed" in text:
            try:
                return free_bytes(folder) < (1 << 20)
            except OSError:
                return False
        e = e.__cause__ or e.__context__
    return False


MAX_INPUT_BYTES = 64 * 2**20  # a config, a facts file, a notebook, a record: far below this


def regular_file(path, what: str) -> Path | None:
    """`path` when it is a regular file, None when nothing is there; a UsageError for anything else.

    `what` starts the message ("cannot read config x.yaml", "-o out.py"). A FIFO, a device or a folder
    where kit expects a file would hang a read (`mkfifo train_ddp.py`) or never end (`--config
    /dev/zero`): they are refused by name before any byte is read.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{what}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what}: not a regular file (a pipe, socket or device)")
    return path


def read_text(path, what: str, max_bytes: int | None = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of `path`, or a one-line UsageError naming `what` ("config", "data file") and the cause.

    `max_bytes`: refuse a larger file (None: no limit, for training data, which may be gigabytes).
    """
    if regular_file(path, f"cannot read {what} {path}") is None:
        raise UsageError(f"cannot read {what} {path}: no such file")
    try:
        with open(path, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise UsageError(f"{what} {path} is over {max_bytes // 2**20} MiB: not a file kit reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None


def parse_json(raw: str | bytes):
    """`json.loads`, with every way `raw` can be unusable raised as a ValueError: not JSON, not UTF-8
    (UnicodeDecodeError), a number past Python's 4,300 digits, or nesting past the recursion limit
    (`[[[[…`, a RecursionError otherwise, which callers catching ValueError would miss)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply for Python's JSON parser") from None


def json_problem(e: ValueError) -> str:
    """Why `parse_json` refused, in a few words for a one-line error."""
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON ({e.msg} at line {e.lineno})"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte {e.start})"
    if "integer string conversion" in str(e):
        return "not usable JSON (a number over 4,300 digits)"
    return f"not usable JSON ({str(e)[:80]})"


def read_json(path, what: str, fix: str) -> dict:
    """The JSON object in `path`; a one-line UsageError naming `what`, `path` and ending with `fix`."""
    text = read_text(path, what)
    try:
        doc = parse_json(text)
    except ValueError as e:
        raise UsageError(f"{what} {path} is {json_problem(e)}: {fix}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{what} {path} holds a JSON {type(doc).__name__}, not an object: {fix}")
    return doc


def same_content(path, text: str, what: str) -> bool | None:
    """Whether the file at `path` holds exactly `text` (None: no file there). Bytes are compared, so a
    file that is not UTF-8 is simply different; a folder, FIFO or device there is a UsageError."""
    if regular_file(path, f"{what} {path}") is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    return data == text.encode("utf-8")


def check_output(path, flag: str, example: str) -> Path:
    """Refuse an output path that cannot take a file, before any work: a folder, a FIFO or device, a
    missing or unwritable folder. `flag` names the option (`-o`), `example` a good file name."""
    if str(path) == "-":  # the Unix "standard output": a file named '-' was written instead
        raise UsageError(f"{flag} -: this command writes a file, not to standard output: give a file name such as "
                         f"{example}")
    named_folder = str(path).endswith(("/", os.sep))  # `-o newdir/`: Path() drops the slash, and a file was written
    path = Path(path)
    if path.is_dir() or named_folder:
        what = "is a directory" if path.is_dir() else "names a folder (it ends in /)"
        raise UsageError(f"{flag} {path}{'/' if named_folder else ''}: {what}: give a file name such as "
                         f"{path / example}")
    if path.exists() or path.is_symlink():
        regular_file(path, f"{flag} {path}")
    parent = path.parent
    if not parent.is_dir():
        state = "is not a directory" if parent.exists() else "does not exist"
        raise UsageError(f"{flag} {path}: folder {parent} {state}: create it first or choose another {flag}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: folder {parent} is not writable: choose another {flag}")
    return path


def shared_folder(path) -> str | None:
    """What `path` is, in a few words, when it is a folder that kit must not fill with its outputs
    (checkpoint-N/, final/, kit_*.json): the filesystem's root, the home folder or one above it, the root
    of a git work tree or of the kit checkout, also when reached through a symlink; None for any other
    (a subfolder of those is fine). A relative path is taken from the current folder, as a writer would.
    """
    real = Path(os.path.realpath(path))
    if real == Path(real.anchor):
        return "the filesystem's root"
    home = Path(os.path.realpath(Path.home()))
    if real == home:
        return "the home folder"
    if real in home.parents:
        return "a folder above the home folder"
    if real == Path(__file__).resolve().parent.parent and (real / "kit" / "__init__.py").is_file():
        return "the kit checkout"
    if (real / ".git").exists():
        return "the root of a git work tree"
    return None


def refuse_shared_folder(path, key: str = "output_dir") -> None:
    """UsageError (exit 2) when `path` is a `shared_folder`: one line naming it, where it leads and what to use."""
    what = shared_folder(path)
    if what is None:
        return
    real = os.path.realpath(path)
    via = f" (it leads to {real})" if os.path.normpath(os.path.abspath(path)) != real else ""
    raise UsageError(f"{key}={str(path)!r} is {what}{via}: kit would write checkpoint-N/, final/ and kit_*.json "
                     f"into it; choose a folder of its own, such as outputs/default")


MAX_SECONDS = 7 * 24 * 3600.0  # a week: past it a timer or socket timeout overflows (1e300 did), and nobody waits that long


def env_seconds(name: str, default: float) -> float:
    """A duration from the environment variable `name` (`default` when unset or empty).

    Raises:
        UsageError: not a number of seconds in (0, a week].
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_SECONDS:
        raise UsageError(f"environment variable {name}={raw[:40]!r} must be a number of seconds above 0 and at most "
                         f"{MAX_SECONDS:.0f} (a week)")
    return value
