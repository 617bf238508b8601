"""A Strata store opened from Python: its manifest, arrays as read-only NumPy memmaps, names."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from . import _native
from .errors import StoreFormatError

#: The node splits a store may hold (``node_train`` ...).
NODE_SPLITS = ("train", "valid", "test")
#: The arrays a typed store may hold per node type (``features_t0`` ...).
TYPE_ARRAY_KINDS = ("features", "labels", *(f"node_{s}" for s in NODE_SPLITS))


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
        types = f", {len(self.node_types)} node types, {len(self.edge_types)} edge types" if self.is_typed else ""
        sizes = f"{self.num_nodes:,} nodes, {self.num_relations:,} relations{types}"
        return f"Store({str(self.path)!r}: {sizes}, edges {edges})"

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

    @property
    def format_version(self) -> int:
        """1 for a plain store, 2 when it has node/edge types or edge attributes."""
        return self.manifest["format_version"]

    @property
    def is_typed(self) -> bool:
        """Whether the store has node and edge types (format 2)."""
        return bool(self.manifest.get("node_types"))

    @property
    def node_types(self) -> list[str]:
        """Node type names in id order (empty for an untyped store)."""
        return [t["name"] for t in self.manifest.get("node_types", [])]

    @property
    def edge_types(self) -> list[tuple[str, str, str]]:
        """Edge types by id as PyG-style ``(source type, relation, destination type)`` triples."""
        names = self.node_types
        return [
            (names[e["src_type"]], e["relation"], names[e["dst_type"]]) for e in self.manifest.get("edge_types", [])
        ]

    @property
    def node_type_offsets(self) -> np.ndarray:
        """int64 array of ``len(node_types) + 1`` offsets: type ``t`` owns the global ids
        ``offsets[t] .. offsets[t+1]`` (like GraphBolt's ``node_type_offset``)."""
        types = self.manifest.get("node_types", [])
        return np.array([t["offset"] for t in types] + [self.num_nodes] if types else [], dtype=np.int64)

    def node_type_index(self, node_type: str | int) -> int:
        """Index of a node type given by name or index."""
        names = self.node_types
        if isinstance(node_type, int) and 0 <= node_type < len(names):
            return node_type
        if node_type in names:
            return names.index(node_type)
        raise StoreFormatError(f"store {self.path} has no node type {node_type!r}; it has: {names}")

    def node_type_info(self, node_type: str | int) -> dict:
        """The manifest entry of a node type: ``name``, ``offset``, ``count`` and, when present,
        ``features`` (dim, dtype), ``labels`` (num_classes) and ``node_splits``."""
        return self.manifest["node_types"][self.node_type_index(node_type)]

    def node_type_of(self, nodes) -> np.ndarray:
        """Node type index of each global id in ``nodes`` (a binary search over the offsets)."""
        if not self.is_typed:
            raise StoreFormatError(f"store {self.path} has no node types")
        nodes = np.asarray(nodes)
        if not np.issubdtype(nodes.dtype, np.integer):
            raise TypeError(f"nodes must be integer ids, got an array of {nodes.dtype}")
        outside = (nodes < 0) | (nodes >= self.num_nodes)
        if outside.any():
            raise IndexError(f"node id {nodes[outside].flat[0]} is out of range (0..{self.num_nodes})")
        return np.searchsorted(self.node_type_offsets, nodes, side="right") - 1

    def type_array(self, kind: str, node_type: str | int) -> np.ndarray | None:
        """A per-type array (``features``, ``labels``, ``node_train``, ``node_valid``,
        ``node_test``) of a node type, indexed by local id (``global - offset``; node splits
        hold local ids), or None when the type has none."""
        if kind not in TYPE_ARRAY_KINDS:
            raise ValueError(f"kind must be one of {', '.join(TYPE_ARRAY_KINDS)}, got {kind!r}")
        return self._optional(f"{kind}_t{self.node_type_index(node_type)}")

    @property
    def edge_attributes(self) -> dict:
        """``weights`` and ``times`` (bools) and ``features`` (dim, dtype) of the edges; empty
        for a store without edge attributes."""
        return dict(self.manifest.get("edge_attributes") or {})

    def edge_weights(self, split: str = "train") -> np.ndarray | None:
        """float32 weight of each edge of a split, parallel to ``edges(split)``; None when the
        store has no weights."""
        return self._optional(f"edge_weights_{self._edge_split(split)}")

    def edge_times(self, split: str = "train") -> np.ndarray | None:
        """int64 time of each edge of a split, parallel to ``edges(split)``; None when the store
        has no times."""
        return self._optional(f"edge_times_{self._edge_split(split)}")

    def edge_features(self) -> np.ndarray | None:
        """(E_train, d) features of the train edges, parallel to ``edges("train")`` (the format
        stores no features of valid and test edges); ``csr_eid``/``csc_eid`` index it."""
        return self._optional("edge_features_train")

    def topology_columns(self, direction: str) -> dict[str, np.ndarray]:
        """The per-edge columns parallel to ``csr_indices`` (``direction="csr"``) or
        ``csc_indices`` (``"csc"``) of a format-2 store: ``eid`` (row in ``edges_train``),
        and when present ``etype``, ``weights`` and ``times``."""
        if direction not in ("csr", "csc"):
            raise ValueError(f"direction must be 'csr' or 'csc', got {direction!r}")
        cols = ("eid", "etype", "weights", "times")
        return {c: self.array(f"{direction}_{c}") for c in cols if self.has(f"{direction}_{c}")}

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
        return self.array(f"edges_{self._edge_split(split)}")

    def _edge_split(self, split: str) -> str:
        """``split`` when the store has that edge split, else StoreFormatError naming those it has."""
        if split not in self.num_edges:
            have = ", ".join(self.num_edges) or "none"
            raise StoreFormatError(f"store {self.path} has no edge split {split!r}; its splits: {have}")
        return split

    def _optional(self, name: str) -> np.ndarray | None:
        """Array ``name``, or None when the store has none."""
        return self.array(name) if self.has(name) else None

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of out-neighbours (train edges)."""
        return self.array("csr_indptr"), self.array("csr_indices")

    def csc(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of in-neighbours (train edges)."""
        return self.array("csc_indptr"), self.array("csc_indices")

    @property
    def features(self) -> np.ndarray | None:
        return self._optional("features")

    @property
    def labels(self) -> np.ndarray | None:
        return self._optional("labels")

    def node_split(self, split: str) -> np.ndarray | None:
        """Node ids of a node split (``train``, ``valid``, ``test``), if the store has it."""
        if split not in NODE_SPLITS:
            raise ValueError(f"node split must be one of {', '.join(NODE_SPLITS)}, got {split!r}")
        return self._optional(f"node_{split}")

    @cached_property
    def _node_names(self):
        return _native.NameTable(str(self.path), "node_names") if self.graph["node_names"] else None

    def node_id(self, name: str, node_type: str | int | None = None) -> int | None:
        """Dense (global) id of the node named ``name`` (string-id stores), or None. In a typed
        store names are unique within a node type: ``node_type`` limits the search to one type;
        without it a name that names nodes of several types raises ValueError."""
        if self._node_names is None:
            raise StoreFormatError(f"store {self.path} has integer node ids and no name table")
        if not self.is_typed:
            if node_type is not None:
                raise StoreFormatError(f"store {self.path} has no node types")
            return self._node_names.find(name)
        types = self.manifest["node_types"]
        wanted = range(len(types)) if node_type is None else [self.node_type_index(node_type)]
        found = {}
        for t in wanted:
            node = self._node_names.find_in(name, types[t]["offset"], types[t]["offset"] + types[t]["count"])
            if node is not None:
                found[types[t]["name"]] = node
        if len(found) > 1:
            raise ValueError(f"{name!r} names nodes of several node types ({', '.join(found)}): give node_type")
        return next(iter(found.values()), None)

    @property
    def original_id(self) -> np.ndarray | None:
        """Input id of each node of a reordered store (``strata reorder``), ``(N,)``; None when
        the store keeps its input's ids."""
        return self._optional("original_id")

    def node_name(self, node: int) -> str:
        """Original name of node ``node``: its name, or its input id as text for integer-id
        stores (the id before ``strata reorder``, if the store was reordered). IndexError for
        an id outside ``[0, num_nodes)``."""
        # A bool or a float would pass the range check and be named as if it were an id.
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
            raise TypeError(f"node must be an integer id, got {node!r}")
        node = int(node)
        if not 0 <= node < self.num_nodes:
            raise IndexError(f"node id {node} is out of range (0..{self.num_nodes})")
        if self._node_names is not None:
            return self._node_names.name(node)
        original = self.original_id
        return str(int(original[node]) if original is not None else node)

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


def check_store(path: str | Path, progress=None, **options) -> dict:
    """Reads every array of the store at ``path`` and every grid built for it, and checks every
    invariant (see docs/check.md); ``options`` are the [check] section's (``max_problems``, its
    default the engine's). Returns the report: ``ok``, ``problems`` (the count),
    ``listed`` (at most ``max_problems`` problems per file, each ``{file, row, message}``),
    ``unlisted`` (counts beyond that, by file), ``files_checked``, ``bytes_read``, ``seconds``.
    A store that does not open is reported, not raised; only I/O errors raise."""
    return _native.check_store(str(path), options, progress)


def open_store(path: str | Path) -> Store:
    """Opens and validates a store."""
    return Store(path)
