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

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import cloudpickle
import numpy as np

from zephon_columnar.errors import CheckpointError, ConfigError, warn
from zephon_columnar.recipes import callable_identity

Primer = Literal["measure"] | Mapping[str, float] | float
RatioSource = Literal["measured", "pinned", "fallback"]

#: Tokens per stored byte assumed for a dataset that cannot be measured (~4 bytes a token, BPE on
#: English prose).
DEFAULT_FALLBACK_TOKENS_PER_BYTE: float = 0.25


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
    fallback_tokens_per_byte: float = DEFAULT_FALLBACK_TOKENS_PER_BYTE

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
            raise ConfigError(
                f"{where}: calibration_shards_min={self.calibration_shards_min} is above "
                f"calibration_shards_max={self.calibration_shards_max}."
            )
        _check_ratio(f"{where}(fallback_tokens_per_byte)", self.fallback_tokens_per_byte)

    def __reduce__(self) -> tuple[Any, ...]:
        """Standard pickle carries ``measure`` by value (cloudpickle): a lambda or a local
        function reaches loader workers started with 'spawn' (Zephon's behaviour)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.measure is not None:
            fields["measure"] = cloudpickle.dumps(self.measure)
        return (_token_estimation_from_fields, (fields,))

    def check_names(self, names: Sequence[str]) -> None:
        """A ``{name: ratio}`` primer must name exactly the mixture's datasets."""
        if isinstance(self.primer, Mapping) and set(self.primer) != set(names):
            missing, extra = sorted(set(names) - set(self.primer)), sorted(set(self.primer) - set(names))
            raise ConfigError(
                f"TokenEstimation(primer=...): name every dataset of the mixture exactly "
                f"(missing {missing}, unknown {extra})."
            )

    def given_ratios(self, names: Sequence[str]) -> dict[str, float] | None:
        """The ratios the primer states, or None when they must be measured."""
        if isinstance(self.primer, str):
            return None
        if isinstance(self.primer, Mapping):
            return {n: float(self.primer[n]) for n in names}
        return dict.fromkeys(names, float(self.primer))

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint's recipe records of this estimation (the ratios go in the state)."""
        primer = (
            self.primer
            if isinstance(self.primer, str)
            else (
                {k: float(v) for k, v in sorted(self.primer.items())}
                if isinstance(self.primer, Mapping)
                else float(self.primer)
            )
        )
        return {
            "primer": primer,
            "measure": None if self.measure is None else callable_identity(self.measure),
            "calibration_samples": self.calibration_samples,
            "calibration_shards": [self.calibration_shards_min, self.calibration_shards_max],
            "fallback_tokens_per_byte": float(self.fallback_tokens_per_byte),
        }


def _token_estimation_from_fields(fields: dict[str, Any]) -> TokenEstimation:
    measure = fields["measure"]
    return TokenEstimation(**{**fields, "measure": None if measure is None else cloudpickle.loads(measure)})


def _check_ratio(what: str, v: Any) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float, np.floating, np.integer))
        or not math.isfinite(float(v))
        or float(v) <= 0
    ):
        raise ConfigError(f"{what}={v!r}: a tokens-per-byte ratio must be a finite number > 0.")
    return float(v)


@dataclass(frozen=True)
class TokenRatio:
    """One dataset's primed tokens per stored byte, and where it came from.

    Example:
        >>> TokenRatio.from_state(TokenRatio(0.31, "measured").to_state())
        TokenRatio(tokens_per_byte=0.31, source='measured')
    """

    tokens_per_byte: float
    source: RatioSource

    def __post_init__(self) -> None:
        if self.source not in ("measured", "pinned", "fallback"):
            raise ValueError(f"TokenRatio(source={self.source!r}): use 'measured', 'pinned' or 'fallback'.")
        _check_ratio("TokenRatio(tokens_per_byte)", self.tokens_per_byte)

    def to_state(self) -> list[Any]:
        """``[tokens_per_byte, source]``, JSON-friendly."""
        return [float(self.tokens_per_byte), self.source]

    @classmethod
    def from_state(cls, raw: Any) -> TokenRatio:
        if not isinstance(raw, (list, tuple)) or len(raw) != 2:
            raise ValueError(f"TokenRatio state must be [tokens_per_byte, source], got {raw!r}.")
        return cls(tokens_per_byte=float(raw[0]), source=raw[1])


