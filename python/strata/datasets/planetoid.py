"""Reading the Planetoid citation datasets (Cora, CiteSeer, PubMed) in their original files.

The files ``ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index}`` are Python 2 pickles of SciPy
sparse matrices, NumPy arrays and a ``defaultdict`` adjacency list. SciPy is not needed: the
sparse matrices are rebuilt from their pickled state. Processing follows PyTorch Geometric's
``read_planetoid_data`` exactly, so stores match what PyG users know: test rows reordered by
``test.index``; CiteSeer's isolated test nodes (missing from ``tx``) get zero feature rows and
label 0 as in PyG; self-loops removed and duplicate edges merged; the standard split (the first
``len(y)`` nodes train, the next 500 validation, ``test.index`` test).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, InputNotFoundError

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


class _SparseState:
    """Stands in for ``scipy.sparse.csr_matrix`` while unpickling; keeps the CSR arrays."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def to_dense(self) -> np.ndarray:
        shape = self.__dict__.get("_shape") or self.__dict__.get("shape")
        fmt = self.__dict__.get("format", "csr")
        if fmt not in ("csr", "csc"):
            raise InputError(f"unsupported sparse format {fmt!r} in a Planetoid file")
        out = np.zeros(shape, dtype=np.float32)
        ptr, idx, data = self.indptr, self.indices, self.data
        for i in range(len(ptr) - 1):
            lo, hi = ptr[i], ptr[i + 1]
            if fmt == "csr":
                out[i, idx[lo:hi]] = data[lo:hi]
            else:
                out[idx[lo:hi], i] = data[lo:hi]
        return out


# Every global the Planetoid pickles name (Python 2's module names and NumPy 2's among them): a
# pickle may name any callable, so anything else is refused before it is looked up.
_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "defaultdict"),
    ("__builtin__", "list"),
    ("builtins", "list"),
}


class _Unpickler(pickle.Unpickler):
    """Unpickles the arrays, sparse matrices and adjacency lists of Planetoid files and nothing
    else: a global outside ``_GLOBALS`` (``os.system``, say) is an error, not a call."""

    def find_class(self, module: str, name: str):
        if module.startswith("scipy.sparse") and name in ("csr_matrix", "csc_matrix"):
            return _SparseState
        if (module, name) not in _GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a Planetoid file does not hold")
        return super().find_class(module, name)


@dataclass
class PlanetoidData:
    """A Planetoid dataset as arrays (PyG's processing)."""

    name: str
    edge_index: np.ndarray  # (2, E) int64, sorted, no self-loops or duplicates
    x: np.ndarray  # (N, D) float32
    y: np.ndarray  # (N,) int64
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray


def datasets_in(directory: Path) -> list[str]:
    """Names of the Planetoid datasets whose files are all present in ``directory``."""
    names = {p.name.split(".")[1] for p in Path(directory).glob("ind.*.x")}
    return sorted(n for n in names if all((Path(directory) / f"ind.{n}.{part}").exists() for part in PARTS))


def _load(directory: Path, name: str, part: str):
    path = Path(directory) / f"ind.{name}.{part}"
    if not path.exists():
        raise InputNotFoundError(f"{path}: missing Planetoid file (need ind.{name}.{{{','.join(PARTS)}}})")
    if part == "test.index":
        try:
            return np.array([int(line) for line in path.read_text().split()], dtype=np.int64)
        except (ValueError, OverflowError) as e:
            raise InputError(f"{path}: expected one integer per line ({e})") from None
    try:
        with path.open("rb") as f:
            obj = _Unpickler(f, encoding="latin1").load()
        return obj.to_dense() if isinstance(obj, _SparseState) else obj
    except (
        pickle.UnpicklingError,
        EOFError,
        MemoryError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        OverflowError,
    ) as e:
        # A damaged pickle fails in the unpickler (a huge length: MemoryError) or, with its arrays
        # inconsistent, in to_dense.
        raise InputError(f"{path}: not a readable Planetoid pickle ({e})") from None


def read_planetoid(directory: Path, name: str) -> PlanetoidData:
    """Reads dataset ``name`` (``cora``, ``citeseer``, ``pubmed``) from ``directory``."""
    name = name.lower()
    # ``x`` (the labelled rows) is a prefix of ``allx``: PyG does not read it either.
    parts = [_load(directory, name, p) for p in PARTS[1:]]
    try:
        return _process(directory, name, *parts)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as e:
        # Each file read, but their shapes, ids or types do not fit together (damaged files).
        raise InputError(f"{directory}/ind.{name}.*: the Planetoid files do not agree ({e})") from None


def _process(directory: Path, name: str, tx, allx, y, ty, ally, graph, test_index) -> PlanetoidData:
    """PyG's processing of the loaded parts."""
    train_idx = np.arange(len(y), dtype=np.int64)
    val_idx = np.arange(len(y), len(y) + 500, dtype=np.int64)
    sorted_test = np.sort(test_index)
    if name == "citeseer":
        # Isolated test nodes have no rows in tx/ty: pad them with zeros at their positions.
        span = sorted_test[-1] - sorted_test[0] + 1
        tx_ext = np.zeros((span, tx.shape[1]), dtype=np.float32)
        tx_ext[sorted_test - sorted_test[0]] = tx
        ty_ext = np.zeros((span, np.asarray(ty).shape[1]), dtype=np.asarray(ty).dtype)
        ty_ext[sorted_test - sorted_test[0]] = ty
        tx, ty = tx_ext, ty_ext
    features = np.concatenate([np.asarray(allx, dtype=np.float32), np.asarray(tx, dtype=np.float32)])
    labels_onehot = np.concatenate([np.asarray(ally), np.asarray(ty)])
    n = features.shape[0]
    if test_index.size and (test_index.min() < 0 or test_index.max() >= n):
        bad = test_index.min() if test_index.min() < 0 else test_index.max()
        raise InputError(f"{directory}/ind.{name}.test.index: node {bad} is not in [0, {n}) (the nodes of allx and tx)")
    features[test_index] = features[sorted_test]
    labels_onehot[test_index] = labels_onehot[sorted_test]
    labels = labels_onehot.argmax(axis=1).astype(np.int64)
    try:
        rows = np.concatenate([np.full(len(v), k, dtype=np.int64) for k, v in graph.items()])
        cols = np.concatenate([np.asarray(v, dtype=np.int64) for v in graph.values()])
    except OverflowError as e:
        raise InputError(f"{directory}/ind.{name}.graph: a node id is not an int64 ({e})") from None
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    if rows.size and min(rows.min(), cols.min()) < 0:
        raise InputError(f"{directory}/ind.{name}.graph: node id {min(rows.min(), cols.min())} is negative")
    if rows.size and max(rows.max(), cols.max()) >= n:
        raise InputError(f"{directory}/ind.{name}.graph: node id {max(rows.max(), cols.max())} >= {n} nodes")
    key = np.unique(rows * n + cols)
    edge_index = np.stack([key // n, key % n])
    return PlanetoidData(name, edge_index, features, labels, train_idx, val_idx, sorted_test)
