"""Token-unit mixtures: `TokenEstimation`, and the arithmetic that turns token weights into
sample weights.

A mixture's weights are sample proportions by default. With
``StaticMixtureWorkSource(token_estimation=TokenEstimation(...))`` they are *token*
proportions: a component whose documents are four times longer is drawn four times less often.
The source needs, per dataset, how many tokens a sample becomes. It gets it as *tokens per
stored byte* (``tokens_per_byte``), primed once before the first chunk:

- ``primer="measure"`` (default): the pipeline reads a calibration sample of each dataset
  (``calibration_samples`` rows from ``calibration_shards_min..max`` shards), replays the
  stateless transforms before its tokenizer and counts the tokens (or calls ``measure(payload)``
  on each row). Rows a filter drops count 0 tokens: the ratio is what reaches the tokenizer.
- ``primer={name: ratio}`` or a float: given ratios, nothing measured.

A dataset's expected tokens per sample is then ``ratio x stored bytes / rows`` (its files'
bytes over its rows), and its sample weight is ``token weight / expected tokens per sample``.
The ratios are part of every checkpoint, so a restored run mixes exactly as the one it
continues, without measuring again.

Example:
    >>> est = TokenEstimation(primer={"web": 0.25, "code": 0.5})
    >>> sample_weights({"web": 0.5, "code": 0.5}, tokens_per_sample={"web": 100.0, "code": 400.0})
    {'web': 0.8, 'code': 0.2}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Literal, Mapping, Sequence, Union

import numpy as np

from zephon_columnar.errors import CheckpointError, ConfigError

Primer = Union[Literal["measure"], Mapping[str, float], float]

# Positional arguments allowed (not keyword-only) because Zephon's TokenEstimation takes them.
@dataclass(frozen=True)
class TokenEstimation:
    """How a token-unit mixture learns each dataset's tokens per stored byte (module docstring).

    ``measure``: a callable ``payload dict -> token count`` used instead of the pipeline's
    tokenizer (pre-tokenized or multimodal documents). ``fallback_tokens_per_byte``: used, with
    a warning, for a dataset that cannot be measured (no tokenizer in the pipeline and no
    ``measure``, or no calibration row reached the tokenizer).
    """

    primer: Primer = "measure"
    measure: Callable[[dict[str, Any]], int] | None = None
    calibration_samples: int = 2048
    calibration_shards_min: int = 4
    calibration_shards_max: int = 16
    fallback_tokens_per_byte: float = 0.25

    def __post_init__(self) -> None:
        where = "TokenEstimation"
        p = self.primer
        if isinstance(p, str):
            if p != "measure":
                raise ConfigError(f"{where}(primer={p!r}): use 'measure', a float or {{name: tokens_per_byte}}.")
        elif isinstance(p, Mapping):
            for name, v in p.items():
                _check_ratio(f"{where}(primer[{name!r}])", v)
        else:
            _check_ratio(f"{where}(primer)", p)
        if self.measure is not None and not callable(self.measure):
            raise ConfigError(f"{where}(measure={self.measure!r}): pass a callable payload -> token count, or None.")
        for name in ("calibration_samples", "calibration_shards_min", "calibration_shards_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}({name}={v!r}): pass a positive int.")
        if self.calibration_shards_min > self.calibration_shards_max:
            raise ConfigError(f"{where}: calibration_shards_min={self.calibration_shards_min} is above "
                              f"calibration_shards_max={self.calibration_shards_max}.")
        _check_ratio(f"{where}(fallback_tokens_per_byte)", self.fallback_tokens_per_byte)

    def check_names(self, names: Sequence[str]) -> None:
        """A ``{name: ratio}`` primer must name exactly the mixture's datasets."""
        if isinstance(self.primer, Mapping) and set(self.primer) != set(names):
            missing, extra = sorted(set(names) - set(self.primer)), sorted(set(self.primer) - set(names))
            raise ConfigError(f"TokenEstimation(primer=...): name every dataset of the mixture exactly "
                              f"(missing {missing}, unknown {extra}).")

    def given_ratios(self, names: Sequence[str]) -> dict[str, float] | None:
        """The ratios the primer states, or None when they must be measured."""
        if isinstance(self.primer, str):
            return None
        if isinstance(self.primer, Mapping):
            return {n: float(self.primer[n]) for n in names}
        return dict.fromkeys(names, float(self.primer))

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint's recipe records of this estimation (the ratios go in the state)."""
        from zephon_columnar.ops.tokenizer import callable_identity

        primer = self.primer if isinstance(self.primer, str) else (
            {k: float(v) for k, v in sorted(self.primer.items())} if isinstance(self.primer, Mapping)
            else float(self.primer))
        return {"primer": primer, "measure": None if self.measure is None else callable_identity(self.measure),
                "calibration_samples": self.calibration_samples,
                "calibration_shards": [self.calibration_shards_min, self.calibration_shards_max],
                "fallback_tokens_per_byte": float(self.fallback_tokens_per_byte)}


