"""The packing operators: `PackFlatOp` (``pack_flat``) and `PackSequencesOp`
(``pack_sequences``). Both are ordered stages whose per-lane state is a `LanePacker`."""

from __future__ import annotations

from typing import Any

from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.base import OpTraits, OrderedOp
from zephon_columnar.ops.config import PackingAlgorithm
from zephon_columnar.ops.pack.packer import LanePacker, Packer
from zephon_columnar.ops.pack.spec import resolve_spec


def packer_class(algorithm: str) -> type[Packer]:
    """The `Packer` of one algorithm (imported on use: one module per algorithm)."""
    if algorithm == "wrap":
        from zephon_columnar.ops.pack.wrap import WrapPacker

        return WrapPacker
    if algorithm == "best_fit_wrap":
        from zephon_columnar.ops.pack.best_fit_wrap import BestFitWrapPacker

        return BestFitWrapPacker
    from zephon_columnar.ops.pack.fit import FitPacker

    return FitPacker


class PackFlatOp(OrderedOp):
    """``pack_flat``: pack each lane's documents into rows of exactly ``max_length`` tokens,
    flat and tensor-ready (see `zephon_columnar.ops.pack.emit` for the output columns and
    `zephon_columnar.ops.pack.stream` for which input columns are packed).

    Algorithms: ``"wrap"`` (`zephon_columnar.ops.pack.wrap`), ``"first_fit"`` / ``"best_fit"``
    (`zephon_columnar.ops.pack.fit`), ``"best_fit_wrap"``
    (`zephon_columnar.ops.pack.best_fit_wrap`). ``pad_token_id`` defaults to 0 (the pad tail is
    masked by ``__padding_length``, never by id). ``parallelism`` is accepted and has no effect:
    placement is serial per lane and the rows are built vectorized in the same step.

    Example:
        >>> op = PackFlatOp(2048, algorithm="first_fit", num_bins=16)  # what Pipeline.pack_flat adds
        >>> op.spec.algorithm, op.spec.num_bins, op.spec.pad_token_id
        ('first_fit', 16, 0)
    """

    name = "pack_flat"
    #: The shortest row worth building. Flat rows are training rows: ``to_training(return_labels=True)``
    #: shifts them by one token, so a row of 1 token trains on nothing ((B, 0) tensors), and a
    #: pipeline that builds such rows is refused when it is built, not found out in training.
    min_max_length = 2

    def __init__(
        self,
        max_length: int,
        *,
        algorithm: PackingAlgorithm | None = None,
        parallelism: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.spec = resolve_spec(
            self.name, max_length, algorithm=algorithm, min_max_length=self.min_max_length, **options
        )
        self.algorithm = self.spec.algorithm
        self.max_length = self.spec.max_length
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, indexable=False, composes_rows=True)

    def lane_accumulator(self, ctx: LaneContext | None = None) -> LanePacker:
        ctx = ctx or LaneContext()
        cls = packer_class(self.spec.algorithm)
        return LanePacker(self.spec, ctx, lambda spec, c, emit: cls(spec, c, emit), op=self.name)

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.name, **self.spec.fingerprint()}


class PackSequencesOp(PackFlatOp):
    """``pack_sequences``: the same algorithms, but each packed row keeps its segments apart as
    ``packed_samples`` (see `zephon_columnar.ops.pack.sequences`)."""

    name = "pack_sequences"
    #: Rows keep their segments apart (``packed_samples``) and are not shifted into inputs and
    #: labels here: a row of one 1-token segment is a whole (short) document with its payload,
    #: not an empty row, so 1 stays allowed.
    min_max_length = 1

    def __init__(
        self,
        max_length: int,
        *,
        algorithm: PackingAlgorithm | None = None,
        pack_payloads: Any = "keep_list",
        parallelism: int | None = None,
        **options: Any,
    ) -> None:
        from zephon_columnar.ops.pack.sequences import check_pack_payloads

        super().__init__(max_length, algorithm=algorithm, parallelism=parallelism, emit_positions=False, **options)
        self.pack_payloads = check_pack_payloads(pack_payloads)

    def lane_accumulator(self, ctx: LaneContext | None = None) -> LanePacker:
        from zephon_columnar.ops.pack.sequences import SequencesEmitter

        ctx = ctx or LaneContext()
        cls = packer_class(self.spec.algorithm)
        # A callable merge runs after packing, on the workers (`Pipeline.pack_sequences`).
        emitter = SequencesEmitter(self.spec, "keep_list" if callable(self.pack_payloads) else self.pack_payloads)
        return LanePacker(
            self.spec, ctx, lambda spec, c, emit: cls(spec, c, emit), op=self.name, emit=emitter, keep_payload=True
        )

    def fingerprint(self) -> dict[str, Any]:
        out = super().fingerprint()
        out["pack_payloads"] = (
            self.pack_payloads
            if isinstance(self.pack_payloads, str)
            else getattr(self.pack_payloads, "__qualname__", repr(self.pack_payloads))
        )
        return out
