"""Where data lives: datasets (shards with row counts) and the readers that take rows from them.

Zephon's ``zephon.io`` names: :class:`Dataset`, :class:`InMemoryShard`, plus :class:`ShardInfo`
(the per-shard metadata every reader works from).
"""

from zephon_columnar.io.base import ShardInfo
from zephon_columnar.io.dataset import Dataset, InMemoryShard

__all__ = ["Dataset", "InMemoryShard", "ShardInfo"]
