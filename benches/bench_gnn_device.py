"""Question: does the device data path (device sampler, device-managed cache, deep pipeline)
keep a GPU fed, and what does holding a quarter of the features in host memory cost?

    python benches/bench_gnn_device.py [--device cuda] [--nodes 200000] [--dim 128] [--epochs 3]
        [--work DIR] [--no-peer] [--tiny]

The graph is G6's (docs/benchmarks.md): `strata generate sbm` with `nodes` nodes, 16 classes,
`dim` float32 features, mean degree 10, symmetrized; GraphSAGE (`sage`, hidden 256), fanouts
10 5, batch 1024, Adam. Side by side in one run, on one device:

- `native`: the native data path (Rust sampler and tiers; G6's configuration);
- `device, all in memory`: the device path with every feature row in device memory;
- `device, features 4x host`: the device path with no device tier (only the CSC and the cache
  index on the device) and a host tier (`feature_memory`) of a quarter of the feature bytes,
  page-locked; the other rows are read through the I/O engine per batch;
- `pyg`: PyG's `NeighborLoader` with every feature in memory, the same graph, fanouts and model
  (when PyG and its sampler import; `--no-peer` skips it).

Reported per run: the median epoch seconds and sampled nodes/s over the epochs after the first
(the first warms CUDA up), the share of the epoch the model waited for data (the training
loop's host wait; for the device path also the pipeline's own figure), and test-free training
loss (a sanity check, not a result). `--tiny` runs a few thousand nodes for tests. Results go to
bench-results/gnn-device.json; the figures the GPU session measures go into docs/benchmarks.md
by hand, with the device named.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import machine, save, strata, timed

FANOUTS = [10, 5]
BATCH = 1024


def make_store(args) -> Path:
    """G6's graph (generated and converted once; kept in the work dir)."""
    store = args.work / f"sbm-n{args.nodes}-f{args.dim}.strata"
    if store.exists():
        return store
    raw = args.work / f"sbm-n{args.nodes}-raw"
    gen = ["--nodes", args.nodes, "--classes", 16, "--avg-degree", 10, "--feature-dim", args.dim]
    timed(strata("generate", "sbm", "--out", raw, *gen, "--overwrite", "-q"))
    timed(strata("convert", raw, "--symmetrize", "--out", store, "-q"))
    shutil.rmtree(raw)
    return store


def train(batches, model, opt, device, torch, epochs: int, stats=None) -> dict:
    """Trains ``epochs`` epochs over ``batches()`` (a fresh iterable per epoch of ``(blocks, x,
    y, sampled nodes)``); per epoch: seconds, sampled nodes, host wait seconds, loss."""
    f = torch.nn.functional
    out = []
    for epoch in range(epochs):
        t0, wait, sampled, loss_sum, n = time.perf_counter(), 0.0, 0, 0.0, 0
        it = iter(batches(epoch))
        while True:
            t = time.perf_counter()
            b = next(it, None)
            wait += time.perf_counter() - t
            if b is None:
                break
            blocks, x, y, count = b
            opt.zero_grad()
            loss = f.cross_entropy(model(blocks, x.float()), y)
            loss.backward()
            opt.step()
            loss_sum, n, sampled = loss_sum + loss.item(), n + 1, sampled + count
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rec = {"seconds": seconds, "sampled_nodes": sampled, "wait_seconds": wait, "loss": loss_sum / max(n, 1)}
        if stats is not None:
            rec["pipeline"] = stats()
        out.append(rec)
    return summarize(out)


def summarize(epochs: list[dict]) -> dict:
    later = epochs[1:] or epochs
    secs = sorted(e["seconds"] for e in later)
    rates = sorted(e["sampled_nodes"] / e["seconds"] for e in later)
    waits = sorted(e["wait_seconds"] / e["seconds"] for e in later)
    mid = len(later) // 2
    return {
        "epoch_seconds": secs[mid],
        "sampled_nodes_per_second": rates[mid],
        "wait_share": waits[mid],
        "epochs": epochs,
    }


