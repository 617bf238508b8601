"""Parquet edge tables for ``strata convert`` (the ``parquet`` extra: pyarrow).

A Parquet file is read one record batch at a time (``ParquetFile.iter_batches``, row group by
row group) and each batch is written as CSV lines to a staging file beside the store, which
the text converter then reads like any edge list: memory stays at one batch, whatever the
file's size, and every text-converter feature (string ids, typed graphs, weights, times, edge
features, ``--split``) applies unchanged. The staging file costs disk (about the size of the edges as
text) and is removed when the conversion ends; a killed conversion's staging directory
(``.NAME-parquet-PID``) is removed by the next conversion beside it once that process is gone.
Errors name the Parquet file, the row group, the row inside it and the column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConfigError, InputError, InputNotFoundError

#: The roles a column can play, as in the text converter's ``--columns``; ``feat`` may repeat
#: (each a number column or a fixed-size list of numbers, together the edge feature vector).
ROLES = ("src", "dst", "rel", "weight", "time", "feat")
#: Rows per record batch: the unit of memory while staging (a few MB of columns).
BATCH_ROWS = 65_536


def _pyarrow():
    """Imports pyarrow lazily: only Parquet inputs need it, and it is an optional extra."""
    try:
        import pyarrow
        import pyarrow.csv
        import pyarrow.parquet
    except ImportError as e:
        raise ConfigError(
            "convert: Parquet inputs are read with pyarrow, which is not installed; pip install pyarrow"
        ) from e
    return pyarrow


def parse_columns(spec: str) -> list[tuple[str, str]]:
    """``--columns`` for Parquet: ``ROLE`` or ``ROLE=COLUMN`` items (``src=from,dst=to,weight``);
    returns (role, column name) pairs, the ``feat`` items last (in their order: the staged CSV
    holds the features as one run of fields). src and dst are required."""
    pairs = []
    for item in (c.strip() for c in spec.split(",")):
        role, sep, column = (s.strip() for s in item.partition("="))
        if role not in ROLES:
            raise ConfigError(
                f"convert.columns: unknown role {role!r} in {spec!r}: Parquet columns take the roles "
                f"{', '.join(ROLES)} (ROLE or ROLE=COLUMN)"
            )
        if sep and not column:
            raise ConfigError(f"convert.columns: {item!r} names no column (ROLE=COLUMN)")
        pairs.append((role, column if sep else role))
    roles = [r for r, _ in pairs]
    for role in ROLES[:-1]:
        if roles.count(role) > 1:
            raise ConfigError(f"convert.columns: role {role!r} appears more than once in {spec!r}")
    missing = [r for r in ("src", "dst") if r not in roles]
    if missing:
        raise ConfigError(f"convert.columns: Parquet inputs need the roles src and dst, {spec!r} lacks {missing[0]}")
    return [p for p in pairs if p[0] != "feat"] + [p for p in pairs if p[0] == "feat"]


def text_columns(pairs: list[tuple[str, str]], dim: int) -> list[str]:
    """The text converter's ``columns`` for a staged CSV: the roles, then ``feat:DIM``."""
    return [r for r, _ in pairs if r != "feat"] + ([f"feat:{dim}"] if dim else [])


@dataclass
class Staged:
    """A Parquet file staged as CSV: where, and how its rows map back to row groups."""

    parquet: Path
    csv: Path
    #: Rows of each row group, in file order.
    group_rows: list[int]
    #: "int" or "string" for the id columns (src, dst) and the rel column (None without one).
    id_kind: str
    rel_kind: str | None
    #: Edge feature dimension (0: none).
    feature_dim: int

    def locate(self, line: int) -> str:
        """The row group and row of 1-based staged ``line`` (one CSV line per row, no header)."""
        row = line - 1
        for group, n in enumerate(self.group_rows):
            if row < n:
                return f"row group {group}, row {row}"
            row -= n
        return f"row {line - 1}"


