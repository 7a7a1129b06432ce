"""`TokenizeOp` (``Pipeline.tokenize``): text column in, ``input_ids`` list<int32> column out.

Stateless and columnar: one ``encode_batch_fast`` call per frame (the tokenizer releases the GIL
and uses its own threads), then the special tokens, truncation, splitting and padding are numpy
arithmetic on one flat id buffer and its row offsets -- no per-row or per-token Python.

Semantics (Zephon 0.2.0, B.17, with the choices below):

- ``special_tokens``: ``"bos_eos"`` / ``"bos"`` / ``"eos"`` / ``"none"`` encode without the
  tokenizer's specials and splice BOS/EOS around each document; ``"tokenizer_default"`` lets the
  tokenizer's post-processor add its own (``add_special_tokens=True``). BOS/EOS come from
  ``bos_token_id=`` / ``eos_token_id=`` when given, else from the tokenizer (see
  `zephon_columnar.ops.tokenize.specials`); a needed id that cannot be found is a ConfigError at
  construction (tokenizer objects), at preflight, in worker setup or on the first frame (paths).
- ``max_length`` counts the specials. It is enforced only by ``truncation`` or
  ``split_long_samples`` (as in Zephon and transformers); padding alone leaves longer rows long.
- ``truncation=True`` (needs ``max_length``): bracket modes cut the *content* to
  ``max_length - #specials`` and then add BOS/EOS, so a truncated row still ends with EOS;
  ``tokenizer_default`` uses the tokenizer's own truncation, which keeps its specials (an HF-like
  callable is cut after the fact, so its trailing specials may be cut off).
- ``padding``: ``False`` none; ``"max_length"`` pads every row to ``max_length``; ``True`` and
  ``"longest"`` also pad to ``max_length`` when it is given. Without it, Zephon pads to the
  longest row of each tokenizer call, which depends on how rows are grouped on their way
  (parallelism, frames, resume points); here rows stay unpadded in the stream and each batch is
  padded to its longest row when it becomes tensors (``SampleBatch.to_training`` right-pads
  ragged rows with ``pad_token_id=`` and masks the pad): what padding to the longest of a batch
  gives, the same however rows were grouped. The pad id is the tokenizer's pad token, else EOS,
  else a ConfigError.
- ``split_long_samples=True`` (needs ``max_length``, excludes ``truncation``): each document's
  full sequence (BOS + content + EOS; with ``tokenizer_default`` the tokenizer's own output) is
  cut into consecutive pieces of ``max_length`` ids, i.e.
  ``max(1, ceil((n + #specials) / max_length))`` pieces: BOS only on the first, EOS only on the
  last (the last piece can be just ``[EOS]``), every piece at most ``max_length``, and the pieces
  concatenate back to the document. Children repeat their parent's bookkeeping row, in order,
  each with its own lineage: the parent's extended by the piece's index (``(0,)``, ``(1,)``, ...;
  a document that needs no cut keeps its lineage). The ``__lineage`` column is on every output
  row, ``[]`` for a document that needed no cut and was not cut before, never null, whether or
  not another document of the same frame was cut (the same table however rows are framed).
- ``missing_field``: ``"error"`` raises naming the field and the sample (dataset, shard, row):
  `MissingFieldError` (a ``KeyError``) when the column is absent, `DatasetFormatError` (a
  ``ValueError``) when a value is null; ``"empty"`` tokenizes ``""``.
- Output: ``input_ids`` list<int32> and, with ``add_attention_mask``, ``attention_mask``
  list<int8> (1 real token, 0 padding). The upstream payload is dropped unless
  ``preserve_upstream_payload=True`` keeps it (the text field included; repeated for every piece
  of a split document; an upstream ``input_ids``/``attention_mask`` is replaced).
- ``return_tensors`` and ``use_fast`` are accepted for API compatibility and do nothing: columns
  are Arrow lists (``SampleBatch.to_training`` makes tensors) and the tokenizer is used as given
  (a transformers fast tokenizer through its Rust backend).

Example:
    >>> record = next(iter(pipe.tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")))
    >>> sorted(record.payload), record.payload["input_ids"][-1]  # each document ends with EOS (id 1)
    (['attention_mask', 'input_ids'], 1)
    >>> pieces = Pipeline(ws).tokenize(tokenizer=tok, field="text", max_length=8, split_long_samples=True)
    >>> [len(r.payload["input_ids"]) for r in pieces if r.meta.sample_id == (0, 0, 0)]  # one document's pieces
    [8, 8, 8, 8, 1]
"""

