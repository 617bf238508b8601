"""PyG interop for typed stores: a store converted from a typed, weighted, timestamped edge list
(plus per-type features and labels written into it as format 2 lays them out) served through
PyG's FeatureStore/GraphStore APIs; every tensor checked against NumPy on the raw edge list."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")
needs("torch_geometric")

from torch_geometric.data import EdgeAttr, remote_backend_utils  # noqa: E402

from conftest import run_strata, save_aligned  # noqa: E402
from strata.errors import StoreFormatError  # noqa: E402
from strata.gnn.pyg_hetero import TypedCSC, hetero_stores  # noqa: E402
from strata.store import Store, check_store  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_pyg_hetero")

TYPES = {"paper": 40, "author": 25, "field": 6}
# A relation name ("about") may serve two edge types.
EDGE_TYPES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "about", "field"),
              ("field", "about", "paper")]  # fmt: skip
OFFSET = {"paper": 0, "author": 40, "field": 65}
FEATURE_DIM, CLASSES = 8, 3


def raw_edges(rng) -> list[tuple[int, int, int, float, int]]:
    """(etype, local src, local dst, weight, time) rows in input order (= edge id). Paper 0 is
    a hub with long runs of every type into papers, so that the per-node binary searches take
    several rounds; papers 21.. and field 0 have no in-edges, and some edges repeat."""
    rows = []
    for k, (s, _, d) in enumerate(EDGE_TYPES):
        n = 120 if d == "paper" else 40
        src = rng.integers(0, TYPES[s], n)
        if d == "paper":
            dst = np.where(rng.random(n) < 0.3, 0, rng.integers(0, TYPES[d] // 2 + 1, n))
        else:
            dst = rng.integers(1, TYPES[d], n)
        weights, times = rng.integers(1, 16, n) / 4, rng.integers(-50, 50, n)
        rows += [(k, int(u), int(v), float(w), int(t)) for u, v, w, t in zip(src, dst, weights, times, strict=True)]
    rows += rows[:5]  # repeated edges keep their own ids, weights and times
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def add_node_data(store: Path, node_type: int, features: np.ndarray, labels: np.ndarray) -> None:
    """Writes a type's ``features_tI`` and ``labels_tI`` into a store and its manifest, as
    docs/formats.md ("Version 2") lays them out (no converter writes them yet)."""
    m = json.loads((store / "manifest.json").read_text())
    for name, arr in ((f"features_t{node_type}", features), (f"labels_t{node_type}", labels)):
        save_aligned(store / f"{name}.npy", arr)
        assert np.array_equal(np.load(store / f"{name}.npy"), arr)
        m["arrays"][name] = {"file": f"{name}.npy", "dtype": str(arr.dtype), "shape": list(arr.shape)}
    m["node_types"][node_type]["features"] = {"dim": features.shape[1], "dtype": str(features.dtype)}
    m["node_types"][node_type]["labels"] = {"num_classes": CLASSES}
    (store / "manifest.json").write_text(json.dumps(m))


def add_edge_features(store: Path, features: np.ndarray) -> None:
    """Writes ``edge_features_train`` (by edge id) into a store and its manifest."""
    m = json.loads((store / "manifest.json").read_text())
    save_aligned(store / "edge_features_train.npy", features)
    m["arrays"]["edge_features_train"] = {
        "file": "edge_features_train.npy",
        "dtype": "float32",
        "shape": list(features.shape),
    }
    m["edge_attributes"]["features"] = {"dim": features.shape[1], "dtype": "float32"}
    (store / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    d = tmp_path_factory.mktemp("pyghetero")
    rng = np.random.default_rng(7)
    edges = raw_edges(rng)
    (d / "node_types.tsv").write_text("".join(f"{n}\t{c}\n" for n, c in TYPES.items()))
    (d / "edge_types.tsv").write_text("".join("\t".join(et) + "\n" for et in EDGE_TYPES))
    lines = []
    for k, u, v, w, t in edges:
        s, rel, dd = EDGE_TYPES[k]
        lines.append(f"{u + OFFSET[s]},{rel},{v + OFFSET[dd]},{w},{t}\n")
    (d / "edges.csv").write_text("".join(lines))
    types = ["--node-types", d / "node_types.tsv", "--edge-types", d / "edge_types.tsv"]
    run_strata(
        "convert", d / "edges.csv", "--columns", "src,rel,dst,weight,time", *types, "--out", d / "plain.strata", "-q"
    )
    shutil.copytree(d / "plain.strata", d / "g.strata")
    features = rng.normal(size=(TYPES["paper"], FEATURE_DIM)).astype(np.float32)
    labels = rng.integers(-1, CLASSES, TYPES["paper"]).astype(np.int32)
    add_node_data(d / "g.strata", 0, features, labels)
    add_edge_features(d / "g.strata", edge_features(len(edges)))
    assert check_store(d / "g.strata")["ok"]
    return d / "g.strata", np.array(edges, dtype=object), features, labels


def edge_features(num_edges: int) -> np.ndarray:
    """Edge ``e``'s features: ``(e, -e, 0.5 e)``, so that a wrong edge id shows."""
    e = np.arange(num_edges, dtype=np.float32)
    return np.stack([e, -e, 0.5 * e], axis=1)