def _check_ratio(what: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(v)) or float(v) <= 0:
        raise ConfigError(f"{what}={v!r}: a tokens-per-byte ratio must be a finite number > 0.")
    return float(v)


def calibration_rows(counts: np.ndarray, est: TokenEstimation, *, seed: int, dataset_index: int) -> np.ndarray:
    """``(shard position, row)`` pairs of one dataset's calibration sample, (n, 2) int64.

    Shards: ``min(shards, calibration_shards_max)`` of them, at least ``calibration_shards_min``
    when the dataset has that many, chosen by a seeded permutation. Rows: a contiguous run at a
    seeded offset in each shard (one or two row groups to decode, not the whole file), the
    ``calibration_samples`` split evenly between the shards.
    """
    rng = np.random.default_rng([seed, dataset_index, 0x70CE])
    nonempty = np.flatnonzero(counts > 0)
    k = min(len(nonempty), max(est.calibration_shards_min, min(est.calibration_shards_max, len(nonempty))))
    shards = np.sort(rng.permutation(nonempty)[:k])
    per_shard = -(-est.calibration_samples // max(k, 1))
    parts = []
    for s in shards:
        n = min(per_shard, int(counts[s]))
        start = int(rng.integers(0, int(counts[s]) - n + 1))
        parts.append(np.column_stack([np.full(n, s, np.int64), np.arange(start, start + n, dtype=np.int64)]))
    return np.concatenate(parts) if parts else np.empty((0, 2), np.int64)


def measured_ratio(tokens: np.ndarray, shards: np.ndarray, bytes_per_row: np.ndarray) -> float | None:
    """Tokens per stored byte of a calibration sample: its tokens over the stored bytes its rows
    stand for (each row: its shard's bytes / rows). None when no token was counted."""
    total_tokens = float(np.sum(tokens))
    total_bytes = float(np.sum(bytes_per_row[shards]))
    if total_tokens <= 0 or total_bytes <= 0:
        return None
    return total_tokens / total_bytes


def sample_weights(token_weights: Mapping[str, float], *, tokens_per_sample: Mapping[str, float]) -> dict[str, float]:
    """Normalized sample weights that give ``token_weights`` as token proportions: each token
    weight over that dataset's expected tokens per sample."""
    raw = {n: (Fraction(w) / Fraction(tokens_per_sample[n]) if w > 0 else Fraction(0))
           for n, w in token_weights.items()}
    total = sum(raw.values())
    return {n: float(v / total) for n, v in raw.items()}


def ratios_from_state(value: Any, names: Sequence[str], *, where: str) -> dict[str, float] | None:
    """The ``tokens_per_byte`` of a source state, validated (None: the state was not primed)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != set(names):
        raise CheckpointError(f"{where}: tokens_per_byte must map every dataset {list(names)} to a ratio, "
                              f"got {value!r}.")
    try:
        return {n: _check_ratio(f"tokens_per_byte[{n!r}]", value[n]) for n in names}
    except ConfigError as err:
        raise CheckpointError(f"{where}: the state is malformed: {err}") from err
