"""PyG's NeighborLoader and LinkNeighborLoader over typed, weighted and temporal stores through
``StrataNeighborSampler``: batches checked against plain NumPy references of PyG's documented
semantics computed from the arrays the stores were converted from (edges exist, per-edge-type
fanouts, the temporal bound and "last", weighted inclusion frequencies), determinism, and a
tiny heterogeneous model trained through the loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")
needs("torch_geometric")

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader  # noqa: E402
from torch_geometric.nn import HeteroConv, SAGEConv  # noqa: E402
from torch_geometric.sampler import NegativeSampling  # noqa: E402

from conftest import run_strata  # noqa: E402
from strata.convert import convert_dicts  # noqa: E402
from strata.errors import ConfigError  # noqa: E402
from strata.gnn import GnnData  # noqa: E402
from strata.gnn.pyg import stores  # noqa: E402
from strata.gnn.pyg_hetero import hetero_stores  # noqa: E402
from strata.gnn.pyg_sampler import EdgeAttributes, StrataNeighborSampler  # noqa: E402
from strata.store import Store  # noqa: E402
from test_gnn_pyg_hetero import save_aligned  # noqa: E402
from test_gnn_sampling import assert_frequencies, inclusion  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_pyg_loader")

COUNTS = {"paper": 40, "author": 15}
CITES, WRITES, WRITTEN_BY = (
    ("paper", "cites", "paper"),
    ("author", "writes", "paper"),
    ("paper", "written_by", "author"),
)
EDGE_TYPES = [CITES, WRITES, WRITTEN_BY]
DIM, CLASSES = 8, 4
#: Batches a frequency test draws over.
TRIALS = 1500


def typed_graph(seed: int = 0) -> dict:
    """Distinct edges per edge type (local ids) with weights (some zero) and times, features
    for both node types and paper labels planted in the features (argmax of the first CLASSES
    columns, so a model can learn them)."""
    rng = np.random.default_rng(seed)
    p, a = COUNTS["paper"], COUNTS["author"]
    cites = np.array(sorted({(int(s), int(d)) for s, d in rng.integers(0, p, (260, 2)) if s != d})).T
    writes = np.array(
        sorted({(int(s), int(d)) for s, d in zip(rng.integers(0, a, 100), rng.integers(0, p, 100), strict=True)})
    ).T
    edges = {CITES: cites, WRITES: writes, WRITTEN_BY: writes[::-1].copy()}
    values = np.array([0.0, 0.5, 1.0, 3.0, 8.0], dtype=np.float32)
    weights = {et: rng.choice(values, ei.shape[1]) for et, ei in edges.items()}
    times = {et: rng.integers(0, 100, ei.shape[1]) for et, ei in edges.items()}
    x = {t: rng.normal(size=(n, DIM)).astype(np.float32) for t, n in COUNTS.items()}
    y = x["paper"][:, :CLASSES].argmax(1)
    return {"edges": edges, "weights": weights, "times": times, "x": x, "y": y}


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("pygloader")
    g = typed_graph()
    convert_dicts(
        d / "typed.strata",
        COUNTS,
        g["edges"],
        node_feat_dict=g["x"],
        node_label_dict={"paper": g["y"]},
        edge_weight_dict=g["weights"],
        edge_time_dict=g["times"],
    )
    g["stores"] = hetero_stores(d / "typed.strata")
    g["dir"] = d
    return g


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[dict, GnnData]:
    """The cites edges alone as an untyped store with weights and times (text converter), with
    the papers' features written into it as formats.md lays them out (no converter writes
    features beside weighted text edges)."""
    d = tmp_path_factory.mktemp("pygloader-plain")
    g = typed_graph()
    (src, dst), w, t = g["edges"][CITES], g["weights"][CITES], g["times"][CITES]
    lines = zip(src, dst, w, t, strict=True)
    (d / "cites.csv").write_text("".join(f"{a},{b},{float(c)!r},{e}\n" for a, b, c, e in lines))
    store = d / "cites.strata"
    n = str(COUNTS["paper"])
    run_strata("convert", d / "cites.csv", "--columns", "src,dst,weight,time", "--num-nodes", n, "--out", store, "-q")
    x = g["x"]["paper"]
    save_aligned(store / "features.npy", x)
    m = json.loads((store / "manifest.json").read_text())
    m["features"] = {"dim": DIM, "dtype": "float32"}
    m["arrays"]["features"] = {"file": "features.npy", "dtype": "float32", "shape": list(x.shape)}
    (store / "manifest.json").write_text(json.dumps(m))
    return g, GnnData(store, fanouts=[2], batch_size=8)


def test_homogeneous_weighted_temporal_loader(plain):
    g, data = plain
    (src, dst), w, t = g["edges"][CITES], g["weights"][CITES], g["times"][CITES]
    fs, gs = stores(data)
    fanouts = [3, 2]
    times = torch.from_numpy(np.random.default_rng(2).integers(20, 100, COUNTS["paper"]))
    options = {"weight_attr": "edge_weight", "time_attr": "edge_time", "temporal_strategy": "uniform"}
    sampler = StrataNeighborSampler((fs, gs), fanouts, **options)
    batches = NeighborLoader(
        (fs, gs),
        fanouts,
        input_nodes=torch.arange(COUNTS["paper"]),
        input_time=times,
        time_attr="edge_time",
        batch_size=10,
        neighbor_sampler=sampler,
        transform=EdgeAttributes(data.store.path),
    )
    stored = Store(data.store.path).edges()
    for b in batches:
        n_id, seed_time = b.n_id.numpy(), b.seed_time.numpy()
        assert torch.equal(b.x, torch.from_numpy(g["x"]["paper"][n_id]))
        row, col = b.edge_index.numpy()
        # e_id names each sampled edge's row in edges("train"); the attributes follow it.
        assert np.array_equal(stored[b.e_id.numpy()], np.stack([n_id[row], n_id[col]], axis=1))
        for k, (r, c) in enumerate(zip(row, col, strict=True)):
            (i,) = np.flatnonzero((src == n_id[r]) & (dst == n_id[c]))
            assert b.batch[r] == b.batch[c] and t[i] <= seed_time[b.batch[c]] and w[i] > 0
            assert b.edge_weight[k] == w[i] and b.edge_time[k] == t[i]
        known = np.cumsum(b.num_sampled_nodes)
        for h, part in enumerate(hop_slices(b.num_sampled_edges)):
            got = np.bincount(col[part], minlength=int(known[h]))
            for j in range(int(known[h])):
                eligible = (dst == n_id[j]) & (t <= seed_time[b.batch[j]]) & (w > 0)
                assert got[j] == min(fanouts[h], eligible.sum()), f"hop {h + 1}: node {n_id[j]}"


def edge_lookup(g: dict) -> dict:
    """``(edge type, src, dst)`` -> index into that type's arrays (edges are distinct)."""
    return {(et, int(s), int(d)): i for et, ei in g["edges"].items() for i, (s, d) in enumerate(ei.T)}


