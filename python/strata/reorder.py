"""Locality-aware node orders (``strata reorder``): renumbers the nodes of a finished store so that
nodes sampled together get nearby ids, and therefore share feature pages, and writes the
renumbered store with every node-indexed array permuted consistently.

Orders (each a pure function of the topology; ties go to the lower old id):

- ``degree``: by decreasing degree (out + in). The rows most often sampled share pages.
- ``bfs``: breadth-first from the highest-degree node of each connected component (components
  taken in order of their highest degree), neighbours in adjacency order: a node's neighbours get
  ids close to each other.
- ``rcm``: reverse Cuthill-McKee: breadth-first from a lowest-degree node of each component,
  each node's new neighbours in increasing degree, the whole order reversed; it minimises the
  bandwidth (largest ``|new(u) - new(v)|`` over edges) heuristically.
- ``glist``: GLIST's Alg. 2 vertex re-ordering, the serve engine's (``strata_serve::reorder``,
  its default parameters): chained centres, each followed by its in-neighbours, over the CSC.
- ``community``: communities by label propagation (Raghavan et al.; ``COMMUNITY_ROUNDS``
  synchronous rounds, each node taking the most frequent label among itself and its neighbours,
  ties broken by a hash of the label and the round), laid out one after another, largest first,
  each by decreasing degree: a node's neighbours, mostly in its community, get nearby ids (the
  idea of Rabbit order, without its hierarchy).

Memory: the order is computed from the undirected adjacency, read into memory: the CSR of a
symmetrized store, else CSR and CSC merged (``8 N`` bytes plus one id per CSR and CSC entry).
The order's own arrays are about ``41 N`` bytes (degree, roots, order, inverse, visited flags),
plus breadth-first steps of at most ``EXPAND`` adjacency entries (~40 MB). Writing then holds one
``indices`` array in memory while its segments are permuted, and streams everything else in
chunks of ``CHUNK_ROWS`` rows: features and labels are gathered through the I/O engine (O_DIRECT)
and every output is written sequentially, so the feature matrix's size does not matter.

The new store keeps the input's ids visible: ``original_id`` (int, ``(N,)``) is the input id of
each new node, and ``Store.node_name`` reports it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from . import _native
from .errors import ConfigError, StoreExistsError, StoreFormatError
from .io import read_rows
from .store import Store

ORDERS = ("degree", "bfs", "rcm", "glist", "community")

#: Label propagation rounds of the ``community`` order.
COMMUNITY_ROUNDS = 5

#: Rows (or nodes' topology segments) permuted per chunk.
CHUNK_ROWS = 1 << 16

#: Adjacency entries expanded per breadth-first step.
EXPAND = 1 << 20

#: The header block of every store array: data starts at this byte (docs/formats.md).
DATA_OFFSET = 4096


def undirected(store: Store) -> tuple[np.ndarray, np.ndarray]:
    """The undirected adjacency, in memory, as ``(indptr (N+1,) int64, indices (T',) id dtype)``:
    the CSR when the store is symmetrized, else each node's out-neighbours followed by its
    in-neighbours."""
    indptr, indices = store.csr()
    if store.graph["symmetrized"]:
        return np.asarray(indptr), np.array(indices)
    cindptr, cindices = store.csc()
    out_deg, in_deg = np.diff(indptr), np.diff(cindptr)
    both = np.concatenate(([0], np.cumsum(out_deg + in_deg)))
    merged = np.empty(int(both[-1]), dtype=indices.dtype)
    merged[_positions(both[:-1], out_deg)] = indices
    merged[_positions(both[:-1] + out_deg, in_deg)] = cindices
    return both, merged


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ranges ``[starts[i], starts[i] + lengths[i])``, as one int64 array."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def compute_order(indptr: np.ndarray, indices: np.ndarray, order: str) -> np.ndarray:
    """The new order of the nodes of the undirected graph ``(indptr (N+1,), indices (T,))``:
    ``result[new] = old`` (int64, ``(N,)``, a permutation of ``0..N-1``)."""
    degree = np.diff(indptr)
    if order == "degree":
        return np.argsort(-degree, kind="stable")
    if order == "bfs":
        return _traverse(indptr, indices, degree, roots=np.argsort(-degree, kind="stable"), by_degree=False)
    if order == "rcm":
        cm = _traverse(indptr, indices, degree, roots=np.argsort(degree, kind="stable"), by_degree=True)
        return cm[::-1].copy()
    if order == "community":
        label = communities(indptr, indices, COMMUNITY_ROUNDS)
        size = np.bincount(label, minlength=degree.size)
        ids = np.arange(degree.size)
        return np.lexsort((ids, -degree, label, -size[label]))
    raise ConfigError(f"reorder: compute_order computes degree, bfs, rcm and community, not {order!r}")


def communities(indptr: np.ndarray, indices: np.ndarray, rounds: int) -> np.ndarray:
    """Label propagation over the undirected graph ``(indptr (N+1,), indices (T,))``: every node
    starts with its own id as label; each of ``rounds`` synchronous rounds gives every node the
    most frequent label among itself and its neighbours (a multigraph's parallel edges count),
    ties going to the smallest hash of (label, round), a deterministic stand-in for the random
    tie-break of Raghavan et al. (ties to the smallest label would spread the lowest ids over
    whole components). Nodes are taken in slices of at most ``EXPAND`` adjacency entries, so the
    work arrays stay bounded. Returns the labels, int64 ``(N,)``, each a node id."""
    n = indptr.size - 1
    label = np.arange(n, dtype=np.int64)
    starts = np.asarray(indptr, dtype=np.int64)
    for r in range(rounds):
        new = np.empty_like(label)
        a = 0
        while a < n:
            b = max(a + 1, int(np.searchsorted(starts, starts[a] + EXPAND, side="right")) - 1)
            # At most EXPAND nodes too, so that `owner * n + label` stays below 2^52.
            b = min(b, n, a + EXPAND)
            lengths = np.diff(starts[a : b + 1])
            owner = np.concatenate([np.repeat(np.arange(b - a), lengths), np.arange(b - a)])
            seen = np.concatenate([label[np.asarray(indices[starts[a] : starts[b]], dtype=np.int64)], label[a:b]])
            keys, counts = np.unique(owner * n + seen, return_counts=True)
            own, lab = keys // n, keys % n
            best = np.lexsort((_mix(lab, r), -counts, own))
            first = np.flatnonzero(np.diff(own[best], prepend=-1))
            new[a:b] = lab[best[first]]
            a = b
        label = new
    return label


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """A 64-bit hash of each value and ``salt`` (SplitMix64's finaliser), as uint64."""
    z = x.astype(np.uint64) + np.uint64((salt + 1) * 0x9E3779B97F4A7C15 % (1 << 64))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _traverse(indptr, indices, degree, roots: np.ndarray, by_degree: bool) -> np.ndarray:
    """Breadth-first order of every node: components one after another, each from the first
    unvisited node of ``roots``. Within a level, new nodes follow their earliest-discovered
    neighbour; among one node's new neighbours, adjacency order, or increasing degree (then id)
    when ``by_degree`` (Cuthill-McKee). A level is expanded with array operations, in steps of
    at most ``EXPAND`` adjacency entries so that the work arrays stay bounded."""
    n = degree.size
    seen = np.zeros(n, dtype=bool)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    next_root = 0
    while filled < n:
        while seen[roots[next_root]]:
            next_root += 1
        frontier = roots[next_root : next_root + 1]
        seen[frontier] = True
        out[filled] = frontier[0]
        filled += 1
        while frontier.size:
            level_start = filled
            ends = np.cumsum(degree[frontier])
            a = 0
            while a < frontier.size:
                done = int(ends[a - 1]) if a else 0
                b = max(a + 1, int(np.searchsorted(ends, done + EXPAND, side="right")))
                part = frontier[a:b]
                lengths = degree[part]
                nb = np.asarray(indices[_positions(indptr[part], lengths)], dtype=np.int64)
                parent = np.repeat(np.arange(part.size, dtype=np.int64), lengths)
                new = ~seen[nb]
                nb, parent = nb[new], parent[new]
                if by_degree:
                    nb = nb[np.lexsort((nb, degree[nb], parent))]
                _, first = np.unique(nb, return_index=True)
                found = nb[np.sort(first)]
                seen[found] = True
                out[filled : filled + found.size] = found
                filled += found.size
                a = b
            frontier = out[level_start:filled]
    return out


def _open_input(path: Path) -> Store:
    store = Store(path)
    if store.format_version >= 2:
        raise StoreFormatError(
            f"reorder: {path} is a format {store.format_version} store (node or edge types, edge weights, "
            "times or features); reordering supports plain (format 1) stores only"
        )
    if store.graph["node_names"]:
        raise StoreFormatError(
            f"reorder: {path} has a node name table; reordering supports integer-id stores only "
            "(a name's id is its rank in the sorted table, which a new order would break)"
        )
    if store.has("original_id"):
        raise StoreFormatError(f"reorder: {path} is already reordered ({store.manifest['provenance'].get('reorder')})")
    return store


def _header(dtype: np.dtype, shape: tuple) -> bytes:
    """A .npy 1.0 header padded so that the data starts at ``DATA_OFFSET``."""
    shape_text = f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(str(s) for s in shape)})"
    text = f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': {shape_text}, }}"
    body = text.ljust(DATA_OFFSET - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + (DATA_OFFSET - 10).to_bytes(2, "little") + body.encode("latin1")


class _Array:
    """One output array, written front to back in blocks (plain sequential writes: no dirty
    memory-mapped pages to thrash under a memory limit)."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple):
        self.file = open(path, "wb")
        self.file.write(_header(dtype, shape))
        self.dtype = dtype

    def write(self, block: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(block, dtype=self.dtype).tobytes())


class _Writer:
    """Arrays written into the partial output directory, in the store's layout."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.arrays: dict[str, dict] = {}
        self.open: list[_Array] = []

    def create(self, name: str, dtype, shape: tuple, file: str | None = None) -> _Array:
        dtype = np.dtype(dtype)
        file = file or f"{name}.npy"
        self.arrays[name] = {"file": file, "dtype": dtype.name, "shape": list(shape)}
        out = _Array(self.directory / file, dtype, shape)
        self.open.append(out)
        return out

    def alias(self, name: str, of: str) -> None:
        self.arrays[name] = dict(self.arrays[of])

    def close(self) -> None:
        for out in self.open:
            out.file.close()


def _permute_rows(store: Store, name: str, dst: _Array, order: np.ndarray) -> None:
    """``dst[new] = src[order[new]]`` for store array ``name``, in chunks of rows read through
    the I/O engine (O_DIRECT, so the page cache is neither used nor thrashed)."""
    path = store.path / store.manifest["arrays"][name]["file"]
    for a in range(0, order.size, CHUNK_ROWS):
        dst.write(read_rows(path, order[a : a + CHUNK_ROWS]))


def _map_ids(src: np.ndarray, dst: _Array, new_id: np.ndarray, columns: list[int] | None) -> None:
    """``dst = new_id[src]`` (only ``columns`` of a 2-D array; the others copied), in chunks."""
    for a in range(0, src.shape[0], CHUNK_ROWS):
        block = np.array(src[a : a + CHUNK_ROWS])
        if columns is None:
            block = new_id[block]
        else:
            for c in columns:
                block[:, c] = new_id[block[:, c]]
        dst.write(block)


def _permute_topology(indptr, indices, out_indptr: _Array, out_indices: _Array, order, new_id) -> None:
    """Node ``new``'s segment is old node ``order[new]``'s, its ids mapped by ``new_id``, in the
    same (edge-list) order within the segment. ``indices`` is read into memory (one id per
    entry): the segments of consecutive new nodes lie anywhere in it."""
    indptr, indices = np.asarray(indptr), np.array(indices)
    lengths = np.diff(indptr)[order]
    out_indptr.write(np.concatenate(([0], np.cumsum(lengths))))
    for a in range(0, order.size, CHUNK_ROWS):
        pos = _positions(indptr[order[a : a + CHUNK_ROWS]], lengths[a : a + CHUNK_ROWS])
        out_indices.write(new_id[indices[pos]])


def reorder_store(src: str | Path, out: str | Path, order: str, overwrite: bool = False) -> dict:
    """Writes the store at ``src`` renumbered by ``order`` (one of :data:`ORDERS`) to ``out``;
    returns the summary (order, nodes, seconds per phase, the order's mean edge span before and
    after: the mean ``|id(u) - id(v)|`` over topology edges)."""
    if order not in ORDERS:
        raise ConfigError(f"reorder: --order must be one of {', '.join(ORDERS)}, got {order!r}")
    src, out = Path(src), Path(out)
    if out.resolve() == src.resolve():
        raise ConfigError(f"reorder: --out {out} is the input store; write to a new directory")
    if out.exists() and not overwrite:
        raise StoreExistsError(f"{out} exists (pass --overwrite to replace it)")
    store = _open_input(src)
    t0 = time.perf_counter()
    indptr, indices = undirected(store)
    if order == "glist":
        perm = np.frombuffer(_native.glist_order(str(src)), dtype="<u4").astype(np.int64)
    else:
        perm = compute_order(indptr, indices, order)
    n = perm.size
    new_id = np.empty(n, dtype=np.int64)
    new_id[perm] = np.arange(n, dtype=np.int64)
    span_before = _mean_span(indptr, indices, np.arange(n, dtype=np.int64))
    span_after = _mean_span(indptr, indices, new_id)
    del indptr, indices
    t_order = time.perf_counter() - t0

    partial = out.parent / f"{out.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        writer = _Writer(partial)
        try:
            _write_arrays(store, writer, perm, new_id)
        finally:
            writer.close()
        manifest = dict(store.manifest)
        manifest["arrays"] = dict(sorted(writer.arrays.items()))
        seconds = time.perf_counter() - t0
        manifest["provenance"] = {
            "converter": "reorder",
            "seconds": round(seconds, 3),
            "reorder": {"order": order, "input": str(src), "input_provenance": store.manifest.get("provenance")},
        }
        _publish(partial, out, manifest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    Store(out)
    return {
        "store": str(out),
        "order": order,
        "nodes": n,
        "order_seconds": round(t_order, 3),
        "seconds": round(time.perf_counter() - t0, 3),
        "mean_edge_span_before": span_before,
        "mean_edge_span_after": span_after,
    }


def _mean_span(indptr: np.ndarray, indices: np.ndarray, new_id: np.ndarray) -> float:
    """Mean ``|new_id[u] - new_id[v]|`` over the adjacency's entries (0 for an empty graph)."""
    if indices.size == 0:
        return 0.0
    total = 0.0
    for a in range(0, indices.size, CHUNK_ROWS * 16):
        v = indices[a : a + CHUNK_ROWS * 16]
        u = np.searchsorted(indptr, np.arange(a, a + v.size), side="right") - 1
        total += float(np.abs(new_id[u] - new_id[v]).sum())
    return total / indices.size


def _write_arrays(store: Store, writer: _Writer, perm: np.ndarray, new_id: np.ndarray) -> None:
    """Every array of ``store``, permuted (node-indexed rows) and mapped (node ids), then
    ``original_id``. Names that share a file in the input (CSC = CSR in a symmetrized store)
    share one in the output."""
    arrays = store.manifest["arrays"]
    written: dict[str, str] = {}
    for name in sorted(arrays):
        file = arrays[name]["file"]
        if file in written:
            writer.alias(name, written[file])
            continue
        a = store.array(name)
        out = writer.create(name, a.dtype, a.shape, file)
        if name.startswith("edges_"):
            _map_ids(a, out, new_id, [0, a.shape[1] - 1])
        elif name.startswith("node_") and name[5:] in ("train", "valid", "test"):
            _map_ids(a, out, new_id, None)
        elif name in ("out_degree", "in_degree", "features", "labels"):
            _permute_rows(store, name, out, perm)
        elif name.endswith(("_indptr", "_indices")):
            base = name.rsplit("_", 1)[0]
            ip_name, ix_name = f"{base}_indptr", f"{base}_indices"
            if ip_name not in arrays or ix_name not in arrays:
                raise StoreFormatError(f"reorder: {store.path}: array {name!r} has no matching indptr or indices")
            ip, ix = store.array(ip_name), store.array(ix_name)
            out_ip = out if name == ip_name else writer.create(ip_name, ip.dtype, ip.shape, arrays[ip_name]["file"])
            out_ix = out if name == ix_name else writer.create(ix_name, ix.dtype, ix.shape, arrays[ix_name]["file"])
            _permute_topology(ip, ix, out_ip, out_ix, perm, new_id)
            written[arrays[ip_name]["file"]] = ip_name
            written[arrays[ix_name]["file"]] = ix_name
        else:
            raise StoreFormatError(f"reorder: {store.path} has an array this reorder cannot permute: {name!r}")
        written[file] = name
    id_dtype = np.dtype(store.graph["id_dtype"])
    writer.create("original_id", id_dtype, (perm.size,)).write(perm)


def _publish(partial: Path, out: Path, manifest: dict) -> None:
    """Writes the manifest last, fsyncs every file and the directory, and renames ``partial`` to
    ``out``. An existing ``out`` loses its manifest first (so that it no longer opens), then the
    rest, so a kill at any moment leaves the old store, the new one, or nothing that opens."""
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for f in partial.iterdir():
        _fsync(f)
    _fsync(partial)
    if out.exists():
        (out / "manifest.json").unlink(missing_ok=True)
        _fsync(out)
        shutil.rmtree(out)
    os.rename(partial, out)
    _fsync(out.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
