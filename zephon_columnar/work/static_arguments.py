"""The arguments of `~zephon_columnar.work.static_mixture.StaticMixtureWorkSource`, checked and
resolved: the datasets, the per-dataset exhaustion policies (Zephon's B.4), shuffle block sizes.

Every error names the argument and says what to pass instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from zephon_columnar.errors import ConfigError, ConfigurationWarning, warn

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset


ExhaustedPolicy = Literal["stop", "repeat", "redistribute"]
LaneAssignment = Literal["permute", "modulo"]
_BlockSize = int | Literal["auto", "global"] | None
ShuffleBlockSpec = _BlockSize | Mapping[str, _BlockSize]

_POLICIES = ("stop", "repeat", "redistribute")


class _Unset:
    """Marks an argument the caller did not pass (its default depends on other arguments)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def check_datasets(datasets: Any) -> list[Dataset]:
    where = "StaticMixtureWorkSource"
    if isinstance(datasets, (str, bytes, Mapping)) or not isinstance(datasets, Sequence):
        raise ConfigError(f"{where}: datasets must be a list of Dataset, got {type(datasets).__name__}.")
    checked: list[Dataset] = list(datasets)
    if not checked:
        raise ConfigError(f"{where}: datasets is empty; pass at least one Dataset.")
    for i, ds in enumerate(checked):
        if not (hasattr(ds, "name") and hasattr(ds, "counts")):
            raise ConfigError(f"{where}: datasets[{i}] is a {type(ds).__name__}, not a Dataset.")
    names = [ds.name for ds in checked]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigError(
            f"{where}: duplicate dataset names {dups}; names are mixture component names and must "
            "be unique. Rename one (e.g. Dataset.from_path('web_2', ...))."
        )
    return checked


def check_rows(names: Sequence[str], rows: Sequence[int], policies: Mapping[str, str], *, tokens: bool) -> None:
    """Refuse what an empty dataset makes impossible: a 'stop' or 'repeat' one could never give
    its share ('redistribute' leaves at once, announced), nor can a mixture of empty datasets.
    (Zephon's order: a token mixture checks repeats only once primed, after the all-empty check.)"""
    where = "StaticMixtureWorkSource"
    empty = [n for n, r in zip(names, rows) if r == 0]
    for n in empty:
        if policies[n] == "stop":
            raise ConfigError(
                f"{where}: Dataset {n!r} has 0 samples and exhausted_policy='stop', so the source "
                f"could never fill its share; give it rows, or exhausted_policy={{{n!r}: "
                "'redistribute'}} to leave it out."
            )

    def check_repeats() -> None:
        for n in empty:
            if policies[n] == "repeat":
                raise ConfigError(
                    f"{where}: Dataset {n!r} has 0 samples but repeat policy requires at least one "
                    f"to repeat; give it rows, or exhausted_policy={{{n!r}: 'redistribute'}} to "
                    "leave it out."
                )

    if not tokens:
        check_repeats()
    if len(empty) == len(names):
        raise ConfigError(f"{where}: At least one dataset must contain samples; all of {list(names)} have 0 rows.")
    check_repeats()


def shard_ids_by_position(ds: Dataset, n_shards: int) -> np.ndarray | None:
    """``ds``'s shard ids by position, or None when they are the positions ``0..n-1`` (the
    common case: pointers are then written without a lookup). A dataset without ``ids()``
    numbers its shards by position."""
    get = getattr(ds, "ids", None)
    if get is None:
        return None
    ids = np.array(get(), dtype=np.int64).reshape(-1)  # a copy: frozen below, never the caller's array
    if len(ids) != n_shards:
        raise ConfigError(
            f"StaticMixtureWorkSource: dataset {ds.name!r} has {len(ids)} shard ids but {n_shards} "
            "shard row counts; ids() and counts() must list the same shards in the same order."
        )
    if np.array_equal(ids, np.arange(n_shards)):
        return None
    ids.setflags(write=False)
    return ids


