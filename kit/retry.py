"""kit's one retry policy: try again after fixed pauses while a call fails transiently.

    retry(call, pauses=(1, 2, 4), transient=(TransientStoreError,), what="downloading step 40", log=log)

Used for the store's downloads (kit.checkpoints.store.base), uploads (kit.checkpoints.sync), the
lease (kit.checkpoints.lease), and a Kaggle schedule's status polls and output download
(kit.notebooks.schedule.kaggle_run; never the push, which is not idempotent). Not tenacity: that comes with papermill (the notebooks extra)
only, and these calls run inside the training script. Not huggingface_hub's `http_backoff`:
it retries one raw HTTP request, and these are whole operations (a commit, a verified download).
The pauses are read when the call is made, so a test (or a caller) can shorten them.
"""

from __future__ import annotations

import logging
import time


def retry(call, *, pauses, transient: tuple[type[BaseException], ...], what: str,
          log: logging.Logger, sleep=time.sleep):
    """``call()``; while it raises one of `transient`, log, sleep the next pause and try again.

    After the last pause the failure is raised as it is: the caller words the final error.
    """
    pauses = tuple(pauses)
    for attempt in range(len(pauses) + 1):
        try:
            return call()
        except transient as err:
            if attempt == len(pauses):
                raise
            log.warning("%s failed (%s); retrying in %g s", what, err, pauses[attempt])
            sleep(pauses[attempt])
    raise AssertionError("unreachable")
