"""Storage options (`StoreOptions`, `CacheOptions`, ...): Zephon's ``io_options`` classes.

``options(io_options=...)`` takes a `StoreOptions`, or the same thing as a dict
(``{"cache": {"enabled": True, "root": dir, "limit_bytes": "50gb"}}``). What takes effect here:

- ``cache.root``: where local copies of remote shards are kept (default, None:
  ``$ZEPHON_COLUMNAR_CACHE/shards`` or ``~/.cache/zephon_columnar/shards``); the processes
  of a node that use one root share it: each shard is downloaded once for all of them
  (`zephon_columnar.io.fs.ShardCache`);
- ``cache.limit_bytes``: the most those copies may take, all processes together; past it the
  least recently used copies are deleted (one a reader has open stays readable to it). An int
  or a size such as ``"50gb"``.
- ``cache.download_retry`` (12), ``cache.download_timeout`` (180 s): a download failing with
  transient errors is tried that many more times, within that many seconds, each try resuming
  after the bytes already downloaded; ``cache.open_retry_attempts`` (5) tries of a listing,
  size or footer request, waiting ``cache.open_retry_initial_backoff`` (0.1 s) after the first
  failure, doubling up to ``cache.open_retry_max_backoff`` (2 s) (:mod:`zephon_columnar.io.retry`).

This library reads a remote shard from a local copy whatever ``cache.enabled`` says, so
``enabled`` only documents intent. The other fields (footer read slack, row-group cache, Arrow /
Parquet / Vortex / Lance threads, metadata cache entries) tune Zephon's own machinery: they are
accepted, validated and merged as Zephon does, and change nothing here.

Supplied and omitted fields: every class remembers which of its fields the caller supplied
(`supplied_fields`). An omitted field takes its default; so does one supplied as None, except the
thread counts (``arrow.cpu_threads``, ``arrow.io_threads``, ``vortex.worker_threads``,
``lance.worker_threads``), where None is a value ("leave the pool as it is") and is kept.
``a.merge(b)`` takes from ``b`` only what ``b`` supplied (an explicit None too, which resets a
field to its default), nested options merging field by field. ``from_any(None)`` supplies every
field with its default, so merging it resets everything; ``from_any({})`` and a bare constructor
supply nothing, so merging them changes nothing. Sizes (``"8gb"``: powers of 1024) are byte
counts by the time an object exists.

Example:
    >>> opts = StoreOptions(cache=CacheOptions.from_any({"enabled": True, "root": "/tmp/c", "limit_bytes": "2kb"}))
    >>> opts.cache.limit_bytes
    2048
    >>> merged = StoreOptions.from_any({"cache": {"limit_bytes": 10}}).merge({"cache": {"root": "/x"}})
    >>> merged.cache.root, merged.cache.limit_bytes, merged.cache.download_retry, sorted(merged.cache.supplied_fields())
    ('/x', 10, 12, ['limit_bytes', 'root'])
    >>> merged.merge({"cache": {"limit_bytes": None}}).cache.limit_bytes is None  # explicit None: the default
    True
    >>> StoreOptions.from_any({"arrow": {"cpu_threads": None}}).arrow  # None kept: Arrow's pool left as it is
    ArrowOptions(cpu_threads=None, io_threads=1)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from zephon_columnar.errors import ConfigError, warn
from zephon_columnar.io.decoded import DEFAULT_LIMIT_BYTES as DEFAULT_DECODED_LIMIT_BYTES
from zephon_columnar.io.retry import RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

# Zephon's units: kb, mb, gb, tb are powers of 1024 (as are kib, mib, gib, tib).
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1 << 10,
    "mb": 1 << 20,
    "gb": 1 << 30,
    "tb": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}

# The least automatic size of the decoded row-group cache (Zephon's: 4 GiB).
RG_CACHE_MIN_BYTES = 4 << 30


class OptionTypeError(ConfigError, TypeError):
    """Options of the wrong shape: an unknown or moved key, or a value that is not an options
    object, a dict or None. A `ConfigError` (so a ``ValueError``) and a ``TypeError`` (what Zephon
    raises for these)."""


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
    """  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap
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
        raise ValueError(
            f"cannot parse a size from {value!r}: use a byte count or a number with a unit "
            "(b, kb, mb, gb, tb), e.g. '50gb'."
        )
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


