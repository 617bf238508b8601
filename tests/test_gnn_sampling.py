"""Weighted, temporal and per-edge-type sampling end to end: stores converted through the CLI
from a random typed, weighted, timestamped edge list, sampled through
``strata.gnn.sampling.NeighborSampler``, and checked against plain NumPy references of PyG's
documented semantics computed from the edge list (exact where the choice is deterministic,
frequencies over many batch keys where it is random)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata
from strata.errors import ConfigError
from strata.gnn.sampling import NeighborSampler
from strata.store import Store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_sampling")

PAPERS, AUTHORS = 30, 12
EDGE_TYPES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "written_by", "author")]
#: Batch keys a frequency test draws over.
TRIALS = 2000


def random_edges(seed: int = 0) -> dict[str, np.ndarray]:
    """Distinct (src, etype, dst) edges with weights (some zero) and times: papers cite papers,
    authors write papers, and each writes edge reversed as written_by."""
    rng = np.random.default_rng(seed)
    cites = {(int(a), 0, int(b)) for a, b in rng.integers(0, PAPERS, size=(220, 2)) if a != b}
    writes = {
        (int(a), 1, int(b))
        for a, b in zip(rng.integers(PAPERS, PAPERS + AUTHORS, 90), rng.integers(0, PAPERS, 90), strict=True)
    }
    rows = sorted(cites | writes | {(dst, 2, src) for src, _, dst in writes})
    src, etype, dst = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
    weight = rng.choice(np.array([0.0, 0.2, 1.0, 3.0, 7.0], dtype=np.float32), size=len(rows))
    time = rng.integers(0, 100, size=len(rows))
    return {"src": src, "etype": etype, "dst": dst, "weight": weight, "time": time}


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict:
    """The edges, and three stores of them: typed, untyped with weights and times, and bare
    (no weights, times or types)."""
    d: Path = tmp_path_factory.mktemp("sampling")
    e = random_edges()
    (d / "node_types.tsv").write_text(f"paper\t{PAPERS}\nauthor\t{AUTHORS}\n")
    (d / "edge_types.tsv").write_text("".join("\t".join(t) + "\n" for t in EDGE_TYPES))
    rel = [EDGE_TYPES[t][1] for t in e["etype"]]
    lines = zip(e["src"], rel, e["dst"], e["weight"], e["time"], strict=True)
    (d / "typed.csv").write_text("".join(f"{s},{r},{t},{float(w)!r},{tm}\n" for s, r, t, w, tm in lines))
    (d / "plain.csv").write_text(
        "".join(
            f"{s},{t},{float(w)!r},{tm}\n"
            for s, t, w, tm in zip(e["src"], e["dst"], e["weight"], e["time"], strict=True)
        )
    )
    types = ["--node-types", d / "node_types.tsv", "--edge-types", d / "edge_types.tsv"]
    run_strata(
        "convert", d / "typed.csv", "--columns", "src,rel,dst,weight,time", *types, "--out", d / "typed.strata", "-q"
    )
    run_strata("convert", d / "plain.csv", "--columns", "src,dst,weight,time", "--out", d / "attrs.strata", "-q")
    (d / "bare.csv").write_text("".join(f"{s},{t}\n" for s, t in zip(e["src"], e["dst"], strict=True)))
    run_strata("convert", d / "bare.csv", "--columns", "src,dst", "--out", d / "bare.strata", "-q")
    return {"edges": e, "typed": d / "typed.strata", "attrs": d / "attrs.strata", "dir": d}


def in_edges(e: dict, v: int, etype: int | None = None) -> np.ndarray:
    """Indices of ``v``'s in-edges (of ``etype`` when given), in edge-id order."""
    mask = e["dst"] == v
    if etype is not None:
        mask &= e["etype"] == etype
    return np.flatnonzero(mask)


def inclusion(weights: np.ndarray, k: int) -> np.ndarray:
    """PyG's weighted sampling without replacement, exactly: the probability that each item
    is among ``k`` successive draws, each proportional to the weights left (zero never)."""
    w = np.asarray(weights, dtype=np.float64)
    positive = np.flatnonzero(w > 0)
    if len(positive) <= k:
        return (w > 0).astype(np.float64)
    p = np.zeros(len(w))
    for order in itertools.permutations(positive, k):
        left, prob = w.sum(), 1.0
        for i in order:
            prob *= w[i] / left
            left -= w[i]
        p[list(order)] += prob
    return p


