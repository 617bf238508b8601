"""Graph analytics on grids (`strata grid build`, `strata run`): results against networkx and
scipy on small random graphs and on Cora, in column and row order, with edge blocks resident or
streamed from disk every pass; the grid format read back; the CLI end to end with `strata plot`;
bad inputs."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import needs

needs("networkx")
needs("scipy")

import networkx as nx  # noqa: E402
import scipy.sparse as sparse  # noqa: E402

from cli_in_process import strata_in_process  # noqa: E402
from conftest import SHARED_DATASETS, run_strata  # noqa: E402
from strata import Store  # noqa: E402
from strata.config import ConvertConfig, GridBuildConfig, RunConfig  # noqa: E402
from strata.convert import convert  # noqa: E402
from strata.errors import BudgetError, ConfigError, InputNotFoundError, StoreFormatError  # noqa: E402
from strata.grid import build_grid, format_iteration, format_summary, grid_info, list_grids, run  # noqa: E402
from torchrun_env import free_port  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_grid")

PNG = b"\x89PNG\r\n\x1a\n"
N = 310  # vertices 300..309 have no edges at all
PARTITIONS = 4  # chunks of 78 vertices, the last one of 76
SEGMENT = "4K"  # 512 edges per segment: blocks are split into several segments
MODES = [("column", True), ("column", False), ("row", True), ("row", False)]
MODE_IDS = [f"{o}-{'resident' if k else 'streamed'}" for o, k in MODES]


def make_store(directory: Path, edges: np.ndarray, num_nodes: int, name: str = "g") -> Path:
    """A store whose train edges are ``edges`` (all of them: no split)."""
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / f"{name}-edges.npy", np.asarray(edges, dtype=np.int64).reshape(-1, 2))
    out = directory / f"{name}.strata"
    convert(ConvertConfig(inputs=[directory / f"{name}-edges.npy"], out=out, num_nodes=num_nodes))
    return out


def grid_edges(grid_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Global (src, dst, weight) of every edge of a grid, from its files: block (i, j) sits at
    position j*P+i (column order) or i*P+j (row order); ids are offsets from chunk_index*chunk_size."""
    m = json.loads((grid_dir / "grid.json").read_text())
    p, cs = m["partitions"], m["chunk_size"]
    edges = np.load(grid_dir / "edges.npy")
    index = np.load(grid_dir / "block_index.npy")
    weights = np.load(grid_dir / "weights.npy") if "weights" in m["arrays"] else None
    assert index.shape == (p * p + 1,) and index[0] == 0 and index[-1] == len(edges) == m["num_edges"]
    assert np.all(np.diff(index) >= 0)
    src, dst = np.empty(len(edges), np.int64), np.empty(len(edges), np.int64)
    for pos in range(p * p):
        a, b = index[pos], index[pos + 1]
        major, minor = divmod(pos, p)
        i, j = (minor, major) if m["order"] == "column" else (major, minor)
        assert np.all(edges[a:b] < cs)
        src[a:b] = i * cs + edges[a:b, 0].astype(np.int64)
        dst[a:b] = j * cs + edges[a:b, 1].astype(np.int64)
    return src, dst, weights


def components_graph(seed: int) -> nx.DiGraph:
    """A directed graph of several weakly connected parts (and isolated vertices) whose vertex ids
    are shuffled so that every part spans several chunks."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(300)
    g = nx.DiGraph()
    g.add_nodes_from(range(N))
    start = 0
    for size in (160, 80, 40, 12, 5, 3):
        part = nx.gnm_random_graph(size, 5 * size, seed=seed + size, directed=True)
        g.add_edges_from((int(perm[start + u]), int(perm[start + v])) for u, v in part.edges)
        start += size
    return g


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A directed store with its grids (plain, weighted, symmetric) in both orders, the networkx
    graph it came from, and an undirected simple store with self-loops for k-core."""
    d = tmp_path_factory.mktemp("grid")
    g = components_graph(3)
    edges = np.array(sorted(g.edges), dtype=np.int64)
    store = make_store(d, edges, N, "directed")
    for order in ("column", "row"):
        common = {"store": store, "partitions": PARTITIONS, "order": order}
        build_grid(name=f"d-{order}", **common)
        build_grid(name=f"w-{order}", weighted=True, weight_seed=5, weight_low=1.0, weight_high=5.0, **common)
        build_grid(name=f"s-{order}", symmetrize=True, **common)
    u = nx.gnm_random_graph(N, 1400, seed=11)
    rng = np.random.default_rng(11)
    und = np.array([(a, b) if rng.random() < 0.5 else (b, a) for a, b in u.edges] + [(7, 7), (100, 100), (100, 100)])
    ustore = make_store(d, und, N, "undirected")
    for order in ("column", "row"):
        build_grid(store=ustore, name=f"s-{order}", partitions=PARTITIONS, order=order, symmetrize=True)
        build_grid(store=ustore, name=f"k-{order}", partitions=PARTITIONS, order=order, symmetrize=True, simple=True)
    return {"dir": d, "store": store, "g": g, "ustore": ustore, "u": u}


def run_on(store: Path, grid: str, algorithm: str, keep: bool, out: Path, **options) -> tuple[dict, Path]:
    summary = run(algorithm=algorithm, store=store, grid=grid, keep_resident=keep, segment=SEGMENT, out=out, **options)
    tiers = set(summary["placement"]["tiers"])
    assert tiers == ({"local"} if keep else {"disk"}), tiers
    assert summary["bytes_disk" if not keep else "bytes_local"] > 0
    return summary, out


