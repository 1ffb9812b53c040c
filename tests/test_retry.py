"""kit.retry: the one retry policy of the store's uploads, downloads and lease."""

import logging

import pytest

from kit.checkpoints.store.base import TransientStoreError
from kit.errors import StoreError
from kit.retry import retry

log = logging.getLogger("test.retry")


def flaky(failures: list[BaseException], result="ok"):
    calls = []

    def call():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result
    return call, calls


def test_transient_failures_are_retried_after_each_pause(caplog):
    slept = []
    call, calls = flaky([TransientStoreError("503"), TransientStoreError("timeout")])
    with caplog.at_level(logging.WARNING, "test.retry"):
        assert retry(call, pauses=(1, 2, 4), transient=(TransientStoreError,), what="downloading step 4",
                     log=log, sleep=slept.append) == "ok"
    assert slept == [1, 2] and len(calls) == 3
    assert "step 4 failed (503)" in caplog.text and "retrying in 1 s" in caplog.text


def test_the_last_transient_failure_is_raised_after_the_pauses():
    slept = []
    call, calls = flaky([TransientStoreError(str(i)) for i in range(5)])
    with pytest.raises(TransientStoreError, match="^2$"):
        retry(call, pauses=(0.5, 0.5), transient=(TransientStoreError,), what="x", log=log, sleep=slept.append)
    assert len(calls) == 3 and slept == [0.5, 0.5]


def test_a_refusal_is_not_retried():
    call, calls = flaky([StoreError("403: no write access")])
    with pytest.raises(StoreError, match="403"):
        retry(call, pauses=(1, 2), transient=(TransientStoreError,), what="x", log=log, sleep=lambda s: None)
    assert len(calls) == 1