def expected(edges, k: int):
    """NumPy's (row, colptr, weights, times, edge ids) of edge type ``k``: sources by
    destination, then edge id, in local ids."""
    mine = [(u, v, w, t, eid) for eid, (kk, u, v, w, t) in enumerate(edges) if kk == k]
    src, dst = (np.array([e[i] for e in mine], dtype=np.int64) for i in (0, 1))
    order = np.argsort(dst, kind="stable")  # input order = edge id within a destination
    colptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=TYPES[EDGE_TYPES[k][2]]))])
    weights = np.array([e[2] for e in mine], dtype=np.float32)[order]
    times = np.array([e[3] for e in mine], dtype=np.int64)[order]
    eids = np.array([e[4] for e in mine], dtype=np.int64)[order]
    return src[order], colptr, weights, times, eids


def test_each_edge_type_is_its_own_csc_in_local_ids(typed):
    path, edges, _, _ = typed
    fs, gs = hetero_stores(path)
    attrs = {a.edge_type: a for a in gs.get_all_edge_attrs()}
    assert list(attrs) == EDGE_TYPES
    for k, et in enumerate(EDGE_TYPES):
        row, colptr, weights, times, eids = expected(edges, k)
        assert attrs[et].layout.value == "csc" and attrs[et].is_sorted
        assert attrs[et].size == (TYPES[et[0]], TYPES[et[2]])
        got_row, got_colptr = gs.get_edge_index(EdgeAttr(et, "csc"))
        assert got_row.dtype == got_colptr.dtype == torch.int64
        np.testing.assert_array_equal(got_colptr.numpy(), colptr, err_msg=str(et))
        np.testing.assert_array_equal(got_row.numpy(), row, err_msg=str(et))
        np.testing.assert_array_equal(fs[et, "edge_weight", None].numpy(), weights)
        np.testing.assert_array_equal(fs.get_tensor(et, "edge_time", None).numpy(), times)
        idx = torch.tensor([len(row) - 1, 0, 3, 3, -1])
        np.testing.assert_array_equal(fs[et, "edge_time", idx].numpy(), times[idx.numpy()])
        np.testing.assert_array_equal(fs[et, "edge_weight", slice(2, 9, 3)].numpy(), weights[2:9:3])
        assert fs.get_tensor_size(et, "edge_weight", None) == (len(row),)
        np.testing.assert_array_equal(fs[et, "edge_attr", None].numpy(), edge_features(len(edges))[eids])
        np.testing.assert_array_equal(fs[et, "edge_attr", idx].numpy(), edge_features(len(edges))[eids[idx.numpy()]])
        assert fs.get_tensor_size(et, "edge_attr", None) == (len(row), 3)
    assert sum(len(expected(edges, k)[0]) for k in range(len(EDGE_TYPES))) == len(edges)