# ---------------------------------------------------------------------------------------------
# Field kinds: each turns a supplied, non-None value into the stored one, or raises naming the
# option (``name`` is its dotted path, e.g. ``"parquet.rg_cache.limit_bytes"``).

Normalizer = Callable[[str, Any], Any]


def _anything(name: str, value: Any) -> Any:
    return value


def _size(*, blank_is_none: bool) -> Normalizer:
    """A byte count or a size string; a blank string is None (``blank_is_none``) or an error."""

    def normalize(name: str, value: Any) -> int | None:
        if isinstance(value, str) and not value.strip() and not blank_is_none:
            raise ConfigError(
                f"{name}={value!r}: must not be empty; pass a byte count or a size such as "
                "'64mb' (None for the default)."
            )
        return parse_bytes(value, what=name)

    return normalize


def _count(minimum: int) -> Normalizer:
    """An int >= ``minimum`` (not a bool, a float or a numeric string)."""

    def normalize(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name}={value!r}: pass an int >= {minimum} (None for the default).")
        return value

    return normalize


def _thread_count(minimum: int) -> Normalizer:
    """A thread count >= ``minimum``; None (kept, not replaced by the default) leaves the pool alone."""

    def normalize(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name}={value!r}: pass an int >= {minimum}, or None to leave the pool as it is.")
        return value

    return normalize


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name}={value!r}: pass a number of seconds >= 0 (None for the default).")
    return value


