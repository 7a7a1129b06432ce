"""A progress readout for long runs: ``pipeline.show_progress()``, then iterate as usual.

Every ``every_s`` seconds (and at the end of the pass) it reports the items delivered, the
tokens in them and tokens per second since the start, and each lane's position (items taken,
the chunk its last row came from): through tqdm when it is installed (a bar whose postfix is
that line), else as one plain line on stderr.

Example:
    >>> import io
    >>> from zephon_columnar.types import SampleBatch
    >>> from zephon_columnar.frame import frame_of
    >>> out = io.StringIO()
    >>> p = Progress(every_s=3600, file=out, use_tqdm=False)
    >>> p.update(SampleBatch(frame_of({"input_ids": [[1, 2, 3], [4]]})))
    >>> p.close()
    >>> out.getvalue().split(" | ")[:2]
    ['zephon_columnar: 1 items, 2 rows', '4 tokens']
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.types import TOKEN_FIELD_CANDIDATES


class Progress:
    """Counts what a pass delivers and reports it now and then (see the module docstring)."""

    def __init__(self, *, every_s: float = 10.0, file: IO[str] | None = None, use_tqdm: bool | None = None) -> None:
        self.every_s = every_s
        self.file = file if file is not None else sys.stderr
        self.items = self.rows = self.tokens = 0
        self.lanes: dict[int, tuple[int, int]] = {}  # lane -> (items, chunk of its last row)
        self.start = self.last = time.perf_counter()
        self._bar = None
        if use_tqdm is None or use_tqdm:
            try:
                from tqdm import tqdm

                self._bar = tqdm(unit="item", file=self.file, dynamic_ncols=True)
            except ImportError:
                if use_tqdm:
                    raise

    def update(self, value: Any) -> None:
        table = getattr(value, "table", None)
        if isinstance(table, pa.Table) and table.num_rows:
            self.rows += table.num_rows
            name = next((f for f in TOKEN_FIELD_CANDIDATES if f in table.column_names), None)
            if name is not None:
                self.tokens += int(pc.sum(pc.list_value_length(table.column(name))).as_py() or 0)
            lane, chunk = table.column(F.LANE)[-1].as_py(), table.column(F.CHUNK)[-1].as_py()
            self.lanes[lane] = (self.lanes.get(lane, (0, 0))[0] + 1, chunk)
        self.items += 1
        if self._bar is not None:
            self._bar.update(1)
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            self._report()

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        lanes = " ".join(f"{lane}:{n}@chunk{chunk}" for lane, (n, chunk) in sorted(self.lanes.items()))
        return (
            f"zephon_columnar: {self.items:,} items, {self.rows:,} rows | {self.tokens:,} tokens | "
            f"{self.tokens / elapsed:,.0f} tok/s | lanes {lanes}"
        )

    def _report(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.line().split(" | ", 1)[1], refresh=True)
        else:
            print(self.line(), file=self.file, flush=True)

    def close(self) -> None:
        self._report()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
