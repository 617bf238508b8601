"""Question: does R-GCN trained from disk by `strata gnn train` on a typed
store reach the accuracy of the same model fed from memory? Target: within 0.5 points.

    python benches/bench_gnn_typed.py [--papers 10000] [--epochs 8] [--seeds 0,1,2] [--work DIR]

The graph: `strata generate hetsbm` (papers, authors, institutions, fields of study, 8 classes,
reverse edge types). For each training seed, three runs of the same model (`rgcn`, the same
initial parameters, optimizer, epochs, batches of the same train seeds in the same order, the
best epoch by validation accuracy, test accuracy at the end):

- disk: `strata gnn train STORE --model rgcn` in its own process (Strata's sampler, fanouts per
  edge type, feature rows read from the store's per-type files);
- memory, same sampler: the whole graph loaded into a PyG `HeteroData` (x per node type,
  edge_index per edge type); batches sampled by the same sampler with the same keys, feature rows
  gathered from `HeteroData` tensors, trained by the same loop (`strata.gnn.train`): it isolates
  the data path, so any difference is a wrong row;
- memory, full neighbourhood: the same `HeteroData`, every layer aggregating all in-edges
  (no sampling; PyG's own samplers need pyg-lib or torch-sparse, which do not install here), so
  it is an independent reference for what sampling costs in accuracy.

Reported: the median test accuracy over seeds of each, and the largest per-seed gap of disk
against each in-memory run. Results go to bench-results/gnn-typed.json and the gnn-typed section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from common import machine, save, strata, timed, update_doc

FANOUTS = [10, 5]
HIDDEN, BATCH, LR = 64, 512, 0.01


def generate(args, work: Path) -> Path:
    store = work / "hetsbm.strata"
    if not store.exists():
        sizes = ["--papers", args.papers, "--authors", int(args.papers * 1.5), "--institutions", args.papers // 50]
        sizes += ["--fields", args.papers // 10, "--classes", 8, "--feature-dim", 32, "--paper-feature-noise", 2.5]
        timed(strata("generate", "hetsbm", "--out", store, *sizes, "-q"))
    return store


def train_options(args, seed: int, run_dir: Path) -> dict:
    return {
        "model": "rgcn",
        "fanouts": FANOUTS,
        "hidden": HIDDEN,
        "batch_size": BATCH,
        "lr": LR,
        "epochs": args.epochs,
        "seed": seed,
        "device": "cpu",
        "torch_threads": args.torch_threads,
        "run_dir": run_dir,
    }


def from_disk(store: Path, opts: dict) -> float:
    flags = [
        x
        for k, v in opts.items()
        for x in (f"--{k.replace('_', '-')}", ",".join(map(str, v)) if isinstance(v, list) else v)
    ]
    timed(strata("gnn", "train", store, *flags, "-q"))
    return json.loads((Path(opts["run_dir"]) / "run.json").read_text())["test"]["accuracy"]


def hetero_data(store_path: Path):
    """The whole typed store in RAM as PyG ``HeteroData``: ``x`` and ``y`` per node type (type
    order), ``edge_index`` per edge type (type-local ids)."""
    import torch
    from torch_geometric.data import HeteroData

    from strata.store import Store

    s = Store(store_path)
    data = HeteroData()
    offsets = s.node_type_offsets
    for t, name in enumerate(s.node_types):
        data[name].num_nodes = int(offsets[t + 1] - offsets[t])
        x = s.type_array("features", t)
        if x is not None:
            data[name].x = torch.from_numpy(np.array(x))
    e = np.asarray(s.edges())
    for k, (src, rel, dst) in enumerate(s.edge_types):
        mask = e[:, 1] == k
        pair = np.stack([e[mask, 0] - offsets[s.node_types.index(src)], e[mask, 2] - offsets[s.node_types.index(dst)]])
        data[src, rel, dst].edge_index = torch.from_numpy(pair.astype(np.int64))
    return s, data


def in_memory(store: Path, opts: dict, data, full: bool) -> float:
    """Test accuracy of the same training loop (``strata.gnn.train._train``) with rows from
    ``data`` (a ``HeteroData``): sampled by Strata's sampler, or every in-edge (``full``)."""
    import torch

    from strata.config import as_dict
    from strata.config.gnn import GnnTrainConfig
    from strata.gnn.models import Block, TypedRows
    from strata.gnn.train import _train, _typed
    from strata.gnn.typed import TypedBatch, TypedEpochLoader, TypedGnnData
    from strata.store import Store

    cfg = GnnTrainConfig(store=store, **opts)
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    s = Store(store)
    model, _ = _typed(cfg, s, None, torch.device("cpu"), None)
    xs = [data[name].x if "x" in data[name] else None for name in s.node_types]

    class RamRows(TypedGnnData):
        def read_rows(self, nodes):
            types = np.searchsorted(self.offsets, nodes, side="right") - 1
            rows, index = [], []
            for t, x in enumerate(xs):
                pos = np.flatnonzero(types == t)
                index.append(torch.from_numpy(pos))
                rows.append(None if x is None else x[torch.from_numpy(nodes[pos] - self.offsets[t])])
            return rows, index, 0

    offsets = torch.from_numpy(s.node_type_offsets)
    src = torch.cat([data[e].edge_index[0] + offsets[s.node_types.index(e[0])] for e in s.edge_types])
    dst = torch.cat([data[e].edge_index[1] + offsets[s.node_types.index(e[2])] for e in s.edge_types])
    etype = torch.cat([torch.full((data[e].num_edges,), k) for k, e in enumerate(s.edge_types)])
    n = s.num_nodes
    ntype_all = torch.from_numpy(s.node_type_of(np.arange(n)))

    class FullLoader(TypedEpochLoader):
        def _make(self, index):
            d = self.data
            seeds = self.nodes[index * d.batch_size : (index + 1) * d.batch_size]
            glob = torch.from_numpy(seeds + d.offsets[d.target])
            # Seeds first, then every other node: the last block's destinations are the seeds.
            rest = torch.ones(n, dtype=torch.bool)
            rest[glob] = False
            order = torch.cat([glob, rest.nonzero().squeeze(1)])
            local = torch.empty(n, dtype=torch.int64)
            local[order] = torch.arange(n)
            ls, ld = local[src], local[dst]
            into = ld < len(seeds)
            ntype = ntype_all[order]
            blocks = [Block(n, n, ls, ld, etype, ntype) for _ in range(len(cfg.fanouts) - 1)]
            blocks.append(Block(n, len(seeds), ls[into], ld[into], etype[into], ntype))
            rows, pos, _ = d.read_rows(order.numpy())
            y = torch.from_numpy(np.asarray(d.labels[seeds], dtype=np.int64))
            return TypedBatch(index, seeds, order.numpy(), blocks, TypedRows(n, rows, pos), y)

    class FullRows(RamRows):
        epoch_loader = FullLoader

    kind = FullRows if full else RamRows

    def open_data():
        from strata.gnn.typed import fanout_dict, target_type

        return kind(
            store,
            target_type(s, None),
            fanout_dict(s, list(cfg.fanouts), None),
            batch_size=cfg.batch_size,
            memory=int(cfg.memory),
            seed=cfg.seed,
            threads=cfg.sampler_threads,
            training=model.training_costs(optimizer_states=2),
        )

    record = _train(cfg, as_dict(cfg), model, torch.device("cpu"), None, None, open_data)
    return record["test"]["accuracy"]


