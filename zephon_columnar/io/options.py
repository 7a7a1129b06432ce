"""Storage options (`StoreOptions`, `CacheOptions`, ...): Zephon's ``io_options`` classes.

``options(io_options=...)`` takes a `StoreOptions`, or the same thing as a dict
(``{"cache": {"enabled": True, "root": dir, "limit_bytes": "50gb"}}``). What takes effect here:

- ``cache.root``: where local copies of remote shards are kept (default
  ``$ZEPHON_COLUMNAR_CACHE/shards`` or ``~/.cache/zephon_columnar/shards``);
- ``cache.limit_bytes``: the most those copies may take; past it the least recently used
  copies are deleted (never one a reader has open). An int or a size such as ``"50gb"``.

- ``cache.download_retry`` (12), ``cache.download_timeout`` (180 s): a download failing with
  transient errors is tried that many more times, within that many seconds, each try resuming
  after the bytes already downloaded; ``cache.open_retry_attempts`` (5): tries of a listing,
  size or footer request (:mod:`zephon_columnar.io.retry`).

This library reads a remote shard from a local copy whatever ``cache.enabled`` says, so
``enabled`` only documents intent. The other fields (row-group cache, Arrow / Parquet / Vortex /
Lance threads, metadata cache entries) tune Zephon's own machinery: they are accepted and
validated, and change nothing here.

Example:
    >>> opts = StoreOptions(cache=CacheOptions.from_any({"enabled": True, "root": "/tmp/c", "limit_bytes": "2kb"}))
    >>> opts.cache.limit_bytes
    2048
    >>> StoreOptions.from_any({"cache": {"limit_bytes": 10}}).merge({"cache": {"root": "/x"}}).cache
    CacheOptions(enabled=False, keep_zip=False, validate_hash=None, root='/x', limit_bytes=10, rg_cache_bytes=None, download_retry=12, download_timeout=180.0, open_retry_attempts=5)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, TypeVar

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.retry import RetryPolicy

# Zephon's units: kb, mb, gb, tb are powers of 1024 (as are kib, mib, gib, tib).
_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}

T = TypeVar("T", bound="_Options")


def parse_size_bytes(value: str | int | None) -> int | None:
    """A size as a byte count: ``None`` and blank strings are None, an int is itself, a string is
    a number with an optional unit (b, kb, mb, gb, tb: powers of 1024; kib ... tib alike).

    Example:
        >>> parse_size_bytes("750gb"), parse_size_bytes("1.5 MiB"), parse_size_bytes(4096), parse_size_bytes("  ")
        (805306368000, 1572864, 4096, None)
        >>> parse_size_bytes("lots")
        Traceback (most recent call last):
        ...
        ValueError: cannot parse a size from 'lots': use a byte count or a number with a unit (b, kb, mb, gb, tb), e.g. '50gb'.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise TypeError(f"cannot parse a size from {value!r}: pass a byte count (int) or a string such as '50gb'.")
    text = value.strip().lower()
    if not text:
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot parse a size from {value!r}: use a byte count or a number with a unit "
                         "(b, kb, mb, gb, tb), e.g. '50gb'.")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_bytes(value: Any, *, what: str) -> int | None:
    """`parse_size_bytes` for the option ``what``: a negative count or anything else unparseable
    is a `ConfigError` naming the option.

    Example:
        >>> parse_bytes("1.5 GiB", what="limit_bytes"), parse_bytes(None, what="x")
        (1610612736, None)
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r}: pass a byte count (int) or a size such as '50gb'.")
    try:
        size = parse_size_bytes(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}={value!r}: pass a byte count (int) or a size such as '50gb' or '512MiB'.") from None
    if size is not None and size < 0:
        raise ConfigError(f"{what}={value!r}: a byte count must be >= 0.")
    return size


@dataclass(frozen=True, kw_only=True)
class _Options:
    """``from_any`` (None, an instance or a dict with known keys) and ``merge`` for every class."""

    @classmethod
    def from_any(cls: type[T], value: Any) -> T:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(f"{cls.__name__}: unknown option(s) {unknown}; valid: {sorted(known)}.")
            return cls(**{k: _nested(cls, k, v) for k, v in value.items()})
        raise ConfigError(f"{cls.__name__}.from_any: pass None, a {cls.__name__} or a dict, "
                          f"got {type(value).__name__}.")

    def merge(self: T, other: Any) -> T:
        """A copy with the fields ``other`` sets (a dict: its keys; an instance: the fields that
        differ from the defaults); nested options merge field by field."""
        if other is None:
            return self
        if isinstance(other, Mapping):
            type(self).from_any(other)  # raises on unknown keys and bad values
            given = dict(other)
        else:
            defaults = type(other)()
            given = {f.name: getattr(other, f.name) for f in fields(other)
                     if getattr(other, f.name) != getattr(defaults, f.name)}
        changes = {k: getattr(self, k).merge(v) if isinstance(getattr(self, k), _Options) else v
                   for k, v in given.items()}
        return dataclasses.replace(self, **changes)


def _nested(cls: type, key: str, value: Any) -> Any:
    """``value`` of field ``key`` of ``cls``: a nested options class built from a dict."""
    sub = _NESTED.get((cls.__name__, key))
    return sub.from_any(value) if sub is not None else value


@dataclass(frozen=True, kw_only=True)
class CacheOptions(_Options):
    """Local copies of remote shards (see the module docstring for what takes effect)."""

    enabled: bool = False
    keep_zip: bool = False
    validate_hash: Any = None
    root: str | None = None
    limit_bytes: int | None = None
    rg_cache_bytes: int | None = None
    download_retry: int = 12
    download_timeout: float = 180.0
    open_retry_attempts: int = 5

    def __post_init__(self) -> None:
        for name in ("limit_bytes", "rg_cache_bytes"):  # "50gb" -> 50_000_000_000
            object.__setattr__(self, name, parse_bytes(getattr(self, name), what=f"CacheOptions({name})"))
        if self.root is not None and not isinstance(self.root, str):
            object.__setattr__(self, "root", str(self.root))  # a pathlib.Path
        for name in ("download_retry", "open_retry_attempts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"CacheOptions({name}={v!r}): pass an int >= 0.")

    def download_policy(self) -> RetryPolicy:
        """``download_retry`` retries (so one more try) within ``download_timeout`` seconds."""
        return RetryPolicy(attempts=self.download_retry + 1, deadline_s=self.download_timeout)

    def metadata_policy(self) -> RetryPolicy:
        """``open_retry_attempts`` tries of a listing, size or footer request (at least one)."""
        return RetryPolicy(attempts=max(1, self.open_retry_attempts))


@dataclass(frozen=True, kw_only=True)
class ArrowOptions(_Options):
    """Accepted for Zephon compatibility (Arrow's thread pools are left as they are)."""

    cpu_threads: int | None = None
    io_threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class ParquetRGCacheOptions(_Options):
    """Accepted for Zephon compatibility (no row-group cache here: decoded groups are shared)."""

    enabled: bool = False
    root: str | None = None
    limit_bytes: int | None = None
    min_free_bytes: int = 1 << 30


@dataclass(frozen=True, kw_only=True)
class ParquetOptions(_Options):
    """Accepted for Zephon compatibility."""

    use_threads: bool | None = None
    rg_cache: ParquetRGCacheOptions = field(default_factory=ParquetRGCacheOptions)


@dataclass(frozen=True, kw_only=True)
class VortexOptions(_Options):
    """Accepted for Zephon compatibility (Vortex files are not read by this library)."""

    segment_cache_bytes: int | None = None
    worker_threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class LanceOptions(_Options):
    """Accepted for Zephon compatibility (Lance datasets are not read by this library)."""

    worker_threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class StoreOptions(_Options):
    """Every storage option; ``options(io_options=...)`` takes one (or the same as a dict)."""

    cache: CacheOptions = field(default_factory=CacheOptions)
    arrow: ArrowOptions = field(default_factory=ArrowOptions)
    parquet: ParquetOptions = field(default_factory=ParquetOptions)
    vortex: VortexOptions = field(default_factory=VortexOptions)
    lance: LanceOptions = field(default_factory=LanceOptions)
    metadata_cache_entries: int | None = None


_NESTED: dict[tuple[str, str], type[_Options]] = {
    ("StoreOptions", "cache"): CacheOptions, ("StoreOptions", "arrow"): ArrowOptions,
    ("StoreOptions", "parquet"): ParquetOptions, ("StoreOptions", "vortex"): VortexOptions,
    ("StoreOptions", "lance"): LanceOptions, ("ParquetOptions", "rg_cache"): ParquetRGCacheOptions,
}


__all__ = ["ArrowOptions", "CacheOptions", "LanceOptions", "ParquetOptions", "ParquetRGCacheOptions", "StoreOptions",
           "VortexOptions", "parse_size_bytes"]