def _flag(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise ConfigError(f"{name}={value!r}: pass True or False (None for the default).")
    return value


def _path(*, as_str: bool) -> Normalizer:
    """A directory: a str or an ``os.PathLike`` (stored as a str when ``as_str``)."""

    def normalize(name: str, value: Any) -> Any:
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(
                f"{name}={value!r}: pass a directory path (str or pathlib.Path), or None for the default."
            )
        return os.fspath(value) if as_str else value

    return normalize


_DEFAULT, _KEEP_NONE, _NORMALIZE, _NESTED = "default", "keep_none", "normalize", "nested"


class _Unset:
    """The default of every option field: "not supplied" (replaced by the field's default)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:  # noqa: PYI034 - a singleton: always the one _Unset instance
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<not supplied>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Unset, ())


_UNSET: Any = _Unset()


def _option(default: Any, normalize: Normalizer = _anything, *, keep_none: bool = False) -> Any:
    """An option field: omitted, it takes ``default``; supplied as None, ``default`` too unless
    ``keep_none`` (then None is stored); otherwise ``normalize(name, value)``."""
    return field(default=_UNSET, metadata={_DEFAULT: default, _NORMALIZE: normalize, _KEEP_NONE: keep_none})


def _nested(cls: type[_Options]) -> Any:
    """A nested options object (an instance, or anything its ``from_any`` takes)."""
    return field(default_factory=cls, metadata={_NESTED: cls})


@dataclass(frozen=True, kw_only=True)
class _Options:
    """What every options class shares: supplied fields, ``from_any``, ``merge``, validation."""

    # Dotted path of this class's fields in error messages ("" for the top level).
    _prefix: ClassVar[str] = ""
    # Keys ``from_any`` refuses with a hint: old or misplaced spellings -> where they live now.
    _moved: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        supplied = set()
        for f in fields(self):
            value = getattr(self, f.name)
            nested = f.metadata.get(_NESTED)
            if nested is not None:
                if not isinstance(value, nested):
                    object.__setattr__(self, f.name, nested.from_any(value))
                continue
            if value is _UNSET:
                value = f.metadata[_DEFAULT]
            else:
                supplied.add(f.name)
                if value is not None:
                    value = f.metadata[_NORMALIZE](self._name(f.name), value)
                if value is None and not f.metadata[_KEEP_NONE]:
                    value = f.metadata[_DEFAULT]
            object.__setattr__(self, f.name, value)
        object.__setattr__(self, "_supplied", frozenset(supplied))
        self._check()

    def _check(self) -> None:
        """Checks across fields (each field's own check ran already)."""

    @classmethod
    def _name(cls, field_name: str) -> str:
        return f"{cls._prefix}.{field_name}" if cls._prefix else field_name

    def supplied_fields(self) -> frozenset[str]:
        """The fields (not the nested options) the caller supplied, None included: the ones
        `merge` takes from this object.

        Example:
            >>> sorted(CacheOptions(limit_bytes="1gb", root=None).supplied_fields()), CacheOptions().supplied_fields()
            (['limit_bytes', 'root'], frozenset())
        """
        # `_supplied` is set by __post_init__ (object.__setattr__ on the frozen instance), not a field.
        supplied: frozenset[str] = self._supplied  # type: ignore[attr-defined]
        return supplied

    @classmethod
    def defaults(cls) -> Self:
        """Every field supplied with its default (nested options alike): merging it resets all."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            nested = f.metadata.get(_NESTED)
            values[f.name] = nested.defaults() if nested is not None else f.metadata[_DEFAULT]
        return cls(**values)

    @classmethod
    def _from_bool(cls, value: bool) -> Self:
        raise OptionTypeError(
            f"{cls.__name__}.from_any({value!r}): pass None, a {cls.__name__} or a dict of its fields."
        )

    @classmethod
    def from_any(cls, value: Any) -> Self:
        """``value`` as a ``cls``: None gives `defaults`; an instance is returned as it is; a dict
        supplies its keys (nested dicts become nested options). Unknown keys, and anything else,
        raise `OptionTypeError`."""
        if value is None:
            return cls.defaults()
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            return cls._from_bool(value)
        if isinstance(value, Mapping):
            for key in value:
                if key in cls._moved:
                    raise OptionTypeError(f"{cls._name(str(key))}: {key!r} has moved to {cls._moved[key]}.")
            known = {f.name for f in fields(cls)}
            unknown = sorted(str(k) for k in set(value) - known)
            if unknown:
                raise OptionTypeError(f"{cls.__name__}: unknown option(s) {unknown}; valid: {sorted(known)}.")
            return cls(**value)
        raise OptionTypeError(
            f"{cls.__name__}.from_any: pass None, a {cls.__name__} or a dict, got {type(value).__name__}."
        )

    def merge(self, other: Any) -> Self:
        """A copy with what ``other`` (an instance, or anything `from_any` takes but None) supplied
        laid over this object: a field ``other`` omitted keeps this object's value (supplied or
        not), nested options merge field by field. ``other=None`` returns this object."""
        if other is None:
            return self
        if not isinstance(other, type(self)):
            if not isinstance(other, Mapping):
                raise OptionTypeError(
                    f"{type(self).__name__}.merge: pass a {type(self).__name__}, a dict or "
                    f"None, got {type(other).__name__}."
                )
            other = type(self).from_any(other)
        values: dict[str, Any] = {}
        for f in fields(self):
            if f.metadata.get(_NESTED) is not None:
                values[f.name] = getattr(self, f.name).merge(getattr(other, f.name))
            elif f.name in other.supplied_fields():
                values[f.name] = getattr(other, f.name)
            elif f.name in self.supplied_fields():
                values[f.name] = getattr(self, f.name)
        return type(self)(**values)


@dataclass(frozen=True, kw_only=True)
class CacheOptions(_Options):
    """Local copies of remote shards (see the module docstring for what takes effect).

    ``from_any(False)`` is `defaults` (the cache as configured by default); ``from_any(True)`` is
    refused: say ``{"enabled": True}``. ``rg_cache_bytes`` is deprecated (`StoreOptions` warns):
    use ``parquet.rg_cache.limit_bytes``. ``min_slack_bytes`` / ``max_slack_bytes`` (Zephon's
    footer read-ahead bounds) are accepted and change nothing here.
    """

    _prefix = "cache"
    _moved: ClassVar[dict[str, str]] = {
        "metadata_cache_entries": "StoreOptions(metadata_cache_entries=...), beside 'cache'"
    }

    enabled: bool = _option(False)
    root: str | None = _option(None, _path(as_str=True))
    limit_bytes: int | None = _option(None, _size(blank_is_none=True))
    rg_cache_bytes: int | None = _option(None, _size(blank_is_none=True))
    keep_zip: bool = _option(False)
    validate_hash: str | None = _option(None)
    download_retry: int = _option(12, _count(0))
    download_timeout: float = _option(180.0, _seconds)
    open_retry_attempts: int = _option(5, _count(0))
    open_retry_initial_backoff: float = _option(0.1, _seconds)
    open_retry_max_backoff: float = _option(2.0, _seconds)
    min_slack_bytes: int = _option(512 << 10, _size(blank_is_none=True))
    max_slack_bytes: int = _option(64 << 20, _size(blank_is_none=True))

    @classmethod
    def _from_bool(cls, value: bool) -> CacheOptions:
        if value is False:
            return cls.defaults()
        raise OptionTypeError(
            "CacheOptions.from_any(True): say which cache, e.g. {'enabled': True, 'root': '/path/to/cache'}."
        )

    def download_policy(self) -> RetryPolicy:
        """``download_retry`` retries (so one more try) within ``download_timeout`` seconds."""
        return RetryPolicy(attempts=self.download_retry + 1, deadline_s=self.download_timeout)

    def metadata_policy(self) -> RetryPolicy:
        """``open_retry_attempts`` tries of a listing, size or footer request (at least one), with
        ``open_retry_initial_backoff`` .. ``open_retry_max_backoff`` seconds between them."""
        return RetryPolicy(
            attempts=max(1, self.open_retry_attempts),
            first_delay_s=self.open_retry_initial_backoff,
            max_delay_s=self.open_retry_max_backoff,
        )


@dataclass(frozen=True, kw_only=True)
class ArrowOptions(_Options):
    """Zephon's process-wide Arrow CPU and I/O pool sizes (default 1; None: leave the pool as it
    is). Accepted and validated; this library leaves Arrow's pools as they are."""

    _prefix = "arrow"

    cpu_threads: int | None = _option(1, _thread_count(1), keep_none=True)
    io_threads: int | None = _option(1, _thread_count(1), keep_none=True)