def in_degree(g: dict, et, v: int, time=None) -> int:
    """In-edges of local node ``v`` of edge type ``et`` (no later than ``time`` when given)."""
    mask = g["edges"][et][1] == v
    if time is not None:
        mask &= g["times"][et] <= time
    return int(mask.sum())


def hop_slices(counts: list[int]) -> list[slice]:
    ends = np.cumsum([0, *counts])
    return [slice(int(ends[h]), int(ends[h + 1])) for h in range(len(counts))]


def check_batch(g: dict, batch, fanouts: dict, lookup: dict, seed_time=None):
    """A HeteroData batch against the graph: features, labels, every edge one of the graph's
    (no later than its seed's time when ``seed_time`` is given), and per edge type and hop each
    node known before the hop has exactly min(fanout, eligible in-degree) sampled in-edges of the
    type (each hop re-samples every node known so far)."""
    for t in COUNTS:
        n_id = batch[t].n_id.numpy()
        assert torch.equal(batch[t].x, torch.from_numpy(g["x"][t][n_id]))
    assert torch.equal(batch["paper"].y, torch.from_numpy(g["y"][batch["paper"].n_id.numpy()]))
    for et in EDGE_TYPES:
        src, dst = batch[et[0]].n_id.numpy(), batch[et[2]].n_id.numpy()
        row, col = batch[et].edge_index.numpy()
        for r, c in zip(row, col, strict=True):
            i = lookup.get((et, int(src[r]), int(dst[c])))
            assert i is not None, f"{et}: sampled edge {src[r]} -> {dst[c]} is not in the graph"
            if seed_time is not None:
                s = int(batch[et[2]].batch[c])
                assert batch[et[0]].batch[r] == s, f"{et}: an edge joins two seeds' trees"
                assert g["times"][et][i] <= seed_time[s], f"{et}: edge later than its seed's time"
        known = np.cumsum(batch[et[2]].num_sampled_nodes)
        for h, part in enumerate(hop_slices(batch[et].num_sampled_edges)):
            got = np.bincount(col[part], minlength=int(known[h]))
            for j in range(int(known[h])):
                time = None if seed_time is None else seed_time[int(batch[et[2]].batch[j])]
                want = in_degree(g, et, int(dst[j]), time)
                if fanouts[et][h] >= 0:
                    want = min(fanouts[et][h], want)
                assert got[j] == want, f"{et} hop {h + 1}: node {dst[j]} has {got[j]} edges, expected {want}"
            # Without replacement: no edge twice into a node at one hop.
            pairs = set(zip(row[part].tolist(), col[part].tolist(), strict=True))
            assert len(pairs) == part.stop - part.start


