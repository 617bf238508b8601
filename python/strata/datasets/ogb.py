"""OGB node-property datasets staged as NumPy arrays for the converter, in bounded memory.

An extracted OGB zip holds either CSV files (ogbn-arxiv, ogbn-products)::

    raw/edge.csv.gz           one "src,dst" line per edge
    raw/node-feat.csv.gz      one line of comma-separated floats per node
    raw/node-label.csv.gz     one label per node
    raw/num-node-list.csv.gz  raw/num-edge-list.csv.gz   the counts
    split/<type>/{train,valid,test}.csv.gz                node ids

or NumPy archives (ogbn-papers100M): ``raw/data.npz`` with ``edge_index`` (2, E), ``node_feat``
and ``num_nodes_list``, and ``raw/node-label.npz`` with ``node_label`` (float, NaN where unlabelled),
with the same split files. Both are copied into ``.npy`` files chunk by chunk: CSV rows are parsed
a block of lines at a time and ``.npz`` members (zip entries holding ``.npy`` files) are streamed
after their header, so no array is ever held whole.

A heterogeneous dataset (ogbn-mag) is laid out as OGB's ``read_csv_heterograph_raw`` reads it::

    raw/num-node-dict.csv.gz                 header of node types, one line of counts
    raw/triplet-type-list.csv.gz             one "src_type,relation,dst_type" line per edge type
    raw/relations/SRC___REL___DST/edge.csv.gz          "src,dst" local ids per line
    raw/relations/SRC___REL___DST/num-edge-list.csv.gz the count
    raw/relations/SRC___REL___DST/edge_time.csv.gz     (or edge_year; optional) time per edge
    raw/node-feat/TYPE/node-feat.csv.gz      features of that type's nodes
    raw/nodetype-has-label.csv.gz            header of node types, one line of True/False
    raw/node-label/TYPE/node-label.csv.gz    labels
    split/<kind>/nodetype-has-split.csv.gz   split/<kind>/TYPE/{train,valid,test}.csv.gz

Types are taken in OGB's (sorted) order and staged as a typed NumPy directory
(:mod:`.hetero`). Not staged: ``edge_reltype`` (the edge type itself), ``node_year`` and
``edge-feat`` files (the store has no per-type node attributes beyond features, and no
converter writes edge features yet).
"""

from __future__ import annotations

import gzip
import io
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from ..errors import InputError, InputNotFoundError
from . import hetero
from .download import no_progress

ProgressFn = Callable[..., bool]
SPLITS = ("train", "valid", "test")


@dataclass
class Staged:
    """The ``.npy`` files written for one OGB dataset, by converter role."""

    edges: Path
    #: ``rows`` for (E, 2) edges from CSV, ``columns`` for OGB's (2, E) ``edge_index``.
    layout: Literal["rows", "columns"]
    num_nodes: int
    features: Path | None = None
    labels: Path | None = None
    #: ``node_train`` / ``node_valid`` / ``node_test`` -> ids file.
    splits: dict[str, Path] = field(default_factory=dict)


