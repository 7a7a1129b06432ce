"""Metadata helpers for operators that fan out, merge or drop records (Zephon's ``zephon.ops.children``).

They live with the record vocabulary in `zephon_columnar.records` (below ``ops/``, which the
frame conversions also use); this module is their public address.

Example:
    >>> from zephon_columnar.records import SampleMeta
    >>> parent = SampleMeta(sample_id=(0, 0, 7), lane_id=0, chunk_id=3, chunk_offset=1)
    >>> spawn_child(parent, 2, is_last_child=True).lineage
    (2,)
"""

from zephon_columnar.records import pack_meta, spawn_child, tombstone_meta, tombstones_for_record

__all__ = ["pack_meta", "spawn_child", "tombstone_meta", "tombstones_for_record"]