FANOUTS = {CITES: [3, 2], WRITES: [2, -1], WRITTEN_BY: [1, 0]}


def loader(g, fanouts=FANOUTS, seed=0, **options):
    fs, gs = g["stores"]
    sampler_options = {k: v for k, v in options.items() if k in ("weight_attr", "time_attr", "temporal_strategy")}
    sampler = StrataNeighborSampler((fs, gs), fanouts, seed=seed, **sampler_options)
    return NeighborLoader((fs, gs), fanouts, neighbor_sampler=sampler, **options)


def check_edge_ids(g: dict, batch, store: Store, lookup: dict):
    """Each edge type's ``e_id`` names the sampled edge's row of the typed store's
    ``edges("train")`` (global ids, relation), and ``EdgeAttributes`` filled its weight and time."""
    offsets = dict(zip(store.node_types, store.node_type_offsets[:-1], strict=True))
    stored = store.edges()
    for r, et in enumerate(store.edge_types):
        src = batch[et[0]].n_id.numpy()[batch[et].edge_index[0].numpy()]
        dst = batch[et[2]].n_id.numpy()[batch[et].edge_index[1].numpy()]
        ids = batch[et].e_id.numpy()
        want = np.stack([src + offsets[et[0]], np.full(len(ids), r), dst + offsets[et[2]]], axis=1)
        assert np.array_equal(stored[ids], want), f"{et}: e_id names other edges"
        i = [lookup[(et, int(s), int(d))] for s, d in zip(src, dst, strict=True)]
        assert np.array_equal(batch[et].edge_weight.numpy(), g["weights"][et][i])
        assert np.array_equal(batch[et].edge_time.numpy(), g["times"][et][i])