def power_iteration(src, dst, n: int, iterations: int, d: float = 0.85) -> np.ndarray:
    """PageRank as networkx defines it (dangling rank spread evenly), in plain numpy."""
    out = np.bincount(src, minlength=n).astype(np.float64)
    r = np.full(n, 1.0 / n)
    for _ in range(iterations):
        contrib = np.where(out > 0, r / np.maximum(out, 1), 0.0)
        dangling = r[out == 0].sum()
        r = (1 - d) / n + d * dangling / n + d * np.bincount(dst, weights=contrib[src], minlength=n)
    return r


# ---------------------------------------------------------------------------------------------
# the grid format


def test_grids_hold_exactly_the_store_edges(graphs):
    store = graphs["store"]
    stored = np.asarray(Store(store).edges("train")).astype(np.int64)
    want = np.sort(stored[:, 0] * N + stored[:, 1])
    for order in ("column", "row"):
        for kind in ("d", "w"):
            gdir = store / "grids" / f"{kind}-{order}"
            src, dst, w = grid_edges(gdir)
            assert np.array_equal(np.sort(src * N + dst), want)
            m = grid_info(gdir)
            assert (m["order"], m["partitions"], m["symmetric"]) == (order, PARTITIONS, False)
            assert np.array_equal(np.load(gdir / "out_degree.npy"), np.bincount(src, minlength=N))
            assert np.array_equal(np.load(gdir / "in_degree.npy"), np.bincount(dst, minlength=N))
            if kind == "w":
                assert w is not None and np.all((w > 1.0) & (w <= 5.0))
                assert m["weights"] == {"kind": "random", "seed": 5, "low": 1.0, "high": 5.0}
        # Symmetric grids: both directions of every edge, self-loops once.
        src, dst, _ = grid_edges(store / "grids" / f"s-{order}")
        both = np.concatenate([stored, stored[:, ::-1]])
        assert np.array_equal(np.sort(src * N + dst), np.sort(both[:, 0] * N + both[:, 1]))
    # Weights are a function of the endpoint pair, so both orders draw the same ones.
    (sc, dc, wc), (sr, dr, wr) = grid_edges(store / "grids" / "w-column"), grid_edges(store / "grids" / "w-row")
    assert np.array_equal(wc[np.argsort(sc * N + dc)], wr[np.argsort(sr * N + dr)])


def test_a_grid_of_more_edges_than_one_read_batch(tmp_path):
    """700,000 int32 pairs (5.6 MB) take more than one 4 MiB read: each must be spooled once."""
    rng = np.random.default_rng(2)
    n = 50_000
    edges = rng.integers(0, n, size=(700_000, 2))
    store = make_store(tmp_path, edges, n)
    built = build_grid(store=store, partitions=3, memory="256M")
    assert built["num_edges"] == len(edges)
    src, dst, _ = grid_edges(Path(built["dir"]))
    assert np.array_equal(np.sort(src * n + dst), np.sort(edges[:, 0] * n + edges[:, 1]))