class PerShardTokenCost:
    """Expected tokens of one drawn sample, per dataset and shard: the shard's stored bytes per
    row times the dataset's tokens per byte (at least 1). A dataset whose shards report no
    bytes falls back to one flat estimate (with a warning).

    Example:
        >>> import pyarrow as pa
        >>> from zephon_columnar.io.dataset import Dataset
        >>> ds = Dataset.from_tables("a", [pa.table({"text": ["x" * 400] * 4})])
        >>> costs = PerShardTokenCost({"a": ds}, {"a": TokenRatio(0.25, "pinned")})
        >>> costs.cost("a", (0, 0, 3)) >= 1.0
        True
    """

    def __init__(self, datasets: Mapping[str, Any], ratios: Mapping[str, TokenRatio]) -> None:

        self._by_shard: dict[str, dict[int, float]] = {}
        self._mean: dict[str, float] = {}
        flat: list[str] = []
        for name, dataset in datasets.items():
            ratio = ratios[name].tokens_per_byte
            rows = np.asarray(dataset.counts(), np.float64)
            stored = np.asarray(dataset.raw_bytes(), np.float64)
            known = (rows > 0) & (stored > 0)
            if not known.any():
                flat.append(name)
                self._by_shard[name], self._mean[name] = {}, max(1.0, ratio)
                continue
            ids = np.asarray(dataset.ids())
            self._by_shard[name] = {
                int(i): max(1.0, float(b / r * ratio)) for i, b, r in zip(ids[known], stored[known], rows[known])
            }
            self._mean[name] = max(1.0, float(stored[known].sum() / rows[known].sum()) * ratio)
        if flat:
            warn(
                f"token-aware mixture: no byte metadata (shard sizes) for datasets {sorted(flat)}; each "
                "is costed with one flat per-sample estimate (differences between its shards are invisible).",
                RuntimeWarning,
            )

    def cost(self, name: str, sample_id: tuple[int, int, int]) -> float:
        """Expected delivered tokens of the sample ``sample_id`` of dataset ``name`` (>= 1)."""
        return self._by_shard[name].get(int(sample_id[1]), self._mean[name])

    def mean_cost(self, name: str) -> float:
        """Mean expected tokens per sample of dataset ``name`` (>= 1)."""
        return self._mean[name]


