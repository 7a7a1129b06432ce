"""Text to token ids: the ``tokenize`` operator and the tokenizers it loads.

Modules, each importing only those listed before it:

- `backend`: who encodes (``tokenizers`` or ``fastokens``) and the proof that fastokens gives a
  tokenizer's own ids;
- `paths`: resolving ``tokenizer_id`` paths, and their errors;
- `fallback`: the ``"__fallback__"`` stub tokenizer for tests and dry runs;
- `specials`: finding BOS/EOS/PAD;
- `handle`: `TokenizerHandle`, a loaded tokenizer;
- `load`: `load_tokenizer` (the accepted forms), identity, this process's cache of loaded files;
- `owner`: `TokenizerOwner`, what the tokenizing operators share;
- `op`: `TokenizeOp` (``Pipeline.tokenize``) and its numpy helpers;
- `fork`: the package's one after-fork hook, registered here.
"""

from __future__ import annotations

import os

from zephon_columnar.ops.tokenize.backend import (
    PROBE_TEXTS,
    FastokensProof,
    existing_proof,
    flat_encodings,
    forget_proofs,
    probe_difference,
    shared_proof,
    truncate_rows,
    unsupported_parts,
)
from zephon_columnar.ops.tokenize.fallback import FALLBACK_ID, FallbackTokenizer
from zephon_columnar.ops.tokenize.fork import after_fork_in_child
from zephon_columnar.ops.tokenize.handle import TokenizerHandle, check_backend
from zephon_columnar.ops.tokenize.load import (
    check_tokenizer_args,
    forget_tokenizers,
    load_tokenizer,
    path_identity,
    tokenizer_identity,
    tokenizer_source,
)
from zephon_columnar.ops.tokenize.op import TokenizeOp, pad_rows, splice_specials, split_rows
from zephon_columnar.ops.tokenize.owner import TokenizerOwner
from zephon_columnar.ops.tokenize.paths import TokenizerNotFoundError, resolve_tokenizer_path
from zephon_columnar.ops.tokenize.specials import BOS_CANDIDATES, EOS_CANDIDATES, PAD_CANDIDATES

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork_in_child)

__all__ = [
    "BOS_CANDIDATES",
    "EOS_CANDIDATES",
    "FALLBACK_ID",
    "PAD_CANDIDATES",
    "PROBE_TEXTS",
    "FallbackTokenizer",
    "FastokensProof",
    "TokenizeOp",
    "TokenizerHandle",
    "TokenizerNotFoundError",
    "TokenizerOwner",
    "check_backend",
    "check_tokenizer_args",
    "existing_proof",
    "flat_encodings",
    "forget_proofs",
    "forget_tokenizers",
    "load_tokenizer",
    "pad_rows",
    "path_identity",
    "probe_difference",
    "resolve_tokenizer_path",
    "shared_proof",
    "splice_specials",
    "split_rows",
    "tokenizer_identity",
    "tokenizer_source",
    "truncate_rows",
    "unsupported_parts",
]
