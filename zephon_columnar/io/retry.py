"""Retries for remote storage: which errors are worth another try, and how long to wait.

Object stores fail transiently all the time: a 500 or 503 ("SlowDown"), a connection reset, a
response cut short. fsspec backends retry some of these themselves (s3fs and botocore do,
within their own limits; others do not), so every remote request this
library makes (listing, sizes, Parquet footers, shard downloads) goes through :func:`retrying`
as well: transient errors are retried with exponential backoff, and when the tries run out the
error names the URL and what was being done. Permanent errors (a missing file, a refused
permission, a bad argument) are raised at once, as they are.

Example:
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionResetError("reset by peer")
    ...     return "bytes"
    >>> retrying(flaky, url="s3://bucket/a.parquet", what="read", policy=RetryPolicy(attempts=5, first_delay_s=0.0))
    'bytes'
    >>> len(calls)
    3
"""

from __future__ import annotations

import errno
import http.client
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from zephon_columnar.errors import ConfigError, ZephonError

log = logging.getLogger(__name__)

T = TypeVar("T")

# errno values that say the request itself is wrong: another try gives the same answer.
_PERMANENT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.EACCES,
        errno.EPERM,
        errno.EINVAL,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENAMETOOLONG,
        errno.EROFS,
    }
)
# Network libraries whose exceptions (not OSError subclasses) are connection or protocol trouble.
_NETWORK_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure")
# ... except these, which are configuration mistakes.
_CONFIG_ERROR_NAMES = (
    "Credential",
    "ParamValidation",
    "NoRegion",
    "InvalidConfig",
    "UnknownService",
    "InvalidURL",
    "InvalidUrl",
)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry a remote request.

    ``attempts`` tries in all (1: no retry). The wait before try ``k + 1`` is
    ``first_delay_s * 2**(k - 1)``, at most ``max_delay_s``, times a random factor in
    [0.5, 1] (so many readers that failed together do not retry together). ``deadline_s``
    (None: no limit): no new try starts this long after the first one.
    """

    attempts: int = 5
    first_delay_s: float = 0.1
    max_delay_s: float = 2.0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"RetryPolicy(attempts={self.attempts!r}): pass an int >= 1.")
        for name in ("first_delay_s", "max_delay_s", "deadline_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(f"RetryPolicy({name}={value!r}): pass a number of seconds >= 0.")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try (1, 2, ...)."""
        return min(self.max_delay_s, self.first_delay_s * 2.0 ** (failures - 1)) * random.uniform(0.5, 1.0)


class RetriesExhaustedError(ZephonError, OSError):
    """A remote request kept failing with transient errors until its retries ran out
    (``except OSError`` catches it); the message names the URL, the request and the last error."""


def is_transient(err: BaseException) -> bool:
    """Whether another try of the request that raised ``err`` may succeed.

    Transient: connection and protocol trouble (``ConnectionError``, ``TimeoutError``, an
    ``OSError`` with no errno or a server-side one such as ``EREMOTEIO``/``EBUSY``, which s3fs
    gives for 500 and 503, ``http.client`` errors, and the network errors of botocore, aiohttp,
    urllib3, requests). Permanent: missing files, refused permissions, bad requests, credential
    and configuration mistakes, and every error this library raises itself.

    Example:
        >>> is_transient(ConnectionResetError(104, "reset")), is_transient(OSError(121, "Internal Server Error"))
        (True, True)
        >>> (is_transient(FileNotFoundError("s3://b/k")), is_transient(PermissionError(13, "denied")),
        ...  is_transient(ValueError()))
        (False, False, False)
    """
    if isinstance(err, ZephonError):
        return False
    if isinstance(err, (ConnectionError, TimeoutError, http.client.HTTPException)):
        return True
    if isinstance(err, OSError):
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        return err.errno not in _PERMANENT_ERRNOS
    module = type(err).__module__.split(".", 1)[0]
    if module in _NETWORK_MODULES:
        names = " ".join(c.__name__ for c in type(err).__mro__)
        return not any(word in names for word in _CONFIG_ERROR_NAMES)
    return False


#: The exceptions storage clients raise when they find no credentials (botocore, google-auth),
#: by class name: the clients are optional extras, not imported here.
CREDENTIAL_ERRORS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError"}
)


def credentials_missing(err: BaseException) -> bool:
    """Whether ``err`` says the storage client found no credentials (never transient).

    Example:
        >>> class NoCredentialsError(Exception): ...
        >>> credentials_missing(NoCredentialsError("Unable to locate credentials")), credentials_missing(OSError())
        (True, False)
    """
    return any(cls.__name__ in CREDENTIAL_ERRORS for cls in type(err).__mro__)


def retrying(
    call: Callable[[], T],
    *,
    url: str,
    what: str,
    policy: RetryPolicy,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``call()``, tried again after transient errors (:func:`is_transient`) as ``policy`` says.

    Permanent errors propagate unchanged. When the tries (or ``policy.deadline_s``) run out, a
    :class:`RetriesExhaustedError` naming ``url`` and ``what`` is raised from the last error.
    ``on_retry(err)`` is called before each wait (counters).
    """
    start = time.monotonic()
    for failures in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as err:  # classified just below
            if credentials_missing(err):
                raise PermissionError(
                    f"{url}: {what} needs credentials, and the storage client found none ({type(err).__name__}: "
                    f"{err}). Give them as the client reads them: for s3://, AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials, an instance role); for gs://, "
                    "GOOGLE_APPLICATION_CREDENTIALS. A public bucket reads without them with "
                    "fsspec.config.conf['s3'] = {'anon': True}."
                ) from err
            if not is_transient(err):
                raise
            elapsed = time.monotonic() - start
            out_of_time = policy.deadline_s is not None and elapsed >= policy.deadline_s
            if failures == policy.attempts or out_of_time:
                raise RetriesExhaustedError(
                    f"{url}: {what} failed {failures} time(s) over {elapsed:.1f} s; the last error was "
                    f"{type(err).__name__}: {err}. The storage kept failing: check the endpoint, network and "
                    "credentials, or allow more tries (options(io_options={'cache': {'download_retry': N, "
                    "'open_retry_attempts': N}}))."
                ) from err
            if on_retry is not None:
                on_retry(err)
            wait = policy.delay(failures)
            log.info(
                "%s: %s failed (%s: %s); try %d of %d in %.2f s",
                url,
                what,
                type(err).__name__,
                err,
                failures + 1,
                policy.attempts,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises
