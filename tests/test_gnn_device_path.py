"""The device data path on its CPU twin: the device-managed cache serves every tier's rows bit
for bit as the store holds them, pre-sampling counts what the Rust sampler samples, and the
pipeline's batches equal the native loader's (same order, keys, blocks, features, labels), for
node batches and for link batches (the same negatives too, through the counter-based RNG), also
through PyG's LinkNeighborLoader sampler. Where torch sees a GPU the same tests run on ``cuda``
too (``gpu_devices``), against the native loader on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_devices, needs, run_strata

torch = needs("torch")

from strata.device.waits import HostWaits  # noqa: E402
from strata.gnn.device.cache import DEVICE, HOST, MISS, DeviceCache, presample_hotness  # noqa: E402
from strata.gnn.device.keys import batch_key  # noqa: E402
from strata.gnn.device.pipeline import DevicePipeline, _ahead  # noqa: E402
from strata.gnn.device.reads import EngineReads  # noqa: E402
from strata.gnn.device.sampler import DeviceSampler, Started  # noqa: E402
from strata.gnn.device.topology import DeviceTopology  # noqa: E402
from strata.gnn.loader import GnnData, LinkLoader  # noqa: E402
from strata.gnn.sampling import NeighborSampler  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_device_path")

#: The CPU twin, and the GPU where torch sees one.
DEVICES = gpu_devices("cpu")


def bits(t: torch.Tensor) -> np.ndarray:
    return t.cpu().contiguous().view(torch.int32).numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_presampling_counts_the_rust_sampler_s_nodes(cora, device):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, device), [5, 5], seed=data.config["seed"])
    train = np.asarray(data.nodes("train"))
    hot = presample_hotness(sampler, train, 64, epoch=3)
    rust = NeighborSampler(cora, [5, 5], seed=data.config["seed"], threads=1)
    expected = np.zeros(data.num_nodes, dtype=np.int64)
    for b, start in enumerate(range(0, len(train), 64)):
        np.add.at(expected, rust.sample(train[start : start + 64], batch_key(3, b)).node, 1)
    assert hot.device.type == torch.device(device).type
    np.testing.assert_array_equal(hot.cpu().numpy(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_cache_serves_every_tier_s_rows_bit_for_bit(cora, device):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, device), [5, 5])
    hot = presample_hotness(sampler, data.nodes("train"), 64)
    engine = EngineReads(data._native, data.dim, data.torch_dtype, device)
    cache = DeviceCache(data.store.features, engine, hot, device_rows=300, host_rows=500, device=device)
    # On CUDA the host tier is page-locked and read by the UVA kernel.
    assert cache.device_table.device.type == torch.device(device).type and cache.host_table.device.type == "cpu"
    store_rows = torch.from_numpy(np.array(data.store.features, dtype=np.float32))
    nodes = torch.cat([torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(1)), torch.arange(50)])
    rows = cache.lookup(nodes.to(device))
    assert rows.device.type == torch.device(device).type
    np.testing.assert_array_equal(bits(rows), bits(store_rows[nodes]))
    nodes = nodes.to(device)
    tier, _ = cache.tiers(nodes)
    assert cache.stats.device_rows == int((tier == DEVICE).sum()) == 300 + int((tier[-50:] == DEVICE).sum())
    assert cache.stats.host_rows == int((tier == HOST).sum()) == 500 + int((tier[-50:] == HOST).sum())
    assert cache.stats.miss_rows == int((tier == MISS).sum()) > 0
    # The hottest nodes are the device tier's, the next the host's.
    order = torch.sort(hot, descending=True, stable=True).indices
    assert (cache.tiers(order[:300])[0] == DEVICE).all() and (cache.tiers(order[300:800])[0] == HOST).all()
    with pytest.raises(ValueError, match="one hotness count per node"):
        DeviceCache(data.store.features[:5], engine, hot, device_rows=1, host_rows=1, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tiers", ["one", "three"])
def test_a_batch_waits_for_the_device_once(cora, device, tiers):
    """A batch, presampled or in an epoch, reads back its sizes once (the nodes reached after
    each hop and each hop's edges: 5 values for two hops) and, when the rows are spread over
    tiers, its one lookup's tier sizes; nothing else waits for the device."""
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, device), [5, 5])
    train = data.nodes("train")
    with HostWaits() as waits:
        hot = presample_hotness(sampler, train, 64)
    assert waits.waits == [] and waits.reads == [5] * -(-len(train) // 64)
    engine = EngineReads(data._native, data.dim, data.torch_dtype, device)
    held = {"device_rows": data.num_nodes, "host_rows": 0} if tiers == "one" else {"device_rows": 300, "host_rows": 500}
    cache = DeviceCache(data.store.features, engine, hot, **held, device=device)
    batches = DevicePipeline(sampler, cache, None, 64).epoch(train, epoch=1)
    with HostWaits() as waits:
        count = sum(1 for _ in batches)
    assert count > 1 and waits.waits == []
    # Per batch: its sizes; with three tiers, the (device, host, miss) row counts of its lookup
    # (every node of the batch at once).
    per_batch = [5] + ([3] if tiers == "three" else [])
    assert sorted(waits.reads) == sorted(per_batch * count)
    # A link batch reads back its number of distinct endpoints (the seeds) first.
    links = DevicePipeline(sampler, cache, None, 64).link_epoch(cora_edges(cora, 300), 2, epoch=1)
    with HostWaits() as waits:
        count = sum(1 for _ in links)
    assert count > 1 and waits.waits == [] and sorted(waits.reads) == sorted([1, *per_batch] * count)


@pytest.mark.parametrize("device", DEVICES)
def test_an_epoch_s_seeds_are_checked_once_before_its_batches(cora, device):
    data = GnnData(cora, fanouts=[5], batch_size=64, data_path="native")
    sampler = DeviceSampler(DeviceTopology.open(data.store, device), [5])
    engine = EngineReads(data._native, data.dim, data.torch_dtype, device)
    hot = torch.zeros(data.num_nodes, dtype=torch.int64)
    cache = DeviceCache(data.store.features, engine, hot, device_rows=data.num_nodes, host_rows=0, device=device)
    pipeline = DevicePipeline(sampler, cache, None, 2)
    with pytest.raises(ValueError, match="distinct"):
        pipeline.epoch([3, 5, 7, 3])
    with pytest.raises(ValueError, match=f"node {data.num_nodes}, out of range"):
        pipeline.epoch([3, data.num_nodes], shuffle=False)
    with pytest.raises(ValueError, match="node -1, out of range"):
        pipeline.link_epoch(np.array([[0, 1], [2, -1]]), 1)
    assert sum(1 for _ in pipeline.epoch([3, 5, 7], shuffle=False)) == 2
    assert pipeline.stats["batches"] == 2 and pipeline.stats["sampled_nodes"] > 3


@pytest.mark.parametrize("device", DEVICES)
def test_an_epoch_stopped_early_reports_the_batches_it_served(cora, device):
    """A benchmark that takes the first batches of an epoch, or a loop that breaks, still gets
    the stats of what was served (and, on a GPU, the prefetch thread ends with the epoch)."""
    data = GnnData(cora, device=device, data_path="device", fanouts=[5], batch_size=64)
    loader = data.loader(data.nodes("train"))
    epoch = iter(loader)
    served = [next(epoch) for _ in range(2)]
    epoch.close()
    stats = loader.stats()
    assert stats["batches"] == 2
    assert stats["sampled_nodes"] == sum(len(b.nodes) for b in served)


@pytest.mark.parametrize("device", DEVICES)
def test_no_pre_sampling_epoch_when_device_memory_holds_every_row(cora, device, monkeypatch):
    from strata.gnn.device import path

    calls = []
    monkeypatch.setattr(path, "presample_hotness", lambda *a, **k: calls.append(1) or presample_hotness(*a, **k))
    whole = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="device", device=device, device_memory="64M")
    assert calls == [] and whole.device_path.budget()["device_rows"] == whole.num_nodes
    part = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="device", device=device, device_memory="200K")
    assert calls == [1] and 0 < part.device_path.budget()["device_rows"] < part.num_nodes


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` hold the same values, wherever each lives (the native loader's batch on
    the CPU, the device path's on its device)."""
    return torch.equal(a.cpu(), b.cpu())


def assert_same_batch(x, y) -> None:
    """Two batches hold the same nodes, blocks, feature bits and labels."""
    assert equal(x.nodes, y.nodes) and x.hop_counts == y.hop_counts
    for bx, by in zip(x.blocks, y.blocks, strict=True):
        assert (bx.num_src, bx.num_dst) == (by.num_src, by.num_dst)
        assert equal(bx.src, by.src) and equal(bx.dst, by.dst)
    np.testing.assert_array_equal(bits(x.x), bits(y.x))
    assert equal(x.y, y.y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("producer", ["thread", "inline"])
def test_device_pipeline_batches_equal_the_native_loader_s(cora, device, producer):
    """Whoever issues the work (a producer thread, or the training loop inline), the batches
    are the native loader's; the epoch's stats say who issued it (on the CPU twin, always in
    order) and the share of it the model had no step to run."""
    options = {"fanouts": [5, 5], "batch_size": 48, "device_memory": "200K"}
    native = GnnData(cora, data_path="native", **options)
    dev = GnnData(cora, data_path="device", device=device, producer=producer, **options)
    assert dev.data_path == "device" and native.data_path == "native"
    assert dev.plan_lines()[-1].startswith("data path: device; memory ")
    for epoch in (0, 1):
        a = list(native.loader("train", epoch=epoch))
        loader = dev.loader("train", epoch=epoch)
        b = list(loader)
        assert len(a) == len(b) > 1
        for x, y in zip(a, b, strict=True):
            assert_same_batch(x, y)
            assert y.x.device.type == torch.device(device).type
        stats = loader.stats()
        assert stats["sampler"] == "device" and stats["batches"] == len(b)
        assert set(stats["busy_seconds"]) == {"sample", "lookup"}
        assert 0.0 <= stats["wait_share"] <= 1.0 and stats["waited_seconds"] <= stats["wall_seconds"]
        assert stats["stalled_seconds"] >= 0.0 and (device == "cuda" or stats["stalled_seconds"] == 0.0)
        assert stats["producer"] == (producer if device == "cuda" else "in order")
        assert 0.0 < stats["train_seconds"] < stats["wall_seconds"]
        assert stats["model_idle_share"] == pytest.approx(1 - stats["train_seconds"] / stats["wall_seconds"])
        tiers = stats["tiers"]
        assert tiers["device_rows"] + tiers["host_rows"] + tiers["miss_rows"] == sum(len(x.nodes) for x in b)
    with pytest.raises(ValueError, match="data_path: expected one of"):
        GnnData(cora, data_path="gpu", **options)
    with pytest.raises(ValueError, match="producer: expected one of thread, inline, got 'process'"):
        GnnData(cora, data_path="device", device=device, producer="process", **options)


def cora_edges(cora, count: int) -> np.ndarray:
    """``count`` of Cora's edges as a ``(2, E)`` array (CSC order: in-edges node by node)."""
    indptr, indices = (np.asarray(a, dtype=np.int64) for a in GnnData(cora, data_path="native").store.csc())
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return np.stack([indices, dst])[:, :count]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("negatives", [0, 3])
def test_device_link_batches_equal_the_native_loader_s(cora, negatives, device):
    edges = cora_edges(cora, 700)
    options = {"edges": edges, "negatives": negatives, "device_memory": "200K"}
    native = LinkLoader(cora, [5, 5], 96, data_path="native", **options)
    on_device = dict(options, device=device)
    dev = LinkLoader(cora, [5, 5], 96, data_path="device", **on_device)
    assert (native.data.data_path, dev.data.data_path) == ("native", "device")
    for _epoch in (0, 1):
        a, b = list(native), list(dev)
        assert len(a) == len(b) == 8
        for x, y in zip(a, b, strict=True):
            assert_same_batch(x, y)
            assert equal(x.edge_label_index, y.edge_label_index) and equal(x.edge_label, y.edge_label)
            num_pos = len(y.edge_label) // (1 + negatives)
            assert y.edge_label_index.shape == (2, num_pos * (1 + negatives)) and int(y.edge_label.sum()) == num_pos
        assert dev.stats["sampler"] == "device" and dev.stats["batches"] == 8
    # Unshuffled, the positives are the given edges in order.
    unshuffled = LinkLoader(cora, [5, 5], 96, data_path="device", shuffle=False, **on_device)
    first = next(iter(unshuffled))
    assert equal(first.nodes[first.edge_label_index[:, :96]], torch.from_numpy(edges[:, :96]))


@pytest.mark.parametrize("device", DEVICES)
def test_pyg_link_sampler_on_the_device_path_draws_the_native_sample(cora, device):
    needs("torch_geometric")
    from torch_geometric.sampler import EdgeSamplerInput, NegativeSampling

    from strata.gnn.pyg import StrataSampler

    options = {"fanouts": [5, 5], "batch_size": 64, "device_memory": "200K"}
    edges = torch.from_numpy(cora_edges(cora, 64))
    inputs = EdgeSamplerInput(None, edges[0], edges[1])
    out = [
        StrataSampler(GnnData(cora, data_path=path, device=on, **options)).sample_from_edges(
            inputs, NegativeSampling("binary", 2)
        )
        for path, on in (("native", "cpu"), ("device", device))
    ]
    for name in ("node", "row", "col"):
        assert equal(getattr(out[0], name), getattr(out[1], name)), name
    assert out[0].num_sampled_nodes == out[1].num_sampled_nodes
    assert out[0].num_sampled_edges == out[1].num_sampled_edges
    assert equal(out[0].metadata[1], out[1].metadata[1]) and equal(out[0].metadata[2], out[1].metadata[2])
    # The feature store serves x through the device path's cache, bit for bit the store's rows.
    from strata.gnn.pyg import stores

    fs, _ = stores(GnnData(cora, data_path="device", device=device, **options))
    x = fs.get_tensor(group_name=None, attr_name="x", index=out[1].node)
    expected = np.asarray(fs.data.store.features)[out[1].node.cpu().numpy()]
    np.testing.assert_array_equal(bits(x), bits(torch.from_numpy(expected)))
    assert fs.data.device_path.cache.stats.lookups == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_store_without_node_splits_ranks_hotness_over_its_edge_endpoints(tmp_path, device):
    # A link store (no node splits): the device tier holds the rows pre-sampling over the
    # training edges' endpoints reaches most, not the first ids.
    run_strata("generate", "sbm", "--out", tmp_path / "raw", "--nodes", "1500", "--classes", "4", "--feature-dim", "8")
    for split in ("train", "valid", "test"):
        (tmp_path / "raw" / f"{split}_idx.npy").unlink()
    store = tmp_path / "links.strata"
    run_strata("convert", tmp_path / "raw", "--symmetrize", "--out", store, "-q")
    data = GnnData(store, fanouts=[5, 5], batch_size=64, data_path="device", device=device, device_memory="100K")
    assert not data.has_split("train")
    cache = data.device_path.cache
    rows = cache.device_table.shape[0]
    assert 0 < rows < data.num_nodes
    hot = presample_hotness(data.device_path.sampler, np.unique(data.edges("train")), 64)
    expected = torch.sort(hot, descending=True, stable=True).indices[:rows]
    assert (cache.tiers(expected)[0] == DEVICE).all()
    assert not (cache.tiers(torch.arange(rows, device=device))[0] == DEVICE).all()


@pytest.mark.parametrize("fails", ["enter", "items"])
def test_the_prefetch_thread_s_failure_is_raised_to_the_consumer(fails):
    """On a GPU the batches are prepared ahead by a thread. A failure there, in its setup (the
    thread's ``set_device``) or in a batch, is raised in the training loop: it must not leave the
    loop waiting forever for a batch that never comes."""

    def items():
        yield 1
        if fails == "items":
            raise ValueError("batch 2")
        yield 2

    def enter():
        if fails == "enter":
            raise ValueError("no device")

    with pytest.raises(ValueError, match="no device" if fails == "enter" else "batch 2"):
        list(_ahead(items(), 2, enter))
    assert list(_ahead(iter([1, 2, 3]), 1, lambda: None)) == [1, 2, 3]


def all_pins(data: GnnData) -> int:
    """Window pins held in the native tiers' dynamic cache, over every node."""
    return sum(data._native.window_pins(np.arange(data.num_nodes, dtype="<u4").tobytes()))


@pytest.mark.parametrize("device", DEVICES)
def test_the_window_pins_the_misses_of_the_batches_sampled_ahead(cora, device):
    """GIDS window buffering on the device path: batches are sampled ``window`` ahead of their
    lookups, and their missed rows are pinned in the I/O engine's dynamic cache until they are
    read; the batches are the native loader's whatever the window, and an epoch, finished or
    stopped early, leaves no pin behind."""
    options = {"fanouts": [5, 5], "batch_size": 48, "device_memory": "200K", "feature_memory": "2M"}
    native = list(GnnData(cora, data_path="native", **options).loader("train", epoch=1))
    data = GnnData(cora, data_path="device", device=device, **options)
    path = data.device_path
    assert data._native.has_cache and path.pipeline.window == data.config["window"] == 8
    for window in (0, 3):
        # A read a batch (read_rows=1), so the batches behind the first keep their pins.
        pipeline = DevicePipeline(path.sampler, path.cache, path.pipeline.labels, 48, window=window, read_rows=1)
        batches = pipeline.epoch(data.nodes("train"), epoch=1)
        first = next(batches)
        # Batch 0 is served; batches 1 .. window wait in the window with their misses pinned.
        assert (all_pins(data) > 0) == (window > 0)
        rest = list(batches)
        assert all_pins(data) == 0
        for x, y in zip(native, [first, *rest], strict=True):
            assert_same_batch(x, y)
        stats = pipeline.stats
        tiers = stats["tiers"]
        assert stats["window"] == window
        assert tiers["cache_rows"] + tiers["disk_rows"] == tiers["miss_rows"] > 0
        assert tiers["rows"] == tiers["device_rows"] + tiers["hot_rows"] + tiers["miss_rows"]
        assert tiers["disk_requests"] > 0 and tiers["disk_bytes_read"] >= 4096
        stopped = pipeline.epoch(data.nodes("train"), epoch=2)
        next(stopped)
        stopped.close()
        assert all_pins(data) == 0 and pipeline.stats["batches"] == 1
    # The same through the loader, with the path's window and reads.
    loader = data.loader("train", epoch=2)
    batches = iter(loader)
    next(batches)
    batches.close()
    assert all_pins(data) == 0 and loader.stats()["batches"] == 1
    with pytest.raises(ValueError, match="window: expected at least 0"):
        DevicePipeline(path.sampler, path.cache, None, 48, window=-1)
    # The accumulator off, each batch's misses are read alone, and the plan says so.
    alone = GnnData(cora, data_path="device", device=device, accumulator=False, **options)
    assert alone.device_path.pipeline.read_rows == 0 < path.pipeline.read_rows
    # On CUDA the line goes on to say who issues the work.
    assert "each batch's misses read alone (no accumulator)" in alone.plan_lines()[-1]


def test_a_failed_sample_releases_the_pins_of_the_hops_it_placed(cora):
    """A batch whose sampling fails after some hops were placed (and their misses pinned)
    releases those pins; so do the batches already waiting in the window."""
    options = {"fanouts": [5, 5], "batch_size": 48, "device_memory": "200K", "feature_memory": "2M"}
    data = GnnData(cora, data_path="device", **options)
    path = data.device_path
    pipeline = DevicePipeline(path.sampler, path.cache, None, 48, window=2, read_rows=1)
    start = pipeline.sampler.start
    calls, held = [], []

    def failing(seeds, key, **kw):
        calls.append(key)
        started = start(seeds, key, **kw)
        if len(calls) != 2:
            return started

        def finish(on_hop):
            on_hop(seeds.to(pipeline.device))  # the seeds placed, then the draw fails
            held.append(all_pins(data))
            raise RuntimeError("draw failed")

        return Started(finish, started.abandon)

    pipeline.sampler.start = failing
    with pytest.raises(RuntimeError, match="draw failed"):
        list(pipeline.epoch(data.nodes("train"), epoch=1))
    # Batch 1 failed as it was finished, after batch 2 was started: that one is given up.
    assert len(calls) == 3 and held[0] > 0 and all_pins(data) == 0
    assert not any(b.under_way for pair in path.sampler._batches.values() for b in pair)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "read_rows"), [(0, None), (3, None), (3, 1)])
def test_the_window_s_misses_are_read_in_one_read(cora, device, window, read_rows):
    """GIDS's accumulator on the device path: when a batch's misses are due, those of the
    batches waiting behind it in the window are read with them, in one read (each distinct row
    once, pages shared by batches read once), up to ``read_rows`` missed rows; the batches are
    the native loader's all the same."""
    options = {"fanouts": [5, 5], "batch_size": 48, "device_memory": "200K", "feature_memory": "2M"}
    native = list(GnnData(cora, data_path="native", **options).loader("train", epoch=1))
    data = GnnData(cora, data_path="device", device=device, hot_share=1.0, **options)
    path = data.device_path
    pipeline = DevicePipeline(path.sampler, path.cache, None, 48, window=window, read_rows=read_rows)
    reads = path.cache.misses
    sizes = []
    host_rows = reads.host_rows
    reads.host_rows = lambda ids, **kw: sizes.append(ids.size) or host_rows(ids, **kw)
    batches = list(pipeline.epoch(data.nodes("train"), epoch=1))
    for x, y in zip(native, batches, strict=True):
        np.testing.assert_array_equal(bits(x.x), bits(y.x))
    # One read for each run of window + 1 batches (every batch misses rows here), or a read a
    # batch when the rows allowed are fewer than one batch's misses.
    groups = len(batches) if read_rows == 1 else -(-len(batches) // (window + 1))
    assert len(sizes) == groups and sum(sizes) == pipeline.stats["tiers"]["miss_rows"]
