"""The reference GNNs of strata.gnn.models on hand-built blocks: shapes, the aggregation
formulas against a direct computation, and learning on Cora."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")

from strata.gnn.models import GNN, Block, GATConv, GCNConv, SAGEConv  # noqa: E402

# Destinations 0, 1 are the first sources; 0 <- {1, 2, 3}, 1 <- {0}, 2 extra sources.
INDPTR = np.array([0, 3, 4])
INDICES = np.array([1, 2, 3, 0])


def block() -> Block:
    return Block.from_csc(4, 2, INDPTR, INDICES)


def test_block_from_csc():
    b = block()
    assert b.src.tolist() == [1, 2, 3, 0] and b.dst.tolist() == [0, 0, 0, 1]
    assert b.in_degree().tolist() == [3.0, 1.0]


def test_sage_is_self_plus_mean_of_neighbours():
    torch.manual_seed(0)
    conv, x = SAGEConv(5, 3), torch.randn(4, 5)
    out = conv(block(), x)
    want0 = conv.self_lin(x[0]) + conv.neigh_lin(x[1:4].mean(0))
    want1 = conv.self_lin(x[1]) + conv.neigh_lin(x[0])
    assert torch.allclose(out, torch.stack([want0, want1]), atol=1e-6)


def test_gcn_symmetric_normalisation_with_self_loops():
    torch.manual_seed(0)
    conv, x = GCNConv(5, 3), torch.randn(4, 5)
    out = conv(block(), x)
    h = x @ conv.lin.weight.T
    # Degrees with self loops: destinations 0: 3 + 1, 1: 1 + 1; sources (out-degree in the
    # block, plus the loop for destinations): 0: 1 + 1, 1: 1 + 1, 2: 1, 3: 1.
    d_dst, d_src = [4.0, 2.0], [2.0, 2.0, 1.0, 1.0]
    want0 = h[0] / (d_src[0] * d_dst[0]) ** 0.5 + sum(h[u] / (d_src[u] * d_dst[0]) ** 0.5 for u in (1, 2, 3))
    want1 = h[1] / (d_src[1] * d_dst[1]) ** 0.5 + h[0] / (d_src[0] * d_dst[1]) ** 0.5
    assert torch.allclose(out, torch.stack([want0, want1]) + conv.lin.bias, atol=1e-5)


def test_gat_attention_is_a_softmax_over_sources_and_self():
    torch.manual_seed(0)
    conv, x = GATConv(5, 3, heads=2, concat=False), torch.randn(4, 5)
    out = conv(block(), x)
    h = conv.lin(x).view(4, 2, 3)
    a_s, a_d = (h * conv.att_src).sum(-1), (h * conv.att_dst).sum(-1)
    srcs = [0, 1, 2, 3]  # destination 0 attends to itself and 1, 2, 3
    e = torch.nn.functional.leaky_relu(a_s[srcs] + a_d[0], 0.2)
    alpha = torch.softmax(e, 0)
    want0 = (alpha.unsqueeze(-1) * h[srcs]).sum(0).mean(0) + conv.bias
    assert torch.allclose(out[0], want0, atol=1e-5)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_stack_shapes_and_gradients(kind):
    torch.manual_seed(0)
    outer = Block.from_csc(6, 4, np.array([0, 2, 3, 5, 6]), np.array([4, 5, 0, 1, 2, 3]))
    model = GNN(kind, 5, 8, 3, layers=2, heads=2)
    out = model([outer, block()], torch.randn(6, 5))
    assert out.shape == (2, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bad_arguments():
    with pytest.raises(ValueError, match="expected sage, sage_pool, gcn, gin, gat, rgcn or sage_hetero"):
        GNN("gine", 5, 8, 3)
    with pytest.raises(ValueError, match="2 layers but got 1"):
        GNN("sage", 5, 8, 3)([block()], torch.randn(4, 5))


def test_every_registered_layer_kind_is_a_choice_and_stacks():
    """Each declared layer kind (strata.layer_kinds, read without torch) is a `strata gnn train
    --model` choice and has its torch module registered, which builds a two-layer GNN of the
    requested widths; a kind is registered once, and only when declared."""
    import typing

    from strata.config.gnn import GnnTrainConfig
    from strata.gnn.models import LAYERS, MODEL_KINDS, register_layer
    from strata.layer_kinds import LAYER_KINDS

    assert typing.get_args(typing.get_type_hints(GnnTrainConfig)["model"]) == MODEL_KINDS == tuple(LAYER_KINDS)
    assert tuple(LAYERS) == tuple(LAYER_KINDS)
    two = Block.from_csc(4, 2, INDPTR, INDICES)
    one = Block.from_csc(2, 1, np.array([0, 1]), np.array([1]))
    for name, kind in LAYERS.items():
        model = GNN(name, 5, 6, 3, layers=2, heads=2).eval()
        assert all(isinstance(conv, kind.cls) for conv in model.convs), name
        assert model([two, one], torch.randn(4, 5)).shape == (1, 3), name
    with pytest.raises(ValueError, match="'gcn' is registered twice"):
        register_layer("gcn")(GCNConv)
    with pytest.raises(ValueError, match=r"'gcm' is not declared: add it to strata\.layer_kinds\.LAYER_KINDS"):
        register_layer("gcm")(GCNConv)
    with pytest.raises(ValueError, match="model: expected"):
        GNN("gcm", 5, 6, 3)
