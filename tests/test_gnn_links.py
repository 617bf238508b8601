"""Link-prediction batches through Python: shapes and labels as PyG's LinkNeighborLoader gives
them, positives that map back to the given edges, determinism, clear errors for bad edges, a
model that learns from them, and PyG's LinkNeighborLoader over Strata's stores and sampler."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")

from conftest import run_strata  # noqa: E402
from strata.errors import ConfigError  # noqa: E402
from strata.gnn import GnnData, LinkLoader  # noqa: E402
from strata.gnn.loader import node_id_bytes  # noqa: E402
from strata.gnn.models import GNN  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_links")

NEGATIVES = 2


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    """A labelled SBM graph (2000 nodes, 4 communities, 16 float32 features) as a store whose
    10,000 train edges are each stored once (the topology has both directions)."""
    d = tmp_path_factory.mktemp("links")
    run_strata("generate", "sbm", "--out", d / "raw", "--nodes", "2000", "--classes", "4", "--feature-dim", "16", "-q")
    run_strata("convert", d / "raw", "--symmetrize", "--out", d / "sbm.strata", "-q")
    return d / "sbm.strata"


@pytest.fixture(scope="module")
def data(sbm) -> GnnData:
    return GnnData(sbm, fanouts=[5, 5], batch_size=64, feature_memory="16K")


def pairs(edges) -> Counter:
    """The multiset of (source, destination) pairs of a ``(2, E)`` array."""
    return Counter(map(tuple, np.asarray(edges).T.tolist()))


@pytest.mark.parametrize("pipeline", [True, False])
def test_link_batches_score_the_given_edges_and_their_negatives(sbm, pipeline):
    loader = LinkLoader(
        sbm, fanouts=[5, 5], batch_size=64, negatives=NEGATIVES, feature_memory="16K", pipeline=pipeline
    )
    feats = np.asarray(loader.data.store.features)
    train = loader.data.edges("train")
    assert train.shape == (2, 10_000)
    seen = []
    batches = list(loader)
    assert len(batches) == -(-train.shape[1] // 64)
    for b in batches:
        index, label = b.edge_label_index, b.edge_label
        num_pos = len(label) // (1 + NEGATIVES)
        assert 0 < num_pos <= 64
        assert index.shape == (2, num_pos * (1 + NEGATIVES)) and index.dtype == torch.int64
        assert label.dtype == torch.float32
        assert torch.equal(label, torch.cat([torch.ones(num_pos), torch.zeros(num_pos * NEGATIVES)]))
        # Every pair scores two seeds, which are the first rows of x.
        assert int(index.max()) < b.num_seeds and torch.equal(b.nodes[: b.num_seeds], b.seeds)
        assert torch.equal(b.x, torch.from_numpy(feats[b.nodes.numpy()]))
        assert b.blocks[-1].num_dst == b.num_seeds and b.blocks[0].num_src == len(b.nodes)
        # Negatives pair each edge's source (edge-major) with another destination.
        assert torch.equal(index[0, num_pos:], index[0, :num_pos].repeat_interleave(NEGATIVES))
        seen.append(b.nodes[index[:, :num_pos]].numpy())
    assert pairs(np.concatenate(seen, axis=1)) == pairs(train), "each train edge once per epoch"
    assert loader.stats["positive_edges"] == train.shape[1]
    assert loader.stats["batches"] == len(batches)


def test_link_epochs_are_deterministic(data):
    def epoch(n: int, edges="train"):
        return [(b.nodes, b.edge_label_index) for b in data.link_loader(edges, negatives=NEGATIVES, epoch=n)]

    first, again = epoch(3), epoch(3)
    assert len(first) == len(again)
    for (n1, i1), (n2, i2) in zip(first, again, strict=True):
        assert torch.equal(n1, n2) and torch.equal(i1, i2)
    other = epoch(4)
    assert not torch.equal(first[0][0], other[0][0]), "another epoch, another shuffle"

    # Unshuffled, explicit edges (a (2, E) array or a (src, dst) pair) come in the given order.
    edges = data.edges("train")[:, :100]
    for given in (edges, (edges[0], edges[1]), torch.from_numpy(edges)):
        got = [
            b.nodes[b.edge_label_index[:, : len(b.edge_label) // 3]]
            for b in data.link_loader(given, shuffle=False, negatives=NEGATIVES)
        ]
        assert np.array_equal(torch.cat(got, dim=1).numpy(), edges)

    # No negatives: positives only; drop_last keeps whole batches.
    batches = list(data.link_loader(edges, negatives=0, drop_last=True))
    assert len(batches) == 1 and batches[0].edge_label_index.shape == (2, 64)
    assert bool(batches[0].edge_label.all())
    # Node batches carry no link part.
    node_batch = next(iter(data.loader("train")))
    assert node_batch.edge_label_index is None and node_batch.edge_label is None


def test_bad_edges_fail_clearly(data):
    n = data.num_nodes
    with pytest.raises(ValueError, match="pair up"):
        data.link_loader((np.arange(5), np.arange(4)))
    with pytest.raises(ValueError, match=r"\(2, E\)"):
        data.link_loader(np.zeros((3, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=f"node id {n} is out of range"):
        data.link_loader(np.array([[0, 1], [2, n]]))
    with pytest.raises(ValueError, match=r"must not be negative|out of range"):
        data.link_loader(np.array([[0, -1], [2, 3]]))
    with pytest.raises(ValueError, match="integer"):
        data.link_loader(np.array([[0.5], [1.0]]))
    with pytest.raises(ValueError, match="negatives"):
        data.link_loader("train", negatives=-1)
    with pytest.raises(ValueError, match="no edge split"):
        data.link_loader("valid")
    with pytest.raises(ValueError, match="out of range"):
        LinkLoader(data.store.path, fanouts=[5], edges=np.array([[0], [n + 3]]))
    # The native side checks too: lengths when the epoch starts, ids when their batch is sampled.
    with pytest.raises(ConfigError, match="must pair up"):
        data._native.link_epoch(node_id_bytes([0, 1]), node_id_bytes([2]), 1, 0, True, False)
    epoch = data._native.link_epoch(node_id_bytes([0, 1]), node_id_bytes([2, n + 7]), 1, 0, True, False)
    with pytest.raises(ConfigError, match=f"node {n + 7}, out of range"):
        next(iter(epoch))


def link_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Probability that a positive outscores a negative."""
    return float((pos[:, None] > neg[None, :]).float().mean())


