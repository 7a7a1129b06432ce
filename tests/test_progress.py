"""The progress readout (``Pipeline.show_progress``): counts, tokens and lane positions, a final
line at the end of the pass, and nothing when it is not turned on."""

from __future__ import annotations

import io
import re

from tests.engine.test_mtp import build


def test_progress_lines_count_items_rows_and_tokens_and_end_with_the_totals():
    out = io.StringIO()
    pipe = build("stateful", mtp=False).show_progress(every_s=0.0, file=out, use_tqdm=False)
    batches = list(pipe)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(batches) + 1  # one per item (every_s=0), then the final one
    tokens = sum(len(r.payload["input_ids"]) for b in batches for r in b.records)
    last = lines[-1]
    assert last.startswith(f"zephon_columnar: {len(batches):,} items, {sum(len(b) for b in batches):,} rows")
    assert f"| {tokens:,} tokens |" in last
    lanes = dict(re.findall(r"(\d+):(\d+)@chunk\d+", last))
    assert sorted(lanes) == ["0", "1"] and sum(map(int, lanes.values())) == len(batches)


def test_progress_is_off_unless_asked_for_and_every_s_none_turns_it_off(capsys):
    pipe = build("stateless", mtp=False)
    list(pipe)
    pipe.show_progress(every_s=0.0, use_tqdm=False).show_progress(every_s=None)
    list(pipe)
    assert "zephon_columnar:" not in capsys.readouterr().err