# ---------------------------------------------------------------------------------------------
# algorithms against networkx and scipy


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_pagerank(graphs, tmp_path, order, keep):
    store, g = graphs["store"], graphs["g"]
    src, dst, _ = grid_edges(store / "grids" / f"d-{order}")
    # Ten iterations exactly as a numpy power iteration computes them.
    s, out = run_on(store, f"d-{order}", "pagerank", keep, tmp_path / "pr10", iterations=10)
    assert s["iterations"] == 10 and s["edges"] == 10 * g.number_of_edges()
    rank = np.load(out / "rank.npy")
    assert rank.dtype == np.float32 and rank.shape == (N,)
    np.testing.assert_allclose(rank, power_iteration(src, dst, N, 10), rtol=1e-5)
    # Run to convergence: networkx's PageRank (dangling vertices included).
    s, out = run_on(store, f"d-{order}", "pagerank", keep, tmp_path / "pr", iterations=150)
    ref = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    np.testing.assert_allclose(np.load(out / "rank.npy"), [ref[v] for v in range(N)], rtol=1e-5)
    assert abs(np.load(out / "rank.npy").sum() - 1) < 1e-5
    # A tolerance stops early and says so.
    s, _ = run_on(store, f"d-{order}", "pagerank", keep, tmp_path / "tol", iterations=150, tolerance=1e-8)
    assert s["iterations"] < 150 and s["result"]["converged"] is True


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_bfs_levels_and_parents(graphs, tmp_path, order, keep):
    store, g = graphs["store"], graphs["g"]
    root = max(range(300), key=lambda v: g.out_degree(v))  # a vertex of the big part
    s, out = run_on(store, f"d-{order}", "bfs", keep, tmp_path, root=root)
    level, parent = np.load(out / "level.npy"), np.load(out / "parent.npy")
    assert level.dtype == parent.dtype == np.int64
    want = np.full(N, -1)
    for v, k in nx.single_source_shortest_path_length(g, root).items():
        want[v] = k
    assert np.array_equal(level, want)
    assert 0 < (want >= 0).sum() < N  # some vertices are out of reach
    assert parent[root] == root and np.all(parent[want < 0] == -1)
    for v in np.flatnonzero(want > 0):
        assert g.has_edge(int(parent[v]), int(v)) and level[parent[v]] == level[v] - 1
    assert s["iterations"] == want.max() + 1
    # From a vertex without edges only the root is reached.
    run_on(store, f"d-{order}", "bfs", keep, tmp_path / "alone", root=305)
    assert np.array_equal(np.flatnonzero(np.load(tmp_path / "alone" / "level.npy") >= 0), [305])


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_wcc(graphs, tmp_path, order, keep):
    store, g = graphs["store"], graphs["g"]
    _, out = run_on(store, f"s-{order}", "wcc", keep, tmp_path)
    component = np.load(out / "component.npy")
    assert component.dtype == np.int64
    want = [set(c) for c in nx.weakly_connected_components(g)]
    got: dict[int, set] = {}
    for v, c in enumerate(component.tolist()):
        got.setdefault(c, set()).add(v)
    assert sorted(map(sorted, got.values())) == sorted(map(sorted, want))
    assert all(label == min(members) for label, members in got.items())  # labelled by the smallest id


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_sssp(graphs, tmp_path, order, keep):
    store, g = graphs["store"], graphs["g"]
    src, dst, w = grid_edges(store / "grids" / f"w-{order}")
    wg = nx.DiGraph()
    wg.add_nodes_from(range(N))
    wg.add_weighted_edges_from(zip(src.tolist(), dst.tolist(), w.astype(np.float64).tolist(), strict=True))
    root = max(range(300), key=lambda v: g.out_degree(v))
    _, out = run_on(store, f"w-{order}", "sssp", keep, tmp_path, root=root)
    distance = np.load(out / "distance.npy")
    want = np.full(N, np.inf)
    for v, dist in nx.single_source_dijkstra_path_length(wg, root).items():
        want[v] = dist
    assert np.array_equal(np.isinf(distance), np.isinf(want)) and distance[root] == 0
    np.testing.assert_allclose(distance[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-9)


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_spmv(graphs, tmp_path, order, keep):
    store = graphs["store"]
    x = np.random.default_rng(4).standard_normal(N)
    np.save(tmp_path / "x.npy", x)
    for grid, weighted in ((f"d-{order}", False), (f"w-{order}", True)):
        src, dst, w = grid_edges(store / "grids" / grid)
        a = sparse.coo_matrix((w.astype(np.float64) if weighted else np.ones(len(src)), (src, dst)), shape=(N, N))
        _, out = run_on(store, grid, "spmv", keep, tmp_path / grid, vector=tmp_path / "x.npy", weighted=weighted)
        np.testing.assert_allclose(np.load(out / "y.npy"), a.T @ x, rtol=1e-6, atol=1e-9)
    # Without a vector, x is all ones: y is the in-degree.
    _, out = run_on(store, f"d-{order}", "spmv", keep, tmp_path / "ones")
    assert np.array_equal(np.load(out / "y.npy"), np.load(store / "grids" / f"d-{order}" / "in_degree.npy"))


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_kcore(graphs, tmp_path, order, keep):
    """Core numbers of an undirected simple graph, on a simple grid: the store's self-loops dropped."""
    _, out = run_on(graphs["ustore"], f"k-{order}", "kcore", keep, tmp_path)
    core = np.load(out / "core.npy")
    want = nx.core_number(graphs["u"])
    assert core.dtype == np.int64 and core.tolist() == [want[v] for v in range(N)]
    assert core.max() >= 3


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_personalized_pagerank(graphs, tmp_path, order, keep):
    store, g = graphs["store"], graphs["g"]
    seeds = [max(range(300), key=lambda v: g.out_degree(v)), 305]  # a hub and a vertex without edges
    s, out = run_on(store, f"d-{order}", "ppr", keep, tmp_path, iterations=150, seeds=",".join(map(str, seeds)))
    ref = nx.pagerank(g, alpha=0.85, personalization=dict.fromkeys(seeds, 1.0), tol=1e-14, max_iter=10_000)
    rank = np.load(out / "rank.npy")
    np.testing.assert_allclose(rank, [ref[v] for v in range(N)], rtol=1e-5, atol=1e-9)
    assert s["result"]["seeds"] == seeds and abs(rank.sum() - 1) < 1e-5


def test_personalized_pagerank_seeds_by_name(tmp_path):
    """In a store with node names, seeds are names; an unknown name is refused by name."""
    g = nx.gnm_random_graph(40, 160, seed=2, directed=True)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.tsv").write_text("".join(f"n{u}\tn{v}\n" for u, v in g.edges))
    run_strata("convert", tmp_path / "raw", "--out", tmp_path / "named.strata", "-q")
    named = Store(tmp_path / "named.strata")
    s = run(algorithm="ppr", store=tmp_path / "named.strata", seeds=["n3", "n17"], iterations=150, out=tmp_path / "o")
    assert s["result"]["seeds"] == [named.node_id("n3"), named.node_id("n17")]
    ref = nx.pagerank(g, alpha=0.85, personalization={3: 1.0, 17: 1.0}, tol=1e-14, max_iter=10_000)
    rank = np.load(tmp_path / "o" / "rank.npy")
    np.testing.assert_allclose([rank[named.node_id(f"n{v}")] for v in g], [ref[v] for v in g], rtol=1e-5)
    with pytest.raises(ConfigError, match=r'seeds: no node is named "n99"'):
        run(algorithm="ppr", store=tmp_path / "named.strata", seeds="n99", out=tmp_path / "bad")


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_scc(graphs, tmp_path, order, keep):
    """Against networkx: each component labelled by its smallest vertex."""
    store, g = graphs["store"], graphs["g"]
    s, out = run_on(store, f"d-{order}", "scc", keep, tmp_path)
    component = np.load(out / "component.npy")
    want = list(nx.strongly_connected_components(g))
    assert 10 < len(want) < N - 10 and s["result"]["components"] == len(want)
    for members in want:
        assert set(component[sorted(members)].tolist()) == {min(members)}


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_mis(graphs, tmp_path, order, keep):
    """Independent and maximal on an undirected graph with self-loops; a seed fixes the set."""
    u = graphs["u"]
    sets = []
    for seed in (1, 1, 2):
        s, out = run_on(graphs["ustore"], f"s-{order}", "mis", keep, tmp_path / str(len(sets)), seed=seed)
        in_set = np.load(out / "in_set.npy")
        members = set(np.flatnonzero(in_set == 1).tolist())
        assert nx.is_dominating_set(u, members) and not any(u.has_edge(a, b) for a in members for b in members)
        assert s["result"]["size"] == len(members)
        sets.append(members)
    assert sets[0] == sets[1] != sets[2]


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_radii(graphs, tmp_path, order, keep):
    """Each vertex's radius is its largest BFS distance from the sampled sources reaching it."""
    store, g = graphs["store"], graphs["g"]
    s, out = run_on(store, f"d-{order}", "radii", keep, tmp_path, samples=20, seed=4)
    sources = s["result"]["sources"]
    assert len(set(sources)) == 20
    want = np.full(N, -1)
    for source in sources:
        for v, k in nx.single_source_shortest_path_length(g, source).items():
            want[v] = max(want[v], k)
    assert np.array_equal(np.load(out / "radius.npy"), want)
    assert s["result"]["largest_radius"] == want.max() > 2


@pytest.mark.parametrize(("order", "keep"), MODES[:2], ids=MODE_IDS[:2])
def test_hyperanf(graphs, tmp_path, order, keep):
    """N(t) within three standard errors of the exact neighbourhood function (BFS from every vertex)."""
    store, g = graphs["store"], graphs["g"]
    s, out = run_on(store, f"d-{order}", "hyperanf", keep, tmp_path, log2_registers=10, seed=7)
    lengths = dict(nx.all_pairs_shortest_path_length(g))
    depth = max(d for row in lengths.values() for d in row.values())
    exact = [sum(d <= t for row in lengths.values() for d in row.values()) for t in range(depth + 2)]
    got = s["result"]["neighbourhood_function"]
    sigma = 1.04 / 32
    for t, want in enumerate(exact):
        assert abs(got[min(t, len(got) - 1)] - want) <= 3 * sigma * want, (t, got, exact)
    reach = np.load(out / "reach.npy")
    assert reach.dtype == np.float64 and reach.min() >= 0.9  # every vertex reaches itself


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_triangles(graphs, tmp_path, order, keep):
    """Per vertex and in all as networkx's `triangles` (self-loops and repeated edges aside)."""
    s, out = run_on(graphs["ustore"], f"s-{order}", "triangles", keep, tmp_path)
    want = nx.triangles(graphs["u"])
    assert np.load(out / "triangles.npy").tolist() == [want[v] for v in range(N)]
    assert s["result"]["triangles"] == sum(want.values()) // 3 > 50


def prec_max_rounds(src: np.ndarray, dst: np.ndarray, n: int, rounds: int) -> tuple[np.ndarray, bool]:
    """Synchronous rounds of networkx's per-vertex rule (`_update_label`: keep the label when it is
    among the most frequent, else take the largest of those) over a grid's edge records."""
    label = np.arange(n)
    for _ in range(rounds):
        new = label.copy()
        for v in range(n):
            labels, counts = np.unique(label[src[dst == v]], return_counts=True)
            if len(labels) and label[v] not in labels[counts == counts.max()]:
                new[v] = labels[counts == counts.max()].max()
        if np.array_equal(new, label):
            return label, True
        label = new
    return label, False


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_lpa(graphs, tmp_path, order, keep):
    """Synchronous rounds of networkx's Prec-Max rule, against a reference of the rule on the
    grid's records (self-loops counted, the repeated one twice)."""
    s, out = run_on(graphs["ustore"], f"s-{order}", "lpa", keep, tmp_path, rounds=8)
    src, dst, _ = grid_edges(graphs["ustore"] / "grids" / f"s-{order}")
    want, converged = prec_max_rounds(src, dst, N, 8)
    assert np.array_equal(np.load(out / "community.npy"), want)
    assert s["result"]["converged"] is converged
    assert s["result"]["communities"] == len(np.unique(want))


def test_lpa_finds_the_planted_communities_networkx_finds(tmp_path):
    """Cliques joined in a ring by single edges: one community each, as networkx's semi-synchronous
    `label_propagation_communities` finds them."""
    g = nx.ring_of_cliques(7, 9)
    store = make_store(tmp_path, np.array(g.edges), g.number_of_nodes(), "cliques")
    s = run(algorithm="lpa", store=store, out=tmp_path / "lpa")
    label = np.load(tmp_path / "lpa" / "community.npy")
    ours = {frozenset(np.flatnonzero(label == x).tolist()) for x in np.unique(label)}
    assert ours == {frozenset(c) for c in nx.community.label_propagation_communities(g)}
    assert len(ours) == 7 and s["result"]["converged"]


@pytest.mark.parametrize(("order", "keep"), MODES, ids=MODE_IDS)
def test_betweenness(graphs, tmp_path, order, keep):
    """Every source: networkx's exact `betweenness_centrality` of the undirected graph. Sampled on
    the directed one: networkx's sums from the same sources, scaled as its `k=` scales them."""
    u, g = graphs["u"], graphs["g"]
    s, out = run_on(graphs["ustore"], f"s-{order}", "betweenness", keep, tmp_path / "exact", sources=0)
    want = nx.betweenness_centrality(u)
    np.testing.assert_allclose(np.load(out / "betweenness.npy"), [want[v] for v in range(N)], rtol=1e-9, atol=1e-15)
    assert s["result"]["batches"] == -(-N // 16)
    k = 25
    s, out = run_on(graphs["store"], f"d-{order}", "betweenness", keep, tmp_path / "k", sources=k, seed=3, batch=10)
    sources = s["result"]["sources"]
    assert len(set(sources)) == k
    sums = nx.betweenness_centrality_subset(g, sources, list(g), normalized=False)
    pairs = N - 1
    scale = [1 / ((k - 1) * (pairs - 1)) if v in sources else 1 / (k * (pairs - 1)) for v in range(N)]
    np.testing.assert_allclose(np.load(out / "betweenness.npy"), [sums[v] * scale[v] for v in range(N)], rtol=1e-9)


def test_runs_find_or_build_a_grid_that_suits(tmp_path):
    g = nx.gnm_random_graph(120, 500, seed=8, directed=True)
    store = make_store(tmp_path, np.array(sorted(g.edges)), 120)
    run(algorithm="pagerank", store=store, iterations=3)
    assert (store / "runs" / "grid-pagerank" / "rank.npy").is_file()
    wcc = run(algorithm="wcc", store=store)  # needs a symmetric grid: one is built
    assert grid_info(wcc["grid"])["symmetric"] is True
    s = run(algorithm="sssp", store=store, root=1, weight_seed=3, weight_low=2.0, weight_high=3.0)
    assert grid_info(s["grid"])["weights"] == {"kind": "random", "seed": 3, "low": 2.0, "high": 3.0}
    names = sorted(e["name"] for e in list_grids(store))
    assert len(names) == 3 and all("error" not in e for e in list_grids(store))
    # The next runs find the grids built for them instead of building more.
    assert run(algorithm="wcc", store=store)["grid"] == wcc["grid"]
    drawn = {"weight_seed": 3, "weight_low": 2.0, "weight_high": 3.0}
    assert run(algorithm="spmv", store=store, weighted=True, **drawn)["grid"] == s["grid"]
    assert sorted(e["name"] for e in list_grids(store)) == names
    # Other drawn weights are another grid: a run never reads weights it did not ask for.
    assert run(algorithm="sssp", store=store, root=1)["grid"] != s["grid"]


def test_sssp_runs_on_the_weights_the_store_was_converted_with(tmp_path):
    g = nx.gnm_random_graph(150, 700, seed=4, directed=True)
    rng = np.random.default_rng(4)
    for a, b in g.edges:
        g[a][b]["weight"] = float(np.float32(rng.uniform(0.1, 5.0)))
    (tmp_path / "edges.tsv").write_text("".join(f"{a}\t{b}\t{w['weight']!r}\n" for a, b, w in g.edges(data=True)))
    store = tmp_path / "w.strata"
    cols = ["--columns", "src,dst,weight"]
    run_strata("convert", tmp_path / "edges.tsv", *cols, "--num-nodes", 150, "--out", store, "-q")
    proc = run_strata("run", "sssp", store, "--root", 0, "--out", tmp_path / "sssp")
    assert "weighted by the edges' own weights" in proc.stderr, proc.stderr
    dist = np.load(tmp_path / "sssp" / "distance.npy")
    want = nx.single_source_dijkstra_path_length(g, 0)
    for v in range(150):
        assert dist[v] == pytest.approx(want.get(v, np.inf), rel=1e-9)
    assert grid_info(run(algorithm="sssp", store=store, root=0)["grid"])["weights"] == {"kind": "store"}
    info = run_strata("grid", "info", store).stdout
    assert "weighted (the store's edge_weights_train)" in info, info
    # Asked for the store's weights, a store without them is refused naming the option.
    plain = make_store(tmp_path, np.array(sorted(g.edges)), 150)
    proc = run_strata("run", "sssp", plain, "--weight-source", "store", check=False)
    assert proc.returncode == 2 and "weight_source" in proc.stderr and "no edge weights" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    if not (SHARED_DATASETS / "planetoid").is_dir():
        pytest.skip(f"{SHARED_DATASETS}/planetoid is absent (CI always has it): the Cora checks need it")
    out = tmp_path_factory.mktemp("cora") / "cora.strata"
    convert(ConvertConfig(inputs=[SHARED_DATASETS / "planetoid"], name="cora", out=out))
    edges = np.asarray(Store(out).edges("train")).astype(np.int64)
    g = nx.DiGraph()
    g.add_nodes_from(range(Store(out).num_nodes))
    g.add_edges_from(edges.tolist())
    return out, g


def test_cora_citation_graph(cora, tmp_path):
    """Cora's citation graph (2,708 papers, 10,556 directed edges: every citation both ways)."""
    store, g = cora
    n = g.number_of_nodes()
    build_grid(store=store, name="rows", partitions=5, order="row")
    build_grid(store=store, name="sym", partitions=3, symmetrize=True)
    ref = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    for vertex in ("memory", "windows"):
        s = run(algorithm="pagerank", store=store, grid="rows", iterations=150, keep_resident=False, segment="8K",
                vertex=vertex, out=tmp_path / f"pr-{vertex}")  # fmt: skip
        assert s["bytes_disk"] > 0
        np.testing.assert_allclose(np.load(Path(s["out"]) / "rank.npy"), [ref[v] for v in range(n)], rtol=1e-5)
    assert "in windows of" in format_summary(s)
    want = np.full(n, -1)
    for v, k in nx.single_source_shortest_path_length(g, 0).items():
        want[v] = k
    for vertex in ("auto", "windows"):
        s = run(algorithm="bfs", store=store, grid="rows", root=0, out=tmp_path / vertex, vertex=vertex)
        assert s["placement"]["vertex_windowed"] is (vertex == "windows")
        assert np.array_equal(np.load(tmp_path / vertex / "level.npy"), want)
    assert not list((tmp_path / "windows").glob(".vertex-*")), "scratch files are unlinked"
    s = run(algorithm="wcc", store=store, grid="sym", out=tmp_path / "wcc")
    component = np.load(tmp_path / "wcc" / "component.npy")
    parts = list(nx.weakly_connected_components(g))
    assert len(np.unique(component)) == len(parts) == 78
    assert all(len({int(component[v]) for v in p}) == 1 and component[next(iter(p))] == min(p) for p in parts)


# ---------------------------------------------------------------------------------------------
# run directories, the CLI and `strata plot`


def test_run_directory_records_each_iteration(graphs, tmp_path):
    seen = []
    summary = run(
        RunConfig(algorithm="pagerank", store=graphs["store"], grid="d-row", iterations=4, out=tmp_path / "r"),
        on_iteration=seen.append,
    )
    assert [r["iteration"] for r in seen] == [0, 1, 2, 3]  # the native records count from 0
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["format"] == "strata-grid-run" and meta["config"]["iterations"] == 4
    assert meta["summary"]["arrays"] == summary["arrays"] == [str(tmp_path / "r" / "rank.npy")]
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2, 3, 4] and lines == meta["history"]
    keys = {"iteration", "seconds", "edges", "edges_per_s", "active", "value", "mb_disk", "mb_far", "mb_local",
            "mb_per_s_disk", "mb_per_s_far", "wait_seconds", "far_fallbacks"}  # fmt: skip
    assert all(keys <= set(m) for m in lines)
    assert all(m["edges"] == graphs["g"].number_of_edges() and m["active"] == N for m in lines)
    assert format_iteration(seen[2], "pagerank").startswith("iter 3  ")
    assert " edges/s  active 310  disk 0 MB/s  far 0 MB/s  L1 change " in format_iteration(lines[2], "pagerank")
    # An exception from on_iteration stops the run; a run failing its checks leaves the last one be.
    with pytest.raises(RuntimeError, match="stop here"):
        run(algorithm="pagerank", store=graphs["store"], grid="d-row", out=tmp_path / "r",
            on_iteration=lambda r: (_ for _ in ()).throw(RuntimeError("stop here")))  # fmt: skip
    assert not (tmp_path / "r" / "run.json").exists()
    run(algorithm="bfs", store=graphs["store"], grid="d-row", out=tmp_path / "r2", root=1)
    with pytest.raises(ConfigError, match="root"):
        run(algorithm="bfs", store=graphs["store"], grid="d-row", out=tmp_path / "r2", root=N)
    assert json.loads((tmp_path / "r2" / "run.json").read_text())["config"]["root"] == 1
    # --out never writes into a store, a grid or another engine's run (whose run.json it replaced).
    other = tmp_path / "embed-run"
    other.mkdir()
    (other / "run.json").write_text('{"format": "strata-embed-run"}')
    for out, what in (
        (graphs["store"], "a store"),
        (graphs["store"] / "grids" / "d-row", "a grid"),
        (other, "another kind of run"),
    ):
        with pytest.raises(ConfigError, match=f"--out {out} is {what}"):
            run(algorithm="bfs", store=graphs["store"], grid="d-row", out=out)
    assert (other / "run.json").read_text() == '{"format": "strata-embed-run"}'
    assert not (graphs["store"] / "level.npy").exists()


def test_cli_end_to_end_with_plots(graphs, tmp_path, capsys):
    store = tmp_path / "cli.strata"
    shutil.copytree(graphs["store"], store, ignore=shutil.ignore_patterns("grids", "runs"))
    proc = run_strata("grid", "build", store, "--partitions", "3", "--order", "row", "--name", "g1", "--weighted")
    assert f"Built grid {store}/grids/g1: 310 vertices in 3 chunks" in proc.stdout
    listing = run_strata("grid", "info", store).stdout
    e = graphs["g"].number_of_edges()
    assert f"g1  P=3, row order, weighted (random, seed 0, in (0, 1]); 310 vertices, {e:,} edges" in listing
    detail = run_strata("grid", "list", store / "grids" / "g1").stdout
    assert "310 vertices in 3 chunks of 104" in detail
    assert json.loads(run_strata("grid", "info", store, "--json").stdout)[0]["manifest"]["order"] == "row"
    out = tmp_path / "sssp"
    proc = run_strata("run", "sssp", store, "--root", "3", "--grid", "g1", "--segment", "4K",
                      "--no-keep-resident", "--out", out)  # fmt: skip
    assert "grid budget 1.00 GiB: planned" in proc.stderr and "the rest from SSD" in proc.stderr
    assert "iter 1  " in proc.stderr and "activated" in proc.stderr
    assert proc.stdout.startswith("Ran sssp on grid g1") and f"wrote {out}/distance.npy" in proc.stdout
    assert {p.name for p in out.iterdir()} == {"distance.npy", "metrics.jsonl", "run.json"}
    summary = json.loads(run_strata("run", "pagerank", store, "--iterations", "5", "-q", "--json-summary").stdout)
    assert summary["iterations"] == 5 and Path(summary["out"]) == store / "runs" / "grid-pagerank"
    charts = run_strata("plot", out, "--out", tmp_path / "charts").stdout.split()
    assert sorted(Path(p).name for p in charts) == ["bytes.png", "iterations.png"]
    for p in charts:
        data = Path(p).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, p
    # `strata plot STORE` means its only grid run; a run still going has metrics.jsonl only. These
    # two in this process (tests/cli_in_process.py): matplotlib's import costs a child ~1 CPU s.
    cli = strata_in_process(capsys)
    assert cli("plot", store).stdout.split() == [
        str(store / "runs" / "grid-pagerank" / "plots" / n) for n in ("iterations.png", "bytes.png")
    ]
    (out / "run.json").unlink()
    assert len(cli("plot", out).stdout.split()) == 2
    # A grid or a grid run where a store belongs says what it is (was: "manifest.json is missing
    # (an interrupted conversion leaves only a .partial directory)").
    grid = cli("info", store / "grids" / "g1", check=False)
    assert grid.returncode != 0 and "not a Strata store but a grid (`strata grid info`" in grid.stderr
    ran = cli("check", store / "runs" / "grid-pagerank", check=False)
    assert ran.returncode == 2 and "not a Strata store but a run directory" in ran.stdout + ran.stderr


# ---------------------------------------------------------------------------------------------
# bad inputs


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"algorithm": "pagerank", "far_ratio": 1.5}, "run.far_ratio: must be <= 1.0, got 1.5"),
        ({"algorithm": "pagerank", "far_ratio": -0.1}, "run.far_ratio: must be >= 0.0, got -0.1"),
        ({"algorithm": "bfs", "root": -1}, "run.root: must be >= 0, got -1"),
        ({"algorithm": "pagerank", "iterations": 0}, "run.iterations: must be >= 1, got 0"),
        ({"algorithm": "pagerank", "damping": 1.0}, "run.damping: must be in [0, 1)"),
        ({"algorithm": "pagerank", "far": "localhost"}, "run.far: expected HOST:PORT"),
        ({"algorithm": "pagerank", "far_chunk": "1K"}, "run.far_chunk: must be between 4 KiB and 64 MiB"),
        ({"algorithm": "pagerank", "prefetch": 0}, "run.prefetch: must be >= 1, got 0"),
        (
            {"algorithm": "pagerank", "vertex": "disk"},
            "run.vertex: unknown choice 'disk' (choices: auto, memory, windows)",
        ),
        ({"algorithm": "pagerank", "segment": "1K"}, "run.segment: must be auto or at least 4 KiB"),
        ({"algorithm": "sssp", "weight_low": 2.0, "weight_high": 1.0}, "weight_low < weight_high"),
        ({"algorithm": "closeness"}, "unknown choice 'closeness' (choices: pagerank, bfs, wcc, "),
        ({"algorithm": "betweenness", "batch": 65}, "run.batch: must be <= 64, got 65"),
        ({"algorithm": "lpa", "rounds": 0}, "run.rounds: must be >= 1, got 0"),
        # 10^5 compute threads were spawned every pass: minutes of thread starts.
        ({"algorithm": "pagerank", "threads": 100_000}, "run.threads: must be <= 1024, got 100000"),
    ],
)
def test_bad_options_name_the_field(options, message):
    with pytest.raises(ConfigError) as e:
        RunConfig(store="x.strata", **options)
    assert message in str(e.value)


