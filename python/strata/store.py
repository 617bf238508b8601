"""A Strata store opened from Python: its manifest, arrays as read-only NumPy memmaps, names."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from . import _native
from .errors import StoreFormatError


class Store:
    """A validated store directory (see docs/formats.md).

    Opening checks the format version and every array's dtype, shape and size; arrays are then
    memory-mapped read-only, so nothing is loaded until it is used.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest: dict = _native.open_store(str(self.path))

    def __repr__(self) -> str:
        edges = ", ".join(f"{k}={v:,}" for k, v in self.num_edges.items())
        return f"Store({str(self.path)!r}: {self.num_nodes:,} nodes, {self.num_relations:,} relations, edges {edges})"

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def graph(self) -> dict:
        return self.manifest["graph"]

    @property
    def num_nodes(self) -> int:
        return self.graph["num_nodes"]

    @property
    def num_relations(self) -> int:
        """Number of relation types (0 when edges have no relation column)."""
        return self.graph["num_relations"]

    @property
    def num_edges(self) -> dict[str, int]:
        """Edges per split."""
        return dict(self.graph["num_edges"])

    def has(self, name: str) -> bool:
        return name in self.manifest["arrays"]

    def array(self, name: str) -> np.ndarray:
        """Array ``name`` as a read-only memmap."""
        info = self.manifest["arrays"].get(name)
        if info is None:
            raise StoreFormatError(
                f"store {self.path} has no '{name}' array; it has: " + ", ".join(sorted(self.manifest["arrays"]))
            )
        return np.load(self.path / info["file"], mmap_mode="r")

    def checked(self, name: str, field: str, lo: int, hi: int, column: int | None = None) -> np.ndarray:
        """Array ``name`` (or one ``column`` of it; a read-only memmap) with every value checked
        against ``[lo, hi)``: one out of range raises StoreFormatError naming the file, the row, the
        value (called ``field``) and the range, as the native engines do for the arrays they read."""
        arr = self.array(name)
        if column is not None:
            arr = arr[:, column]
        if arr.size and (arr.min() < lo or arr.max() >= hi):
            row = int(np.flatnonzero((arr < lo) | (arr >= hi))[0])
            file = self.manifest["arrays"][name]["file"]
            raise StoreFormatError(
                f"store {self.path}: {file} row {row}: {field} {arr[row]} is out of range [{lo}, {hi})"
            )
        return arr

    def edges(self, split: str = "train") -> np.ndarray:
        """Edges of a split, shape (E, 2) as (src, dst) or (E, 3) as (src, rel, dst)."""
        return self.array(f"edges_{split}")

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of out-neighbours (train edges)."""
        return self.array("csr_indptr"), self.array("csr_indices")

    def csc(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of in-neighbours (train edges)."""
        return self.array("csc_indptr"), self.array("csc_indices")

    @property
    def features(self) -> np.ndarray | None:
        return self.array("features") if self.has("features") else None

    @property
    def labels(self) -> np.ndarray | None:
        return self.array("labels") if self.has("labels") else None

    def node_split(self, split: str) -> np.ndarray | None:
        """Node ids of a node split (``train``, ``valid``, ``test``), if the store has it."""
        return self.array(f"node_{split}") if self.has(f"node_{split}") else None

    @cached_property
    def _node_names(self):
        return _native.NameTable(str(self.path), "node_names") if self.graph["node_names"] else None

    def node_id(self, name: str) -> int | None:
        """Dense id of the node named ``name`` (string-id stores), or None."""
        if self._node_names is None:
            raise StoreFormatError(f"store {self.path} has integer node ids and no name table")
        return self._node_names.find(name)

    def node_name(self, node: int) -> str:
        """Original name of node ``node`` (its id as text for integer-id stores)."""
        return self._node_names.name(node) if self._node_names is not None else str(node)

    @cached_property
    def relation_names(self) -> list[str]:
        """Relation names by id (``str(id)`` for integer relation ids)."""
        if not self.graph["relation_names"]:
            return [str(i) for i in range(self.num_relations)]
        table = _native.NameTable(str(self.path), "relation_names")
        return [table.name(i) for i in range(len(table))]

    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk per file."""
        return _native.disk_usage(str(self.path))


def check_store(path: str | Path, max_per_file: int = 20, progress=None) -> dict:
    """Reads every array of the store at ``path`` and every grid built for it, and checks every
    invariant (see docs/check.md). Returns the report: ``ok``, ``problems`` (the count),
    ``listed`` (at most ``max_per_file`` problems per file, each ``{file, row, message}``),
    ``unlisted`` (counts beyond that, by file), ``files_checked``, ``bytes_read``, ``seconds``.
    A store that does not open is reported, not raised; only I/O errors raise."""
    return _native.check_store(str(path), {"max_problems": max_per_file}, progress)


def open_store(path: str | Path) -> Store:
    """Opens and validates a store."""
    return Store(path)
