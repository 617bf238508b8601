"""The device sampler (strata.gnn.device.sampler, here on its CPU twin) draws exactly the Rust
sampler's blocks: the same nodes in the same order, the same local ids, the same CSC per layer,
on Cora and on a generated weighted power-law graph, for several fanouts, uniform and weighted;
and the UVA gather kernel reads what plain indexing reads (Triton's interpreter on the CPU).
Where torch sees a GPU the same tests run on ``cuda`` too (``gpu_devices``): the sampler there
draws the same bits, with the CSC in device memory and in page-locked host memory read by the
real kernel over UVA."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import gpu_devices, needs, run_strata, triton_kernels

torch = needs("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from strata.device import rng  # noqa: E402
from strata.gnn.device import floyd, uva  # noqa: E402
from strata.gnn.device.sampler import (  # noqa: E402
    LN_2,
    SERIES_TERMS,
    DeviceSampler,
    ln_unit,
)
from strata.gnn.device.topology import DeviceTopology  # noqa: E402
from strata.gnn.sampling import NeighborSampler  # noqa: E402
from strata.store import Store  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_device_sampler")

FANOUTS = [[5], [10, 5], [3, -1], [2, 2, 2], [25, 10]]
#: The CPU twin, and the GPU where torch sees one.
DEVICES = gpu_devices("cpu")


@pytest.fixture(scope="module")
def powerlaw(tmp_path_factory) -> Path:
    """3,000 nodes whose in-degrees follow a Zipf law (hubs with hundreds of in-edges, many
    nodes with none), every edge weighted, a tenth of the weights zero."""
    d = tmp_path_factory.mktemp("powerlaw")
    rng = np.random.default_rng(5)
    n = 3000
    dst = np.minimum(rng.zipf(1.6, size=40_000), n) - 1
    dst = rng.permutation(n)[dst]
    src = rng.integers(0, n, size=dst.size)
    weight = rng.choice(
        np.array([0.0, 0.1, 0.5, 1.0, 2.5, 40.0], dtype=np.float32), size=dst.size, p=[0.1, 0.2, 0.2, 0.3, 0.1, 0.1]
    )
    rows = "".join(f"{s},{t},{float(w)!r}\n" for s, t, w in zip(src, dst, weight, strict=True))
    (d / "edges.csv").write_text(f"{n - 1},{n - 1},1.0\n" + rows)
    run_strata("convert", d / "edges.csv", "--columns", "src,dst,weight", "--out", d / "pl.strata", "-q")
    return d / "pl.strata"


def rust_sample(store: Path, fanouts, weighted: bool, seeds, batch_key: int, seed: int):
    s = NeighborSampler(store, fanouts, weighted=weighted, seed=seed, threads=2).sample(seeds, batch_key)
    return s.node, s.row, s.col, s.num_sampled_nodes, s.num_sampled_edges


def placements(device: str) -> list[int | None]:
    """Device budgets to open the CSC with: on CUDA none (device memory) and 0 (page-locked host
    memory, read by the UVA kernel); the CPU twin holds it in RAM whatever the budget."""
    return [None, 0] if device == "cuda" else [None]


def assert_same(
    store: Path, fanouts, weighted: bool, device: str, batches: int = 4, batch_size: int = 64, seed: int = 3
):
    for budget in placements(device):
        topo = DeviceTopology.open(Store(store), device, weighted=weighted, budget=budget)
        assert topo.placement == ("host" if budget == 0 else "device")
        sampler = DeviceSampler(topo, fanouts, seed=seed, weighted=weighted)
        rng = np.random.default_rng(len(fanouts))
        for b in range(batches):
            seeds = rng.choice(topo.num_nodes, size=batch_size, replace=False)
            key = (b + 1) << 32 | b
            got = sampler.sample(torch.from_numpy(seeds).to(device), key)
            node, row, col, hop_counts, edges = rust_sample(store, fanouts, weighted, seeds, key, seed)
            grow, gcol = got.edge_index()
            assert got.nodes.device.type == grow.device.type == topo.device.type
            assert got.hop_counts == hop_counts and got.edges_per_hop == edges, (fanouts, b, budget)
            np.testing.assert_array_equal(got.nodes.cpu().numpy(), node)
            np.testing.assert_array_equal(grow.cpu().numpy(), row)
            np.testing.assert_array_equal(gcol.cpu().numpy(), col)
            for block in got.blocks:
                assert int(block.indptr[-1]) == block.indices.numel() and int(block.indices.max()) < block.num_src


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fanouts", FANOUTS)
def test_uniform_blocks_equal_the_rust_sampler_s_on_cora(cora, fanouts, device):
    assert_same(cora, fanouts, weighted=False, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fanouts", FANOUTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_blocks_equal_the_rust_sampler_s_on_a_power_law_graph(powerlaw, fanouts, weighted, device):
    assert_same(powerlaw, fanouts, weighted=weighted, device=device, batches=3, batch_size=128)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bounded_batch_equals_the_one_drawn_hop_by_hop(cora, device):
    """Uniform fanouts draw a batch in buffers sized by bounds (on ``cuda`` one CUDA graph per
    capacity, the seeds' count rounded up to a power of two), spare slots past each frontier's
    live nodes: the batch, the nodes handed to ``on_hop`` (at once, where the hop-by-hop draw
    hands each hop's) and the clean local-id map after it are those of the hop-by-hop draw, for
    batches that fill their capacity or leave it mostly spare."""
    topo = DeviceTopology.open(Store(cora), device)
    bounded = DeviceSampler(topo, [10, 5], seed=3)
    hop_by_hop = DeviceSampler(topo, [10, 5], seed=3)
    hop_by_hop.bounded = False
    rng = np.random.default_rng(9)
    sizes = [50, 64, 1, 300]
    for b, size in enumerate(sizes):
        seeds = torch.from_numpy(rng.choice(topo.num_nodes, size=size, replace=False)).to(device)
        seen = ([], [])
        got = bounded.sample(seeds, b + 7, on_hop=lambda nodes, into=seen[0]: into.append(nodes.tolist()))
        want = hop_by_hop.sample(seeds, b + 7, on_hop=lambda nodes, into=seen[1]: into.append(nodes.tolist()))
        assert (got.hop_counts, got.edges_per_hop) == (want.hop_counts, want.edges_per_hop), size
        assert torch.equal(got.nodes, want.nodes) and len(seen[0]) == 1 and len(seen[1]) == 3
        assert seen[0][0] == [node for hop in seen[1] for node in hop]
        for g, w in zip(got.blocks, want.blocks, strict=True):
            assert (g.num_src, g.num_dst) == (w.num_src, w.num_dst)
            assert torch.equal(g.indptr, w.indptr) and torch.equal(g.indices, w.indices)
        assert bool((bounded._local == -1).all())
    if device == "cuda":
        assert bounded.counts == {"replayed": len(sizes), "captured": 3, "op_by_op": 0}
    else:
        assert bounded.counts == {"replayed": 0, "captured": 0, "op_by_op": len(sizes)}
    assert hop_by_hop.counts["op_by_op"] == 0


class HostValues(TorchDispatchMode):
    """Records what copies a value from host memory onto a tensor's device when that device is
    a GPU: a tensor made of Python data (``torch.tensor``), an index put of a 0-dim value, and
    a Python value put into a tensor by index (``t[i] = -1``: torch 2.11 makes the value a host
    tensor and copies it; later versions fill in place, so the call itself is recorded)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.ops: list[str] = []
        setitem = torch.Tensor.__setitem__

        def recorded(t, index, value):
            if not isinstance(value, torch.Tensor):
                self.ops.append(f"a tensor's item set to the Python value {value!r}")
            return setitem(t, index, value)

        monkeypatch.setattr(torch.Tensor, "__setitem__", recorded)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("index_put", "index_put_", "_index_put_impl_") and args[2].dim() == 0:
            self.ops.append(f"{func} of a 0-dim value")
        elif name in ("lift_fresh", "lift_fresh_copy"):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_bounded_draw_copies_no_host_value_to_the_device(cora, monkeypatch):
    """On ``cuda`` a bounded batch is captured as a CUDA graph, and a capture refuses any copy
    from pageable host memory ("Cannot copy between CPU and CUDA tensors during CUDA graph
    capture"), where the sampler would fall back to drawing op by op. The draw, recorded on the
    CPU twin (the same calls and ops), copies no host value."""
    topo = DeviceTopology.open(Store(cora), "cpu")
    sampler = DeviceSampler(topo, [10, 5], seed=3)
    sampler.sample(torch.arange(40), 1)  # makes the capacity's buffers, as a first batch does
    ((batch, _),) = sampler._batches.values()
    with HostValues(monkeypatch) as recorded:
        batch.draw()
    assert recorded.ops == []
    assert bool((sampler._local == -1).all())


def test_a_replayed_batch_outlives_the_next_replay(cora, monkeypatch):
    """A CUDA graph's buffers are rewritten by its next replay, so a replayed batch hands out
    copies. On the CPU a stand-in graph replays into the same buffers: a batch kept across the
    next batches stays the batch it was."""
    from strata.gnn.device.bounded import BoundedBatch

    def capture(self):
        out = self.draw()

        class Replay:
            def replay(_):
                new = self.draw()
                for mine, theirs in zip(self_tensors(out), self_tensors(new), strict=True):
                    mine.copy_(theirs)

        self.graph, self.out = Replay(), out
        self.sampler.counts["captured"] += 1

    def self_tensors(drawn):
        return [drawn.nodes, drawn.sizes, *(t for block in drawn.blocks for t in block)]

    monkeypatch.setattr(BoundedBatch, "capturable", lambda self: True)
    monkeypatch.setattr(BoundedBatch, "_capture", capture)
    topo = DeviceTopology.open(Store(cora), "cpu")
    replayed, op_by_op = DeviceSampler(topo, [10, 5], seed=3), DeviceSampler(topo, [10, 5], seed=3, graphs=False)
    rng = np.random.default_rng(4)
    seeds = [torch.from_numpy(rng.choice(topo.num_nodes, size=64, replace=False)) for _ in range(3)]
    kept = [replayed.sample(s, b) for b, s in enumerate(seeds)]
    for b, s in enumerate(seeds):
        want = op_by_op.sample(s, b)
        assert torch.equal(kept[b].nodes, want.nodes)
        assert all(torch.equal(g.indices, w.indices) for g, w in zip(kept[b].blocks, want.blocks, strict=True))
    assert replayed.counts == {"replayed": 3, "captured": 1, "op_by_op": 0}
    assert op_by_op.counts == {"replayed": 0, "captured": 0, "op_by_op": 3}


def floyd_step_by_step(degree: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """``uniform.rs``'s Floyd loop, one step at a time over every node: the sorted picks."""
    picks = torch.empty((degree.numel(), k), dtype=torch.int64)
    for s in range(k):
        j = degree - k + s
        t = rng.below(rng.draw(keys, torch.tensor(s)), j + 1)
        picks[:, s] = torch.where((picks[:, :s] == t[:, None]).any(1), j, t)
    return picks.sort(dim=1).values


@pytest.mark.parametrize(
    "how, k", [*(("twin", k) for k in (1, 2, 3, 10, 25, 64)), *(("kernel", k) for k in (1, 3, 10, 25))]
)
def test_floyd_s_steps_at_once_pick_what_the_loop_picks(monkeypatch, how, k):
    """Degrees just above ``k`` make most draws collide, so chains of collisions (a draw that
    hits the ``j`` of a step whose own draw collided) are common and each must be followed: the
    twin's steps at once, and the kernel's steps in order (under Triton's interpreter), pick
    what the loop picks."""
    # The interpreter runs each step's reductions element by element: its rows get fewer as k
    # grows (16 at k = 25 still draw some 400 picks, most of them colliding).
    m = 4000 if how == "twin" else 400 // k
    degree = k + 1 + torch.randint(0, 2 * k, (m,), generator=torch.Generator().manual_seed(k))
    keys = rng.derive(1000 + k, torch.arange(m))
    start = torch.arange(m) * 1000
    constants = floyd.FloydConstants.on(k, torch.device("cpu"))
    if how == "kernel":
        needs("triton")
        monkeypatch.setattr(floyd, "BLOCK", 64)  # small programs: the interpreter's reductions are slow
        monkeypatch.setattr(floyd.kernels, "fused", lambda name, device, kernel, twin: kernel())
    with triton_kernels(monkeypatch, "cpu") if how == "kernel" else contextlib.nullcontext():
        positions, counts, valid = floyd.choose(start, degree, keys, constants)
        assert bool(valid.all()) and torch.equal(counts, torch.full((m,), k))
        assert torch.equal(positions.view(m, k) - start[:, None], floyd_step_by_step(degree, keys, k))
        # Nodes of at most k in-edges keep them all, the slots past their degree unused.
        small = torch.tensor([0, 1, k])
        positions, counts, valid = floyd.choose(start[:3], small, keys[:3], constants)
    assert counts.tolist() == small.tolist()
    assert (positions.view(3, k) - start[:3, None])[valid.view(3, k)].tolist() == list(range(1)) + list(range(k))


@pytest.mark.parametrize("device", DEVICES)
def test_seeds_and_fanouts_are_checked(cora, device):
    topo = DeviceTopology.open(Store(cora), device)
    with pytest.raises(ValueError, match="fanouts: entry 1 is 0"):
        DeviceSampler(topo, [5, 0])
    sampler = DeviceSampler(topo, [5])
    with pytest.raises(ValueError, match="out of range"):
        sampler.sample(torch.tensor([0, topo.num_nodes]), 0)
    with pytest.raises(ValueError, match="distinct"):
        sampler.sample(torch.tensor([4, 4]), 0)
    with pytest.raises(ValueError, match="no edge weights"):
        DeviceTopology.open(Store(cora), device, weighted=True)
    # A failed batch leaves the local-id map clean for the next one.
    assert sampler.sample(torch.tensor([1, 2]), 0).nodes[:2].tolist() == [1, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_uva_gather_kernel_reads_what_indexing_reads(monkeypatch, device):
    """On the CPU the kernel runs in Triton's interpreter over CPU tensors; on CUDA it is the
    compiled kernel, reading tables in page-locked host memory from a device index (the path
    ``uva.gather`` takes for them)."""
    cuda = device == "cuda"
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(0)
        index = torch.randint(0, 3000, (2500,), generator=gen)
        for table in [
            torch.randint(-(2**31), 2**31 - 1, (3000,), dtype=torch.int32, generator=gen),
            torch.randint(0, 2**62, (3000,), dtype=torch.int64, generator=gen),
            torch.randn(3000, 7, generator=gen),
        ]:
            host = uva.pinned(table, torch.device(device))
            assert host.device.type == "cpu" and (not cuda or host.is_pinned())
            got = uva.gather(host, index.to(device)) if cuda else uva.kernel_gather(host, index)
            assert got.device.type == device
            assert torch.equal(got.cpu(), table[index])
        empty = uva.kernel_gather(
            uva.pinned(torch.arange(5), torch.device(device)), torch.empty(0, dtype=torch.int64, device=device)
        )
        assert empty.numel() == 0


def rust_ln_unit(m: int) -> float:
    """``weighted.rs``'s ``ln_unit`` step for step in Python floats (IEEE doubles, each
    operation correctly rounded, as Rust's)."""
    e = m.bit_length() - 1
    f = m / float(1 << e)
    if f > math.sqrt(2):
        f *= 0.5
        e += 1
    s = (f - 1.0) / (f + 1.0)
    z = s * s
    p = 1.0 / (2 * SERIES_TERMS + 1)
    for n in reversed(range(SERIES_TERMS)):
        p = p * z + 1.0 / (2 * n + 1)
    return 2.0 * s * p + float(e - 53) * LN_2


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_keys_use_the_rust_logarithm_not_the_device_s(device):
    bits = rng.draw(99, torch.arange(5000, device=device))
    got = ln_unit(bits).tolist()
    ms = [(1 << 53) - (b >> 11) for b in rng.as_u64(bits)]
    assert got == [rust_ln_unit(m) for m in ms]
    # Within a few ulp of the true logarithm, and not simply the device's own log.
    exact = [math.log(m / float(1 << 53)) for m in ms]
    assert all(abs(g - x) <= 4 * math.ulp(x) for g, x in zip(got, exact, strict=True))
    assert got != exact