def test_bad_grid_options():
    with pytest.raises(ConfigError, match=r"grid\.build\.partitions: must be <= 4096, got 5000"):
        GridBuildConfig(store="x", partitions=5000)
    with pytest.raises(ConfigError, match=r"grid\.build\.name: must be a plain directory name"):
        GridBuildConfig(store="x", name="../up")


def test_bad_inputs_through_the_api(graphs, tmp_path):
    store = graphs["store"]
    with pytest.raises(ConfigError, match=f"option root: vertex {N} is not in the graph"):
        run(algorithm="bfs", store=store, root=N, out=tmp_path / "o")
    with pytest.raises(InputNotFoundError, match="no such store"):
        run(algorithm="pagerank", store=tmp_path / "missing.strata")
    with pytest.raises(InputNotFoundError, match="no such store"):
        build_grid(store=tmp_path / "missing.strata")
    with pytest.raises(ConfigError, match="d-column is not symmetric and wcc needs it"):
        run(algorithm="wcc", store=store, grid="d-column", out=tmp_path / "o")
    with pytest.raises(ConfigError, match="d-row has no weights and sssp needs them"):
        run(algorithm="sssp", store=store, grid="d-row", out=tmp_path / "o")
    with pytest.raises(ConfigError, match="not a grid"):
        run(algorithm="pagerank", store=store, grid="no-such-grid", out=tmp_path / "o")
    with pytest.raises(ConfigError, match="already exists"):
        build_grid(store=store, name="d-row")
    with pytest.raises(
        BudgetError, match=r"memory budget of 1.00 MiB is too small: vertex data takes .* \(windows of it"
    ):
        run(algorithm="pagerank", store=store, grid="d-row", memory="1M", out=tmp_path / "o")
    port = free_port()
    with pytest.raises(ConfigError, match=f"cannot use the memory server at 127.0.0.1:{port}"):
        run(algorithm="pagerank", store=store, grid="d-row", far=f"127.0.0.1:{port}", out=tmp_path / "o")
    assert not (tmp_path / "o").exists()  # failed runs leave nothing behind
    np.save(tmp_path / "short.npy", np.ones(3))
    with pytest.raises(ConfigError, match=r"expected shape \(310,\)"):
        run(algorithm="spmv", store=store, grid="d-row", vector=tmp_path / "short.npy", out=tmp_path / "o")