def _kind(pa, path: Path, role: str, column: str, dtype) -> str:
    """ "int" or "string" for an id or relation column; anything else is refused."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_integer(dtype):
        return "int"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    raise InputError(
        f"{path}: column {column!r} ({role}) is {dtype}: {role} ids must be integers or strings (node names)"
    )


def _feature_width(pa, path: Path, column: str, dtype) -> int:
    """Features a ``feat`` column holds: 1 for a number column, the size of a fixed-size list
    of numbers."""
    if pa.types.is_fixed_size_list(dtype) and (
        pa.types.is_floating(dtype.value_type) or pa.types.is_integer(dtype.value_type)
    ):
        return dtype.list_size
    if pa.types.is_floating(dtype) or pa.types.is_integer(dtype):
        return 1
    raise InputError(
        f"{path}: column {column!r} (feat) is {dtype}: edge features must be numbers or fixed-size lists of numbers"
    )


def _check_schema(pa, path: Path, pairs: list[tuple[str, str]]) -> tuple[str, str | None, int]:
    """Checks that every column exists with a type its role takes; returns the id and rel
    kinds and the feature dimension."""
    try:
        schema = pa.parquet.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: not a readable Parquet file ({e})") from e
    kinds = {}
    dim = 0
    for role, column in pairs:
        if column not in schema.names:
            raise InputError(
                f"{path}: no column {column!r} for role {role}; the file's columns are {', '.join(schema.names)} "
                "(name them with --columns ROLE=COLUMN)"
            )
        dtype = schema.field(column).type
        if role in ("src", "dst", "rel"):
            kinds[role] = _kind(pa, path, role, column, dtype)
        elif role == "weight" and not (pa.types.is_floating(dtype) or pa.types.is_integer(dtype)):
            raise InputError(f"{path}: column {column!r} (weight) is {dtype}: weights must be numbers")
        elif role == "time" and not pa.types.is_integer(dtype):
            raise InputError(f"{path}: column {column!r} (time) is {dtype}: times must be integers")
        elif role == "feat":
            dim += _feature_width(pa, path, column, dtype)
    if kinds["src"] != kinds["dst"]:
        raise InputError(
            f"{path}: src and dst columns must both hold integers or both strings, "
            f"got {kinds['src']} and {kinds['dst']}"
        )
    return kinds["src"], kinds.get("rel"), dim


def stage(path: Path, pairs: list[tuple[str, str]], csv: Path) -> Staged:
    """Writes the role columns of Parquet file ``path`` to ``csv`` (no header, roles in the
    order of ``pairs``, each feature its own field), one record batch at a time; refuses nulls,
    naming row group, row and column."""
    pa = _pyarrow()
    if not path.is_file():
        raise InputNotFoundError(f"{path}: no such file")
    id_kind, rel_kind, dim = _check_schema(pa, path, pairs)
    # A buffered stream of 1 MiB reads pages as needed; the default reads whole column chunks.
    try:
        source = pa.parquet.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable Parquet file ({e})") from None
    columns = list(dict.fromkeys(c for _, c in pairs))
    names = {"src": id_kind, "dst": id_kind, "rel": rel_kind}
    options = pa.csv.WriteOptions(include_header=False, quoting_style="needed")
    group_rows = [source.metadata.row_group(g).num_rows for g in range(source.num_row_groups)]
    schema = _staged_schema(pa, source.schema_arrow, pairs)
    with pa.csv.CSVWriter(str(csv), schema, write_options=options) as out:
        for group in range(source.num_row_groups):
            row = 0
            for batch in _batches(pa, source, path, group, columns):
                arrays = []
                for role, column in pairs:
                    array = batch.column(column)
                    problem = _first_bad_row(pa, array, names.get(role) == "string")
                    if problem is not None:
                        first, what = problem
                        raise InputError(
                            f"{path}: row group {group}, row {row + first}: column {column!r} ({role}) {what}"
                        )
                    arrays += _fields(pa, array)
                out.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
                row += batch.num_rows
    # Arrow's allocator keeps freed batches for reuse; the converter that runs next in this
    # process needs that memory within the same limit.
    pa.default_memory_pool().release_unused()
    return Staged(path, csv, group_rows, id_kind, rel_kind, dim)


def _batches(pa, source, path: Path, group: int, columns: list[str]):
    """The record batches of row group ``group``; a page that does not decode (a damaged file:
    a bad page header, corrupt compressed data, invalid UTF-8) is an InputError naming it."""
    try:
        yield from source.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{path}: row group {group} does not decode: the file is damaged ({e})") from None


def _nulls(pa, array) -> np.ndarray:
    """(rows,) bool: which rows are null, or hold a null inside a fixed-size list."""
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
        inner = array.flatten().is_null().to_numpy(zero_copy_only=False)
        # flatten() skips null lists, so its rows line up only without them.
        if not nulls.any():
            nulls = inner.reshape(len(array), width).any(axis=1)
    return nulls


def _first_bad_row(pa, array, names: bool) -> tuple[int, str] | None:
    """The first row of a batch's column the staged CSV cannot hold, and why: a null, or (for
    a column of node or relation names, ``names``) a line break, since the CSV is read a line
    at a time and a name's line break would also break every line-based file it reaches
    (exports, TSV)."""
    nulls = _nulls(pa, array)
    if nulls.any():
        return int(nulls.argmax()), "is null"
    if names:
        breaks = _line_breaks(pa, array)
        if breaks.any():
            return int(breaks.argmax()), "holds a line break, which a name may not"
    return None


def _line_breaks(pa, array) -> np.ndarray:
    """(rows,) bool: which names of a string column hold a line break (CR or LF)."""
    import pyarrow.compute as pc

    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return pc.match_substring_regex(array, "[\r\n]").to_numpy(zero_copy_only=False)


def _fields(pa, array) -> list:
    """The CSV fields of a column: itself, dictionary strings decoded (the CSV holds the names
    themselves), or one field per element of a fixed-size list."""
    if pa.types.is_dictionary(array.type):
        return [array.dictionary_decode()]
    if pa.types.is_fixed_size_list(array.type):
        values = array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), array.type.list_size)
        return [pa.array(values[:, j]) for j in range(values.shape[1])]
    return [array]


def _staged_schema(pa, schema, pairs: list[tuple[str, str]]):
    fields = []
    for role, column in pairs:
        dtype = schema.field(column).type
        if pa.types.is_dictionary(dtype):
            fields.append(pa.field(role, dtype.value_type))
        elif pa.types.is_fixed_size_list(dtype):
            fields += [pa.field(f"{column}[{j}]", dtype.value_type) for j in range(dtype.list_size)]
        else:
            fields.append(pa.field(role if role != "feat" else column, dtype))
    return pa.schema(fields)


_LINE = re.compile(r"(?P<path>\S+?):(?P<line>\d+): ")


def rename_error(message: str, staged: list[Staged], pairs: list[tuple[str, str]]) -> str:
    """The text converter's ``STAGED.csv:LINE: msg`` errors told in Parquet terms:
    ``FILE.parquet: row group G, row R: msg (column C)``."""
    by_csv = {str(s.csv): s for s in staged}
    match = _LINE.match(message)
    if match and match["path"] in by_csv:
        s = by_csv[match["path"]]
        rest = message[match.end() :]
        role = rest.split(" ", 1)[0]
        column = dict(pairs).get(role)
        named = f" (column {column!r})" if column else ""
        return f"{s.parquet}: {s.locate(int(match['line']))}: {rest}{named}"
    for s in staged:
        message = message.replace(str(s.csv), str(s.parquet))
    return message