def test_the_scan_and_the_binary_search_find_the_same_runs(typed):
    path, edges, _, _ = typed
    store = Store(path)
    indices = np.asarray(store.array("csc_indices"))
    for k, et in enumerate(EDGE_TYPES):
        row, colptr, *_ = expected(edges, k)
        for method in ("scan", "search"):
            csc = TypedCSC(store, k, method)
            np.testing.assert_array_equal(csc.colptr, colptr, err_msg=f"{et} {method}")
            np.testing.assert_array_equal(indices[csc.positions()] - OFFSET[et[0]], row, err_msg=f"{et} {method}")
    with pytest.raises(ValueError, match="method must be 'scan', 'search' or None"):
        TypedCSC(store, 0, "walk")


def test_pyg_converts_the_typed_csc_to_coo(typed):
    path, edges, _, _ = typed
    _, gs = hetero_stores(path)
    rows, cols, perms = gs.coo()
    assert set(rows) == set(EDGE_TYPES) and all(p is None for p in perms.values())
    for k, et in enumerate(EDGE_TYPES):
        row, colptr, *_ = expected(edges, k)
        np.testing.assert_array_equal(rows[et].numpy(), row)
        np.testing.assert_array_equal(cols[et].numpy(), np.repeat(np.arange(len(colptr) - 1), np.diff(colptr)))


def test_node_attributes_are_per_type_rows(typed):
    path, _, features, labels = typed
    fs, gs = hetero_stores(Store(path))
    idx = torch.tensor([39, 0, 5, 5, -2])
    np.testing.assert_array_equal(fs.get_tensor("paper", "x", idx).numpy(), features[idx.numpy()])
    np.testing.assert_array_equal(fs["paper"].x[idx].numpy(), features[idx.numpy()])  # PyG's attribute views
    y = fs["paper", "y", None]
    assert y.dtype == torch.int64 and y.tolist() == labels.tolist() and -1 in y.tolist()
    np.testing.assert_array_equal(fs["paper", "x", slice(1, 4)].numpy(), features[1:4])
    assert fs.get_tensor_size("paper", "x", None) == (TYPES["paper"], FEATURE_DIM)
    got = {(a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()}
    edge_attrs = {(et, a) for et in EDGE_TYPES for a in ("edge_weight", "edge_time", "edge_attr")}
    assert got == {("paper", "x"), ("paper", "y")} | edge_attrs
    assert {t: remote_backend_utils.num_nodes(fs, gs, t) for t in TYPES} == TYPES
    with pytest.raises(IndexError, match="index 40 is out of range for 40 rows"):
        fs.get_tensor("paper", "x", torch.tensor([3, 40]))
    with pytest.raises(KeyError, match="'author' has no attribute 'x'"):
        fs.get_tensor("author", "x", None)
    with pytest.raises(KeyError, match="no edge type"):
        gs.get_edge_index(EdgeAttr(("author", "cites", "paper"), "csc"))


def test_typed_store_without_node_data_and_refusals(typed, tmp_path):
    path, _, _, _ = typed
    fs, gs = hetero_stores(path.parent / "plain.strata")
    assert {a.attr_name for a in fs.get_all_tensor_attrs()} == {"edge_weight", "edge_time"}
    with pytest.raises(NotImplementedError, match="read-only"):
        fs.put_tensor(torch.zeros(3), group_name="paper", attr_name="x", index=None)
    with pytest.raises(ValueError, match="serves its topology as csc, not csr"):
        gs.get_edge_index(EdgeAttr(EDGE_TYPES[0], "csr"))
    (tmp_path / "e.tsv").write_text("0\t1\n1\t2\n")
    run_strata("convert", tmp_path / "e.tsv", "--out", tmp_path / "u.strata", "-q")
    with pytest.raises(StoreFormatError, match="has no node and edge types"):
        hetero_stores(tmp_path / "u.strata")