def test_malformed_grid_json(graphs, tmp_path):
    store = tmp_path / "bad.strata"
    shutil.copytree(graphs["store"], store, ignore=shutil.ignore_patterns("runs"))
    (store / "grids" / "d-row" / "grid.json").write_text("{not json")
    with pytest.raises(StoreFormatError, match=r"grid\.json is not valid JSON"):
        grid_info(store / "grids" / "d-row")
    with pytest.raises(StoreFormatError, match=r"grid\.json is not valid JSON"):
        run(algorithm="pagerank", store=store, grid="d-row")
    (store / "grids" / "d-column" / "grid.json").write_text('{"format": "strata-grid"}')
    with pytest.raises(StoreFormatError):
        grid_info(store / "grids" / "d-column")
    # Listing the store shows the broken grids beside the good ones, and fails naming them;
    # naming one fails.
    entries = {e["name"]: e for e in list_grids(store)}
    assert "error" in entries["d-row"] and "manifest" in entries["w-row"]
    proc = run_strata("grid", "info", store, check=False)
    assert proc.returncode == 2
    assert "d-row" in proc.stdout and "invalid: grid" in proc.stdout and "w-row" in proc.stdout
    assert "error: grid d-row is invalid: " in proc.stderr and "grid.json is not valid JSON" in proc.stderr
    proc = run_strata("grid", "info", store / "grids" / "d-row", check=False)
    assert proc.returncode == 2 and "grid.json is not valid JSON" in proc.stderr