@dataclass(frozen=True, kw_only=True)
class ParquetRGCacheOptions(_Options):
    """Zephon's node-shared cache of decoded Parquet row groups (none here: decoded groups are
    shared in memory). Accepted, validated and resolved (`StoreOptions.resolved_parquet_rg_cache`).

    ``enabled`` None: on with the shard cache or an explicit ``root``; ``root`` None: the shard
    cache's ``.parquet-rg-cache`` folder; ``limit_bytes`` None: automatic (see
    `StoreOptions.resolved_parquet_rg_cache`). These stay None until resolved, so merges keep
    omitted and explicit values apart. ``from_any(True)`` / ``from_any(False)`` supply ``enabled``.
    """

    _prefix = "parquet.rg_cache"

    enabled: bool | None = _option(None)
    root: str | os.PathLike[str] | None = _option(None, _path(as_str=False))  # noqa: RUF009 - _option returns a field()
    limit_bytes: int | None = _option(None, _size(blank_is_none=False))
    min_free_bytes: int = _option(1 << 30, _size(blank_is_none=False))

    def _check(self) -> None:
        if self.enabled is not False and self.limit_bytes is not None and self.limit_bytes <= 0:
            raise ConfigError(
                f"parquet.rg_cache.limit_bytes={self.limit_bytes!r}: must be positive while the "
                "cache may be enabled; pass a size such as '8gb', None for the automatic size, or "
                "enabled=False."
            )

    @classmethod
    def _from_bool(cls, value: bool) -> ParquetRGCacheOptions:
        return cls(enabled=value)


@dataclass(frozen=True, kw_only=True)
class ParquetOptions(_Options):
    """Zephon's Parquet read options: ``use_threads`` (False; decode columns in parallel) and the
    decoded row-group cache ``rg_cache``. Accepted and validated."""

    _prefix = "parquet"

    use_threads: bool = _option(False, _flag)
    rg_cache: ParquetRGCacheOptions = _nested(ParquetRGCacheOptions)  # noqa: RUF009 - a field(default_factory=...)


@dataclass(frozen=True, kw_only=True)
class VortexOptions(_Options):
    """Zephon's Vortex options: ``segment_cache_bytes`` (64 MiB; 0 disables the cache) and
    ``worker_threads`` (1; 0: no background worker; None: leave the pool as it is). Accepted and
    validated (Vortex files are not read by this library)."""

    _prefix = "vortex"

    segment_cache_bytes: int = _option(64 << 20, _size(blank_is_none=False))
    worker_threads: int | None = _option(1, _thread_count(0), keep_none=True)


@dataclass(frozen=True, kw_only=True)
class LanceOptions(_Options):
    """Zephon's Lance options: ``worker_threads`` (2, at least 1; None: leave the pools as they
    are). Accepted and validated (Lance datasets are not read by this library)."""

    _prefix = "lance"

    worker_threads: int | None = _option(2, _thread_count(1), keep_none=True)


