"""Row and batch views of frames: `SampleRecord`, `SampleBatch`, and `SampleBatch.to_training`.

Frames stay columnar inside the engine; these are what the caller sees. A `SampleBatch`
wraps one lane's rows as an Arrow table and turns the token column into torch tensors
without per-row Python loops (`to_training`, built in `zephon_columnar.training`). A
`SampleRecord` is a row view (payload dict + metadata), built only when someone asks for records.

Example:
    >>> batch  # 4 packed rows of 65 tokens
    SampleBatch(rows=4, fields=['input_ids', 'attention_mask', 'positions'])
    >>> batch.to_training(return_labels=True)["input_ids"].shape
    torch.Size([4, 64])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.keywords import suggest_keywords
from zephon_columnar.training import PADDING_LENGTH, TOKEN_FIELD_CANDIDATES, PositionMode, TrainingOptions, to_training

if TYPE_CHECKING:
    import torch

from zephon_columnar.records import (
    ContributorRef,
    FieldsByDataset,
    SampleCursor,
    SampleId,
    SampleMeta,
    SampleRecord,
    frame_of_records,
    records_of,
)

# The identifiers of Zephon's data model (all plain ints and tuples of them).
DatasetId = int
ShardId = int
LocalSampleId = int
LaneId = int
ChunkId = int
ChunkOffset = int
ComponentId = int
LineageIndex = int
LineagePath = tuple[LineageIndex, ...]
#: A record's place in the stream, the order checkpoints and comparisons use:
#: chunk, offset in the chunk, lineage (fan-out path), then the sample id as a tie-break.
SampleCursorKey = tuple[ChunkId, ChunkOffset, LineagePath, SampleId]


class SampleBatch:
    """A lane-pure batch of rows: an Arrow table (payload + bookkeeping columns), or the records
    it was built from (``SampleBatch(records=[...])``, Zephon's form).

    ``records`` gives row views; ``to_training`` gives training tensors. A batch built from
    records keeps them as given (their payloads may be dicts, or numpy arrays / torch tensors of
    token ids); its Arrow table is built only when asked for (``table``), and only dict payloads
    have one.
    """

    __slots__ = ("_fields", "_from_records", "_records", "_table")

    def __init__(
        self,
        table: pa.Table | Sequence[SampleRecord] | None = None,
        *,
        records: Sequence[SampleRecord] | None = None,
        fields: FieldsByDataset | None = None,
    ) -> None:
        if (table is None) == (records is None):
            raise TypeError(
                "SampleBatch: pass the rows once, as an Arrow table or as records "
                "(SampleBatch(records=[...]), Zephon's form)."
            )
        self._fields = fields
        if table is None or not isinstance(table, pa.Table):
            # Records are kept as given (their payload objects too): ``records`` returns them and
            # to_training reads their payloads. The table is made on first use of ``table``.
            self._records: tuple[SampleRecord, ...] | None = tuple(records if records is not None else table)  # type: ignore[arg-type]
            self._table: pa.Table | None = None
            self._from_records = True
        else:
            self._records = None
            self._table = table
            self._from_records = False

    @property
    def table(self) -> pa.Table:
        """The batch as an Arrow table. For a batch built from records it is made from them on
        first use (tombstones left out); that needs dict payloads (WrongTypeError otherwise)."""
        if self._table is None:
            self._table = frame_of_records(list(self._records or ()))
        return self._table

    @table.setter
    def table(self, value: pa.Table) -> None:
        self._table = value
        self._records = None
        self._from_records = False

    def __len__(self) -> int:
        if self._from_records:
            return len(self._records or ())
        return int(self.table.num_rows)

    def __repr__(self) -> str:
        if self._from_records and self._table is None:
            return f"SampleBatch(records={len(self)})"
        return f"SampleBatch(rows={self.table.num_rows}, fields={F.payload_names(self.table)})"

    @property
    def records(self) -> tuple[SampleRecord, ...]:
        if self._records is None:
            self._records = tuple(records_of(self.table, self._fields))
        return self._records

    @property
    def ids(self) -> tuple[SampleId, ...]:
        """Each row's sample id ``(dataset, shard, row)``, in batch order."""
        if self._from_records:
            return tuple(r.meta.sample_id for r in self._records or ())
        t = self.table
        return tuple(zip(*(t.column(c).to_pylist() for c in (F.DATASET, F.SHARD, F.ROW))))

    @property
    def lane_ids(self) -> tuple[LaneId, ...]:
        """Each row's lane, in batch order (a batch is lane-pure: one value repeated)."""
        if self._from_records:
            return tuple(r.meta.lane_id for r in self._records or ())
        return tuple(int(x) for x in self.table.column(F.LANE).to_pylist())

    @property
    def chunk_ids(self) -> tuple[ChunkId, ...]:
        """Each row's chunk id, in batch order."""
        if self._from_records:
            return tuple(r.meta.chunk_id for r in self._records or ())
        return tuple(int(x) for x in self.table.column(F.CHUNK).to_pylist())

    @property
    def lane_id(self) -> int:
        """The batch's lane (-1 for an empty batch)."""
        if self._from_records:
            return int(self._records[0].meta.lane_id) if self._records else -1
        return int(self.table.column(F.LANE)[0].as_py()) if self.table.num_rows else -1

    @property
    def lineage_paths(self) -> tuple[tuple[int, ...], ...]:
        """Each row's lineage (child indices after fan-out; ``()`` for an original row)."""
        if self._from_records:
            return tuple(tuple(r.meta.lineage) for r in self._records or ())
        return tuple(F.lineage_paths(self.table))

    def column(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)

    def to_pydict(self) -> dict[str, list[Any]]:
        """Payload columns as Python lists (the batch's columns: a field that only some rows'
        datasets have is None in the others; ``records`` leaves it out there)."""
        columns: dict[str, list[Any]] = F.payload_of(self.table).to_pydict()
        return columns

    # ------------------------------------------------------------------ training tensors
    @suggest_keywords
    def to_training(
        self,
        *,
        tokens_field: str = "auto",
        return_labels: bool = False,
        dtype: Any = "auto",
        extra_fields: Sequence[str] = (),
        ignore_index: int = -100,
        rename_fields: Mapping[str, str] | None = None,
        flatten: bool = False,
        exclude_fields: Sequence[str] = (),
        return_num_valid_tokens: bool = False,
        return_loss_mask: bool = False,
        return_cu_seqlens: bool = False,
        return_padding_mask: bool = False,
        eos_mask_loss: bool = False,
        eos_token_id: int | None = None,
        position_mode: PositionMode = "preserve",
        pad_token_id: int = 0,
        zero_copy: bool = False,
        device: Any = None,
        non_blocking: bool = False,
    ) -> dict[str, Any]:
        """Training tensors for this batch: ``input_ids`` (B, L) and friends, plus ``ids``
        (sample ids) and ``texts`` (payload ``text``, ``""`` where absent) as lists. The
        keywords are checked as a `~zephon_columnar.training.TrainingOptions`; the work is
        `zephon_columnar.training.to_training`.

        ``tokens_field="auto"`` takes the first of ``input_ids``, ``tokens``, ``token_ids``,
        ``ids`` the rows have; the output is named ``input_ids`` whatever the field. ``dtype``:
        ``"auto"`` (torch int64), a torch dtype, a numpy dtype, or None for per-row Python lists
        (rows may then differ in length). Masks and sequence metadata keep their own dtypes:
        ``loss_mask`` float32, ``padding_mask`` bool, ``cu_seqlens``/``max_seqlen`` int32.

        With ``return_labels`` the inputs are ``tokens[:, :-1]`` and labels ``tokens[:, 1:]``;
        extra fields and ``positions`` are sliced like the inputs. Labels are ``ignore_index``
        at a row's pad tail (``meta.padding_length``), where a payload ``loss_mask`` (shifted
        into label alignment, ``mask[:, 1:]``) is 0, and (with ``eos_mask_loss``) where the
        input token is ``eos_token_id``. Without labels a payload ``loss_mask`` is passed
        through as it is. ``return_loss_mask`` (float ``labels != ignore_index``) and
        ``return_num_valid_tokens`` (a Python int) need ``return_labels``.
        ``return_padding_mask``: True at each row's pad tail, input-aligned. ``positions`` is
        forwarded when the payload has it (``position_mode="sequence"`` gives ``0..L-1`` per row
        instead); ``cu_seqlens``/``max_seqlen`` come from the zeros of the payload positions
        (required for them). ``flatten`` reshapes every (B, L) output to (B*L,); then
        ``max_seqlen`` is a Python int. ``rename_fields`` (``{emitted: new}``; sources must be
        emitted, targets must not collide) applies before ``exclude_fields``. An empty batch
        gives lists (``{"ids": [], "texts": []}`` plus what was asked for).

        Arrow-backed batches: rows of equal length become a (B, L) view of the Arrow buffer (one
        dtype copy at most, int32 -> int64). Ragged rows are right-padded with ``pad_token_id``
        and the pad is masked like a pad tail (padding mask, labels, valid-token count). Tensors
        never alias loader memory unless ``zero_copy=True``: then int64 token rows are views of
        the Arrow buffers, which must not be modified in place. Batches built from records are
        converted from their payloads (dicts, or numpy arrays / torch tensors of token ids); their
        rows must have equal lengths unless ``dtype=None``.

        ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``...; None: host tensors as above) moves the
        tensors there: each crosses in the dtype it has on the host (int32 token ids: half the
        bytes of int64) and is widened on the device; ``non_blocking`` lets that copy return
        before it finishes (it overlaps only from pinned memory: ``Pipeline.to_torch_loader(
        device=...)`` stages batches there and copies the next while the trainer computes).

        Raises:
            ValueError (ConfigError): an option conflict (named in the message), a ``device``
                this torch does not have, a missing or
                undetectable token field, a field missing from some rows, misaligned
                ``loss_mask``/``positions``, a bad ``padding_length``, or a rename collision.
            TypeError: ``exclude_fields`` given as one string, or payloads that are neither
                dicts nor arrays (or a mix of both).

        Warns:
            UserWarning: ``eos_token_id`` given without ``eos_mask_loss=True`` (it is ignored).

        Example:
            >>> t = batch.to_training(return_labels=True, return_padding_mask=True)
            >>> t["input_ids"].dtype, t["labels"].shape, t["padding_mask"].shape
            (torch.int64, torch.Size([4, 64]), torch.Size([4, 64]))
        """
        return self.to_training_with(TrainingOptions(**{k: v for k, v in locals().items() if k != "self"}))

    def to_training_with(self, options: TrainingOptions, *, on_host: bool = False) -> dict[str, Any]:
        """`to_training` with its keywords already checked, as a `TrainingOptions`: what a loader
        that converts every batch alike uses (the options are built once, not per batch).
        ``on_host`` stops before the copy to ``options.device`` (host tensors, integers in their
        own dtype: what a loader whose device stage moves them takes).

        Example:
            >>> options = TrainingOptions(return_labels=True)
            >>> batch.to_training_with(options)["labels"].shape
            torch.Size([4, 64])
        """
        return to_training(self._records or () if self._from_records else self.table, options, on_host=on_host)


# What a payload holds: Arrow columns become these when records are made (lists of numbers as
# numpy arrays), and what user operators may put back.
SampleNumeric: TypeAlias = "int | float | complex | np.number[Any]"
SamplePayloadArray: TypeAlias = "np.ndarray[Any, Any] | torch.Tensor"
SamplePayloadAtom: TypeAlias = (
    "bytes | memoryview | str | SampleNumeric | np.datetime64 | np.timedelta64 | SamplePayloadArray | None"
)
SamplePayload: TypeAlias = "SamplePayloadAtom | list[SamplePayload] | dict[Any, SamplePayload]"
SamplePayloadDict: TypeAlias = "dict[Any, SamplePayload]"
#: What flows between operators: a record, or (after ``batch``) a batch of them.
StreamItem: TypeAlias = "SampleRecord | SampleBatch"

__all__ = [
    "PADDING_LENGTH",
    "TOKEN_FIELD_CANDIDATES",
    "ChunkId",
    "ChunkOffset",
    "ComponentId",
    "ContributorRef",
    "DatasetId",
    "LaneId",
    "LineageIndex",
    "LineagePath",
    "LocalSampleId",
    "SampleBatch",
    "SampleCursor",
    "SampleCursorKey",
    "SampleId",
    "SampleMeta",
    "SampleNumeric",
    "SamplePayload",
    "SamplePayloadArray",
    "SamplePayloadAtom",
    "SamplePayloadDict",
    "SampleRecord",
    "ShardId",
    "StreamItem",
]