def test_hetero_neighbor_loader_batches_match_the_graph(graph):
    lookup = edge_lookup(graph)
    seeds = np.arange(0, COUNTS["paper"], 2)
    store = Store(graph["dir"] / "typed.strata")
    batches = list(
        loader(graph, input_nodes=("paper", torch.from_numpy(seeds)), batch_size=8, transform=EdgeAttributes(store))
    )
    assert len(batches) == 3
    for i, b in enumerate(batches):
        assert b["paper"].batch_size == len(seeds[i * 8 : (i + 1) * 8])
        assert b["paper"].n_id[: b["paper"].batch_size].tolist() == seeds[i * 8 : (i + 1) * 8].tolist()
        assert b["author"].num_sampled_nodes[0] == 0
        check_batch(graph, b, FANOUTS, lookup)
        check_edge_ids(graph, b, store, lookup)
    # A list of fanouts applies to each edge type, as in PyG.
    for b in loader(graph, [2, 1], input_nodes=("author", torch.arange(COUNTS["author"])), batch_size=15):
        check_batch(graph, b, {et: [2, 1] for et in EDGE_TYPES}, lookup)


def test_batches_are_deterministic_per_seed(graph):
    def edges(seed):
        b = next(iter(loader(graph, seed=seed, input_nodes=("paper", torch.arange(20)), batch_size=20)))
        return [b[et].edge_index.tolist() for et in EDGE_TYPES], [b[t].n_id.tolist() for t in COUNTS]

    assert edges(5) == edges(5)
    assert edges(5) != edges(6)


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_temporal_batches_keep_to_the_seed_time(graph, strategy):
    lookup = edge_lookup(graph)
    seeds = torch.arange(COUNTS["paper"])
    times = torch.from_numpy(np.random.default_rng(1).integers(0, 100, COUNTS["paper"]))
    options = {"time_attr": "edge_time", "temporal_strategy": strategy}
    for b in loader(graph, input_nodes=("paper", seeds), input_time=times, batch_size=16, **options):
        seed_time = b["paper"].seed_time.numpy()
        assert np.array_equal(seed_time, times[b["paper"].input_id].numpy())
        check_batch(graph, b, FANOUTS, lookup, seed_time=seed_time)
        if strategy != "last":
            continue
        # "last": a seed's hop-1 edges of each type are the most recent eligible ones.
        for et in (CITES, WRITES):
            src, n_id = b[et[0]].n_id.numpy(), b["paper"].n_id.numpy()
            row, col = b[et].edge_index[:, : b[et].num_sampled_edges[0]].numpy()
            for j in range(b["paper"].batch_size):
                mask = (graph["edges"][et][1] == n_id[j]) & (graph["times"][et] <= seed_time[j])
                want = sorted(graph["times"][et][mask])[-FANOUTS[et][0] :]
                got = sorted(graph["times"][et][lookup[(et, int(src[r]), int(n_id[j]))]] for r in row[col == j])
                assert got == want, f"{et}: seed {n_id[j]} at {seed_time[j]}"


def test_weighted_inclusion_frequencies(graph):
    # One hop of cites only; seeds whose choice of 2 among their positive-weight in-edges is random.
    fanouts = {CITES: [2], WRITES: [0], WRITTEN_BY: [0]}
    dst, w = graph["edges"][CITES][1], graph["weights"][CITES]
    seeds = np.array([v for v in range(COUNTS["paper"]) if 2 < np.sum(w[dst == v] > 0) and np.sum(dst == v) <= 7])
    assert len(seeds) >= 8, "the random graph has too few seeds with a weighted choice"
    lookup = edge_lookup(graph)
    counts = np.zeros(len(w))
    ids = torch.from_numpy(np.tile(seeds, TRIALS))
    batches = loader(graph, fanouts, input_nodes=("paper", ids), batch_size=len(seeds), weight_attr="edge_weight")
    for b in batches:
        n_id = b["paper"].n_id.numpy()
        for r, c in b[CITES].edge_index.T.numpy():
            counts[lookup[(CITES, int(n_id[r]), int(n_id[c]))]] += 1
    stat, cells = 0.0, 0
    for v in seeds:
        edges = np.flatnonzero(dst == v)
        probs = inclusion(w[edges], 2)
        assert_frequencies(counts[edges], probs, TRIALS, f"paper {v}")
        random = (probs > 0) & (probs < 1)
        p, c = probs[random], counts[edges][random]
        stat += np.sum((c - TRIALS * p) ** 2 / (TRIALS * p * (1 - p)))
        cells += random.sum()
    # Over all edges with a random outcome: the sum of squared standardised deviations stays
    # near its count (a node's inclusions are negatively correlated, so this bound is loose
    # only on the safe side), which a small bias on every edge would exceed.
    assert stat < cells + 5 * np.sqrt(2 * cells), f"chi-square {stat:.1f} over {cells} edges"