from __future__ import annotations

import os
from typing import Any, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError, MissingFieldError, WrongTypeError
from zephon_columnar.keywords import choice
from zephon_columnar.ops.base import FrameOp, OpContext, OpTraits
from zephon_columnar.ops.config import MissingFieldMode, SpecialTokensMode, TokenizerBackend
from zephon_columnar.ops.rows import sample_of
from zephon_columnar.ops.tokenize.backend import truncate_rows
from zephon_columnar.ops.tokenize.load import tokenizer_source
from zephon_columnar.ops.tokenize.owner import TokenizerOwner
from zephon_columnar.records import as_python_lists

SPECIAL_MODES: tuple[str, ...] = get_args(SpecialTokensMode)
OUTPUT_FIELDS = ("input_ids", "attention_mask")
_INT32_MAX = 2**31 - 1


class TokenizeOp(TokenizerOwner, FrameOp):
    """Tokenize ``field`` into ``input_ids`` (+ ``attention_mask``); see the module docstring.

    The tokenizer is built once per worker copy (in ``setup``, or on the first frame when the op
    is used without ``setup``), never per frame.
    """

    name = "tokenize"

    def __init__(
        self,
        tokenizer: Any = None,
        tokenizer_id: str | os.PathLike[str] | None = None,
        *,
        field: str,
        missing_field: MissingFieldMode = "error",
        add_attention_mask: bool = True,
        max_length: int | None = None,
        padding: bool | str = False,
        truncation: bool | str = False,
        return_tensors: str | None = None,
        split_long_samples: bool = False,
        use_fast: bool = True,
        preserve_upstream_payload: bool = False,
        special_tokens: SpecialTokensMode = "bos_eos",
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        parallelism: int | None = None,
        backend: TokenizerBackend = "auto",
    ) -> None:
        super().__init__()
        self._choose_backend(backend)
        if not isinstance(field, str) or not field:
            raise ConfigError(f"tokenize: field= must be a column name, got {field!r}.")
        choice("tokenize", "missing_field", missing_field, ("error", "empty"))
        choice("tokenize", "special_tokens", special_tokens, SPECIAL_MODES)
        if return_tensors not in (None, "pt", "np", "tf"):
            raise ConfigError(
                f"tokenize: return_tensors={return_tensors!r}; use None, 'pt', 'np' or 'tf' "
                "(accepted for compatibility: columns stay Arrow lists)."
            )
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ConfigError(f"tokenize: max_length={max_length!r}; pass a positive int or None.")
        for name, v in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise ConfigError(f"tokenize: {name}={v!r}; pass a non-negative token id or None.")
        self.field = field
        self.missing_field = missing_field
        self.add_attention_mask = bool(add_attention_mask)
        self.max_length = max_length
        self.special_tokens = special_tokens
        self.truncation = _truncation_flag(truncation)
        self.padding = _padding_mode(padding, max_length)
        self.split_long_samples = bool(split_long_samples)
        self.return_tensors = return_tensors
        self.use_fast = use_fast
        self.preserve_upstream_payload = bool(preserve_upstream_payload)
        self.bos_override = None if bos_token_id is None else int(bos_token_id)
        self.eos_override = None if eos_token_id is None else int(eos_token_id)
        self.parallelism = parallelism

        n_specials = self._n_specials()
        if self.truncation and max_length is None:
            raise ConfigError("tokenize: truncation=True needs max_length=<tokens per row, specials included>.")
        if (
            self.truncation
            and special_tokens != "tokenizer_default"
            and max_length is not None
            and max_length <= n_specials
        ):
            raise ConfigError(
                f"tokenize: max_length={max_length} leaves no room for content next to "
                f"special_tokens={special_tokens!r}; use max_length > {n_specials}."
            )
        if self.split_long_samples:
            if max_length is None:
                raise ConfigError("tokenize: split_long_samples=True needs max_length=<tokens per piece>.")
            if self.truncation:
                raise ConfigError(
                    "tokenize: split_long_samples=True cuts long documents into pieces and "
                    "truncation=True cuts them off; pick one."
                )

        self._path, self._handle = tokenizer_source(tokenizer, tokenizer_id)
        self._path_arg = "tokenizer_id" if tokenizer_id is not None else "tokenizer"
        self._ids: tuple[int | None, int | None, int | None] | None = None
        self._identity: str | None = None
        if self._handle is not None:
            self._resolve_ids()  # a missing BOS/EOS is an error at pipeline build

    # ------------------------------------------------------------------ contract
    def traits(self) -> OpTraits:
        return OpTraits(
            preserves_cursor_order=True,
            indexable=not self.split_long_samples,
            parallelism=self.parallelism or 1,
            emits="any" if self.split_long_samples else "at_most_one",  # a row without the field may be dropped
        )

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._ensure_handle().materialize()
        self._resolve_ids()

    def preflight(self) -> None:
        """Load the tokenizer, resolve the special ids this configuration needs and encode a probe;
        raises what the first frame would."""
        handle = self._ensure_handle().materialize()
        self._resolve_ids()
        handle.preflight(add_special_tokens=self.special_tokens == "tokenizer_default")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "op": self.name,
            "tokenizer": self._tokenizer_fingerprint(),
            "field": self.field,
            "missing_field": self.missing_field,
            "special_tokens": self.special_tokens,
            "bos_token_id": self.bos_override,
            "eos_token_id": self.eos_override,
            "max_length": self.max_length,
            "truncation": self.truncation,
            "padding": self.padding,
            "split_long_samples": self.split_long_samples,
            "add_attention_mask": self.add_attention_mask,
            "preserve_upstream_payload": self.preserve_upstream_payload,
        }

    # ------------------------------------------------------------------ tokenizer and ids
    def _n_specials(self) -> int:
        return {"bos_eos": 2, "bos": 1, "eos": 1}.get(self.special_tokens, 0)

    def _resolve_ids(self) -> tuple[int | None, int | None, int | None]:
        """(bos, eos, pad) this configuration splices; a needed one missing is a ConfigError."""
        h = self._ensure_handle()
        mode = self.special_tokens
        bos = self.bos_override if self.bos_override is not None else h.bos_token_id
        eos = self.eos_override if self.eos_override is not None else h.eos_token_id
        for key, needed, value, other in (
            ("bos", mode in ("bos_eos", "bos"), bos, "'eos'"),
            ("eos", mode in ("bos_eos", "eos"), eos, "'bos'"),
        ):
            if needed and value is None:
                why = f" ({h.notes[key]})" if key in h.notes else ""
                raise ConfigError(
                    f"tokenize(special_tokens={mode!r}) needs a {key.upper()} token id and {h.source} has "
                    f"none{why}. Pass {key}_token_id=<id>, or special_tokens={other}, 'none' or "
                    "'tokenizer_default'."
                )
        pad = None
        if self.padding is not None:
            pad = h.pad_token_id if h.pad_token_id is not None else eos
            if pad is None:
                raise ConfigError(
                    f"tokenize(padding={self.padding!r}) needs a pad id and {h.source} has neither a pad nor an "
                    "EOS token. Pass eos_token_id=<id> (EOS pads when there is no pad token), or padding=False "
                    "(pack_flat pads packed rows itself)."
                )
        self._ids = (bos if mode in ("bos_eos", "bos") else None, eos if mode in ("bos_eos", "eos") else None, pad)
        return self._ids

    # ------------------------------------------------------------------ the columnar hook
    def process_frame(self, frame: pa.Table) -> pa.Table:
        bos, eos, pad = self._ids if self._ids is not None else self._resolve_ids()
        handle = self._handle
        assert handle is not None
        texts = self._texts(frame)
        defaults = self.special_tokens == "tokenizer_default"
        limit = None
        if self.truncation:
            assert self.max_length is not None
            limit = self.max_length if defaults else self.max_length - self._n_specials()
        flat, offsets = handle.encode_ids(texts, add_special_tokens=defaults, truncate_to=limit)
        if limit is not None:
            flat, offsets = truncate_rows(flat, offsets, limit)  # a no-op after the tokenizer's own
        flat, offsets = splice_specials(flat, offsets, bos, eos)
        parent = None
        if self.split_long_samples:
            assert self.max_length is not None
            offsets, parent = split_rows(offsets, self.max_length)
        mask = None
        if self.padding is not None:
            assert self.max_length is not None and pad is not None
            flat, offsets, mask = pad_rows(flat, offsets, self.max_length, pad)
        elif self.add_attention_mask:
            mask = np.ones(len(flat), dtype=np.int8)
        return self._assemble(frame, flat, offsets, mask, parent)

    def _texts(self, frame: pa.Table) -> list[str]:
        n = frame.num_rows
        if self.field not in frame.column_names:
            if self.missing_field == "empty" or n == 0:
                return [""] * n
            raise MissingFieldError(
                f"tokenize: field {self.field!r} is missing from {_where(frame, 0)} (fields: "
                f"{F.payload_names(frame)}). Pass field=<one of them>, or missing_field='empty' to tokenize ''."
            )
        col = frame.column(self.field)
        t = col.type
        if pa.types.is_null(t):
            col = pa.chunked_array([pa.nulls(n, pa.string())])
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            raise WrongTypeError(
                f"tokenize: field {self.field!r} holds bytes ({t}); add .decode_text(fields="
                f"({self.field!r},)) before tokenize."
            )
        elif not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            raise WrongTypeError(
                f"tokenize: field {self.field!r} has type {t}, not text ({_where(frame, 0)}); tokenize a string column."
            )
        if col.null_count:
            if self.missing_field == "error":
                first = pc.index(pc.is_null(col), True).as_py()
                raise DatasetFormatError(
                    f"tokenize: field {self.field!r} is null in {_where(frame, first)}. Fix the data, filter "
                    "such rows out, or pass missing_field='empty' to tokenize ''."
                )
            col = pc.fill_null(col, "")
        texts: list[str] = col.to_pylist()  # a string column without nulls
        return texts

    def _assemble(
        self, frame: pa.Table, flat: np.ndarray, offsets: np.ndarray, mask: np.ndarray | None, parent: np.ndarray | None
    ) -> pa.Table:
        if offsets[-1] > _INT32_MAX:
            raise ConfigError(
                f"tokenize: one frame produced {int(offsets[-1])} tokens, more than a list<int32> "
                "column holds; use smaller fetch batches (fetch(max_batch=...))."
            )
        off = pa.array(offsets.astype(np.int32, copy=False))
        columns: list[pa.Array | pa.ChunkedArray] = []
        names: list[str] = []
        book = F.bookkeeping_of(frame)
        upstream = None
        if self.preserve_upstream_payload:
            upstream = F.payload_of(frame)
            upstream = upstream.drop_columns([c for c in OUTPUT_FIELDS if c in upstream.column_names])
        if parent is not None:
            # Each piece of a cut document is a child of it: lineage extended by the piece's index.
            # A document that needed no cut keeps its lineage, whatever else is in the frame.
            first = np.searchsorted(parent, parent, side="left")
            last = np.searchsorted(parent, parent, side="right")
            child = np.where(last - first > 1, np.arange(len(parent)) - first, -1).astype(np.int32)
            book = F.with_children(book, parent, child)
            if upstream is not None:
                upstream = upstream.take(pa.array(parent))
        elif self.split_long_samples:
            # No document of this frame needed a cut, but a splitting tokenize gives every row a
            # lineage column all the same ([] for an uncut document): otherwise whether a row has
            # one would depend on which rows shared its frame (fetch batch size, restore).
            book = F.with_lineage_column(book)
        if upstream is not None:
            columns.extend(upstream.columns)
            names.extend(upstream.column_names)
        columns.append(pa.ListArray.from_arrays(off, pa.array(flat, pa.int32())))
        names.append("input_ids")
        if mask is not None and self.add_attention_mask:
            columns.append(pa.ListArray.from_arrays(off, pa.array(mask, pa.int8())))
            names.append("attention_mask")
        # Records see these as Python lists, as Zephon's tokenize gives them.
        return as_python_lists(F.with_payload(book, pa.Table.from_arrays(columns, names=names)), OUTPUT_FIELDS)


