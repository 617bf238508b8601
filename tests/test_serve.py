"""``strata serve`` end to end, through the Python client and the CLI: registration (re-ordering
is invisible to clients), sampled neighbourhoods and feature rows equal to the store's,
durable mutations (across a restart and a fold), analyses equal to the PyTorch forward on the
same sampled neighbourhood (fp32 and int8), result fetching, authentication, request limits,
``strata serve status`` and the SIGTERM drain.

Only the analysis tests need PyTorch (they ask for the ``torch`` fixture); the rest use a
GraphSAGE model written with NumPy alone."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import needs, run_strata, symmetric_sbm_store
from serve_process import Server, server_env, serving
from strata.serve import Client, _proto
from strata.serve.client import TOKEN_ENV, ServiceError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_serve")

NODES, DIM, CLASSES = 1500, 16, 4
HIDDEN = 12
FANOUTS = [5, 3]


# Servers ---------------------------------------------------------------------------------


def error_code(fn, *args, **kwargs) -> str:
    """The gRPC code ``fn(*args)`` fails with (fails the test when it succeeds)."""
    with pytest.raises(ServiceError) as e:
        fn(*args, **kwargs)
    return e.value.code


# Data -------------------------------------------------------------------------------------


class StoreArrays:
    """The source store's arrays, memory-mapped: features and the CSC (in-neighbours)."""

    def __init__(self, path: Path):
        manifest = json.loads((path / "manifest.json").read_text())
        arrays = manifest["arrays"]

        def load(key):
            return np.load(path / arrays[key]["file"], mmap_mode="r")

        self.path = path
        self.features = load("features")
        self.indptr = load("csc_indptr")
        self.indices = load("csc_indices")
        self.num_nodes = manifest["graph"]["num_nodes"]
        self.num_edges = manifest["graph"]["num_topology_edges"]

    def in_neighbours(self, v: int) -> list[int]:
        return sorted(int(u) for u in self.indices[self.indptr[v] : self.indptr[v + 1]])


#: The server's runtime in its plan (strata_serve::server::RUNTIME_BYTES).
SERVER_RUNTIME = 24 << 20


def served_graph_bytes(graph: dict) -> int:
    """What a graph of ``strata serve status`` holds in its plan: in- and out-lists (8 B a
    vertex and 4 B an edge, each), removed flags, ids both ways and labels (13 B a vertex)."""
    n, e = graph["num_nodes"], graph["num_edges"]
    return 2 * ((n + 1) * 8 + e * 4) + n * 13


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    """A labelled SBM store (1500 nodes, 4 classes, 16 float32 features, symmetric)."""
    d = tmp_path_factory.mktemp("serve-sbm")
    return symmetric_sbm_store(d, nodes=NODES, classes=CLASSES, dim=DIM, avg_degree=8)


@pytest.fixture(scope="module")
def store(sbm) -> StoreArrays:
    return StoreArrays(sbm)


def numpy_sage(path: Path, in_dim: int = DIM, out_dim: int = CLASSES, fanouts=(5, 3), seed: int = 0) -> Path:
    """A 2-layer GraphSAGE (mean) weights file in the npz format ``export_model`` writes,
    made without PyTorch."""
    rng = np.random.default_rng(seed)
    dims = [in_dim, HIDDEN, out_dim]
    tensors = {}
    for i in range(2):
        tensors[f"convs.{i}.self_lin.weight"] = 0.3 * rng.standard_normal((dims[i + 1], dims[i]))
        tensors[f"convs.{i}.self_lin.bias"] = 0.1 * rng.standard_normal(dims[i + 1])
        tensors[f"convs.{i}.neigh_lin.weight"] = 0.3 * rng.standard_normal((dims[i + 1], dims[i]))
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    arch = {"kind": "sage", "in_dim": in_dim, "hidden_dim": HIDDEN, "out_dim": out_dim, "layers": 2,
            "fanouts": list(fanouts)}  # fmt: skip
    arch_bytes = np.frombuffer(json.dumps(arch).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **tensors, __strata_architecture__=arch_bytes)
    return path


class Shared:
    """The module's server: graph ``g`` (the store, re-ordered; never mutated) and model
    ``np_sage`` (NumPy-made GraphSAGE over the store's features)."""

    def __init__(self, server: Server, client: Client, state_dir: Path):
        self.server, self.c, self.state_dir = server, client, state_dir


