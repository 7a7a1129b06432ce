"""Packing options: `PackSpec` (every argument of ``pack_flat`` / ``pack_sequences``, checked
and resolved once).

Example:
    >>> spec = resolve_spec("pack_flat", 2048, algorithm="first_fit", num_bins=16)
    >>> spec.algorithm, spec.num_bins, spec.drop_oversized, spec.pad_token_id
    ('first_fit', 16, True, 0)
    >>> resolve_spec("pack_flat", 2048, algorithm="first_fit")
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.ConfigError: pack_flat(algorithm='first_fit'): num_bins is required (the open bins per lane), e.g. num_bins=16.
"""  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.keywords import choice
from zephon_columnar.ops.config import FlushStrategy as FlushStrategy
from zephon_columnar.ops.config import Homogeneity as Homogeneity
from zephon_columnar.ops.config import PackingAlgorithm as PackingAlgorithm
from zephon_columnar.ops.config import ShuffleStrategy as ShuffleStrategy
from zephon_columnar.ops.grouping import DomainGroups as DomainGroups
from zephon_columnar.types import TOKEN_FIELD_CANDIDATES

ALGORITHMS: tuple[str, ...] = get_args(PackingAlgorithm)
FIT_ALGORITHMS: tuple[str, ...] = ("first_fit", "best_fit")
POSITIONS = "positions"
DEFAULT_CANDIDATE_POOL = 1024