def strata_run(store: Path, device, torch, args, *, data_path: str, device_memory, feature_memory) -> dict:
    from strata.gnn.loader import GnnData
    from strata.gnn.models import GNN

    options = {"fanouts": FANOUTS, "batch_size": args.batch_size, "device_memory": device_memory}
    if feature_memory is not None:
        options["feature_memory"] = feature_memory
    data = GnnData(store, device=str(device), data_path=data_path, **options)
    torch.manual_seed(0)
    model = GNN("sage", data.dim, 256, data.num_classes, layers=len(FANOUTS)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    train_nodes = data.nodes("train")
    loaders = {}

    def batches(epoch):
        loaders["last"] = data.loader(train_nodes, epoch=epoch)
        return ((b.blocks, b.x, b.y, len(b.nodes)) for b in loaders["last"])

    res = train(batches, model, opt, device, torch, args.epochs, lambda: loaders["last"].stats())
    res["data_path"] = data.data_path
    res["plan"] = data.plan_lines()
    return res


def pyg_run(store: Path, device, torch, args) -> dict:
    """PyG's NeighborLoader, every feature in memory (on the device), the same model."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from strata.gnn.models import GNN, Block
    from strata.store import Store

    s = Store(store)
    indptr, indices = (np.asarray(a, dtype=np.int64) for a in s.csc())
    dst = np.repeat(np.arange(s.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([indices, dst]))
    x = torch.from_numpy(np.asarray(s.features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(s.labels, dtype=np.int64))
    g = Data(x=x, y=y, edge_index=edge_index, num_nodes=s.num_nodes)
    train_nodes = torch.from_numpy(np.asarray(s.array("node_train"), dtype=np.int64))
    torch.manual_seed(0)
    model = GNN("sage", x.shape[1], 256, int(y.max()) + 1, layers=len(FANOUTS)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)

    def batches(epoch):
        loader = NeighborLoader(
            g, num_neighbors=FANOUTS, batch_size=args.batch_size, input_nodes=train_nodes, shuffle=True
        )
        for b in loader:
            # PyG's hop-by-hop subgraph as the two blocks GNN reads: the whole sampled graph
            # each layer, the seeds' rows at the end (PyG's own SAGE does the same work).
            ei = b.edge_index.to(device)
            n, seeds = b.num_nodes, b.batch_size
            blocks = [Block(n, n, ei[0], ei[1]) for _ in FANOUTS[:-1]] + [Block(n, seeds, *_into(ei, seeds))]
            yield blocks, b.x.to(device), b.y[:seeds].to(device), n

    res = train(batches, model, opt, device, torch, args.epochs)
    res["data_path"] = "pyg"
    return res


def _into(ei, seeds):
    keep = ei[1] < seeds
    return ei[0][keep], ei[1][keep]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a few thousand nodes, two epochs (tests)")
    p.add_argument("--out", type=Path, default=None, help="write the result JSON here instead of bench-results/")
    args = p.parse_args()
    if args.tiny:
        args.nodes, args.dim, args.epochs, args.batch_size = 3000, 16, 2, 256
    import torch

    device = torch.device(args.device)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-gnn-device-"))
    work.mkdir(parents=True, exist_ok=True)
    args.work = work
    store = make_store(args)
    feature_bytes = args.nodes * args.dim * 4
    from strata.store import Store

    # Device memory for the CSC and the cache's index only: no row in a device tier.
    csc_and_index = sum(a.nbytes for a in Store(store).csc()) + args.nodes * 8
    quarter = max(feature_bytes // 4, 1)
    runs = {
        "native": strata_run(store, device, torch, args, data_path="native", device_memory="auto", feature_memory=None),
        "device, all in memory": strata_run(
            store,
            device,
            torch,
            args,
            data_path="device",
            device_memory=4 * feature_bytes + (64 << 20),
            feature_memory=None,
        ),
        "device, features 4x host": strata_run(
            store,
            device,
            torch,
            args,
            data_path="device",
            device_memory=csc_and_index,
            feature_memory=quarter,
        ),
    }
    if not args.no_peer:
        try:
            runs["pyg"] = pyg_run(store, device, torch, args)
        except ImportError as e:
            print(f"pyg: skipped ({e})", file=sys.stderr)
    result = {"machine": machine(), "device": str(device), "nodes": args.nodes, "dim": args.dim, "runs": runs}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    if args.out:
        import json

        args.out.write_text(json.dumps(result, indent=1, default=str))
    else:
        save("gnn-device", result)
    print(f"{'run':28s} {'path':8s} {'epoch s':>9s} {'nodes/s':>12s} {'waited':>7s}")
    for name, r in runs.items():
        print(
            f"{name:28s} {r['data_path']:8s} {r['epoch_seconds']:9.3f} {r['sampled_nodes_per_second']:12,.0f} "
            f"{100 * r['wait_share']:6.1f}%"
        )


if __name__ == "__main__":
    main()