def test_a_run_replacing_another_algorithms_leaves_none_of_its_arrays(graphs, tmp_path):
    out = tmp_path / "r"
    run(algorithm="pagerank", store=graphs["store"], grid="d-row", out=out)
    run(algorithm="bfs", store=graphs["store"], grid="d-row", out=out, root=1)
    # The pagerank run's rank.npy stayed beside the bfs run's arrays and its run.json.
    assert sorted(p.name for p in out.iterdir()) == ["level.npy", "metrics.jsonl", "parent.npy", "run.json"]
    # Two runs wrote one directory at once, each its arrays and metrics lines among the other's.
    other = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(ConfigError, match="is being written by another run"):
            # Refused before its first iteration, the directory being there already.
            run(algorithm="pagerank", store=graphs["store"], grid="d-row", out=out, on_iteration=pytest.fail)
    finally:
        os.close(other)
    assert (out / "level.npy").exists() and not (out / "rank.npy").exists()
    # A new --out is made and locked at the run's start, before anything is written there.
    fresh, locked_before = tmp_path / "fresh", []

    def progress(*_):
        if not locked_before:
            fd = os.open(fresh, os.O_RDONLY)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
            locked_before.append(True)

    def first(_):
        assert locked_before, "locked before the first iteration"

    run(algorithm="pagerank", store=graphs["store"], grid="d-row", out=fresh, progress=progress, on_iteration=first)
    assert (fresh / "run.json").exists()
    # A run that fails its checks leaves no directory it made.
    with pytest.raises(ConfigError, match="vertex 1000 is not in the graph"):
        run(algorithm="bfs", store=graphs["store"], grid="d-row", out=tmp_path / "failed", root=1000)
    assert not (tmp_path / "failed").exists()


