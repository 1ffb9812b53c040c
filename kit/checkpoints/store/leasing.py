"""Each backend's lease primitive: a compare-and-swap of the lease record.

    store.swap_lease(decide)   # decide(current_text | None) -> the record to write, or None to leave it

`decide` may raise (a live holder has the lease); a record with ``"released": True`` gives the
lease up. The write happens only if the record is still what `decide` saw; otherwise it is read
again and `decide` is asked again, a few times, then the store gives up.

Hub: ``kit/lease.json`` committed with ``parent_commit`` = the head it was read at; of two racers
only one commit lands, the other gets 412 (:class:`StaleHead`) and re-reads.

Directory: ``kit/lease.lock`` created with ``O_CREAT|O_EXCL``. Not `filelock`: a directory store
is often a Google Drive or other network mount (Colab's /content/drive, a shared NFS folder)
where flock/fcntl locks are not honoured or not seen across machines, while an exclusive create
and a rename are; and this lock must outlive the process (the record's heartbeat says whether
its holder still runs), which an OS lock cannot.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

from kit.errors import StoreError
from kit.files import parse_json, write_atomic
from kit.checkpoints.store.layout import StaleHead, TransientStoreError

log = logging.getLogger("kit.checkpoints.lease")
LEASE_NAME = "lease.json"  # Hub: the record, kept (marked released) when given up
LOCK_NAME = "lease.lock"  # directory: the lock file, deleted when given up
CAS_ATTEMPTS = 5


def hub_swap(store, decide) -> None:
    store.ensure_repo()  # so there is a head to compare against
    for attempt in range(CAS_ATTEMPTS):
        text, head = store.read_text_at_head(LEASE_NAME)
        record = decide(text)
        if record is None:
            return
        try:
            store.write_text(LEASE_NAME, json.dumps(record), parent=head)
            return
        except StaleHead:
            log.info("%s changed while writing the lease; re-reading (attempt %d)", store.describe(), attempt + 1)
    raise TransientStoreError(f"{store.describe()} kept changing; could not write the lease")


def dir_swap(store, path: Path, decide) -> None:
    store._writable_dir(path.parent)
    for _ in range(CAS_ATTEMPTS):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = None
        record = decide(None if raw is None else raw.decode(errors="replace"))
        if record is None:
            return
        if raw is None:
            if record.get("released"):
                return
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue  # someone created it since we looked: judge theirs
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            return
        if not record.get("released") and _holder_id(raw) == record.get("id"):
            # The holder refreshing its own record: only it writes it, and a taker moves it aside first.
            write_atomic(path, json.dumps(record))
            return
        # Someone else's (stale) record, or ours given up: move it aside atomically, and only if it
        # is still what `decide` judged; then create ours on the next round (a racer may win that).
        aside = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue
        if aside.read_bytes() != raw:  # replaced in between: put theirs back
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            continue
        aside.unlink(missing_ok=True)
        if record.get("released"):
            return
    raise StoreError(f"could not take the lease in {store.describe()}: the lock file keeps changing")


def _holder_id(raw: bytes):
    try:
        data = parse_json(raw)
    except ValueError:
        return None
    return data.get("id") if isinstance(data, dict) else None
