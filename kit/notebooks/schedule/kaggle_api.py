"""The few Kaggle API calls a schedule needs, through the official `kaggle` package.

`push(folder)`, `status(ref)` and `output(ref, into)` wrap `KaggleApi.kernels_push`,
`kernels_status` and `kernels_output`. The package's HTTP calls carry no timeout, so each call
runs in a daemon thread that we wait on for a bounded time. Its failures become one-line
`KaggleError`s (exit 4) carrying Kaggle's own message; missing credentials are found before the
package is imported (it prints a page of help and exits when it finds none).

Credentials: the package's own (`KAGGLE_API_TOKEN`, `~/.kaggle/access_token`, `~/.kaggle/kaggle.json`
or `KAGGLE_USERNAME` + `KAGGLE_KEY`, `KAGGLE_CONFIG_DIR`). They are never printed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from kit.errors import KitError, UsageError

CALL_TIMEOUT_S = 120.0
SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,49}/[a-z0-9][a-z0-9-]{3,49}$")


class KaggleError(KitError):
    """The Kaggle API refused, rejected or did not answer a call (``status``: the HTTP status, if any)."""

    exit_code = 4
    status: int | None = None


class KaggleUnavailable(KaggleError):
    """No answer, no connection, 429 or 5xx: worth asking again (kit.retry), unlike a refusal."""


@dataclass
class Status:
    state: str  # queued, running, complete, error, cancelRequested, cancelAcknowledged
    message: str | None = None


def check_slug(ref: str) -> tuple[str, str]:
    """`USER/SLUG` (a kernel's URL path: lowercase letters, digits and dashes, 5+ characters)."""
    if not isinstance(ref, str) or not SLUG_RE.match(ref):
        raise UsageError(f"--kaggle {ref!r} is not USER/SLUG (e.g. me/kit-resume: the slug is 5-50 lowercase "
                         "letters, digits or dashes, as in kaggle.com/code/USER/SLUG)")
    user, slug = ref.split("/")
    return user, slug


def _config_dir() -> Path:
    if os.environ.get("KAGGLE_CONFIG_DIR"):
        return Path(os.environ["KAGGLE_CONFIG_DIR"])
    home = Path.home() / ".kaggle"
    if home.exists():
        return home
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "kaggle"


def credentials_source() -> str | None:
    """Where the package would find credentials (a name, never the value), or None."""
    if os.environ.get("KAGGLE_API_TOKEN", "").strip():
        return "KAGGLE_API_TOKEN"
    if os.environ.get("KAGGLE_USERNAME") and os.environ.get("KAGGLE_KEY"):
        return "KAGGLE_USERNAME/KAGGLE_KEY"
    folder = _config_dir()
    for name in ("access_token", "access_token.txt", "kaggle.json"):
        path = folder / name
        if path.is_file() and path.read_text(errors="replace").strip():
            return str(path)
    return None


def require_credentials() -> str:
    source = credentials_source()
    if source is None:
        raise UsageError("no Kaggle credentials: create an API token at kaggle.com/settings and set "
                         "KAGGLE_API_TOKEN, or save kaggle.json in ~/.kaggle/ (chmod 600)")
    return source


def _api():
    require_credentials()
    try:
        from kaggle.api.kaggle_api_extended import KaggleApi
    except ImportError as err:
        raise UsageError(f"the kaggle package is not usable here ({err}): run `pip install -e \".[kaggle]\"` in the "
                         "kit checkout") from None

    api = KaggleApi()
    api.authenticate()
    return api


def _message(err: BaseException) -> str:
    """Kaggle's own words for a failed call: the JSON `message` of an HTTP error, else the error."""
    response = getattr(err, "response", None)
    if response is not None:
        try:
            body = response.json()
            text = body.get("message") if isinstance(body, dict) else None
        except ValueError:
            text = None
        text = text or (response.text or "").strip()[:200] or response.reason
        return f"HTTP {response.status_code}: {text}"
    return str(err).splitlines()[0][:300] if str(err) else type(err).__name__


def _call(what: str, fn, timeout_s: float = CALL_TIMEOUT_S):
    """Run `fn(api)` in a daemon thread; one-line KaggleError on failure or after `timeout_s`."""
    import requests

    result: dict = {}

    def target() -> None:
        try:
            # The package prints a page of help (at import, too) when it rejects the credentials.
            with contextlib.redirect_stdout(io.StringIO()):
                api = _api()
            result["value"] = fn(api)
        except BaseException as err:  # handed to the caller's thread, which decides
            result["error"] = err

    worker = threading.Thread(target=target, name=f"kit-kaggle-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise KaggleUnavailable(f"Kaggle API: {what} got no answer in {timeout_s:.0f} s; try again later")
    err = result.get("error")
    if err is None:
        return result.get("value")
    if isinstance(err, KitError):
        raise err
    # kernels_status/output turn a 401/403 into a ValueError about the slug: the HTTP error is its context.
    http = err if getattr(err, "response", None) is not None else err.__context__
    status = getattr(getattr(http, "response", None), "status_code", None)
    if status in (401, 403):
        raise KaggleError(f"Kaggle API refused the credentials ({_message(http)}) during {what}: check "
                          "KAGGLE_API_TOKEN or kaggle.json") from None
    if isinstance(err, requests.ConnectionError | requests.Timeout):
        raise KaggleUnavailable(f"Kaggle API unreachable during {what}: {type(err).__name__}; check the network") from None
    if isinstance(err, requests.HTTPError | ValueError):
        busy = status is not None and (status == 429 or status >= 500)
        rejected = (KaggleUnavailable if busy else KaggleError)(f"Kaggle API rejected {what}: {_message(err)}")
        rejected.status = status
        raise rejected from None
    if isinstance(err, SystemExit):  # the package exits when no credentials of it work
        raise KaggleError(f"Kaggle API refused the credentials during {what} ({credentials_source()}): check "
                          "KAGGLE_API_TOKEN or kaggle.json") from None
    raise err


def push(folder: Path, timeout_s: float = CALL_TIMEOUT_S) -> int | None:
    """`kaggle kernels push -p folder`: saves a new version and runs it. Returns its version number."""
    response = _call("push", lambda api: api.kernels_push(str(folder)), timeout_s)
    if getattr(response, "error", None):
        raise KaggleError(f"Kaggle API rejected the push: {response.error}")
    return getattr(response, "version_number", None)


def status(ref: str, timeout_s: float = CALL_TIMEOUT_S) -> Status:
    response = _call("status", lambda api: api.kernels_status(ref), timeout_s)
    name = getattr(response.status, "name", str(response.status)).lower()
    state = {"cancel_requested": "cancelRequested", "cancel_acknowledged": "cancelAcknowledged"}.get(name, name)
    return Status(state, response.failure_message or None)


def current(ref: str, timeout_s: float = CALL_TIMEOUT_S) -> Status | None:
    """The latest version's status, or None when the notebook has no version yet (404)."""
    try:
        return status(ref, timeout_s)
    except KaggleError as err:
        if err.status == 404:
            return None
        raise


def output(ref: str, into: Path, timeout_s: float = CALL_TIMEOUT_S) -> list[Path]:
    """Download the latest version's output files and its log into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    files, _ = _call("output", lambda api: api.kernels_output(ref, str(into), force=True, quiet=True), timeout_s)
    return [Path(f) for f in files]