# ---------------------------------------------------------------------- vectorized pieces
def splice_specials(
    flat: np.ndarray, offsets: np.ndarray, bos: int | None, eos: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Put ``bos`` before and ``eos`` after every row (either may be None): one boolean-mask
    scatter of the content into the grown buffer."""
    b, e = int(bos is not None), int(eos is not None)
    if not (b or e):
        return flat, offsets
    n = len(offsets) - 1
    new_off = offsets + np.arange(n + 1, dtype=np.int64) * (b + e)
    out = np.empty(int(new_off[-1]), dtype=np.int32)
    special = np.zeros(len(out), dtype=bool)
    if b:
        special[new_off[:-1]] = True
    if e:
        special[new_off[1:] - 1] = True
    out[~special] = flat
    if bos is not None:
        out[new_off[:-1]] = bos
    if eos is not None:
        out[new_off[1:] - 1] = eos
    return out, new_off


def split_rows(offsets: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Cut every row into consecutive pieces of at most ``max_length`` (an empty row stays one
    empty piece). The flat buffer is unchanged: only the offsets change. Returns the new offsets
    and each piece's parent row (None when nothing was cut)."""
    lens = np.diff(offsets)
    pieces = np.maximum(1, -(-lens // max_length))
    if len(lens) == 0 or int(pieces.max()) == 1:
        return offsets, None
    parent = np.repeat(np.arange(len(lens), dtype=np.int64), pieces)
    first = np.cumsum(pieces) - pieces
    within = np.arange(len(parent), dtype=np.int64) - np.repeat(first, pieces)
    starts = offsets[:-1][parent] + within * max_length
    return np.append(starts, offsets[-1]), parent


def pad_rows(
    flat: np.ndarray, offsets: np.ndarray, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-pad rows shorter than ``length`` with ``pad_id``; returns ids, offsets and the int8
    attention mask (1 real, 0 pad). Longer rows are left as they are."""
    lens = np.diff(offsets)
    padded = np.maximum(lens, length)
    n = len(lens)
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(padded, out=new_off[1:])
    total = int(new_off[-1])
    delta = np.zeros(total + 1, dtype=np.int8)
    # +1 where a row's real ids start, -1 where they end; the running sum marks real ids. An
    # empty row's end is also the previous row's end: .at accumulates repeated indices.
    np.add.at(delta, new_off[:-1], 1)
    np.subtract.at(delta, new_off[:-1] + lens, 1)
    real = np.cumsum(delta[:-1], dtype=np.int8).view(bool)
    out = np.full(total, pad_id, dtype=np.int32)
    out[real] = flat
    return out, new_off, real.view(np.int8)


def _where(frame: pa.Table, i: int) -> str:
    return sample_of(frame, i) if F.DATASET in frame.column_names else f"row {i} of the frame"


def _truncation_flag(truncation: bool | str) -> bool:
    if isinstance(truncation, str):
        if truncation in ("longest_first", "only_first"):
            return True
        if truncation == "do_not_truncate":
            return False
        raise ConfigError(f"tokenize: truncation={truncation!r}; use True or False.")
    return bool(truncation)


def _padding_mode(padding: bool | str, max_length: int | None) -> str | None:
    """None (rows stay unpadded: no padding, or padding to the longest of a batch, which
    ``to_training`` does) or "max_length" (every row padded to ``max_length`` here)."""
    if padding in (False, None, "do_not_pad"):
        return None
    if padding not in (True, "longest", "max_length"):
        raise ConfigError(f"tokenize: padding={padding!r}; use False, True, 'longest' or 'max_length'.")
    if max_length is None:
        if padding == "max_length":
            raise ConfigError("tokenize: padding='max_length' needs max_length=<row length>.")
        return None  # the longest of each batch: SampleBatch.to_training pads ragged rows
    return "max_length"