@dataclass(frozen=True, kw_only=True)
class StoreOptions(_Options):
    """Every storage option; ``options(io_options=...)`` takes one (or the same as a dict).

    ``metadata_cache_entries`` (256; 0: none) bounds Zephon's retained footers per format; accepted
    and validated. ``decoded_cache_bytes`` (256 MiB; not Zephon's) bounds the decoded data that
    every reader of a process keeps together (`zephon_columnar.io.decoded`: Parquet row groups,
    compressed JSON Lines files, Vortex files decoded whole), whatever the number of datasets;
    the last pipeline to set it in a process sets it for all.
    Nested options may be given as dicts (or None: their `defaults`). A
    ``cache.rg_cache_bytes`` raises a ``DeprecationWarning`` (use ``parquet.rg_cache.limit_bytes``);
    the old top-level ``parquet_rg_cache`` key is refused.
    """

    _moved: ClassVar[dict[str, str]] = {"parquet_rg_cache": "parquet.rg_cache (pass {'parquet': {'rg_cache': ...}})"}

    # _nested returns a field(default_factory=...): each instance gets its own default object.
    cache: CacheOptions = _nested(CacheOptions)  # noqa: RUF009
    arrow: ArrowOptions = _nested(ArrowOptions)  # noqa: RUF009
    parquet: ParquetOptions = _nested(ParquetOptions)  # noqa: RUF009
    vortex: VortexOptions = _nested(VortexOptions)  # noqa: RUF009
    lance: LanceOptions = _nested(LanceOptions)  # noqa: RUF009
    metadata_cache_entries: int = _option(256, _count(0))
    decoded_cache_bytes: int = _option(DEFAULT_DECODED_LIMIT_BYTES, _size(blank_is_none=False))

    def _check(self) -> None:
        if self.cache.rg_cache_bytes is not None:
            warn(
                "cache.rg_cache_bytes is deprecated; use parquet.rg_cache.limit_bytes instead "
                "(an explicit parquet.rg_cache.limit_bytes wins; 0 disables the row-group cache).",
                DeprecationWarning,
            )

    def resolved_parquet_rg_cache(self) -> ParquetRGCacheOptions:
        """``parquet.rg_cache`` with its automatic values filled in from ``cache``:

        - ``enabled`` None: on when the shard cache is enabled or ``rg_cache.root`` is set.
          ``enabled=True`` with neither the shard cache nor a root is a `ConfigError`.
        - ``limit_bytes`` None: the deprecated ``cache.rg_cache_bytes`` when set (0 disables the
          cache, leaving the limit at 4 GiB); otherwise the larger of 4 GiB and a tenth of the
          shard cache's ``limit_bytes`` (when the shard cache is enabled and limited).
        - ``root`` and ``min_free_bytes`` as configured (root None: the shard cache's folder).

        Example:
            >>> big = StoreOptions.from_any({"cache": {"enabled": True, "limit_bytes": "100gb"}})
            >>> r = big.resolved_parquet_rg_cache()
            >>> r.enabled, r.limit_bytes == 10 << 30
            (True, True)
        """
        rg, cache = self.parquet.rg_cache, self.cache
        if rg.enabled is True and not cache.enabled and rg.root is None:
            raise ConfigError(
                "parquet.rg_cache.enabled=True requires parquet.rg_cache.root when cache.enabled is "
                "False: set parquet.rg_cache.root, or enable the shard cache (cache.enabled=True)."
            )
        enabled = rg.enabled if rg.enabled is not None else bool(cache.enabled) or rg.root is not None
        limit = rg.limit_bytes
        if limit is None:
            legacy = cache.rg_cache_bytes
            if legacy is not None:
                enabled = enabled and legacy > 0
                limit = legacy if legacy > 0 else RG_CACHE_MIN_BYTES
            else:
                shard_limit = cache.limit_bytes if cache.enabled else None
                limit = max(RG_CACHE_MIN_BYTES, shard_limit // 10 if shard_limit is not None else 0)
        return ParquetRGCacheOptions(enabled=enabled, root=rg.root, limit_bytes=limit, min_free_bytes=rg.min_free_bytes)


__all__ = [
    "ArrowOptions",
    "CacheOptions",
    "LanceOptions",
    "OptionTypeError",
    "ParquetOptions",
    "ParquetRGCacheOptions",
    "StoreOptions",
    "VortexOptions",
    "parse_size_bytes",
]
