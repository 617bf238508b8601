"""PyG interop: PyG's NeighborLoader over Strata's FeatureStore/GraphStore and sampler, with
features served from disk, feeding a stock PyG model."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")
needs("torch_geometric")

from torch_geometric.data import EdgeAttr, TensorAttr  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402
from torch_geometric.nn import GraphSAGE  # noqa: E402

from conftest import run_strata  # noqa: E402
from strata.gnn import GnnData  # noqa: E402
from strata.gnn.pyg import StrataSampler, stores  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_pyg")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> GnnData:
    d = tmp_path_factory.mktemp("pyg")
    run_strata("generate", "sbm", "--out", d / "raw", "--nodes", "2000", "--classes", "4", "--feature-dim", "16", "-q")
    run_strata("convert", d / "raw", "--symmetrize", "--out", d / "sbm.strata", "-q")
    return GnnData(d / "sbm.strata", fanouts=[5, 5], batch_size=64, feature_memory="16K")


def test_feature_and_graph_store_serve_the_store(data):
    fs, gs = stores(data)
    feats = np.asarray(data.store.features)
    idx = torch.tensor([5, 0, 1999, 5])
    assert torch.equal(
        fs.get_tensor(TensorAttr(group_name=None, attr_name="x", index=idx)), torch.from_numpy(feats[idx.numpy()])
    )
    assert fs.get_tensor_size(TensorAttr(group_name=None, attr_name="x")) == (2000, 16)
    assert {a.attr_name for a in fs.get_all_tensor_attrs()} == {"x", "y"}
    (attr,) = gs.get_all_edge_attrs()
    assert attr.layout.value == "csc"
    row, colptr = gs.get_edge_index(EdgeAttr(edge_type=None, layout="csc", size=(2000, 2000)))
    indptr, indices = data.store.csc()
    assert torch.equal(colptr, torch.from_numpy(np.asarray(indptr))) and len(row) == len(indices)
    with pytest.raises(NotImplementedError, match="read-only"):
        fs.put_tensor(torch.zeros(2000, 16), group_name=None, attr_name="x", index=None)


def test_feature_store_indices_read_as_torch_reads_them(data):
    """One id (one row), negative ids, a boolean mask; ids out of range, floats and masks of
    another length are refused, for features and labels alike."""
    fs, _ = stores(data)
    feats, labels = np.asarray(data.store.features), np.asarray(data.labels)

    def get(index, name="x"):
        return fs.get_tensor(TensorAttr(group_name=None, attr_name=name, index=index)).numpy()

    np.testing.assert_array_equal(get(7), feats[7])
    np.testing.assert_array_equal(get(torch.tensor(7)), feats[7])
    np.testing.assert_array_equal(get(torch.tensor([-1, 0])), feats[[1999, 0]])
    assert get(torch.tensor([-1]), "y").tolist() == [labels[1999]]
    mask = torch.zeros(2000, dtype=torch.bool)
    mask[[3, 9]] = True
    np.testing.assert_array_equal(get(mask), feats[[3, 9]])
    np.testing.assert_array_equal(get(mask, "y"), labels[[3, 9]])
    for name in ("x", "y"):
        with pytest.raises(IndexError, match="index 2000 is out of range for 2000 rows"):
            get(torch.tensor([5, 2000]), name)
        with pytest.raises(IndexError, match="index -2001 is out of range"):
            get(torch.tensor([-2001]), name)
        with pytest.raises(IndexError, match="expected integer row ids, got float32"):
            get(torch.tensor([1.5]), name)
        with pytest.raises(IndexError, match=r"one entry per row \(2000\), got shape \(3,\)"):
            get(torch.zeros(3, dtype=torch.bool), name)


def test_neighbor_loader_trains_a_pyg_model(data):
    fs, gs = stores(data)
    feats = np.asarray(data.store.features)
    indptr, indices = (np.asarray(a) for a in data.store.csc())
    train = torch.from_numpy(data.nodes("train").astype(np.int64))
    loader = NeighborLoader(
        (fs, gs), num_neighbors=[5, 5], batch_size=64, input_nodes=train, shuffle=True,
        neighbor_sampler=StrataSampler(data),
    )  # fmt: skip
    torch.manual_seed(0)
    model = GraphSAGE(16, 32, 2, data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(5):
        for b in loader:
            assert torch.equal(b.x, torch.from_numpy(feats[b.n_id.numpy()]))
            src, dst = b.n_id[b.edge_index[0]].numpy(), b.n_id[b.edge_index[1]].numpy()
            for u, v in list(zip(src, dst, strict=True))[:50]:  # every sampled edge is an in-edge
                assert u in indices[indptr[v] : indptr[v + 1]]
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
            opt.step()
    test = torch.from_numpy(data.nodes("test").astype(np.int64))
    correct = 0
    model.eval()
    with torch.no_grad():
        for b in NeighborLoader((fs, gs), num_neighbors=[5, 5], batch_size=256, input_nodes=test,
                                neighbor_sampler=StrataSampler(data)):  # fmt: skip
            correct += int((model(b.x, b.edge_index)[: b.batch_size].argmax(1) == b.y[: b.batch_size]).sum())
    assert correct / len(test) > 0.6  # 4 communities: chance is about 0.25
