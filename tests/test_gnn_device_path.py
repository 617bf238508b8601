"""The device data path on its CPU twin: the device-managed cache serves every tier's rows bit
for bit as the store holds them, pre-sampling counts what the Rust sampler samples, and the
pipeline's batches equal the native loader's (same order, keys, blocks, features, labels)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")

from strata.gnn.device.cache import DEVICE, HOST, MISS, DeviceCache, presample_hotness  # noqa: E402
from strata.gnn.device.keys import batch_key  # noqa: E402
from strata.gnn.device.sampler import DeviceSampler  # noqa: E402
from strata.gnn.device.topology import DeviceTopology  # noqa: E402
from strata.gnn.loader import GnnData  # noqa: E402
from strata.gnn.sampling import NeighborSampler  # noqa: E402


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


def test_presampling_counts_the_rust_sampler_s_nodes(cora):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, "cpu"), [5, 5], seed=data.config["seed"])
    train = np.asarray(data.nodes("train"))
    hot = presample_hotness(sampler, train, 64, epoch=3)
    rust = NeighborSampler(cora, [5, 5], seed=data.config["seed"], threads=1)
    expected = np.zeros(data.num_nodes, dtype=np.int64)
    for b, start in enumerate(range(0, len(train), 64)):
        np.add.at(expected, rust.sample(train[start : start + 64], batch_key(3, b)).node, 1)
    np.testing.assert_array_equal(hot.numpy(), expected)


def test_cache_serves_every_tier_s_rows_bit_for_bit(cora):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, "cpu"), [5, 5])
    hot = presample_hotness(sampler, data.nodes("train"), 64)
    cache = DeviceCache(
        lambda ids: data._native.gather(ids.tobytes()),
        data.num_nodes,
        data.dim,
        data.torch_dtype,
        hot,
        device_rows=300,
        host_rows=500,
        device="cpu",
    )
    store_rows = torch.from_numpy(np.array(data.store.features, dtype=np.float32))
    nodes = torch.cat([torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(1)), torch.arange(50)])
    rows = cache.lookup(nodes)
    np.testing.assert_array_equal(bits(rows), bits(store_rows[nodes]))
    tier, _ = cache.tiers(nodes)
    assert cache.stats.device_rows == int((tier == DEVICE).sum()) == 300 + int((tier[-50:] == DEVICE).sum())
    assert cache.stats.host_rows == int((tier == HOST).sum()) == 500 + int((tier[-50:] == HOST).sum())
    assert cache.stats.miss_rows == int((tier == MISS).sum()) > 0
    # The hottest nodes are the device tier's, the next the host's.
    order = torch.sort(hot, descending=True, stable=True).indices
    assert (cache.tiers(order[:300])[0] == DEVICE).all() and (cache.tiers(order[300:800])[0] == HOST).all()
    with pytest.raises(ValueError, match="one hotness count per node"):
        DeviceCache(cache.read_rows, 5, data.dim, data.torch_dtype, hot, device_rows=1, host_rows=1, device="cpu")


def test_device_pipeline_batches_equal_the_native_loader_s(cora):
    options = {"fanouts": [5, 5], "batch_size": 48, "device_memory": "200K"}
    native = GnnData(cora, data_path="native", **options)
    device = GnnData(cora, data_path="device", **options)
    assert device.data_path == "device" and native.data_path == "native"
    assert "device data path: device_memory" in device.plan_lines()[-1]
    for epoch in (0, 1):
        a = list(native.loader("train", epoch=epoch))
        loader = device.loader("train", epoch=epoch)
        b = list(loader)
        assert len(a) == len(b) > 1
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.nodes, y.nodes) and x.hop_counts == y.hop_counts
            for bx, by in zip(x.blocks, y.blocks, strict=True):
                assert (bx.num_src, bx.num_dst) == (by.num_src, by.num_dst)
                assert torch.equal(bx.src, by.src) and torch.equal(bx.dst, by.dst)
            np.testing.assert_array_equal(bits(x.x), bits(y.x))
            assert torch.equal(x.y, y.y)
        stats = loader.stats()
        assert stats["sampler"] == "device" and stats["batches"] == len(b)
        assert set(stats["busy_seconds"]) == {"sample", "lookup"}
        assert 0.0 <= stats["wait_share"] <= 1.0
        tiers = stats["tiers"]
        assert tiers["device_rows"] + tiers["host_rows"] + tiers["miss_rows"] == sum(len(x.nodes) for x in b)
    with pytest.raises(ValueError, match="data_path: expected one of"):
        GnnData(cora, data_path="gpu", **options)