def prime_token_ratios(
    *,
    datasets: Sequence[Any],
    dataset_ids: Mapping[str, int],
    estimation: TokenEstimation,
    counting_spec: Callable[[dict[str, Any]], int] | None = None,
    io_options: Any = None,
    seed: int = 0,
    mp_context: Any = None,
    pre_tokenize_replay: Any = None,
) -> dict[str, TokenRatio]:
    """Each dataset's tokens per stored byte, as a token-unit mixture needs them.

    Pinned ratios (``estimation.primer`` a float, or ``{name: ratio}`` for some datasets) are
    taken as given; the rest are measured on a calibration sample (`calibration_rows`):
    ``estimation.measure(payload)`` or ``counting_spec(payload)`` counts each row's tokens. A
    dataset that cannot be measured (no counter, no row, no token) gets
    ``estimation.fallback_tokens_per_byte``, with a warning naming it. (The pipeline primes
    its work source itself, counting with its own tokenizer; this is the standalone form.
    ``io_options``, ``mp_context`` and ``pre_tokenize_replay`` are accepted for Zephon's
    signature.)

    Example:
        >>> est = TokenEstimation(primer=0.3)
        >>> prime_token_ratios(datasets=[], dataset_ids={"a": 0}, estimation=est)
        {'a': TokenRatio(tokens_per_byte=0.3, source='pinned')}
    """

    if isinstance(estimation.primer, (int, float)) and not isinstance(estimation.primer, bool):
        return dict.fromkeys(dataset_ids, TokenRatio(float(estimation.primer), "pinned"))
    pinned: Mapping[str, float] = estimation.primer if isinstance(estimation.primer, Mapping) else {}
    unknown = sorted(set(pinned) - set(dataset_ids))
    if unknown:
        raise ConfigError(
            f"token_estimation.primer pins unknown datasets: {unknown}. Known datasets: {sorted(dataset_ids)}."
        )
    ratios = {name: TokenRatio(float(pinned[name]), "pinned") for name in dataset_ids if name in pinned}
    count = estimation.measure or counting_spec
    by_name = {ds.name: ds for ds in datasets}
    failed: dict[str, str] = {}
    for name in [n for n in dataset_ids if n not in ratios]:
        ds = by_name.get(name)
        ratio = None
        if ds is None:
            failed[name] = "dataset not given"
        elif count is None:
            failed[name] = "nothing counts tokens (no measure= and no tokenizer)"
        else:
            rows = calibration_rows(
                np.asarray(ds.counts(), np.int64), estimation, seed=seed, dataset_index=dataset_ids[name]
            )
            reader, ids = ds.open_reader(), np.asarray(ds.ids())
            try:  # tokens of each calibration row, in the order of ``rows``
                tokens = np.zeros(len(rows), np.float64)
                for shard in np.unique(rows[:, 0]):
                    at = np.flatnonzero(rows[:, 0] == shard)
                    payloads = reader.take(int(ids[shard]), rows[at, 1]).to_pylist()
                    tokens[at] = [int(count(p)) for p in payloads]
            finally:
                reader.close()
            # As the work source's own priming measures it.
            per_row = np.asarray(ds.raw_bytes(), np.float64) / np.maximum(np.asarray(ds.counts(), np.float64), 1)
            ratio = measured_ratio(tokens, rows[:, 0], per_row)
            if ratio is None:
                failed[name] = "no token counted in its calibration rows, or no byte sizes"
        ratios[name] = (
            TokenRatio(ratio, "measured")
            if ratio is not None
            else TokenRatio(estimation.fallback_tokens_per_byte, "fallback")
        )
    if failed:
        warn(
            "token-aware mixture: "
            + "; ".join(f"{n!r} ({why})" for n, why in sorted(failed.items()))
            + f" fell back to fallback_tokens_per_byte={estimation.fallback_tokens_per_byte}; the "
            "mixture's token shares may be off for them.",
            RuntimeWarning,
        )
    return {name: ratios[name] for name in dataset_ids}


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
    weight over that dataset's expected tokens per sample (an empty dataset, with none, is never
    drawn: weight 0)."""
    raw = {
        n: (Fraction(w) / Fraction(tokens_per_sample[n]) if w > 0 and tokens_per_sample[n] > 0 else Fraction(0))
        for n, w in token_weights.items()
    }
    total = sum(raw.values())
    return {n: float(v / total) for n, v in raw.items()}


def ratios_from_state(value: Any, names: Sequence[str], *, where: str) -> dict[str, TokenRatio]:
    """The ``token_ratios`` of a source state (``{name: [tokens_per_byte, source]}``, Zephon's
    `TokenRatio.to_state`; a bare number, as older states and ``prime(ratios=...)`` give it, is
    ``"pinned"``), validated."""
    if not isinstance(value, Mapping) or set(value) != set(names):
        raise CheckpointError(
            f"{where}: token_ratios (tokens_per_byte) must map every dataset {list(names)} to a ratio, got {value!r}."
        )
    out = {}
    try:
        for n in names:
            raw = value[n]
            pair = raw if isinstance(raw, (list, tuple)) else (raw, "pinned")
            if len(pair) != 2:
                raise ConfigError(f"token_ratios[{n!r}] is {raw!r}, not [tokens_per_byte, source]")
            ratio = _check_ratio(f"token_ratios[{n!r}] (tokens_per_byte)", pair[0])
            out[n] = TokenRatio(ratio, pair[1])
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{where}: the state is malformed: {err}") from err
    return out
