"""JSON Lines: shard discovery from a cached line index, and a batch-parsing reader.

Files: ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` (and ``*.json`` / ``*.ndjson`` holding JSON
Lines, with the same compressions), in UTF-8. Every non-blank line must be one JSON object; it is
one row.

Discovery counts newlines in big binary blocks and keeps the byte offset of every row (a
:class:`LineIndex`); in the same pass pyarrow parses each block (columnar, no Python object per
row) to learn the schema of every line. Index and schema are cached on disk under
``cache_root()/jsonl_index`` keyed by the file's identity, size and modification time, so a
second discovery of an unchanged file reads the cache instead of parsing the file again.

Blank lines (empty or only spaces, tabs, ``\\r``) are skipped anywhere in a file, as pyarrow,
pandas and Hugging Face ``datasets`` do; they are not rows, but error messages still give the
physical 1-based line number.

The dataset's schema covers every field of every line of every file: a field that first appears
on line 1,000,000 or only in the last file is a column, null in the rows without it. Types widen
as Arrow's JSON reader widens them: null and any type give that type, ints and floats give
``double``, objects merge their fields, arrays their items. A field with two JSON types that do not
widen (a number on one line, a string or an object on another) fails discovery with a
DatasetFormatError naming the file, the line and the field. Strings that look like timestamps stay
strings (a JSON string is a ``str`` in Zephon's payload). The schema is imposed on every read
(``pyarrow.json.read_json`` with an explicit schema).

Discovery also checks the first ~1000 rows of the first non-empty file strictly: a line there that
is not one JSON object, or not UTF-8, fails discovery. A bad line further on is left out of the
schema and reported, with its line number, by the reader when its row is read.

The package's modules, each importing only those above it: `compression` (file names,
decompressed streams), `lines` (one line's bytes), `schema` (types widened line by line),
`index` (a file's :class:`LineIndex` and the scan that builds it), `index_cache` (indexes in
memory and on disk), `bad_lines` (naming a bad line), `reader` (:class:`JsonlReader`) and
`plugin` (:class:`JsonlFormat`, `JSONL`).

Example:
    >>> ds = Dataset.from_path("chat", "data/chat/part-000.jsonl")
    >>> rows = JsonlReader(ds).take(0, np.array([3, 1])).to_pylist()
    >>> [(row["id"], row["messages"][-1]) for row in rows]
    [(3, {'role': 'assistant', 'content': 'Buenos días.'}), (1, {'role': 'assistant', 'content': 'Cheerful.'})]
"""

from zephon_columnar.io.jsonl.compression import JSONL_SUFFIXES, Compression, compression_of, is_jsonl_name
from zephon_columnar.io.jsonl.index import LineIndex
from zephon_columnar.io.jsonl.index_cache import INDEX_CACHE, line_index
from zephon_columnar.io.jsonl.plugin import JSONL, SCHEMA_SAMPLE_ROWS, JsonlFormat
from zephon_columnar.io.jsonl.reader import DEFAULT_DECODED_CACHE_BYTES, DEFAULT_MAX_OPEN_FILES, JsonlReader

__all__ = [
    "DEFAULT_DECODED_CACHE_BYTES",
    "DEFAULT_MAX_OPEN_FILES",
    "INDEX_CACHE",
    "JSONL",
    "JSONL_SUFFIXES",
    "SCHEMA_SAMPLE_ROWS",
    "Compression",
    "JsonlFormat",
    "JsonlReader",
    "LineIndex",
    "compression_of",
    "is_jsonl_name",
    "line_index",
]