def assert_frequencies(counts: np.ndarray, probs: np.ndarray, trials: int, what: str):
    """Counts over ``trials`` draws against their probabilities: within 5 standard deviations
    (plus 3 counts for the discreteness), and exactly zero where the probability is zero."""
    counts, probs = np.asarray(counts, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    expected = probs * trials
    slack = 5 * np.sqrt(trials * probs * (1 - probs)) + 3
    bad = np.flatnonzero(np.abs(counts - expected) > slack)
    assert bad.size == 0, f"{what}: counts {counts[bad]} against expected {expected[bad]}"
    assert np.all(counts[probs == 0] == 0), f"{what}: an impossible edge was drawn"


def kept_edges(e: dict, out, seed_index: int) -> list[int]:
    """Hop-1 edges of seed ``seed_index`` in a homogeneous sample, as indices into the edge
    list (a (source, destination) pair is one edge: the generator draws distinct pairs)."""
    first_hop = slice(0, out.num_sampled_edges[0])
    row, col = out.row[first_hop], out.col[first_hop]
    v = out.node[seed_index]
    found = []
    for r in row[col == seed_index]:
        u = out.node[r]
        match = np.flatnonzero((e["src"] == u) & (e["dst"] == v))
        assert match.size == 1, f"sampled edge {u} -> {v} is not one edge of the graph"
        found.append(int(match[0]))
    return found


def seeds_with_choice(e: dict, k: int, min_positive: int) -> np.ndarray:
    """Papers with more than ``k`` positive-weight in-edges of type cites (the seeds whose
    choice is random), at least ``min_positive``."""
    picked = [v for v in range(PAPERS) if np.sum(e["weight"][in_edges(e, v, 0)] > 0) > k]
    assert len(picked) >= min_positive, "the random graph has too few seeds with a choice"
    return np.array(picked)


def test_weighted_frequencies_match_successive_weighted_draws(graph):
    # Untyped store: a node's in-edges are all one list.
    e = graph["edges"]
    k = 2
    sampler = NeighborSampler(graph["attrs"], [k], weighted=True, seed=3)
    seeds = np.array([v for v in range(PAPERS) if np.sum(e["weight"][in_edges(e, v)] > 0) > k])
    assert len(seeds) >= 10
    counts = {v: np.zeros(len(in_edges(e, v))) for v in seeds}
    for key in range(TRIALS):
        out = sampler.sample(seeds, batch_key=key)
        for i, v in enumerate(seeds):
            edges = in_edges(e, v)
            for idx in kept_edges(e, out, i):
                counts[v][np.searchsorted(edges, idx)] += 1
    for v in seeds:
        assert_frequencies(counts[v], inclusion(e["weight"][in_edges(e, v)], k), TRIALS, f"node {v}")


def test_temporal_uniform_takes_eligible_edges_uniformly(graph):
    e = graph["edges"]
    sampler = NeighborSampler(graph["attrs"], [2], temporal_strategy="uniform", seed=1)
    seeds = np.arange(PAPERS)
    times = np.full(PAPERS, 50)
    counts = {v: np.zeros(len(in_edges(e, v))) for v in seeds}
    for key in range(TRIALS // 2):
        out = sampler.sample(seeds, batch_key=key, seed_time=times)
        assert np.array_equal(out.batch[: len(seeds)], np.arange(len(seeds)))
        for i, v in enumerate(seeds):
            edges = in_edges(e, v)
            for idx in kept_edges(e, out, i):
                counts[v][np.searchsorted(edges, idx)] += 1
    for v in seeds:
        edges = in_edges(e, v)
        eligible = e["time"][edges] <= 50
        m = eligible.sum()
        probs = np.where(eligible, min(1.0, 2 / m) if m else 0.0, 0.0)
        assert_frequencies(counts[v], probs, TRIALS // 2, f"node {v}")


def test_temporal_last_takes_the_most_recent_eligible_edges(graph):
    e = graph["edges"]
    k = 3
    sampler = NeighborSampler(graph["attrs"], [k, 2], temporal_strategy="last")
    seeds = np.arange(PAPERS)
    times = np.random.default_rng(5).integers(0, 100, PAPERS)
    out = sampler.sample(seeds, batch_key=7, seed_time=times)
    for i, v in enumerate(seeds):
        edges = in_edges(e, v)
        eligible = edges[e["time"][edges] <= times[i]]
        # PyG's "last" over edges ordered by time (stable, so ties keep edge-id order).
        order = eligible[np.lexsort((eligible, e["time"][eligible]))]
        want = sorted(e["src"][order[-k:]]) if len(order) else []
        got = sorted(e["src"][kept_edges(e, out, i)])
        assert got == want, f"seed {v} at {times[i]}"
    # Every edge of the disjoint sample, at either hop, stays within its seed's tree and time.
    for r, c in zip(out.row, out.col, strict=True):
        seed = out.batch[c]
        assert out.batch[r] == seed
        ok = (e["src"] == out.node[r]) & (e["dst"] == out.node[c]) & (e["time"] <= times[seed])
        assert ok.any(), f"edge {out.node[r]} -> {out.node[c]} is later than its seed's time"
    # The same node at two times is two seeds with separate trees.
    twice = sampler.sample([seeds[0], seeds[0]], batch_key=1, seed_time=[0, 99])
    assert list(twice.node[:2]) == [seeds[0], seeds[0]] and list(twice.batch[:2]) == [0, 1]


def test_per_edge_type_fanouts_group_by_type(graph):
    e = graph["edges"]
    fanouts = {EDGE_TYPES[0]: [3, 1], EDGE_TYPES[1]: [2, 0], EDGE_TYPES[2]: [0, 2]}
    sampler = NeighborSampler(graph["typed"], fanouts, seed=11)
    seeds = np.arange(PAPERS)
    counts = {v: np.zeros(len(in_edges(e, v, 0))) for v in seeds}
    offsets = {"paper": 0, "author": PAPERS}
    for key in range(TRIALS // 2):
        out = sampler.sample_hetero(("paper", seeds), batch_key=key)
        assert np.array_equal(out.node["paper"][: len(seeds)], seeds)
        assert out.num_sampled_nodes["paper"][0] == len(seeds) and out.num_sampled_nodes["author"][0] == 0
        for t, (src_t, _, dst_t) in enumerate(EDGE_TYPES if key < 20 else []):
            row, col = out.row[EDGE_TYPES[t]], out.col[EDGE_TYPES[t]]
            assert len(row) == sum(out.num_sampled_edges[EDGE_TYPES[t]])
            src = out.node[src_t][row] + offsets[src_t]
            dst = out.node[dst_t][col] + offsets[dst_t]
            for s, d in zip(src, dst, strict=True):
                assert ((e["src"] == s) & (e["dst"] == d) & (e["etype"] == t)).any(), (
                    f"{s} -> {d} is not a {EDGE_TYPES[t]}"
                )
        if key == 0:
            # Hop 1: each seed takes min(fanout, in-degree) of each type into papers.
            hop1 = {t: out.num_sampled_edges[EDGE_TYPES[t]][0] for t in range(3)}
            want = {t: sum(min(fanouts[EDGE_TYPES[t]][0], len(in_edges(e, v, t))) for v in seeds) for t in range(3)}
            assert hop1 == want
        first = out.num_sampled_edges[EDGE_TYPES[0]][0]
        row, col = out.row[EDGE_TYPES[0]][:first], out.col[EDGE_TYPES[0]][:first]
        for r, c in zip(row, col, strict=True):
            v = out.node["paper"][c]
            edges = in_edges(e, v, 0)
            counts[v][np.flatnonzero(e["src"][edges] == out.node["paper"][r])[0]] += 1
    for v in seeds:
        m = len(in_edges(e, v, 0))
        assert_frequencies(counts[v], np.full(m, min(1.0, 3 / m) if m else 0.0), TRIALS // 2, f"paper {v}")


def test_typed_weighted_draws_by_weight_within_each_type(graph):
    e = graph["edges"]
    k = 2
    sampler = NeighborSampler(graph["typed"], [k], weighted=True, seed=2)
    seeds = seeds_with_choice(e, k, 5)
    counts = {v: np.zeros(len(in_edges(e, v, 0))) for v in seeds}
    for key in range(TRIALS):
        out = sampler.sample(seeds, batch_key=key)
        cites = out.edge_type[: out.num_sampled_edges[0]] == 0
        row, col = out.row[: out.num_sampled_edges[0]][cites], out.col[: out.num_sampled_edges[0]][cites]
        for r, c in zip(row, col, strict=True):
            edges = in_edges(e, seeds[c], 0)
            counts[seeds[c]][np.flatnonzero(e["src"][edges] == out.node[r])[0]] += 1
    for v in seeds:
        assert_frequencies(counts[v], inclusion(e["weight"][in_edges(e, v, 0)], k), TRIALS, f"paper {v}")


def test_samples_are_deterministic_per_batch_key(graph):
    a = NeighborSampler(graph["typed"], [2, 2], weighted=True, seed=4, threads=1)
    b = NeighborSampler(graph["typed"], [2, 2], weighted=True, seed=4, threads=2)
    seeds = np.arange(PAPERS)
    x, y = a.sample(seeds, batch_key=9), b.sample(seeds, batch_key=9)
    for field in ("node", "row", "col", "edge_type"):
        assert np.array_equal(getattr(x, field), getattr(y, field))
    z = a.sample(seeds, batch_key=10)
    assert not (len(z.row) == len(x.row) and np.array_equal(z.row, x.row) and np.array_equal(z.node, x.node))


def test_edge_ids_name_rows_of_the_train_edges(graph):
    attrs = NeighborSampler(graph["attrs"], [3, 2], temporal_strategy="uniform", edge_ids=True)
    seeds = np.arange(0, PAPERS, 3)
    times = np.full(len(seeds), 60)
    out = attrs.sample(seeds, batch_key=2, seed_time=times)
    stored = Store(graph["attrs"]).edges()
    assert np.array_equal(stored[out.edge], np.stack([out.node[out.row], out.node[out.col]], axis=1))
    assert (Store(graph["attrs"]).edge_times()[out.edge] <= 60).all()
    typed = NeighborSampler(graph["typed"], [2, 2], weighted=True, edge_ids=True)
    store = Store(graph["typed"])
    offsets = dict(zip(store.node_types, store.node_type_offsets[:-1], strict=True))
    h = typed.sample_hetero(("paper", np.arange(PAPERS)), batch_key=3)
    for r, et in enumerate(EDGE_TYPES):
        src_t, _, dst_t = et
        src = h.node[src_t][h.row[et]] + offsets[src_t]
        dst = h.node[dst_t][h.col[et]] + offsets[dst_t]
        rows = store.edges()[h.edge[et]]
        assert np.array_equal(rows, np.stack([src, np.full(len(src), r), dst], axis=1))
        assert (store.edge_weights()[h.edge[et]] > 0).all()
    assert NeighborSampler(graph["attrs"], [1]).sample([0]).edge is None
    with pytest.raises(ValueError, match=r"edge_ids: .* is a format-1 store"):
        NeighborSampler(graph["dir"] / "bare.strata", [1], edge_ids=True)


def test_bad_options_name_the_option(graph):
    typed, attrs, bare = graph["typed"], graph["attrs"], graph["dir"] / "bare.strata"
    with pytest.raises(ValueError, match=r"fanouts: unknown edge type"):
        NeighborSampler(typed, {("paper", "likes", "paper"): [1], **{t: [1] for t in EDGE_TYPES}})
    with pytest.raises(ValueError, match=r"fanouts: no fanouts for edge type"):
        NeighborSampler(typed, {EDGE_TYPES[0]: [1]})
    with pytest.raises(ValueError, match=r"fanouts: a dict of per-edge-type fanouts needs a typed store"):
        NeighborSampler(attrs, {EDGE_TYPES[0]: [1]})
    with pytest.raises(ValueError, match=r"temporal_strategy: expected one of"):
        NeighborSampler(attrs, [1], temporal_strategy="first")
    with pytest.raises(ConfigError, match=r"gnn.fanouts: edge type 1 lists 1 hops"):
        NeighborSampler(typed, {EDGE_TYPES[0]: [1, 1], EDGE_TYPES[1]: [1], EDGE_TYPES[2]: [1, 1]})
    with pytest.raises(ConfigError, match=r"gnn.weighted"):
        NeighborSampler(attrs, [1], weighted=True, temporal_strategy="last")
    s = NeighborSampler(attrs, [1], temporal_strategy="uniform")
    with pytest.raises(ValueError, match=r"seed_time: a temporal sampler needs one time per seed"):
        s.sample([0, 1])
    with pytest.raises(ValueError, match=r"seed_time: expected 2 integer times"):
        s.sample([0, 1], seed_time=[1, 2, 3])
    with pytest.raises(ValueError, match=r"seed_time: given, but the sampler has no temporal_strategy"):
        NeighborSampler(attrs, [1]).sample([0], seed_time=[1])
    with pytest.raises(ValueError, match=r"seeds: unknown node type 'venue'"):
        NeighborSampler(typed, [1]).sample_hetero(("venue", [0]))
    with pytest.raises(ValueError, match=r"seeds: author id 12 is out of range"):
        NeighborSampler(typed, [1]).sample_hetero(("author", [12]))
    with pytest.raises(ConfigError, match=r"node 3 appears twice"):
        NeighborSampler(attrs, [1]).sample([3, 3])
    with pytest.raises(ValueError, match=r"weighted: .* has no edge weights"):
        NeighborSampler(bare, [1], weighted=True)
    with pytest.raises(ValueError, match=r"temporal_strategy: .* has no edge times"):
        NeighborSampler(bare, [1], temporal_strategy="last")
    plain = NeighborSampler(bare, [-1]).sample([0])
    assert plain.edge_type is None and plain.batch is None
    assert sorted(plain.node[plain.row]) == sorted(graph["edges"]["src"][in_edges(graph["edges"], 0)])
