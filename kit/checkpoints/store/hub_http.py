"""Bounded HTTP for the Hub store: every request huggingface_hub makes gets a timeout.

huggingface_hub's shared client has none, and most ``HfApi`` calls pass ``timeout=None`` per
request, which in httpx switches even a client-level timeout off: a server that accepts the
connection and never answers then hangs ``kit status`` or the training script forever.
"""

from __future__ import annotations

import os

from huggingface_hub import constants
from huggingface_hub.utils import _http as hf_http

from kit.files import env_seconds

DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_ENV = "KIT_NETWORK_TIMEOUT_S"  # seconds one socket operation may stall; default 60
# The HTTP library huggingface_hub itself uses: httpx2 from 2.0, httpx in 1.x (still preinstalled on
# many notebook images, and on the H200 here). Its errors and clients are the ones to catch and build.
_httpx = getattr(hf_http, "httpx2", None) or hf_http.httpx


def network_timeout_s() -> float:
    """The per-operation network timeout: ``KIT_NETWORK_TIMEOUT_S`` or 60 s.

    Raises:
        UsageError: the variable is set to something that is not a positive number.
    """
    return env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)


def hub_offline() -> bool:
    """huggingface_hub's own rule (``HF_HUB_OFFLINE`` read at each request): the Hub is off limits."""
    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in constants.ENV_VARS_TRUE_VALUES


def _bounded(timeout_s: float):
    """A request hook that gives a timeout to a request that has none.

    huggingface_hub 2.x passes ``timeout=None`` explicitly on most API calls (repo_info,
    list_repo_tree, create_commit…), which in httpx switches the client's timeout off for that
    request: a server that accepts the connection and never answers then hangs it forever.
    Requests that set their own timeout (downloads: 10 s) keep it.
    """
    bounded = _httpx.Timeout(timeout_s).as_dict()

    def hook(request) -> None:
        current = request.extensions.get("timeout") or {}
        if all(v is None for v in current.values()):
            request.extensions["timeout"] = dict(bounded)

    return hook


def use_timeouts(timeout_s: float) -> None:
    """Give huggingface_hub's shared HTTP client a timeout (it has none: a stalled socket hangs forever).

    The timeout is per socket operation (connect, one read, one write), so a slow upload that
    keeps moving is not cut. A client factory the user installed is left alone.
    """
    current = hf_http._GLOBAL_CLIENT_FACTORY
    if current is not hf_http.default_client_factory and getattr(current, "kit_timeout", None) is None:
        return
    if getattr(current, "kit_timeout", None) == timeout_s:
        return

    def factory() -> _httpx.Client:
        # Ours runs after the hub's hook, which raises first in offline mode.
        return _httpx.Client(event_hooks={"request": [hf_http.hf_request_event_hook, _bounded(timeout_s)]},
                             follow_redirects=True, timeout=_httpx.Timeout(timeout_s))

    factory.kit_timeout = timeout_s  # type: ignore[attr-defined]
    hf_http.set_client_factory(factory)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