@dataclass(frozen=True, kw_only=True)
class PackSpec:
    """Resolved packing options (see ``Pipeline.pack_flat`` for each one's meaning)."""

    max_length: int
    algorithm: PackingAlgorithm = "wrap"
    tokens_field: str = "auto"
    pad_token_id: int = 0
    emit_positions: bool = True
    max_sequences_per_bin: int | None = None
    num_bins: int | None = None
    drop_oversized: bool = False
    min_sequence_length: int = 1
    flush_strategy: FlushStrategy = "fifo"
    candidate_pool_size: int = DEFAULT_CANDIDATE_POOL
    max_candidate_age: int = 8 * DEFAULT_CANDIDATE_POOL
    shuffle_strategy: ShuffleStrategy | None = None
    shuffle_seed: int = 0
    homogeneity: Homogeneity = "none"
    groups: DomainGroups | None = field(default=None, compare=False)

    def fingerprint(self) -> dict[str, Any]:
        """The options that decide the packed rows (part of a checkpoint's recipe)."""
        out = {
            k: getattr(self, k)
            for k in (
                "algorithm",
                "max_length",
                "tokens_field",
                "pad_token_id",
                "emit_positions",
                "max_sequences_per_bin",
                "num_bins",
                "drop_oversized",
                "min_sequence_length",
                "flush_strategy",
                "candidate_pool_size",
                "max_candidate_age",
                "shuffle_strategy",
                "shuffle_seed",
                "homogeneity",
            )
        }
        out["groups"] = None if self.groups is None else self.groups.groups
        return out


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def resolve_spec(
    op: str,
    max_length: Any,
    *,
    num_bins: Any = None,
    max_sequences_per_bin: Any = None,
    algorithm: Any = None,
    tokens_field: Any = "auto",
    pad_token_id: Any = None,
    emit_positions: Any = True,
    drop_oversized: Any = None,
    min_sequence_length: Any = 1,
    shuffle_strategy: Any = None,
    shuffle_seed: Any = None,
    flush_strategy: Any = "fifo",
    candidate_pool_size: Any = None,
    max_candidate_age: Any = None,
    homogeneity: Any = "none",
    groups: Any = None,
    min_max_length: int = 1,
) -> PackSpec:
    """Check every argument (errors name the option and say what to pass) and resolve defaults
    that depend on the algorithm (``drop_oversized``, ``max_candidate_age``).

    ``algorithm=None``: ``"first_fit"`` (Zephon's default) when ``num_bins`` is given or for
    ``pack_sequences`` (which then refuses the call without ``num_bins``, as Zephon does), and
    ``"wrap"`` for ``pack_flat(max_length)`` alone: Zephon refuses that call; wrap needs no
    sizing, pads nothing and drops no document, only each lane's final partial row (counted,
    and said: `zephon_columnar.losses`).

    ``min_max_length``: the shortest row the operator's output is any use at (not a user
    option): 2 for ``pack_flat``, whose rows go to ``to_training(return_labels=True)``, which
    shifts them by one token (a row of 1 token gives (B, 0) inputs and labels).

    Example:
        >>> resolve_spec("pack_flat", 1, algorithm="wrap", min_max_length=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        zephon_columnar.errors.ConfigError: pack_flat(max_length=1): pass the packed row length, an int >= 2 ...
    """

    def positive(name: str, value: Any) -> int | None:
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"{op}({name}={value!r}): pass a positive int or None.")
        return None if value is None else int(value)

    def literal(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
        return choice(op, name, value, allowed)

    if not _is_int(max_length) or max_length < max(1, min_max_length):
        if min_max_length < 2:
            raise ConfigError(f"{op}(max_length={max_length!r}): pass the packed row length, a positive int.")
        raise ConfigError(
            f"{op}(max_length={max_length!r}): pass the packed row length, an int >= {min_max_length} (e.g. the "
            "sequence length you train on, 2048): to_training(return_labels=True) predicts each token from the one "
            f"before it, so rows shorter than {min_max_length} tokens give (B, 0) inputs and labels."
        )
    if algorithm is None:
        algorithm = "first_fit" if num_bins is not None or op != "pack_flat" else "wrap"
    literal("algorithm", algorithm, ALGORITHMS)
    num_bins = positive("num_bins", num_bins)
    cap = positive("max_sequences_per_bin", max_sequences_per_bin)
    pool = positive("candidate_pool_size", candidate_pool_size)
    age = positive("max_candidate_age", max_candidate_age)
    if not isinstance(tokens_field, str) or not tokens_field or F.is_bookkeeping(tokens_field):
        raise ConfigError(
            f"{op}(tokens_field={tokens_field!r}): pass 'auto' (first of "
            f"{list(TOKEN_FIELD_CANDIDATES)}) or the name of a payload column."
        )
    if pad_token_id is not None and not _is_int(pad_token_id):
        raise ConfigError(f"{op}(pad_token_id={pad_token_id!r}): pass an int token id or None (0).")
    if not isinstance(emit_positions, bool):
        raise ConfigError(f"{op}(emit_positions={emit_positions!r}): pass True or False.")
    if drop_oversized is not None and not isinstance(drop_oversized, bool):
        raise ConfigError(f"{op}(drop_oversized={drop_oversized!r}): pass True, False or None.")
    if not _is_int(min_sequence_length) or not 1 <= min_sequence_length <= max_length:
        raise ConfigError(
            f"{op}(min_sequence_length={min_sequence_length!r}): pass an int in [1, max_length={max_length}]."
        )
    literal("shuffle_strategy", shuffle_strategy, (None, "random", "length"))
    if shuffle_seed is not None and not _is_int(shuffle_seed):
        raise ConfigError(f"{op}(shuffle_seed={shuffle_seed!r}): pass an int or None.")
    literal("flush_strategy", flush_strategy, ("fifo", "fullest"))
    literal("homogeneity", homogeneity, ("none", "group", "full"))

    fit = algorithm in FIT_ALGORITHMS
    if fit and num_bins is None:
        raise ConfigError(
            f"{op}(algorithm={algorithm!r}): num_bins is required (the open bins per lane), e.g. num_bins=16."
        )
    if not fit and num_bins is not None:
        raise ConfigError(
            f"{op}(num_bins={num_bins}, algorithm={algorithm!r}): {algorithm} keeps no fixed set of "
            "open bins and takes no num_bins; remove num_bins (it is for first_fit/best_fit)."
        )
    if algorithm != "best_fit_wrap" and (pool is not None or age is not None):
        which = "candidate_pool_size" if pool is not None else "max_candidate_age"
        raise ConfigError(
            f"{op}({which}=...) is an option of algorithm='best_fit_wrap'; remove it or use that algorithm."
        )
    if groups is not None and homogeneity != "group":
        raise ConfigError(
            f"{op}(groups=...) goes with homogeneity='group' (got homogeneity={homogeneity!r}); "
            "remove groups or pass homogeneity='group'."
        )
    if homogeneity == "group":
        if groups is None:
            raise ConfigError(
                f"{op}(homogeneity='group') needs groups=DomainGroups({{group: [component, ...]}}) "
                "or a {group: [component, ...]} mapping."
            )
        if not isinstance(groups, DomainGroups):
            groups = DomainGroups(groups)
    pool = pool or DEFAULT_CANDIDATE_POOL
    return PackSpec(
        max_length=int(max_length),
        algorithm=algorithm,
        tokens_field=tokens_field,
        pad_token_id=0 if pad_token_id is None else int(pad_token_id),
        emit_positions=emit_positions,
        max_sequences_per_bin=cap,
        num_bins=num_bins,
        drop_oversized=fit if drop_oversized is None else drop_oversized,
        min_sequence_length=int(min_sequence_length),
        flush_strategy=flush_strategy,
        candidate_pool_size=pool,
        max_candidate_age=age or 8 * pool,
        shuffle_strategy=shuffle_strategy,
        shuffle_seed=0 if shuffle_seed is None else int(shuffle_seed),
        homogeneity=homogeneity,
        groups=groups,
    )
