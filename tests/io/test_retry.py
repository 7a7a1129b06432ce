"""Which remote errors are retried, how often, how long, and what the final error says."""

from __future__ import annotations

import http.client
import time

import pytest

from tests.extras import require
from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.io.retry import RetriesExhaustedError, RetryPolicy, is_transient, retrying

botocore_exceptions = require("botocore.exceptions", "s3")


@pytest.mark.parametrize("err", [
    ConnectionResetError(104, "Connection reset by peer"), TimeoutError("read timed out"),
    OSError(121, "Internal Server Error"),  # s3fs: a 500
    OSError(16, "SlowDown"),  # s3fs: a 503
    OSError("no errno"), http.client.IncompleteRead(b"abc", 10),
    botocore_exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
    botocore_exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
], ids=type)
def test_connection_and_server_errors_are_transient(err):
    assert is_transient(err)


@pytest.mark.parametrize("err", [
    FileNotFoundError(2, "No such key"), PermissionError(13, "Access Denied"), OSError(22, "Invalid argument"),
    IsADirectoryError(21, "a directory"), ValueError("bad"), TypeError("bad"), KeyError("k"),
    DatasetFormatError("corrupt"), DatasetNotFoundError("gone"), RetriesExhaustedError("already retried"),
    botocore_exceptions.NoCredentialsError(), botocore_exceptions.ParamValidationError(report="Bucket"),
], ids=type)
def test_missing_denied_bad_and_own_errors_are_permanent(err):
    assert not is_transient(err)


def flaky(failures: list[BaseException], result: str = "ok"):
    """A call that raises the given errors in turn, then returns ``result``; counts its calls."""
    calls = []

    def call():
        calls.append(time.monotonic())
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return result

    return call, calls


def test_transient_errors_are_retried_until_success_with_growing_waits():
    call, calls = flaky([ConnectionResetError()] * 3)
    seen = []
    policy = RetryPolicy(attempts=4, first_delay_s=0.02, max_delay_s=1.0)
    assert retrying(call, url="s3://b/k", what="read", policy=policy, on_retry=seen.append) == "ok"
    assert len(calls) == 4 and len(seen) == 3
    waits = [b - a for a, b in zip(calls, calls[1:])]
    # 0.02, 0.04, 0.08 s, each times a factor in [0.5, 1]
    assert all(0.01 <= w for w in waits) and waits[2] >= 0.04 and waits[0] < 0.1


def test_a_permanent_error_is_raised_at_once_unchanged():
    err = FileNotFoundError(2, "No such key")
    call, calls = flaky([err])
    with pytest.raises(FileNotFoundError) as info:
        retrying(call, url="s3://b/k", what="read", policy=RetryPolicy(attempts=5, first_delay_s=0.0))
    assert info.value is err and len(calls) == 1


def test_out_of_tries_names_the_url_the_request_and_the_last_error():
    call, calls = flaky([OSError(121, "Internal Server Error")] * 9)
    with pytest.raises(RetriesExhaustedError, match=r"s3://b/k: footer read failed 3 time\(s\).*Internal Server Error") as info:
        retrying(call, url="s3://b/k", what="footer read", policy=RetryPolicy(attempts=3, first_delay_s=0.0))
    assert len(calls) == 3 and isinstance(info.value, OSError) and isinstance(info.value.__cause__, OSError)


def test_the_deadline_stops_retrying_before_the_tries_run_out():
    call, calls = flaky([TimeoutError()] * 100)
    t0 = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match="download failed"):
        retrying(call, url="s3://b/k", what="download",
                 policy=RetryPolicy(attempts=100, first_delay_s=0.05, max_delay_s=0.05, deadline_s=0.3))
    assert time.monotonic() - t0 < 1.0 and 3 <= len(calls) < 100


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"attempts": 1.5}, {"first_delay_s": -1}, {"deadline_s": "soon"}])
def test_bad_policies_are_rejected_naming_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        RetryPolicy(**bad)