def test_bad_inputs_through_the_cli(graphs, tmp_path, capsys):
    store = graphs["store"]
    # The first case in a child process (its exit status and stderr), the rest in this one.
    cli = strata_in_process(capsys)
    cases = [
        (["run", "closeness", store], "unknown choice 'closeness' (choices: pagerank, bfs,"),
        (["run", "bfs", store, "--root", "-3"], "--root: must be >= 0, got -3"),
        (["run", "bfs", store, "--grid", "d-row", "--root", "1000"], "option root: vertex 1000 is not in the graph"),
        (
            ["run", "pagerank", store, "--far", "127.0.0.1:7000", "--far-ratio", "2"],
            "run.far_ratio: must be <= 1.0, got 2.0",
        ),
        (["run", "pagerank", tmp_path / "nope.strata"], "no such store"),
        # Another algorithm's option was ignored: this ran global PageRank, not from vertex 5.
        (["run", "pagerank", store, "--root", "5"], "run.root: pagerank does not take it (a parameter of bfs, sssp)"),
        (["run", "bfs", store, "--weight-low", "0.5"], "run.weight_low: bfs reads no edge weights"),
        (["run", "wcc", store, "--grid", "d-row"], "is not symmetric and wcc needs it"),
        (["run", "triangles", store, "--grid", "d-row"], "is not symmetric and triangles needs it"),
        (["grid", "info", tmp_path / "nope"], "no such store or grid directory"),
        (["grid", "info", tmp_path], "neither a store (manifest.json) nor a grid directory"),
    ]
    for i, (args, message) in enumerate(cases):
        runner = run_strata if i == 0 else cli
        proc = runner(*args, "--out", tmp_path / "o", check=False) if args[0] == "run" else runner(*args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    port = free_port()
    proc = run_strata("run", "pagerank", store, "--grid", "d-row", "--far", f"127.0.0.1:{port}", "--out",
                      tmp_path / "o", check=False)  # fmt: skip
    assert proc.returncode != 0 and f"cannot use the memory server at 127.0.0.1:{port}" in proc.stderr
    assert not (tmp_path / "o").exists()
