"""Checkpoint stores: where checkpoints outlive the notebook session.

``open_store("hf://owner/name")`` gives a :class:`HubStore` (a private Hub repo),
``open_store("/path")`` a :class:`DirStore`, ``open_store(None)`` None (no store configured).
The Hub backend imports ``huggingface_hub`` only when asked for.
"""

from __future__ import annotations

from pathlib import Path

from kit.checkpoints.store.base import Candidate, StaleHead, Store, TransientStoreError
from kit.checkpoints.store.directory import DirStore

__all__ = ["open_store", "connect", "Store", "DirStore", "Candidate", "StaleHead", "TransientStoreError"]


def open_store(spec: str | None, *, token: str | None = None, endpoint: str | None = None) -> Store | None:
    """Open the store named by ``spec``.

    Example:
        >>> open_store("hf://me/qwen3-ha-ckpts")        # HubStore, token from kit.auth
        >>> open_store("/kaggle/working/ckpts")          # DirStore
    Raises:
        UsageError: ``hf://`` with an invalid repo id.
    """
    if spec is None or not str(spec).strip():
        return None
    spec = str(spec).strip()
    if spec.startswith("hf://"):
        from kit.checkpoints.store.hub import HubStore

        return HubStore(spec, token=token, endpoint=endpoint)
    return DirStore(Path(spec))


def connect(spec: str | None) -> Store | None:
    """Open the store and check it can be read — the one check `kit status` and the training script share.

    Raises:
        UsageError: an invalid spec. StoreError: a file where a directory should be, the Hub
        while ``HF_HUB_OFFLINE`` is set, or an endpoint that does not answer within the timeout.
    """
    store = open_store(spec)
    if store is not None:
        store.preflight()
    return store