@pytest.fixture(scope="module")
def shared(sbm, tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-shared")
    # Rooted at the session's temporary directory: the tests register files of their own.
    root = tmp_path_factory.getbasetemp()
    with serving(d / "state", f"g={sbm}", "--data-root", root) as server, server.client(timeout=60) as client:
        client.register_model("np_sage", numpy_sage(d / "np_sage.npz"))
        yield Shared(server, client, d / "state")
        assert server.stop() == 0, server.stderr


def live_status(c: Client, graph: str) -> dict:
    return next(g for g in c.status()["graphs"] if g["name"] == graph)


def in_neighbours(c: Client, graph: str, vertices) -> dict[int, list[int]]:
    """Every in-neighbour of each of ``vertices`` (``SampleNeighbors`` with fanout -1)."""
    vertices = [int(v) for v in vertices]
    nb = c.sample_neighbors(graph, vertices, [-1])
    (block,) = nb.blocks
    return {
        v: sorted(int(u) for u in nb.nodes[block.indices[block.indptr[i] : block.indptr[i + 1]]])
        for i, v in enumerate(vertices)
    }


def check_neighbourhood(nb, seeds, fanouts, store: StoreArrays) -> None:
    """``nb`` is well formed (seeds first, distinct nodes, blocks chained input layer first, at
    most ``fanout`` sources a destination) and every sampled edge is an in-edge of the store."""
    nodes = nb.nodes
    assert nodes[: len(seeds)].tolist() == [int(s) for s in seeds]
    assert len(set(nodes.tolist())) == len(nodes)
    assert nodes.min() >= 0 and nodes.max() < store.num_nodes
    assert int(nb.hop_counts.sum()) == len(nodes) and nb.hop_counts[0] == len(seeds)
    assert len(nb.blocks) == len(fanouts)
    assert nb.blocks[0].num_src == len(nodes)
    num_dst = len(seeds)
    edges = 0
    for block, fanout in zip(reversed(nb.blocks), fanouts, strict=True):
        assert block.num_dst == num_dst
        assert len(block.indptr) == num_dst + 1 and block.indptr[0] == 0
        degrees = np.diff(block.indptr)
        assert (degrees >= 0).all() and block.indptr[-1] == len(block.indices)
        assert len(block.indices) == 0 or block.indices.max() < block.num_src
        if fanout != -1:
            assert degrees.max() <= fanout
        for d in range(num_dst):
            sources = nodes[block.indices[block.indptr[d] : block.indptr[d + 1]]]
            assert set(sources.tolist()) <= set(store.in_neighbours(int(nodes[d])))
            edges += len(sources)
        num_dst = block.num_src
    assert edges > 0


# Registration, features, sampling -----------------------------------------------------------


def test_registered_graphs_serve_the_store_under_its_own_ids(shared, sbm, store):
    c = shared.c
    for name, reorder in (("reordered", True), ("plain", False)):
        info = c.register_graph(name, sbm, reorder=reorder)
        assert info == {
            "name": name,
            "num_nodes": NODES,
            "live_nodes": NODES,
            "num_edges": store.num_edges,
            "feature_dim": DIM,
            "version": 1,
            "last_lsn": 0,
            "pending_log_records": 0,
            "reordered": reorder,
            "source_path": str(sbm.resolve()),
            "num_classes": CLASSES,
        }
    # The re-ordered copy really is re-numbered inside the server...
    internal = np.load(shared.state_dir / "graphs" / "reordered" / "v00000001" / "external_ids.npy")
    assert sorted(internal.tolist()) == list(range(NODES))
    assert (internal != np.arange(NODES)).any()
    # ...and both graphs are served at once, each exactly as the store in store ids.
    rng = np.random.default_rng(0)
    ids = rng.permutation(NODES)
    seeds = rng.choice(NODES, 40, replace=False)
    for name in ("reordered", "plain", "g"):
        assert np.array_equal(c.get_features(name, ids), store.features[ids])
        assert c.get_features(name, []).shape == (0, DIM)
        nb = c.sample_neighbors(name, seeds, FANOUTS)
        check_neighbourhood(nb, seeds, FANOUTS, store)
        again = c.sample_neighbors(name, seeds, FANOUTS)
        assert np.array_equal(again.nodes, nb.nodes)
        assert all(np.array_equal(a.indices, b.indices) for a, b in zip(again.blocks, nb.blocks, strict=True))
        full = in_neighbours(c, name, seeds)
        assert full == {int(v): store.in_neighbours(int(v)) for v in seeds}
    names = {g["name"] for g in c.status()["graphs"]}
    assert {"reordered", "plain", "g"} <= names

    for name in ("reordered", "plain"):
        c.unregister_graph(name)
        assert error_code(c.get_features, name, [0]) == "NOT_FOUND"
        assert error_code(c.unregister_graph, name) == "NOT_FOUND"
        assert not (shared.state_dir / "graphs" / name).exists()
    assert {g["name"] for g in c.status()["graphs"]} == names - {"reordered", "plain"}
    # The name is free again.
    assert c.register_graph("plain", sbm, reorder=False)["num_nodes"] == NODES
    c.unregister_graph("plain")


def test_registration_errors(shared, sbm, tmp_path):
    c = shared.c
    assert error_code(c.register_graph, "g", sbm) == "ALREADY_EXISTS"
    assert error_code(c.register_graph, "missing", tmp_path / "nothing-here") in ("FAILED_PRECONDITION", "NOT_FOUND")
    not_a_store = tmp_path / "not-a-store"
    not_a_store.mkdir()
    (not_a_store / "manifest.json").write_text("{not json")
    assert error_code(c.register_graph, "broken", not_a_store) in ("FAILED_PRECONDITION", "INVALID_ARGUMENT")
    path = numpy_sage(tmp_path / "m.npz")
    for bad in ("../x", "a/b", "", ".hidden", "x" * 129, "sp ace"):
        assert error_code(c.register_graph, bad, sbm) == "INVALID_ARGUMENT", bad
        assert error_code(c.register_model, bad, path) == "INVALID_ARGUMENT", bad
        assert error_code(c.register_model, bad, path, upload=False) == "INVALID_ARGUMENT", bad
    assert not (shared.state_dir / "x").exists() and not (shared.state_dir.parent / "x").exists()
    # Models: a name in use, a missing file, bytes that are no weights file.
    assert error_code(c.register_model, "np_sage", path) == "ALREADY_EXISTS"
    assert error_code(c.register_model, "nofile", tmp_path / "absent.npz", upload=False) == "NOT_FOUND"
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    assert error_code(c.register_model, "junk", junk) in ("INVALID_ARGUMENT", "FAILED_PRECONDITION")
    assert error_code(c.unregister_model, "nomodel") == "NOT_FOUND"
    assert {g["name"] for g in c.status()["graphs"]} >= {"g"}
    assert [m["name"] for m in c.status()["models"]].count("np_sage") == 1


def test_sample_and_feature_request_errors(shared):
    c = shared.c
    assert error_code(c.get_features, "nograph", [0]) == "NOT_FOUND"
    assert error_code(c.sample_neighbors, "nograph", [0], [2]) == "NOT_FOUND"
    assert error_code(c.get_features, "g", [NODES]) == "INVALID_ARGUMENT"
    assert error_code(c.sample_neighbors, "g", [0, NODES + 5], [2]) == "INVALID_ARGUMENT"
    assert error_code(c.sample_neighbors, "g", [3, 3], [2]) == "INVALID_ARGUMENT"
    # A repeated seed is named by the client's id, not by the server's (re-ordered) one.
    external = np.load(sorted((shared.state_dir / "graphs" / "g").glob("v*"))[-1] / "external_ids.npy")
    v = int(external[np.flatnonzero(external != np.arange(len(external)))[0]])
    with pytest.raises(ServiceError, match=f"seeds: must be distinct; vertex {v} appears twice"):
        c.sample_neighbors("g", [v, 1 if v != 1 else 2, v], [2])
    assert error_code(c.sample_neighbors, "g", [3], [0]) == "INVALID_ARGUMENT"
    assert error_code(c.sample_neighbors, "g", [3], [-2]) == "INVALID_ARGUMENT"
    assert c.status()["listen"] == shared.server.addr


# Analyses without PyTorch: fetching results, request errors ---------------------------------


def test_results_are_fetched_once_by_id_or_by_stream(shared):
    c = shared.c
    ids = [c.analyze("g", "np_sage", "embedding", [i, i + 7]) for i in range(0, 50, 10)]
    ids.append(c.analyze("g", "np_sage", "classification", [3, 4, 5]))
    ids.append(c.analyze("g", "np_sage", "link", [1, 2], [3, 4]))
    assert len(set(ids)) == len(ids)
    got = {r.request_id: r for r in c.results(ids)}
    assert sorted(got) == sorted(ids)
    for r in got.values():
        assert r.state == "DONE", r.error
        assert r.latency_s >= r.queued_s >= 0
    assert got[ids[0]].task == "NODE_EMBEDDING" and got[ids[0]].values.shape == (2, CLASSES)
    cls = got[ids[-2]]
    assert cls.task == "NODE_CLASSIFICATION" and cls.values.shape == (3, CLASSES)
    assert np.allclose(cls.values.sum(1), 1, atol=1e-5) and (cls.values >= 0).all()
    assert cls.labels.tolist() == cls.values.argmax(1).tolist()
    link = got[ids[-1]]
    assert (
        link.task == "LINK_PREDICTION" and link.scores.shape == (2,) and ((link.scores > 0) & (link.scores < 1)).all()
    )
    # Each result is handed out once.
    for i in ids:
        assert error_code(c.result, i) == "NOT_FOUND"
    assert error_code(lambda: list(c.results([ids[0]]))) == "NOT_FOUND"
    # By id, waiting for it.
    rid = c.analyze("g", "np_sage", "embedding", [9])
    r = c.result(rid, wait=60)
    assert r.state == "DONE" and r.request_id == rid and r.values.shape == (1, CLASSES)
    assert error_code(c.result, rid) == "NOT_FOUND"
    assert error_code(c.result, 10**15) == "NOT_FOUND"
    # The embedding is the same whichever way it is asked for (and from the embedding cache).
    assert np.array_equal(c.embed("g", "np_sage", [9]), r.values)
    assert np.array_equal(c.embed("g", "np_sage", [8, 9])[1], r.values[0])


def test_analysis_request_errors(shared, tmp_path):
    c = shared.c
    c.register_model("narrow", numpy_sage(tmp_path / "narrow.npz", in_dim=DIM // 2))
    try:
        assert error_code(c.analyze, "g", "narrow", "embedding", [1]) == "FAILED_PRECONDITION"
    finally:
        c.unregister_model("narrow")
    assert error_code(c.analyze, "g", "narrow", "embedding", [1]) == "NOT_FOUND"
    assert error_code(c.analyze, "nograph", "np_sage", "embedding", [1]) == "NOT_FOUND"
    assert error_code(c.analyze, "g", "np_sage", "embedding", []) == "INVALID_ARGUMENT"
    assert error_code(c.analyze, "g", "np_sage", "embedding", [NODES]) == "INVALID_ARGUMENT"
    assert error_code(c.analyze, "g", "np_sage", "link", [1, 2], [3]) == "INVALID_ARGUMENT"
    assert error_code(c.analyze, "g", "np_sage", "embedding", [1], [2]) == "INVALID_ARGUMENT"
    with pytest.raises(ValueError, match="task"):
        c.analyze("g", "np_sage", "clustering", [1])
    assert c.embed("g", "np_sage", [1]).shape == (1, CLASSES)


# Mutations ----------------------------------------------------------------------------------


def raw_tensor(shape, data: bytes):
    return _proto.message("Tensor")(
        shape=list(shape), dtype=_proto.enum_value("ElementType", "ELEMENT_TYPE_FLOAT32"), data=data
    )


def test_mutations_are_visible_at_once_and_checked(shared, sbm, store):
    c, g = shared.c, "mutated"
    c.register_graph(g, sbm)
    n, e = NODES, store.num_edges
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((3, DIM)).astype(np.float32)

    # New vertices get the next ids and their rows.
    ids = c.add_vertices(g, rows)
    assert ids.tolist() == [n, n + 1, n + 2]
    assert np.array_equal(c.get_features(g, ids), rows)
    assert in_neighbours(c, g, ids) == {n: [], n + 1: [], n + 2: []}

    # AddEdge(u, v) makes u an in-neighbour of v.
    c.add_edges(g, [10, 11, n], [n, n, 20])
    assert in_neighbours(c, g, [n, 20]) == {n: [10, 11], 20: sorted([*store.in_neighbours(20), n])}
    info = live_status(c, g)
    assert (info["num_nodes"], info["live_nodes"], info["num_edges"]) == (n + 3, n + 3, e + 3)
    assert info["last_lsn"] == 2 and info["pending_log_records"] == 2

    c.remove_edges(g, [11], [n])
    assert in_neighbours(c, g, [n])[n] == [10]
    assert error_code(c.remove_edges, g, [11], [n]) == "NOT_FOUND"
    assert error_code(c.remove_edges, g, [n], [21]) == "NOT_FOUND"
    assert live_status(c, g)["num_edges"] == e + 2

    # Updates replace rows, of new and of the store's vertices.
    new_rows = rng.standard_normal((2, DIM)).astype(np.float32)
    c.update_vertices(g, [n + 1, 5], new_rows)
    assert np.array_equal(c.get_features(g, [n + 1, 5, 6]), np.vstack([new_rows, store.features[6:7]]))

    # A removed vertex is gone from every request and from every neighbourhood.
    c.remove_vertices(g, [n])
    for code, call in [
        ("NOT_FOUND", lambda: c.get_features(g, [n])),
        ("NOT_FOUND", lambda: c.sample_neighbors(g, [n], [-1])),
        ("NOT_FOUND", lambda: c.add_edges(g, [n], [1])),
        ("NOT_FOUND", lambda: c.update_vertices(g, [n], rows[:1])),
        ("NOT_FOUND", lambda: c.remove_vertices(g, [n])),
        ("NOT_FOUND", lambda: c.analyze(g, "np_sage", "embedding", [n])),
    ]:
        assert error_code(call) == code
    assert in_neighbours(c, g, [20])[20] == store.in_neighbours(20)
    victim = 7
    around = sorted(set(store.in_neighbours(victim)) - {victim})
    assert around, "vertex 7 has neighbours in the test store"
    self_loops = store.in_neighbours(victim).count(victim)
    incident = 2 * len(store.in_neighbours(victim)) - self_loops  # symmetric: in-degree == out-degree
    c.remove_vertices(g, [victim])
    nb = c.sample_neighbors(g, around, [-1, -1])
    assert victim not in nb.nodes.tolist()
    info = live_status(c, g)
    assert (info["num_nodes"], info["live_nodes"]) == (n + 3, n + 1)
    assert info["num_edges"] == e + 2 - 2 - incident
    # Ids are never reused.
    assert c.add_vertices(g, rows[:1]).tolist() == [n + 3]
    before = live_status(c, g)["last_lsn"]

    # Refused requests change nothing, and the server goes on answering.
    refused = [
        ("INVALID_ARGUMENT", lambda: c.add_vertices(g, np.ones((2, DIM + 1), np.float32))),
        ("INVALID_ARGUMENT", lambda: c.add_vertices(g, np.full((1, DIM), np.nan, np.float32))),
        ("INVALID_ARGUMENT", lambda: c.update_vertices(g, [1, 2], np.ones((3, DIM), np.float32))),
        ("INVALID_ARGUMENT", lambda: c.update_vertices(g, [1], np.ones((1, DIM - 1), np.float32))),
        ("INVALID_ARGUMENT", lambda: c.update_vertices(g, [1, 1], np.ones((2, DIM), np.float32))),
        ("INVALID_ARGUMENT", lambda: c.add_edges(g, [1, 2], [3])),
        ("INVALID_ARGUMENT", lambda: c.add_edges(g, [1], [n + 100])),
        ("INVALID_ARGUMENT", lambda: c.remove_edges(g, [10**12], [1])),
        ("INVALID_ARGUMENT", lambda: c.remove_vertices(g, [n + 4])),
        ("INVALID_ARGUMENT", lambda: c.remove_vertices(g, [1, 1])),
        ("INVALID_ARGUMENT", lambda: c.update_vertices(g, [n + 4], rows[:1])),
        ("NOT_FOUND", lambda: c.add_vertices("nograph", rows)),
        # Tensors the client would never build: bytes that do not match the shape, no tensor.
        ("INVALID_ARGUMENT", lambda: c._call("AddVertex", graph=g, features=raw_tensor([2, DIM], b"\0" * 12))),
        ("INVALID_ARGUMENT", lambda: c._call("AddVertex", graph=g, features=raw_tensor([DIM], b"\0" * 4 * DIM))),
        ("INVALID_ARGUMENT", lambda: c._call("AddVertex", graph=g)),
        ("INVALID_ARGUMENT", lambda: c._call("UpdateVertex", graph=g, ids=[1], features=raw_tensor([1, DIM], b""))),
    ]
    for code, call in refused:
        assert error_code(call) == code
        assert live_status(c, g)["last_lsn"] == before
    info = live_status(c, g)
    assert (info["num_nodes"], info["live_nodes"]) == (n + 4, n + 2)
    c.unregister_graph(g)


def apply_mutations(c: Client, g: str, store: StoreArrays) -> dict:
    """Eight mutations of ``g`` (a fresh registration of the store); returns what the graph
    must look like after them."""
    n = NODES
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((4, DIM)).astype(np.float32)
    assert c.add_vertices(g, rows[:2]).tolist() == [n, n + 1]
    assert c.add_vertices(g, rows[2:]).tolist() == [n + 2, n + 3]
    c.add_edges(g, [1, 2, 3, n], [n, n, n + 1, 30])
    c.remove_edges(g, [2], [n])
    update = rng.standard_normal((2, DIM)).astype(np.float32)
    c.update_vertices(g, [n + 1, 40], update)
    c.remove_vertices(g, [n + 3])
    c.add_edges(g, [n + 1], [n + 2])
    c.update_vertices(g, [n + 2], rows[:1] * 2)
    features = {n: rows[0], n + 1: update[0], n + 2: rows[0] * 2, 40: update[1], 41: store.features[41]}
    return {
        "lsn": 8,
        "num_nodes": n + 4,
        "live_nodes": n + 3,
        "num_edges": store.num_edges + 4,
        "features": features,
        "in_neighbours": {n: [1], n + 1: [3], n + 2: [n + 1], 30: sorted([*store.in_neighbours(30), n])},
        "removed": [n + 3],
    }


def check_mutations(c: Client, g: str, want: dict) -> dict:
    info = live_status(c, g)
    assert info["num_nodes"] == want["num_nodes"]
    assert info["live_nodes"] == want["live_nodes"]
    assert info["num_edges"] == want["num_edges"]
    assert info["last_lsn"] == want["lsn"]
    ids = list(want["features"])
    assert np.array_equal(c.get_features(g, ids), np.stack([want["features"][i] for i in ids]))
    assert in_neighbours(c, g, want["in_neighbours"]) == want["in_neighbours"]
    for v in want["removed"]:
        assert error_code(c.get_features, g, [v]) == "NOT_FOUND"
    live = [v for v in range(want["num_nodes"]) if v not in want["removed"]]
    nb = c.sample_neighbors(g, live, [-1])
    assert nb.blocks[0].indptr[-1] == want["num_edges"]
    return info


@pytest.mark.parametrize("fold", [False, True], ids=["log", "fold"])
def test_mutations_survive_a_restart(tmp_path, sbm, store, fold):
    state = tmp_path / "state"
    folding = ["--fold-records", "5", "--fold-after", "1"] if fold else []
    with serving(state, f"g={sbm}", "--data-root", tmp_path, *folding) as server:
        with server.client() as c:
            want = apply_mutations(c, "g", store)
            info = check_mutations(c, "g", want)
            if fold:
                deadline = time.monotonic() + 60
                while info["pending_log_records"] or info["version"] == 1:
                    assert time.monotonic() < deadline, f"no fold within 60 s: {info}"
                    time.sleep(0.1)
                    info = live_status(c, "g")
                info = check_mutations(c, "g", want)
            else:
                assert (info["version"], info["pending_log_records"]) == (1, 8)
            # Models come back too, by path and uploaded, with their precision.
            models = [
                c.register_model("m", numpy_sage(tmp_path / "m.npz"), upload=False),
                c.register_model("m8", numpy_sage(tmp_path / "m.npz"), precision="int8"),
            ]
            probe = [NODES, NODES + 1, NODES + 2, 30]
            embedded = [c.embed("g", m["name"], probe) for m in models]
        assert server.stop() == 0, server.stderr
        assert "stopped by SIGTERM after draining" in server.after_listening()
    graph_dir = state / "graphs" / "g"
    current = json.loads((graph_dir / "CURRENT").read_text())
    assert current["version"] == info["version"]
    versions = sorted(p.name for p in graph_dir.iterdir() if p.name.startswith("v"))
    assert versions == [f"v{info['version']:08d}"]
    shown = run_strata("info", graph_dir / versions[0])
    assert f"{want['num_nodes'] if fold else NODES:,}" in shown.stdout
    # Restart without naming the store: the graph comes back from the state directory.
    with serving(state, *folding) as server:
        with server.client() as c:
            again = check_mutations(c, "g", want)
            assert (again["version"], again["pending_log_records"]) == (info["version"], info["pending_log_records"])
            assert sorted(c.status()["models"], key=lambda m: m["name"]) == models
            for m, before in zip(models, embedded, strict=True):
                assert np.allclose(c.embed("g", m["name"], probe), before, rtol=1e-5, atol=1e-6)
            # It goes on from where it was.
            assert c.add_vertices("g", np.zeros((1, DIM), np.float32)).tolist() == [want["num_nodes"]]
        assert server.stop() == 0, server.stderr


# Robustness and security --------------------------------------------------------------------


def test_serving_other_hosts_needs_a_token(tmp_path):
    proc = run_strata("serve", "--listen", "0.0.0.0:0", "--state-dir", tmp_path / "state", check=False, timeout=60,
                      env=server_env())  # fmt: skip
    assert proc.returncode != 0
    assert "token" in (proc.stderr + proc.stdout).lower()
    assert "listening on" not in proc.stdout


def test_a_token_is_required_when_set(tmp_path, sbm, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with serving(tmp_path / "state", f"g={sbm}", "--token", "s3cret") as server:
        assert "(token required)" in server.output
        for token in (None, "wrong", "s3cre", "s3cret "):
            with server.client(token=token) as c:
                assert error_code(c.status) == "UNAUTHENTICATED", token
                assert error_code(c.get_features, "g", [0]) == "UNAUTHENTICATED", token
                assert error_code(c.add_vertices, "g", np.ones((1, DIM), np.float32)) == "UNAUTHENTICATED"
        with server.client(token="s3cret") as c:
            assert c.get_features("g", [0]).shape == (1, DIM)
            assert live_status(c, "g")["num_nodes"] == NODES  # nothing unauthenticated was applied
        monkeypatch.setenv(TOKEN_ENV, "s3cret")
        with server.client() as c:  # the token from the environment
            assert c.status()["graphs"][0]["name"] == "g"
        monkeypatch.delenv(TOKEN_ENV)
        addr = server.addr
        assert run_strata("serve", "status", "--address", addr, check=False, env=server_env()).returncode != 0
        shown = run_strata("serve", "status", "--address", addr, "--token", "s3cret", env=server_env())
        assert "g:" in shown.stdout
        assert server.stop() == 0
    # Off loopback, a token makes it serve.
    with serving(tmp_path / "state", "--token", "s3cret", listen="0.0.0.0:0") as server:
        port = server.addr.rsplit(":", 1)[1]
        with Client(f"127.0.0.1:{port}", token="s3cret") as c:
            assert c.status()["graphs"][0]["name"] == "g"
        with Client(f"127.0.0.1:{port}") as c:
            assert error_code(c.status) == "UNAUTHENTICATED"
        assert server.stop() == 0


def test_size_limits(tmp_path, sbm):
    with serving(tmp_path / "state", f"g={sbm}", "--max-ids", "10", "--max-message", "1M") as server:
        c = server.client()
        assert c.get_features("g", range(10)).shape == (10, DIM)
        assert error_code(c.get_features, "g", range(11)) == "RESOURCE_EXHAUSTED"
        assert error_code(c.sample_neighbors, "g", range(11), [2]) == "RESOURCE_EXHAUSTED"
        assert error_code(c.add_edges, "g", range(11), range(11)) == "RESOURCE_EXHAUSTED"
        assert error_code(c.remove_vertices, "g", range(11)) == "RESOURCE_EXHAUSTED"
        assert error_code(c.add_vertices, "g", np.ones((11, DIM), np.float32)) == "RESOURCE_EXHAUSTED"
        assert error_code(c.update_vertices, "g", range(11), np.ones((11, DIM), np.float32)) == "RESOURCE_EXHAUSTED"
        assert live_status(c, "g")["last_lsn"] == 0
        # A 2 MB message over a 1 MiB limit: refused while decoding, with OUT_OF_RANGE
        # ("decoded message length too large"), as serve.proto documents.
        big = np.ones((2_000_000 // (4 * DIM), DIM), np.float32)
        assert error_code(c.add_vertices, "g", big) == "OUT_OF_RANGE"
        info = live_status(c, "g")
        assert (info["num_nodes"], info["last_lsn"]) == (NODES, 0)
        assert c.add_vertices("g", np.ones((10, DIM), np.float32)).tolist() == list(range(NODES, NODES + 10))
        c.close()
        assert server.stop() == 0


def test_rate_limit(tmp_path, sbm):
    with serving(tmp_path / "state", f"g={sbm}", "--rate", "2") as server, server.client() as c:
        codes = []
        for _ in range(200):
            try:
                c.get_features("g", [1])
                codes.append("OK")
            except ServiceError as e:
                codes.append(e.code)
                break
        assert codes[-1] == "RESOURCE_EXHAUSTED", codes
        # The bucket refills: the server answers again.
        deadline = time.monotonic() + 30
        while True:
            try:
                assert c.status()["graphs"][0]["num_nodes"] == NODES
                break
            except ServiceError as e:
                assert e.code == "RESOURCE_EXHAUSTED" and time.monotonic() < deadline
                time.sleep(0.25)
        assert server.stop() == 0


def test_small_calls_are_not_held_back_by_nagle(shared):
    # Without TCP_NODELAY on the server's connections, the frames after a response's first
    # write waited for the client's delayed ACK: about 40 ms on calls like this one (a reply of
    # 2 KiB; one of 64 bytes went out in one write and did not show it).
    shared.c.get_features("g", list(range(32)))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        shared.c.get_features("g", list(range(32)))
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.015, f"median GetFeatures round trip {statistics.median(times) * 1e3:.1f} ms"


# The CLI ------------------------------------------------------------------------------------


def test_status_command(shared):
    shown = run_strata("serve", "status", "--address", shared.server.addr, env=server_env())
    out = shown.stdout
    assert "g:" in out and "np_sage:" in out
    assert "hit rate" in out and "queue depth" in out
    # An eighth of what --memory 1G leaves after the runtime (24 MiB) and the graphs and
    # models registered at start (none here: they are registered later).
    assert "working memory: 0 B of 125 MiB in use" in out and "messages up to 62.5 MiB" in out
    assert f"{NODES} vertices" in out
    status = json.loads(
        run_strata("serve", "status", "--address", shared.server.addr, "--json", env=server_env()).stdout
    )
    assert "g" in [g["name"] for g in status["graphs"]]
    assert "np_sage" in [m["name"] for m in status["models"]]
    assert status["listen"] == shared.server.addr
    assert {"page_cache", "embedding_cache", "queue_depth", "requests_done"} <= set(status)
    # Nobody listening: a clear failure, not a hang.
    gone = run_strata("serve", "status", "--address", "127.0.0.1:1", "--timeout", "2", check=False, env=server_env())
    assert gone.returncode != 0 and "UNAVAILABLE" in gone.stderr
    assert "no Strata server answers on 127.0.0.1:1" in gone.stderr and "start one with `strata serve`" in gone.stderr


def test_sigterm_drains_queued_analyses(tmp_path, sbm):
    # A long batching window keeps the analyses queued when SIGTERM arrives.
    with serving(tmp_path / "state", f"g={sbm}", "--window-ms", "400", "--json-summary") as server:
        with server.client() as c:
            c.register_model("m", numpy_sage(tmp_path / "m.npz"))
            ids = [c.analyze("g", "m", "embedding", [i]) for i in range(6)]
            assert server.stop(signal.SIGTERM) == 0, server.stderr
        summary = json.loads(server.after_listening())
    assert summary["stopped_by"] == "SIGTERM"
    assert summary["status"]["requests_done"] == len(ids)
    assert summary["status"]["requests_failed"] == 0
    assert (summary["status"]["graphs"], summary["status"]["models"]) == (["g"], ["m"])


def test_cli_registers_stores_given_as_arguments(tmp_path, sbm):
    args = (sbm, f"other={sbm}", "--memory", "40M", "--no-embedding-cache", "--json-summary")
    with serving(tmp_path / "state", *args) as server:
        with server.client() as c:
            status = c.status()
        graphs = {g["name"]: g for g in status["graphs"]}
        assert set(graphs) == {"sbm", "other"}
        assert all(g["reordered"] for g in graphs.values())
        assert server.stop() == 0
        assert re.search(r"embedding cache +0 B", server.output)
        summary = json.loads(server.after_listening())
        plan = summary["plan"]
    # Off the top: the runtime and both graphs. Of the rest, the working memory and the
    # executor an eighth each; without the embedding cache, pages the remainder.
    assert plan["graphs_bytes"] == 2 * served_graph_bytes(graphs["sbm"])
    assert plan["runtime_bytes"] == SERVER_RUNTIME
    # The plan in the common shape: the same parts, summing to the budget.
    assert summary["memory_plan"]["engine"] == "serve" and summary["memory_plan"]["memory"] == 40 << 20
    assert sum(p["bytes"] for p in summary["memory_plan"]["parts"]) == 40 << 20
    shared = (40 << 20) - SERVER_RUNTIME - plan["graphs_bytes"]
    assert status["embedding_cache"]["capacity_bytes"] == 0
    assert status["working_capacity_bytes"] == shared // 8
    assert status["page_cache"]["capacity_bytes"] == shared - 2 * (shared // 8)
    below = run_strata(
        "serve", sbm, "--state-dir", tmp_path / "s1", "--memory", "24M", check=False, timeout=60, env=server_env()
    )
    assert below.returncode == 2 and "below this server's minimum" in below.stderr
    assert not (tmp_path / "s1" / "graphs" / "sbm").exists(), "refused before registering"
    # A budget beyond the machine: the page cache would grow into memory the machine lacks.
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    beyond = run_strata("serve", sbm, "--state-dir", tmp_path / "s1", "--memory", f"{2 * ram // (1 << 20)}M",
                        check=False, timeout=60, env=server_env())  # fmt: skip
    assert beyond.returncode == 2 and "more than this machine's" in beyond.stderr, beyond.stderr
    assert not (tmp_path / "s1" / "graphs" / "sbm").exists(), "refused before registering"
    bad = run_strata(
        "serve", tmp_path / "nowhere", "--state-dir", tmp_path / "s2", check=False, timeout=60, env=server_env()
    )
    assert bad.returncode != 0 and "not a Strata store" in bad.stderr
    # A store (or a run) named as the state directory would get the server's graphs/ and models/.
    before = sorted(p.name for p in sbm.iterdir())
    into_store = run_strata("serve", "--state-dir", sbm, check=False, timeout=60, env=server_env())
    assert into_store.returncode == 2 and f"--state-dir {sbm} is a store" in into_store.stderr
    assert sorted(p.name for p in sbm.iterdir()) == before


# Analyses against the PyTorch forward -------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return needs("torch")


def reference(torch, c: Client, graph: str, model, targets, fanouts=FANOUTS) -> np.ndarray:
    """``model``'s output for ``targets`` on the neighbourhood an analysis samples."""
    from strata.gnn.models import Block

    nb = c.sample_neighbors(graph, targets, fanouts, seed=0, batch_key=0)
    x = c.get_features(graph, nb.nodes).copy()
    blocks = [Block.from_csc(b.num_src, b.num_dst, b.indptr, b.indices) for b in nb.blocks]
    with torch.no_grad():
        return model(blocks, torch.from_numpy(x)).numpy()


def assert_close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    assert got.shape == want.shape
    err = np.abs(got - want).max()
    assert err <= rel * np.abs(want).max() + 1e-6, f"max error {err} against max {np.abs(want).max()}"


def make_model(torch, kind: str, seed: int = 0):
    from strata.gnn.models import GNN

    torch.manual_seed(seed)
    model = GNN(kind, DIM, HIDDEN, CLASSES, layers=2)
    if kind == "gin":
        with torch.no_grad():
            for conv in model.convs:
                conv.eps.fill_(0.3)
    return model.eval()


SERVED = {"sage": "MODEL_KIND_SAGE", "sage_pool": "MODEL_KIND_SAGE_POOL", "gcn": "MODEL_KIND_GCN",
          "gin": "MODEL_KIND_GIN"}  # fmt: skip


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("kind", list(SERVED))
def test_analyses_equal_the_torch_forward(shared, tmp_path, torch, kind, fmt):
    from strata.gnn import export_model

    c = shared.c
    model = make_model(torch, kind, seed=len(kind))
    path = export_model(model, tmp_path / f"model.{fmt}", fanouts=FANOUTS)
    name = f"{kind}-{fmt}"
    upload = fmt == "safetensors"  # the npz file is registered by its path on the server
    info = c.register_model(name, path, upload=upload)
    assert info["architecture"] == {
        "kind": SERVED[kind],
        "in_dim": DIM,
        "hidden_dim": HIDDEN,
        "out_dim": CLASSES,
        "layers": 2,
        "fanouts": FANOUTS,
    }
    assert info["precision"] == "PRECISION_FP32"
    assert info["parameters"] == sum(t.numel() for t in model.state_dict().values())
    assert name in [m["name"] for m in c.status()["models"]]
    try:
        rng = np.random.default_rng(len(name))
        targets = rng.choice(NODES, 24, replace=False)  # not sorted: the server may schedule them in any order
        emb = c.embed("g", name, targets)
        want = reference(torch, c, "g", model, targets)
        assert emb.dtype == np.float32
        assert_close(emb, want, 1e-4)

        labels, probs = c.classify("g", name, targets)
        soft = np.exp(want - want.max(1, keepdims=True))
        soft /= soft.sum(1, keepdims=True)
        assert_close(probs, soft, 1e-4)
        assert labels.tolist() == want.argmax(1).tolist()

        src, dst = targets[:12], targets[12:]
        scores = c.predict_links("g", name, src, dst)
        dots = (want[:12] * want[12:]).sum(1)
        assert np.abs(scores - 1 / (1 + np.exp(-dots))).max() <= 1e-4

        c.register_model(f"{name}-int8", path, precision="int8")
        try:
            assert (
                c.status()["models"][[m["name"] for m in c.status()["models"]].index(f"{name}-int8")]["precision"]
                == "PRECISION_INT8"
            )
            assert_close(c.embed("g", f"{name}-int8", targets), emb, 0.05)
        finally:
            c.unregister_model(f"{name}-int8")
    finally:
        c.unregister_model(name)
    assert error_code(c.analyze, "g", name, "embedding", [1]) == "NOT_FOUND"


def test_analyses_see_mutations(shared, sbm, tmp_path, torch):
    from strata.gnn import export_model

    c, g = shared.c, "analysed"
    c.register_graph(g, sbm)
    model = make_model(torch, "sage", seed=3)
    c.register_model("sage-mut", export_model(model, tmp_path / "m.safetensors", fanouts=FANOUTS))
    try:
        targets = [3, 14, 15, 92]
        before = c.embed(g, "sage-mut", targets)
        assert_close(before, reference(torch, c, g, model, targets), 1e-4)
        # A changed row and a new in-neighbour change the embeddings (no stale cache).
        c.update_vertices(g, [3], np.full((1, DIM), 2.5, np.float32))
        (new,) = c.add_vertices(g, np.full((1, DIM), -1.5, np.float32))
        c.add_edges(g, [new, 3], [14, new])
        after = c.embed(g, "sage-mut", [*targets, new])
        assert_close(after, reference(torch, c, g, model, [*targets, new]), 1e-4)
        assert not np.allclose(after[:2], before[:2])
    finally:
        c.unregister_model("sage-mut")
        c.unregister_graph(g)