def test_link_neighbor_loader_by_edge_type(graph):
    fs, gs = graph["stores"]
    lookup = edge_lookup(graph)
    label_index = torch.from_numpy(graph["edges"][WRITES][:, :24].copy())
    sampler = StrataNeighborSampler((fs, gs), FANOUTS, seed=2)
    batches = LinkNeighborLoader(
        (fs, gs),
        FANOUTS,
        edge_label_index=(WRITES, label_index),
        neg_sampling=NegativeSampling("binary", 1),
        batch_size=8,
        neighbor_sampler=sampler,
    )
    for i, b in enumerate(batches):
        check_batch(graph, b, FANOUTS, lookup)
        eli, label = b[WRITES].edge_label_index, b[WRITES].edge_label
        assert label.tolist() == [1.0] * 8 + [0.0] * 8
        pos = torch.stack([b["author"].n_id[eli[0, :8]], b["paper"].n_id[eli[1, :8]]])
        assert torch.equal(pos, label_index[:, i * 8 : (i + 1) * 8])


@pytest.mark.parametrize("edge_type", [CITES, WRITES], ids=["one-node-type", "two-node-types"])
def test_temporal_link_neighbor_loader(graph, edge_type):
    fs, gs = graph["stores"]
    lookup = edge_lookup(graph)
    label_index = torch.from_numpy(graph["edges"][edge_type][:, :30].copy())
    label_time = torch.from_numpy(graph["times"][edge_type][:30].copy())
    sampler = StrataNeighborSampler((fs, gs), FANOUTS, time_attr="edge_time", temporal_strategy="uniform")
    batches = LinkNeighborLoader(
        (fs, gs),
        FANOUTS,
        edge_label_index=(edge_type, label_index),
        edge_label_time=label_time,
        time_attr="edge_time",
        neg_sampling=NegativeSampling("binary", 1),
        batch_size=10,
        neighbor_sampler=sampler,
    )
    for i, b in enumerate(batches):
        # PyG's times per label: the positives', repeated for the negatives.
        assert torch.equal(b[edge_type].edge_label_time, label_time[i * 10 : (i + 1) * 10].repeat(2))
        eli = b[edge_type].edge_label_index
        pos = torch.stack([b[edge_type[0]].n_id[eli[0, :10]], b[edge_type[2]].n_id[eli[1, :10]]])
        assert torch.equal(pos, label_index[:, i * 10 : (i + 1) * 10])
        # PyG's batch maps each node to its seed edge (negatives to the edge whose time they take).
        check_batch(graph, b, FANOUTS, lookup, seed_time=b[edge_type].edge_label_time.numpy())


def test_bidirectional_subgraphs(graph):
    fs, gs = graph["stores"]
    sampler = StrataNeighborSampler((fs, gs), FANOUTS, subgraph_type="bidirectional")
    b = next(iter(NeighborLoader((fs, gs), FANOUTS, input_nodes=("paper", torch.arange(6)), neighbor_sampler=sampler)))
    edges = set(map(tuple, b[CITES].edge_index.T.tolist()))
    assert edges and all((c, r) in edges for r, c in edges)


class TinyHetero(torch.nn.Module):
    """One SAGEConv per edge type, summed per destination type, then a linear head for papers."""

    def __init__(self):
        super().__init__()
        self.conv = HeteroConv({et: SAGEConv((DIM, DIM), 16) for et in EDGE_TYPES}, aggr="sum")
        self.head = torch.nn.Linear(16 + DIM, CLASSES)

    def forward(self, batch):
        h = self.conv(batch.x_dict, batch.edge_index_dict)
        return self.head(torch.cat([h["paper"], batch["paper"].x], 1))


