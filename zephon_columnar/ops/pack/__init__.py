"""Packing: ``Pipeline.pack_flat`` (`PackFlatOp`) and ``Pipeline.pack_sequences``
(`PackSequencesOp`): each lane's documents into rows of a fixed token budget.

Packing state lives in one `packer.LanePacker` per lane (a `LaneAccumulator`), fed that
lane's frames in order on one thread; the engine flushes it at every flush point and at the
end of the lane. The modules, one concept each:

- `spec`: the options, checked and resolved (`PackSpec`), and `DomainGroups`;
- `stream`: frames -> runs of documents (`TokenRun`, `FrameReader` and the rule deciding which
  columns are packed);
- `emit`: runs -> packed rows (padding, ``positions``, ``__segments``);
- `packer`: the per-stream contract and the lane accumulator (groups, ``shuffle_strategy``);
- one module per algorithm: `wrap`, `fit` (first_fit, best_fit), `best_fit_wrap`;
- `op`: the operators.

Example:
    >>> from zephon_columnar.frame import frame_of
    >>> op = PackFlatOp(4, algorithm="wrap")
    >>> packer = op.lane_accumulator()
    >>> out = packer.push(frame_of({"input_ids": [[1, 2, 3], [4, 5, 6]]}))
    >>> out[0].column("input_ids").to_pylist(), out[0].column("positions").to_pylist()
    ([[1, 2, 3, 4]], [[0, 1, 2, 0]])
    >>> packer.flush(reset=True), packer.carry().column("input_ids").to_pylist()  # carried, not padded
    ([], [[5, 6]])
"""

from zephon_columnar.ops.pack.op import PackFlatOp, PackSequencesOp
from zephon_columnar.ops.pack.spec import (
    ALGORITHMS,
    DomainGroups,
    FlushStrategy,
    Homogeneity,
    PackingAlgorithm,
    PackSpec,
    ShuffleStrategy,
)

__all__ = [
    "ALGORITHMS",
    "DomainGroups",
    "FlushStrategy",
    "Homogeneity",
    "PackFlatOp",
    "PackSequencesOp",
    "PackSpec",
    "PackingAlgorithm",
    "ShuffleStrategy",
]