def test_a_model_learns_links_from_the_batches(sbm):
    torch.manual_seed(0)
    loader = LinkLoader(sbm, fanouts=[5, 5], batch_size=256, negatives=1, feature_memory="16K")
    model = GNN("sage", loader.data.dim, 32, 32, layers=2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def scores(b):
        h = model(b.blocks, b.x.float())
        src, dst = b.edge_label_index
        return (h[src] * h[dst]).sum(-1)

    for _ in range(3):
        for b in loader:
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(scores(b), b.edge_label).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        out = [(scores(b), b.edge_label) for b in loader]
    s, y = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
    # 80% of the edges are inside one of 4 communities, a random pair only 25% of the time.
    assert link_auc(s[y == 1], s[y == 0]) > 0.75


def test_pyg_link_neighbor_loader_trains_a_pyg_model(data):
    needs("torch_geometric")
    from torch_geometric.loader import LinkNeighborLoader
    from torch_geometric.nn import GraphSAGE
    from torch_geometric.sampler import NegativeSampling

    from strata.gnn.pyg import StrataSampler, stores

    fs, gs = stores(data)
    feats = np.asarray(data.store.features)
    edges = torch.from_numpy(data.edges("train")[:, :3000])

    def loader(neg_sampling, **kw):
        return LinkNeighborLoader(
            (fs, gs), num_neighbors=[5, 5], edge_label_index=(None, edges), neg_sampling=neg_sampling, batch_size=128,
            neighbor_sampler=StrataSampler(data), **kw,
        )  # fmt: skip

    seen = []
    for b in loader(NegativeSampling("binary", NEGATIVES)):
        num_pos = b.input_id.numel()
        assert b.edge_label_index.shape == (2, num_pos * (1 + NEGATIVES))
        assert torch.equal(b.edge_label, torch.cat([torch.ones(num_pos), torch.zeros(num_pos * NEGATIVES)]))
        assert torch.equal(b.x, torch.from_numpy(feats[b.n_id.numpy()]))
        pos = b.n_id[b.edge_label_index[:, :num_pos]]
        assert torch.equal(pos, edges[:, b.input_id])
        seen.append(pos.numpy())
    assert pairs(np.concatenate(seen, axis=1)) == pairs(edges.numpy())

    # A fractional amount: ceil(B * amount) negatives.
    b = next(iter(loader(NegativeSampling("binary", 0.5))))
    assert b.edge_label_index.shape == (2, 128 + 64) and int(b.edge_label.sum()) == 128

    torch.manual_seed(0)
    model = GraphSAGE(16, 32, 2, 32)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train = loader(NegativeSampling("binary", 1), shuffle=True)

    def scores(b):
        h = model(b.x, b.edge_index)
        return (h[b.edge_label_index[0]] * h[b.edge_label_index[1]]).sum(-1)

    for _ in range(3):
        for b in train:
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(scores(b), b.edge_label).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        out = [(scores(b), b.edge_label) for b in loader(NegativeSampling("binary", 1))]
    s, y = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
    assert link_auc(s[y == 1], s[y == 0]) > 0.75

    with pytest.raises(NotImplementedError, match="triplet"):
        next(iter(loader(NegativeSampling("triplet", 1))))
    with pytest.raises(NotImplementedError, match="weighted"):
        next(iter(loader(NegativeSampling("binary", 1, src_weight=torch.ones(data.num_nodes)))))
