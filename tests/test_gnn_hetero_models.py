"""The typed reference GNNs (R-GCN, heterogeneous GraphSAGE) of strata.gnn.models: equal to PyG's
own layers with the same weights, shapes and gradients on typed blocks, learning planted labels
on a small heterogeneous graph, and `strata gnn train` refusing typed models on plain stores and
plain models on typed ones."""

from __future__ import annotations

import numpy as np
import pytest

from cli_in_process import strata_in_process
from conftest import needs

torch = needs("torch")

from strata.gnn.models import GNN, Block, HeteroSAGEConv, RGCNConv  # noqa: E402

# Node types 0 (paper) and 1 (author); edge types by id as (source type, destination type):
# paper cites paper, author writes paper, paper written_by author.
EDGE_TYPES = [(0, 0), (1, 0), (0, 1)]
NAMES = ["paper", "author"]
RELATIONS = ["cites", "writes", "written_by"]


def random_typed_block(rng, num_src: int, num_dst: int, edges: int, ntype=None) -> Block:
    """A typed block: source node types ``ntype`` or drawn at random (destinations are the first
    ``num_dst``), each edge of a random edge type whose endpoint types match its endpoints."""
    if ntype is None:
        ntype = rng.integers(0, 2, num_src)
        ntype[:2] = [0, 1]  # both types among the destinations
    rows = []
    while len(rows) < edges:
        u, v, k = int(rng.integers(0, num_src)), int(rng.integers(0, num_dst)), int(rng.integers(0, 3))
        if (ntype[u], ntype[v]) == EDGE_TYPES[k]:
            rows.append((u, v, k))
    src, dst, etype = torch.tensor(rows, dtype=torch.int64).T
    return Block(num_src, num_dst, src, dst, etype, torch.as_tensor(ntype, dtype=torch.int64))


def test_rgcn_equals_pyg_rgcnconv():
    needs("torch_geometric")
    from torch_geometric.nn import RGCNConv as PygRGCN

    torch.manual_seed(0)
    b = random_typed_block(np.random.default_rng(0), 12, 7, 40)
    conv, x = RGCNConv(5, 4, EDGE_TYPES), torch.randn(12, 5)
    ref = PygRGCN(5, 4, num_relations=3, aggr="mean")
    with torch.no_grad():
        ref.weight.copy_(conv.weight)
        ref.root.copy_(conv.root_lin.weight.T)
        ref.bias.copy_(conv.root_lin.bias)
    want = ref((x, x[:7]), torch.stack([b.src, b.dst]), b.etype)
    assert torch.allclose(conv(b, x), want, atol=1e-5)


def test_hetero_sage_equals_pyg_heteroconv_of_sageconvs():
    needs("torch_geometric")
    from torch_geometric.nn import HeteroConv, SAGEConv

    torch.manual_seed(0)
    n = 14
    b = random_typed_block(np.random.default_rng(1), n, n, 45)  # every node is a destination
    conv, x = HeteroSAGEConv(5, 4, EDGE_TYPES), torch.randn(n, 5)
    keys = [(NAMES[s], RELATIONS[k], NAMES[d]) for k, (s, d) in enumerate(EDGE_TYPES)]
    ref = HeteroConv({key: SAGEConv(5, 4) for key in keys}, aggr="sum")
    with torch.no_grad():
        for key, mine in zip(keys, conv.convs, strict=True):
            theirs = ref.convs[key]
            theirs.lin_l.weight.copy_(mine.neigh_lin.weight)
            theirs.lin_l.bias.copy_(mine.self_lin.bias)
            theirs.lin_r.weight.copy_(mine.self_lin.weight)
    # PyG's per-type tensors: each type's nodes in global order, edges in local ids.
    members = [torch.nonzero(b.ntype == t).squeeze(1) for t in range(2)]
    local = torch.empty(n, dtype=torch.int64)
    for m in members:
        local[m] = torch.arange(len(m))
    x_dict = {NAMES[t]: x[members[t]] for t in range(2)}
    edge_index = {
        key: torch.stack([local[b.src[b.etype == k]], local[b.dst[b.etype == k]]]) for k, key in enumerate(keys)
    }
    want = ref(x_dict, edge_index)
    out = conv(b, x)
    for t in range(2):
        assert torch.allclose(out[members[t]], want[NAMES[t]], atol=1e-5), NAMES[t]


def test_a_type_nothing_points_into_gets_zeros():
    b = random_typed_block(np.random.default_rng(2), 10, 6, 20)
    conv = HeteroSAGEConv(5, 4, EDGE_TYPES[:2])  # nothing into authors
    keep = b.etype < 2
    b = Block(b.num_src, b.num_dst, b.src[keep], b.dst[keep], b.etype[keep], b.ntype)
    out = conv(b, torch.randn(10, 5))
    authors = b.ntype[:6] == 1
    assert torch.all(out[authors] == 0) and torch.all(out[~authors].abs().sum(1) > 0)


