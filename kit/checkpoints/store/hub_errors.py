"""How the Hub's failures read: each HTTP status, a timeout, a dropped connection and offline
mode become one StoreError line (TransientStoreError where trying again can help, StaleHead for
a lost compare-and-swap), with the token scrubbed from anything the server echoed."""

from __future__ import annotations

from contextlib import contextmanager

from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from kit.redaction import redact
from kit.errors import StoreError
from kit.checkpoints.store.base import StaleHead, TransientStoreError
from kit.checkpoints.store.hub_http import _httpx, first_line

OFFLINE = ("store {store} is on the Hub, but HF_HUB_OFFLINE is set: unset it (or set HF_HUB_OFFLINE=0), "
           "or use a directory store")
NO_TOKEN = "no Hugging Face token: set HF_TOKEN or add a Kaggle/Colab secret named HF_TOKEN"


@contextmanager
def mapped(store, action: str):
    """Run a Hub call for `store` (a HubStore); its failure leaves as a one-line StoreError."""
    try:
        yield
    except HfHubHTTPError as err:
        error = http_error(store, err, action)
        error.status = err.response.status_code if err.response is not None else None
        raise error from None
    except _httpx.TimeoutException as err:
        raise TransientStoreError(f"{action} on {store.describe()} failed: {store.endpoint} did not answer "
                                  f"within {store.timeout_s:g} s ({type(err).__name__})") from None
    except _httpx.TransportError as err:
        raise TransientStoreError(f"{action} on {store.describe()} failed: {type(err).__name__} from "
                                  f"{store.endpoint} ({redact(first_line(err), store._token)[:200]})") from None
    except OfflineModeIsEnabled:
        raise StoreError(OFFLINE.format(store=store.describe())) from None


def http_error(store, err: HfHubHTTPError, action: str) -> StoreError:
    code = err.response.status_code if err.response is not None else None
    where = store.describe()
    if code == 401:
        if not store._token:
            return StoreError(f"{where} is private or missing and no token was given (401): {NO_TOKEN}")
        return StoreError(f"token rejected for {store.repo_id} (401): check HF_TOKEN is a valid token")
    if code == 403:
        return StoreError(f"token has no write access to {store.repo_id} (403): "
                          "use a token with write permission")
    if code == 404:
        return StoreError(f"{action} on {where} failed: not found (404)")
    if code == 412:
        return StaleHead(f"{where} changed while we wrote to it (412)")
    if code in (408, 429) or (code is not None and code >= 500):
        return TransientStoreError(f"{action} on {where} failed: HTTP {code}")
    return StoreError(f"{action} on {where} failed: HTTP {code}: {redact(first_line(err), store._token)[:200]}")