def markdown(res: dict) -> str:
    r = res["results"]
    med = {k: statistics.median(v) for k, v in r.items()}
    gap = {k: max(abs(a - b) for a, b in zip(r["disk"], r[k], strict=True)) for k in ("ram_sampled", "ram_full")}
    lines = [
        "### Typed graphs: R-GCN from disk against from memory (`benches/bench_gnn_typed.py`)",
        "",
        f"hetsbm, {res['papers']:,} papers (8 classes), {res['nodes']:,} nodes, {res['edges']:,} edges (8 edge types); "
        f"rgcn, fanouts {FANOUTS} per edge type, hidden {HIDDEN}, batch {BATCH}, {res['epochs']} epochs, "
        f"seeds {res['seeds']}; test accuracy (best epoch by validation). Machine: {res['machine']['nproc']} cores, "
        "shared with other builds (only accuracy matters here).",
        "",
        "| run | median test accuracy | largest gap to disk, per seed |",
        "|---|---|---|",
        f"| `strata gnn train` from disk | {med['disk']:.4f} | |",
        f"| in RAM (PyG HeteroData), same sampler and keys | {med['ram_sampled']:.4f} | "
        f"{100 * gap['ram_sampled']:.2f} points |",
        f"| in RAM (PyG HeteroData), full neighbourhood | {med['ram_full']:.4f} | {100 * gap['ram_full']:.2f} points |",
        "",
        f"Median difference disk − full neighbourhood: {100 * (med['disk'] - med['ram_full']):+.2f} points "
        "(target: within 0.5).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--papers", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        store = generate(args, work)
        s, data = hetero_data(store)
        results = {"disk": [], "ram_sampled": [], "ram_full": []}
        for seed in seeds:
            opts = train_options(args, seed, work / f"run-{seed}")
            results["disk"].append(from_disk(store, opts))
            results["ram_sampled"].append(in_memory(store, opts, data, full=False))
            results["ram_full"].append(in_memory(store, opts, data, full=True))
            print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in results.items()), flush=True)
        res = {
            "machine": machine(),
            "papers": args.papers,
            "nodes": s.num_nodes,
            "edges": int(s.num_edges["train"]),
            "epochs": args.epochs,
            "seeds": seeds,
            "results": results,
        }
    save("gnn-typed", res)
    md = markdown(res)
    update_doc("gnn-typed", md)
    print(md)


if __name__ == "__main__":
    main()