@pytest.mark.parametrize("kind", ["rgcn", "sage_hetero"])
def test_typed_stack_shapes_gradients_and_refusals(kind):
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    outer = random_typed_block(rng, 20, 9, 50)
    # A block's sources are the previous block's destinations.
    inner = random_typed_block(rng, 9, 4, 20, outer.ntype[:9].numpy())
    model = GNN(kind, 5, 8, 3, layers=2, edge_types=EDGE_TYPES)
    out = model([outer, inner], torch.randn(20, 5))
    assert out.shape == (4, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert len(model.convs[0].weight if kind == "rgcn" else model.convs[0].convs) == 3
    short = GNN(kind, 5, 8, 3, layers=1, edge_types=EDGE_TYPES[:2])
    with pytest.raises(ValueError, match=f"{kind}: the block has edge type 2, the layer 2 edge types"):
        short([inner], torch.randn(9, 5))
    with pytest.raises(ValueError, match="need at least one edge type"):
        GNN(kind, 5, 8, 3, edge_types=[])


def planted_graph(seed: int, papers: int = 300, authors: int = 200, classes: int = 4, dim: int = 8):
    """A paper-author graph whose paper labels only the authors' features reveal: each paper is
    written by 4 authors of its class, whose features are a noisy one-hot of the class; papers'
    own features are noise, and each paper cites 3 papers at random. Returns (full-graph block,
    x, paper labels)."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, classes, papers)
    author_class = rng.integers(0, classes, authors)
    x = rng.normal(size=(papers + authors, dim))
    x[papers:] = 0.8 * x[papers:] + np.eye(classes, dim)[author_class]
    by_class = [np.flatnonzero(author_class == c) + papers for c in range(classes)]
    writes = [(int(a), p) for p in range(papers) for a in rng.choice(by_class[label[p]], 4, replace=False)]
    cites = [(int(q), p) for p in range(papers) for q in rng.integers(0, papers, 3)]
    triples = [(u, v, 0) for u, v in cites] + [(u, v, 1) for u, v in writes] + [(v, u, 2) for u, v in writes]
    src, dst, etype = (torch.tensor([e[i] for e in triples]) for i in range(3))
    n = papers + authors
    ntype = torch.cat([torch.zeros(papers, dtype=torch.int64), torch.ones(authors, dtype=torch.int64)])
    return Block(n, n, src, dst, etype, ntype), torch.tensor(x, dtype=torch.float32), torch.tensor(label)


@pytest.mark.parametrize("kind", ["rgcn", "sage_hetero"])
def test_typed_models_learn_planted_labels(kind, one_thread):
    torch.manual_seed(0)
    block, x, label = planted_graph(0)
    papers = len(label)
    train, test = torch.arange(papers // 2), torch.arange(papers // 2, papers)
    model = GNN(kind, x.shape[1], 16, 4, layers=2, dropout=0.2, edge_types=EDGE_TYPES)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model([block, block], x)[train], label[train])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model([block, block], x)[test].argmax(1) == label[test]).float().mean().item()
    assert accuracy > 0.7, accuracy  # 4 classes: chance is 0.25


def test_gnn_train_refuses_typed_models_and_stores(tmp_path, capsys):
    # The commands run in this process, which has imported torch already: a child process would
    # import it again (tests/test_gnn_train.py checks the child's exit status of such a refusal).
    strata_cli = strata_in_process(capsys)
    (tmp_path / "e.tsv").write_text("0\t1\n1\t2\n2\t0\n")
    strata_cli("convert", tmp_path / "e.tsv", "--out", tmp_path / "plain.strata", "-q")
    proc = strata_cli("gnn", "train", tmp_path / "plain.strata", "--model", "rgcn", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "gnn.train.model: rgcn needs a typed store" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "nt.tsv").write_text("paper\t2\nauthor\t1\n")
    (tmp_path / "et.tsv").write_text("author\twrites\tpaper\n")
    (tmp_path / "t.csv").write_text("2,writes,0\n2,writes,1\n")
    strata_cli("convert", tmp_path / "t.csv", "--columns", "src,rel,dst", "--node-types", tmp_path / "nt.tsv",
               "--edge-types", tmp_path / "et.tsv", "--out", tmp_path / "typed.strata", "-q")  # fmt: skip
    from strata.errors import ConfigError
    from strata.gnn.train import train

    with pytest.raises(ConfigError, match=r"gnn.train.model: .* is a typed store .* it trains rgcn or sage_hetero"):
        train(store=tmp_path / "typed.strata", model="sage")
    with pytest.raises(ConfigError, match=r"gnn.train.target_type: .* has no node type with labels"):
        train(store=tmp_path / "typed.strata", model="rgcn")
