"""Core numbers, triangles and maximal independent sets are defined on the simple undirected
graph: on stores that hold both directions of each edge without being marked symmetrised (Cora
as `strata convert` writes it), repeated edges (R-MAT) and self-loops, `strata run` and
`strata.grid.run` give networkx's results on the simple graph."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import needs, run_strata
from strata import Store
from strata.errors import ConfigError
from strata.grid import build_grid, run

nx = needs("networkx")


def simple_graph(store) -> nx.Graph:
    """The store's train edges as networkx's simple undirected graph, self-loops dropped."""
    s = Store(store)
    g = nx.Graph()
    g.add_nodes_from(range(s.num_nodes))
    g.add_edges_from(map(tuple, np.asarray(s.edges("train")).tolist()))
    g.remove_edges_from(list(nx.selfloop_edges(g)))
    return g


def check_results(store, g: nx.Graph, tmp_path) -> None:
    """k-core through the CLI, triangles through the Python API, MIS through both."""
    n = g.number_of_nodes()
    out = tmp_path / "kcore"
    proc = run_strata("run", "kcore", store, "--out", out, "--json-summary", "-q")
    want = nx.core_number(g)
    core = np.load(out / "core.npy")
    assert core.tolist() == [want[v] for v in range(n)]
    assert json.loads(proc.stdout)["result"]["max_core"] == max(want.values())
    s = run(algorithm="triangles", store=store, out=tmp_path / "tri")
    want = nx.triangles(g)
    assert np.load(tmp_path / "tri" / "triangles.npy").tolist() == [want[v] for v in range(n)]
    assert s["result"]["triangles"] == sum(want.values()) // 3 > 0
    run(algorithm="kcore", store=store, out=tmp_path / "kcore-py")
    assert np.array_equal(np.load(tmp_path / "kcore-py" / "core.npy"), core)
    for k, seed in enumerate((1, 2)):
        run_strata("run", "mis", store, "--seed", seed, "--out", tmp_path / f"mis{k}", "-q")
        members = set(np.flatnonzero(np.load(tmp_path / f"mis{k}" / "in_set.npy") == 1).tolist())
        assert nx.is_dominating_set(g, members)
        assert not any(g.has_edge(a, b) for a in members for b in members)


def test_cora_as_converted(shared_datasets, tmp_path):
    store = tmp_path / "cora.strata"
    run_strata("convert", shared_datasets / "planetoid", "--name", "cora", "--out", store, "-q")
    assert not Store(store).graph["symmetrized"]  # both directions are in the train edges
    g = simple_graph(store)
    assert g.number_of_edges() == 5278
    check_results(store, g, tmp_path)


def test_rmat_with_repeated_reciprocal_edges_and_self_loops(tmp_path):
    run_strata("generate", "rmat", "--scale", "9", "--edge-factor", "12", "--format", "npy",
               "--out", tmp_path / "rmat.npy", "-q")  # fmt: skip
    edges = np.load(tmp_path / "rmat.npy").astype(np.int64)
    rng = np.random.default_rng(5)
    loops = rng.integers(0, 512, 40)
    edges = np.concatenate([edges, edges[:2000, ::-1], np.stack([loops, loops], 1), edges[:500]])
    assert len({tuple(e) for e in edges.tolist()}) < len(edges)
    np.save(tmp_path / "edges.npy", edges)
    store = tmp_path / "rmat.strata"
    run_strata("convert", tmp_path / "edges.npy", "--num-nodes", 512, "--out", store, "-q")
    check_results(store, simple_graph(store), tmp_path)


def test_kcore_refuses_a_grid_that_keeps_repeated_edges(tmp_path):
    np.save(tmp_path / "edges.npy", np.array([[0, 1], [1, 0], [1, 2], [2, 0], [0, 1]]))
    store = tmp_path / "g.strata"
    run_strata("convert", tmp_path / "edges.npy", "--out", store, "-q")
    build_grid(store=store, name="sym", symmetrize=True)
    with pytest.raises(ConfigError, match=r"grid: .*sym is not simple and kcore needs it.*--symmetrize --simple"):
        run(algorithm="kcore", store=store, grid="sym", out=tmp_path / "o")
    build_grid(store=store, name="simple", symmetrize=True, simple=True)
    run(algorithm="kcore", store=store, grid="simple", out=tmp_path / "o")
    assert np.load(tmp_path / "o" / "core.npy").tolist() == [2, 2, 2]
    m = json.loads((store / "grids" / "simple" / "grid.json").read_text())
    assert m["simple"] and m["num_edges"] == 6