class _NpyWriter:
    """Appends C-order chunks to a new ``.npy`` file whose dtype and shape are known upfront.

    Plain appends (rather than a memmap) keep the resident memory at one chunk.
    """

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...], source: Path):
        self.path, self.dtype, self.shape, self.source = path, np.dtype(dtype), shape, source
        self.expected = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self.written = 0
        self.file = path.open("wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self.file, header)

    def write(self, values: np.ndarray) -> None:
        self.write_bytes(np.ascontiguousarray(values, dtype=self.dtype))

    def write_bytes(self, data) -> None:
        n = memoryview(data).nbytes
        if self.written + n > self.expected:
            raise InputError(f"{self.source}: holds more than the {self._what()} it announces")
        self.file.write(data)
        self.written += n

    def close(self) -> None:
        self.file.close()
        if self.written != self.expected:
            found = self.written // max(self.dtype.itemsize, 1)
            raise InputError(f"{self.source}: expected {self._what()}, found {found:,} values")

    def _what(self) -> str:
        return f"shape {self.shape} ({self.expected // self.dtype.itemsize:,} values)"

    def __enter__(self) -> _NpyWriter:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.file.close()


def find_root(raw: Path) -> Path:
    """The extracted dataset folder under ``raw`` (the one holding ``raw/num-node-list.csv.gz``,
    ``raw/data.npz`` or, for a heterogeneous dataset, ``raw/num-node-dict.csv.gz``)."""
    found = sorted(
        {
            p.parent.parent
            for pattern in ("num-node-list.csv.gz", "data.npz", "num-node-dict.csv.gz")
            for p in raw.rglob(pattern)
            if p.parent.name == "raw"
        }
    )
    if not found:
        raise InputNotFoundError(f"{raw}: no OGB dataset (raw/num-node-list.csv.gz or raw/data.npz) in it")
    if len(found) > 1:
        raise InputError(f"{raw}: holds several OGB datasets ({', '.join(map(str, found))}); keep one")
    return found[0]


def stage(root: Path, staging: Path, chunk_bytes: int, progress: ProgressFn | None = None) -> Staged:
    """Writes the edges, features, labels and node splits of the OGB dataset at ``root`` as ``.npy``
    files in ``staging``, reading ``chunk_bytes`` of input (decompressed) at a time."""
    progress = progress or no_progress
    raw = root / "raw"
    if (raw / "data.npz").exists():
        staged = _stage_npz(raw, staging, chunk_bytes, progress)
    else:
        staged = _stage_csv(raw, staging, chunk_bytes, progress)
    staged.splits = _stage_splits(root / "split", staging, staged.num_nodes)
    return staged


def _require(path: Path) -> Path:
    if not path.exists():
        raise InputNotFoundError(f"{path}: missing from the OGB dataset")
    return path


def _small_csv(path: Path) -> np.ndarray:
    """A small integer CSV.gz (counts, split ids) read whole."""
    try:
        return np.loadtxt(_require(path), dtype=np.int64, delimiter=",", ndmin=1)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{path}: expected one integer per line ({e})") from None


def _csv_blocks(path: Path, chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(number of the first line, whole lines) of a CSV.gz, about ``chunk_bytes`` at a time."""
    carry, line = b"", 1
    try:
        with gzip.open(_require(path), "rb") as f:
            while data := f.read(chunk_bytes):
                data = carry + data
                cut = data.rfind(b"\n") + 1
                block, carry = data[:cut], data[cut:]
                if block.strip():
                    yield line, block
                    line += block.count(b"\n")
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: not a readable gzip file ({e})") from None
    if carry.strip():
        yield line, carry


def _parse(block: bytes, line: int, path: Path, dtype: type, columns: int) -> np.ndarray:
    try:
        values = np.loadtxt(io.BytesIO(block), delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as e:
        raise InputError(f"{path}: in the lines from {line:,}: {e}") from None
    if values.shape[1] != columns:
        raise InputError(f"{path}: line {line:,} has {values.shape[1]} values; expected {columns}")
    return values


def _labels_as_int(values: np.ndarray) -> np.ndarray:
    """Class ids as int32, with -1 where a float label is NaN (unlabelled)."""
    values = values.reshape(-1)
    if values.dtype.kind == "f":
        return np.where(np.isnan(values), -1, values).astype(np.int32)
    return values.astype(np.int32)


def _id_dtype(num_nodes: int) -> np.dtype:
    return np.dtype(np.int32 if num_nodes < 2**31 else np.int64)


def is_hetero(root: Path) -> bool:
    """Whether the OGB dataset at ``root`` is heterogeneous (``raw/num-node-dict.csv.gz``)."""
    return (root / "raw" / "num-node-dict.csv.gz").exists()


def _type_row(path: Path) -> dict[str, str]:
    """A CSV.gz of one header line (node types) and one line of values, as OGB writes a one-row
    pandas frame: {type: value}."""
    try:
        with gzip.open(_require(path), "rt") as f:
            lines = [line.rstrip("\r\n") for line in f if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise InputError(f"{path}: not a readable gzip text file ({e})") from None
    if len(lines) != 2 or lines[0].count(",") != lines[1].count(","):
        raise InputError(f"{path}: expected a header line of node types and one line of values, one per type")
    return dict(zip(lines[0].split(","), lines[1].split(","), strict=True))


def stage_hetero(root: Path, staging: Path, chunk_bytes: int, progress: ProgressFn | None = None) -> Path:
    """Writes the heterogeneous OGB dataset at ``root`` (layout in the module doc) into
    ``staging`` as a typed NumPy directory, reading ``chunk_bytes`` of input at a time; returns
    ``staging``."""
    progress = progress or no_progress
    raw = root / "raw"
    counts_file = raw / "num-node-dict.csv.gz"
    counts = {}
    for name, value in sorted(_type_row(counts_file).items()):
        if not value.strip().isdigit():
            raise InputError(
                f"{counts_file}: node type {name[:40]!r} has count {value[:40]!r}, not a non-negative integer"
            )
        counts[name] = int(value)
    triplets_file = raw / "triplet-type-list.csv.gz"
    triplets = []
    for line, block in _csv_blocks(triplets_file, chunk_bytes):
        for i, row in enumerate(block.decode(errors="replace").splitlines()):
            if not row.strip():
                continue
            parts = tuple(row.strip().split(","))
            if len(parts) != 3 or not all(parts):
                raise InputError(f"{triplets_file}: line {line + i}: expected src_type,relation,dst_type")
            for end in (parts[0], parts[2]):
                if end not in counts:
                    raise InputError(
                        f"{triplets_file}: line {line + i}: '{end}' is not a node type of {counts_file.name} "
                        f"({', '.join(counts)})"
                    )
            triplets.append(parts)
    triplets.sort()
    hetero.write_types(staging, counts, triplets)
    relations = [raw / "relations" / "___".join(t) for t in triplets]
    time_names = ("edge_time.csv.gz", "edge_year.csv.gz")
    times = [next((d / n for n in time_names if (d / n).exists()), None) for d in relations]
    if any(times) and not all(times):
        missing = relations[times.index(None)]
        raise InputError(f"{missing}: no {' or '.join(time_names)} while other edge types have times: all or none")
    id_dtype = _id_dtype(max(counts.values(), default=0))
    for k, ((src, _, dst), folder, time_file) in enumerate(zip(triplets, relations, times, strict=True)):
        num_edges = int(_small_csv(folder / "num-edge-list.csv.gz").sum())
        bounds = (counts[src], counts[dst])
        _csv_to_npy(folder / "edge.csv.gz", staging / f"edges_e{k}.npy", (num_edges, 2), np.int64, id_dtype,
                    chunk_bytes, progress, bound=bounds)  # fmt: skip
        if time_file is not None:
            _csv_to_npy(time_file, staging / f"edge_times_e{k}.npy", (num_edges,), np.int64, np.int64, chunk_bytes,
                        progress)  # fmt: skip
    labelled = _labelled_types(raw, counts)
    for i, (name, count) in enumerate(counts.items()):
        features = raw / "node-feat" / name / "node-feat.csv.gz"
        if features.exists():
            with gzip.open(features, "rb") as f:
                dim = f.readline().count(b",") + 1
            _csv_to_npy(features, staging / f"features_t{i}.npy", (count, dim), np.float64, np.float32, chunk_bytes,
                        progress)  # fmt: skip
        if name in labelled:
            _csv_to_npy(raw / "node-label" / name / "node-label.csv.gz", staging / f"labels_t{i}.npy", (count,),
                        np.float64, np.int32, chunk_bytes, progress, convert=_labels_as_int)  # fmt: skip
    for name, per_split in _hetero_splits(root / "split", counts).items():
        i = list(counts).index(name)
        for split, ids in per_split.items():
            np.save(staging / f"node_{split}_t{i}.npy", ids)
    return staging


def _labelled_types(raw: Path, counts: dict[str, int]) -> list[str]:
    """Node types with labels: those marked True in ``nodetype-has-label.csv.gz`` (or, without
    that file, those with a ``node-label/TYPE`` folder)."""
    flags = raw / "nodetype-has-label.csv.gz"
    if flags.exists():
        marked = [name for name, v in _type_row(flags).items() if v.strip().lower() in ("true", "1")]
    else:
        marked = [p.name for p in (raw / "node-label").glob("*") if p.is_dir()]
    for name in marked:
        if name not in counts:
            raise InputError(f"{flags}: '{name}' is not a node type ({', '.join(counts)})")
    return marked


def _hetero_splits(split_dir: Path, counts: dict[str, int]) -> dict[str, dict[str, np.ndarray]]:
    """``split/<kind>/TYPE/{train,valid,test}.csv.gz`` as local id arrays per node type."""
    kinds = sorted(p for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if not kinds:
        return {}
    if len(kinds) > 1:
        raise InputError(f"{split_dir}: several split types ({', '.join(p.name for p in kinds)}); keep one")
    flags = kinds[0] / "nodetype-has-split.csv.gz"
    if flags.exists():
        names = [name for name, v in _type_row(flags).items() if v.strip().lower() in ("true", "1")]
    else:
        names = sorted(p.name for p in kinds[0].iterdir() if p.is_dir())
    out = {}
    for name in names:
        if name not in counts:
            raise InputError(f"{kinds[0]}: split for '{name}', which is not a node type ({', '.join(counts)})")
        out[name] = {}
        for split in SPLITS:
            source = kinds[0] / name / f"{split}.csv.gz"
            ids = _small_csv(source)
            if ids.size and (ids.min() < 0 or ids.max() >= counts[name]):
                raise InputError(f"{source}: a node id is outside [0, {counts[name]:,}) of node type '{name}'")
            out[name][split] = ids
    return out


def _stage_csv(raw: Path, staging: Path, chunk_bytes: int, progress: ProgressFn) -> Staged:
    num_nodes = int(_small_csv(raw / "num-node-list.csv.gz").sum())
    num_edges = int(_small_csv(raw / "num-edge-list.csv.gz").sum())
    staged = Staged(staging / "edges.npy", "rows", num_nodes)
    _csv_to_npy(
        raw / "edge.csv.gz",
        staged.edges,
        (num_edges, 2),
        np.int64,
        _id_dtype(num_nodes),
        chunk_bytes,
        progress,
        bound=num_nodes,
    )
    features = raw / "node-feat.csv.gz"
    if features.exists():
        with gzip.open(features, "rb") as f:
            dim = f.readline().count(b",") + 1
        staged.features = staging / "features.npy"
        # Parsed as float64 and rounded once to float32, as OGB's pandas loader does.
        _csv_to_npy(features, staged.features, (num_nodes, dim), np.float64, np.float32, chunk_bytes, progress)
    labels = raw / "node-label.csv.gz"
    if labels.exists():
        staged.labels = staging / "labels.npy"
        _csv_to_npy(
            labels, staged.labels, (num_nodes,), np.float64, np.int32, chunk_bytes, progress, convert=_labels_as_int
        )
    return staged


def _csv_to_npy(
    source: Path,
    dest: Path,
    shape: tuple[int, ...],
    parse_dtype: type,
    dtype: type,
    chunk_bytes: int,
    progress: ProgressFn,
    *,
    bound: int | tuple[int, ...] | None = None,
    convert: Callable[[np.ndarray], np.ndarray] | None = None,
) -> None:
    """Parses a CSV.gz a block of lines at a time into a new ``.npy`` of ``shape`` and ``dtype``.

    ``bound``: every value must lie in ``[0, bound)`` (node ids), or each column in its own
    range; ``convert`` transforms each block.
    """
    columns = shape[1] if len(shape) == 2 else 1
    progress("stage", f"stage {source.name.split('.')[0]}", 0, shape[0])
    rows = 0
    with _NpyWriter(dest, np.dtype(dtype), shape, source) as out:
        for line, block in _csv_blocks(source, chunk_bytes):
            values = _parse(block, line, source, parse_dtype, columns)
            if bound is not None and values.size:
                limits = np.broadcast_to(np.asarray(bound), values.shape[1:])
                bad = (values < 0) | (values >= limits)
                if bad.any():
                    row, col = (int(x[0]) for x in np.nonzero(bad))
                    value, limit = values[row, col], int(limits[col])
                    raise InputError(f"{source}: line {line + row:,}: node id {value} is outside [0, {limit:,})")
            out.write(convert(values) if convert else values)
            rows += len(values)
            progress("update", rows, 0)


def _stage_npz(raw: Path, staging: Path, chunk_bytes: int, progress: ProgressFn) -> Staged:
    data = raw / "data.npz"
    with _open_npz(data) as z:
        with _member(z, data, "num_nodes_list") as (src, shape, dtype):
            num_nodes = int(np.frombuffer(_read_exact(src, _nbytes(shape, dtype), data), dtype).sum())
        staged = Staged(staging / "edges.npy", "columns", num_nodes)
        with _member(z, data, "edge_index") as (src, shape, dtype):
            if len(shape) != 2 or shape[0] != 2 or dtype.kind not in "iu":
                raise InputError(f"{data}: edge_index must be integers of shape (2, E), found {dtype} {shape}")
            _copy_member(src, staged.edges, dtype, shape, data, chunk_bytes, "stage edges", progress)
        if "node_feat.npy" in z.namelist():
            staged.features = staging / "features.npy"
            with _member(z, data, "node_feat") as (src, shape, dtype):
                if len(shape) != 2 or shape[0] != num_nodes:
                    raise InputError(f"{data}: node_feat must have shape ({num_nodes:,}, dim), found {shape}")
                _copy_member(src, staged.features, dtype, shape, data, chunk_bytes, "stage features", progress)
    labels = raw / "node-label.npz"
    if labels.exists():
        staged.labels = staging / "labels.npy"
        with _open_npz(labels) as z, _member(z, labels, "node_label") as (src, shape, dtype):
            if not shape or shape[0] != num_nodes or int(np.prod(shape)) != num_nodes:
                raise InputError(f"{labels}: node_label must have one value per node ({num_nodes:,}), found {shape}")
            progress("stage", "stage labels", 0, num_nodes)
            per_chunk = max(chunk_bytes // dtype.itemsize, 1)
            with _NpyWriter(staged.labels, np.dtype(np.int32), (num_nodes,), labels) as out:
                for start in range(0, num_nodes, per_chunk):
                    count = min(per_chunk, num_nodes - start)
                    chunk = np.frombuffer(_read_exact(src, count * dtype.itemsize, labels), dtype)
                    out.write(_labels_as_int(chunk))
                    progress("update", start + count, 0)
    return staged


def _open_npz(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: not a readable .npz file ({e})") from None


@contextmanager
def _member(z: zipfile.ZipFile, path: Path, key: str) -> Iterator[tuple[BinaryIO, tuple[int, ...], np.dtype]]:
    """The ``.npy`` member ``key`` of an open ``.npz``: its stream positioned at the data, its shape
    and its dtype."""
    name = f"{key}.npy"
    if name not in z.namelist():
        arrays = ", ".join(n.removesuffix(".npy") for n in z.namelist())
        raise InputError(f"{path}: no array '{key}' (it has: {arrays})")
    with z.open(name) as src:
        try:
            version = np.lib.format.read_magic(src)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(src)
        except ValueError as e:
            raise InputError(f"{path}: member {name} is not a .npy array ({e})") from None
        if dtype.hasobject or (fortran and len(shape) > 1):
            order = "Fortran" if fortran else "C"
            raise InputError(f"{path}: {key} must be a plain C-order numeric array, found {dtype} {order}-order")
        yield src, tuple(shape), dtype


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _read_exact(src: BinaryIO, n: int, path: Path) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise InputError(f"{path}: an array ends early (truncated file?)")
    return data


def _copy_member(
    src: BinaryIO,
    dest: Path,
    dtype: np.dtype,
    shape: tuple[int, ...],
    path: Path,
    chunk_bytes: int,
    stage: str,
    progress: ProgressFn,
) -> None:
    """Copies the data of an ``.npz`` member into a new ``.npy`` file, ``chunk_bytes`` at a time."""
    total = _nbytes(shape, dtype)
    progress("stage", stage, total, 0)
    with _NpyWriter(dest, dtype, shape, path) as out:
        while out.written < total:
            out.write_bytes(_read_exact(src, min(chunk_bytes, total - out.written), path))
            progress("update", 0, out.written)


def _stage_splits(split_dir: Path, staging: Path, num_nodes: int) -> dict[str, Path]:
    """``split/<type>/{train,valid,test}.csv.gz`` as id arrays; OGB ships one split type per dataset."""
    kinds = sorted(p for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if not kinds:
        return {}
    if len(kinds) > 1:
        raise InputError(f"{split_dir}: several split types ({', '.join(p.name for p in kinds)}); keep one")
    out = {}
    for split in SPLITS:
        source = kinds[0] / f"{split}.csv.gz"
        ids = _small_csv(source)
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            raise InputError(f"{source}: a node id is outside [0, {num_nodes:,})")
        out[f"node_{split}"] = staging / f"node_{split}.npy"
        np.save(out[f"node_{split}"], ids)
    return out
