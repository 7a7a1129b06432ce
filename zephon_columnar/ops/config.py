"""The string options of the operator methods, as ``Literal`` types (Zephon's ``zephon.ops.config``).

One definition each: the operators check their arguments against ``get_args`` of these.

Example:
    >>> from typing import get_args
    >>> get_args(PackingAlgorithm)
    ('first_fit', 'best_fit', 'wrap', 'best_fit_wrap')
"""

from typing import Literal

SpecialTokensMode = Literal["bos_eos", "bos", "eos", "none", "tokenizer_default"]
"""Which special tokens ``tokenize`` adds around each document."""

MissingFieldMode = Literal["error", "empty"]
"""What ``tokenize`` does with a missing or null text field: raise, or tokenize ``""``."""

SpanSource = Literal["auto", "generation_tags", "prefix_diff"]
"""How ``tokenize_chat`` finds the assistant spans it trains on."""

LossScope = Literal["all_assistant", "last_span", "after_last_user"]
"""Which assistant spans of a conversation ``tokenize_chat`` puts in the loss."""

PackingAlgorithm = Literal["first_fit", "best_fit", "wrap", "best_fit_wrap"]
"""How ``pack_flat`` / ``pack_sequences`` fill rows."""

ShuffleStrategy = Literal["random", "length"]
"""How ``pack_flat`` / ``pack_sequences`` order documents in their buffer before packing."""

FlushStrategy = Literal["fifo", "fullest"]
"""Which open row ``pack_flat`` / ``pack_sequences`` closes first when it must close one."""

Homogeneity = Literal["none", "group", "full"]
"""Whether a packed row may mix documents of different domain groups."""

ShuffleAlgorithm = Literal["streaming", "block", "block_warmup"]
"""How ``shuffle`` draws rows from its buffer (`zephon_columnar.ops.shuffle`)."""

TokenizerBackend = Literal["auto", "tokenizers", "fastokens"]
"""Who encodes text for ``tokenize`` (`zephon_columnar.ops.tokenize.backend`)."""

LoaderKind = Literal["auto", "stateful", "plain"]
"""Which loader ``to_torch_loader`` builds: torchdata's ``StatefulDataLoader``, torch's
``DataLoader``, or the stateful one when torchdata is installed (`zephon_columnar.torch`)."""

__all__ = [
    "FlushStrategy",
    "Homogeneity",
    "LoaderKind",
    "LossScope",
    "MissingFieldMode",
    "PackingAlgorithm",
    "ShuffleAlgorithm",
    "ShuffleStrategy",
    "SpanSource",
    "SpecialTokensMode",
    "TokenizerBackend",
]