def check_int(what: str, v: Any, *, minimum: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ConfigError(f"{what} must be an int >= {minimum}, got {v!r}.")
    return int(v)


def check_bool(what: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise ConfigError(f"{what} must be True or False, got {v!r}.")
    return bool(v)


def _check_policy(what: str, v: Any) -> str:
    if v not in _POLICIES:
        raise ConfigError(f"{what}={v!r} must be one of {sorted(_POLICIES)}.")
    return str(v)


def _check_repeats(what: str, v: Any) -> int | None:
    return None if v is None else check_int(what, v, minimum=0)


def per_dataset(option: str, value: Any, names: Sequence[str], *, default: Any, check: Any) -> dict[str, Any]:
    """``{name: value}`` from a scalar (same for all) or a per-dataset dict (missing: default)."""
    where = f"StaticMixtureWorkSource: {option}"
    if isinstance(value, Mapping):
        unknown = sorted(str(n) for n in value if n not in names)
        if unknown:
            raise ConfigError(f"{where} contains unknown dataset names: {unknown}; the datasets are {list(names)}.")
        return {n: check(f"{where}[{n!r}]", value[n]) if n in value else default for n in names}
    return {n: check(where, value) for n in names}


def resolve_exhaustion(
    names: Sequence[str],
    exhausted_policy: Any,
    reshuffle_on_repeat: Any,
    max_repeats: Any,
    stop_after_passes: Any,
) -> tuple[dict[str, str], dict[str, bool], dict[str, int | None], int | None]:
    """Per-dataset policy, reshuffle flag and repeat cap, and the pass floor (Zephon's B.4).

    With neither ``exhausted_policy`` nor ``max_repeats`` the floor defaults to
    ``stop_after_passes=1`` and every dataset repeats toward it. Otherwise there is no floor and
    a dataset the policy does not name stops. A floor needs every dataset to repeat and no
    ``max_repeats`` (both would say when the source ends). A repeat setting given for a dataset
    that does not repeat has no effect: a `ConfigurationWarning` says so.
    """
    where = "StaticMixtureWorkSource"
    if stop_after_passes is UNSET:
        stop_after_passes = 1 if exhausted_policy is None and max_repeats is None else None
    elif stop_after_passes is not None:
        stop_after_passes = check_int(f"{where}: stop_after_passes", stop_after_passes, minimum=1)
    default = "stop" if stop_after_passes is None else "repeat"
    policies = per_dataset(
        "exhausted_policy",
        default if exhausted_policy is None else exhausted_policy,
        names,
        default=default,
        check=_check_policy,
    )
    reshuffle = per_dataset(
        "reshuffle_on_repeat",
        True if reshuffle_on_repeat is UNSET else reshuffle_on_repeat,
        names,
        default=True,
        check=check_bool,
    )
    repeats = per_dataset("max_repeats", max_repeats, names, default=None, check=_check_repeats)
    if stop_after_passes is not None:
        others = [n for n in names if policies[n] != "repeat"]
        if others:
            raise ConfigError(
                f"{where}: stop_after_passes={stop_after_passes} requires every dataset to repeat (it ends the "
                f"source once each has completed that many passes), but exhausted_policy sets {others} to "
                "another policy. Drop stop_after_passes or those exhausted_policy entries."
            )
        if max_repeats is not None:
            raise ConfigError(
                f"{where}: stop_after_passes={stop_after_passes} cannot be combined with max_repeats: both say "
                "when the source ends. Pass only one of them."
            )
    for option, given, unset in (
        ("max_repeats", max_repeats, None),
        ("reshuffle_on_repeat", reshuffle_on_repeat, True),
    ):
        if isinstance(given, Mapping):
            for n, v in given.items():
                if v != unset and policies[n] != "repeat":
                    warn(
                        f"{where}: {option}[{n!r}]={v!r} has no effect with exhausted_policy[{n!r}]="
                        f"{policies[n]!r}; it applies to repeating datasets only.",
                        ConfigurationWarning,
                    )
        elif given is not UNSET and given != unset and "repeat" not in policies.values():
            warn(
                f"{where}: {option}={given!r} has no effect without a repeat component; set "
                "exhausted_policy='repeat' for the datasets it should apply to.",
                ConfigurationWarning,
            )
    repeats = {n: r if policies[n] == "repeat" else None for n, r in repeats.items()}
    return policies, reshuffle, repeats, stop_after_passes


def resolve_block(option: ShuffleBlockSpec, rows: int, largest_shard: int) -> int | None:
    """Block size for one dataset: frozen in the recipe so a restore cannot drift."""
    if option is None:
        return None
    if option == "auto":
        size = 8 * largest_shard
    elif option == "global":
        size = rows
    else:
        size = check_int(
            "StaticMixtureWorkSource: shuffle_block_size (None, an int, 'auto' or 'global')", option, minimum=1
        )
    return min(size, rows)