def test_a_hetero_model_trains_through_the_loader(graph, one_thread):
    torch.manual_seed(0)
    model = TinyHetero()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    train = loader(graph, input_nodes=("paper", torch.arange(COUNTS["paper"])), batch_size=20, shuffle=True)

    def loss_of(b):
        n = b["paper"].batch_size
        return torch.nn.functional.cross_entropy(model(b)[:n], b["paper"].y[:n])

    first = None
    for _ in range(15):
        for b in train:
            loss = loss_of(b)
            first = first if first is not None else loss.item()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        final = np.mean([loss_of(b).item() for b in train])
    assert final < 0.5 * first, f"loss {first:.3f} -> {final:.3f}"


def test_unsupported_options_and_bad_inputs_are_refused(graph):
    fs, gs = graph["stores"]
    with pytest.raises(NotImplementedError, match="replace=True"):
        StrataNeighborSampler((fs, gs), FANOUTS, replace=True)
    with pytest.raises(NotImplementedError, match="induced"):
        StrataNeighborSampler((fs, gs), FANOUTS, subgraph_type="induced")
    with pytest.raises(NotImplementedError, match="disjoint"):
        StrataNeighborSampler((fs, gs), FANOUTS, disjoint=True)
    with pytest.raises(NotImplementedError, match="node-level times"):
        StrataNeighborSampler((fs, gs), FANOUTS, time_attr="time")
    with pytest.raises(ValueError, match="weight_attr"):
        StrataNeighborSampler((fs, gs), FANOUTS, weight_attr="w")
    with pytest.raises(ValueError, match="Missing number of neighbors"):
        StrataNeighborSampler((fs, gs), {CITES: [2]})
    with pytest.raises(TypeError, match="data"):
        StrataNeighborSampler(fs, FANOUTS)
    with pytest.raises(ConfigError, match="weighted"):
        StrataNeighborSampler(
            (fs, gs), FANOUTS, weight_attr="edge_weight", time_attr="edge_time", temporal_strategy="last"
        )
    with pytest.raises(ValueError, match="temporal_strategy"):
        StrataNeighborSampler((fs, gs), FANOUTS, time_attr="edge_time", temporal_strategy="newest")
    seeds, times = ("paper", torch.arange(4)), torch.zeros(4, dtype=torch.long)
    plain = StrataNeighborSampler((fs, gs), FANOUTS)
    with pytest.raises(ValueError, match="input_time: given"):
        next(
            iter(
                NeighborLoader(
                    (fs, gs),
                    FANOUTS,
                    input_nodes=seeds,
                    input_time=times,
                    time_attr="edge_time",
                    neighbor_sampler=plain,
                )
            )
        )
    with pytest.raises(ValueError, match="is typed"):
        next(iter(NeighborLoader((fs, gs), FANOUTS, input_nodes=torch.arange(4), neighbor_sampler=plain)))
    temporal = StrataNeighborSampler((fs, gs), FANOUTS, time_attr="edge_time")
    with pytest.raises(ValueError, match="input_time: a temporal sampler"):
        next(iter(NeighborLoader((fs, gs), FANOUTS, input_nodes=seeds, neighbor_sampler=temporal)))
    # A plain edge list's store numbers no edges: no e_id, so nothing for EdgeAttributes.
    (graph["dir"] / "bare.csv").write_text("0,1\n1,2\n")
    run_strata(
        "convert", graph["dir"] / "bare.csv", "--columns", "src,dst", "--out", graph["dir"] / "bare.strata", "-q"
    )
    with pytest.raises(ValueError, match="format-1 store"):
        EdgeAttributes(graph["dir"] / "bare.strata")
    with pytest.raises(ValueError, match="has no e_id"):
        EdgeAttributes(graph["dir"] / "typed.strata")(Data(edge_index=torch.zeros(2, 0, dtype=torch.long)))
