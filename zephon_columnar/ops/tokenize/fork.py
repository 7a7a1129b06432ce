"""What a forked child does to this package's per-process state: the one after-fork hook of
`zephon_columnar.ops.tokenize`, registered once when the package is imported (its ``__init__``)."""

from __future__ import annotations

from zephon_columnar.ops.tokenize import backend, load


def after_fork_in_child() -> None:
    """In a forked child: a fresh lock for the loaded-tokenizer cache (the tokenizers are kept),
    and a fresh proofs lock with only the settled fastokens proofs kept (the others, whose
    thread the child lost, are proved again)."""
    load.after_fork_in_child()
    backend.after_fork_in_child()
