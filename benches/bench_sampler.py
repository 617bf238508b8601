"""Question: what do weighted, temporal and per-edge-type sampling cost against uniform
sampling, in sampled nodes per second, on the same graph in one run?

    python benches/bench_sampler.py [--nodes 500000] [--edges 5000000] [--batches 10] [--repeats 5]
        [--threads 0] [--work DIR]

The graph: random edges among `nodes` nodes of two types (papers, the first 70% of the ids, and
authors), three edge types (paper cites paper, author writes paper, paper written_by author),
float32 weights drawn from {0, 0.2, 1, 3, 7} and int64 times in [0, 1000). It is converted
twice through the CLI: typed (`--columns src,rel,dst,weight,time --node-types --edge-types`) and
untyped with weights and times (`--columns src,dst,weight,time`). Each mode samples the same
`batches` batches of 1024 random paper seeds, fanouts 15,10, `repeats` times; reported: the
median over repeats of sampled nodes (`len(node)` summed over batches) per second, its ratio
to uniform sampling of the untyped store, and sampled edges per second. Typed sampling gives
each edge type the list's fanout, as PyG does with a list, so it samples more edges per node
than the other modes. Temporal seeds are at time 500, so about half the edges are eligible; a
temporal sample is disjoint per seed, so it holds more nodes.

The peer: DGL's neighbour sampler (`dgl.dataloading.NeighborSampler`, the classic C++ one),
when DGL imports. It expands blocks as Strata does (every node known so far is re-sampled at each
hop), so node counts match in kind: DGL's `input_nodes` of a batch against Strata's `node`. It
runs on the same edges, built once as a DGL graph, uniform, weighted (`prob`) and per edge type,
in the same rounds as Strata's passes (each round runs every mode, Strata's pass and DGL's back
to back, so load on a shared machine hits both alike; round 0 is an untimed warm-up in which DGL
builds its CSC); it has no temporal mode (GraphBolt's temporal
sampler needs GraphBolt's native library, see below). PyG's own samplers need pyg-lib or
torch-sparse, which do not install for this torch.

Installing DGL here: the package registry's newest DGL is 2.1.0, and its GraphBolt library ships
only for torch <= 2.2.1, so `import dgl` fails on GraphBolt under a newer torch. The classic
sampler does not use GraphBolt, so this script lets `import dgl` proceed without it (an empty
`dgl.graphbolt` module) and says so. Put DGL beside the venv's torch, e.g.
`pip install --no-deps --target /tmp/dgl dgl==2.1.0 torchdata==0.7.1 pyyaml pydantic pandas`
then `PYTHONPATH=/tmp/dgl python benches/bench_sampler.py`. `--no-peer` skips it.

Results go to bench-results/gnn-sampler.json and the gnn-sampler section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import types
from functools import partial
from pathlib import Path

import numpy as np

from common import machine, save, strata, timed, update_doc
from strata.gnn.sampling import NeighborSampler

EDGE_TYPES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "written_by", "author")]
FANOUTS = [15, 10]
BATCH = 1024


def write_inputs(d: Path, nodes: int, edges: int, seed: int = 0) -> dict:
    """The random edge list as typed and untyped CSVs and the type files; returns the paths."""
    rng = np.random.default_rng(seed)
    papers = int(nodes * 0.7)
    etype = rng.choice(3, size=edges, p=[0.6, 0.2, 0.2])
    paper_ids = rng.integers(0, papers, size=edges)
    other = rng.integers(0, papers, size=edges)
    author_ids = rng.integers(papers, nodes, size=edges)
    src = np.where(etype == 0, other, np.where(etype == 1, author_ids, paper_ids))
    dst = np.where(etype == 2, author_ids, paper_ids)
    weight = rng.choice(np.array([0.0, 0.2, 1.0, 3.0, 7.0]), size=edges)
    times = rng.integers(0, 1000, size=edges)
    rel = np.array([t[1] for t in EDGE_TYPES])[etype]
    (d / "node_types.tsv").write_text(f"paper\t{papers}\nauthor\t{nodes - papers}\n")
    (d / "edge_types.tsv").write_text("".join("\t".join(t) + "\n" for t in EDGE_TYPES))
    with open(d / "typed.csv", "w") as f:
        f.writelines(f"{s},{r},{t},{w},{tm}\n" for s, r, t, w, tm in zip(src, rel, dst, weight, times, strict=True))
    with open(d / "plain.csv", "w") as f:
        f.writelines(f"{s},{t},{w},{tm}\n" for s, t, w, tm in zip(src, dst, weight, times, strict=True))
    return {"papers": papers}


def convert(d: Path) -> tuple[Path, Path]:
    types = ["--node-types", d / "node_types.tsv", "--edge-types", d / "edge_types.tsv"]
    typed, plain = d / "typed.strata", d / "plain.strata"
    timed(strata("convert", d / "typed.csv", "--columns", "src,rel,dst,weight,time", *types, "--out", typed, "-q"))
    timed(strata("convert", d / "plain.csv", "--columns", "src,dst,weight,time", "--out", plain, "-q"))
    return typed, plain


def strata_pass(sampler: NeighborSampler, batches: list[np.ndarray], *, hetero: bool, temporal: bool) -> tuple:
    """One pass of Strata's sampler over ``batches``: (sampled nodes, sampled edges, seconds)."""
    nodes, edges, start = 0, 0, time.perf_counter()
    for key, seeds in enumerate(batches):
        times = np.full(len(seeds), 500) if temporal else None
        if hetero:
            out = sampler.sample_hetero(("paper", seeds), batch_key=key, seed_time=times)
            nodes += sum(len(v) for v in out.node.values())
            edges += sum(sum(h) for h in out.num_sampled_edges.values())
        else:
            out = sampler.sample(seeds, batch_key=key, seed_time=times)
            nodes += len(out.node)
            edges += sum(out.num_sampled_edges)
    return nodes, edges, time.perf_counter() - start


def summary(passes: list[tuple]) -> dict:
    """Median sampled nodes/s and edges/s over timed passes."""
    return {
        "nodes_per_s": float(np.median([n / s for n, _, s in passes])),
        "edges_per_s": float(np.median([e / s for _, e, s in passes])),
        "nodes_per_pass": passes[-1][0],
        "edges_per_pass": passes[-1][1],
        "rates": [n / s for n, _, s in passes],
    }


def load_dgl():
    """DGL, or None when it does not import; under a torch newer than DGL's GraphBolt library
    supports, DGL is imported without GraphBolt (the classic sampler does not need it)."""
    try:
        return importlib.import_module("dgl")
    except ImportError:
        return None
    except FileNotFoundError as e:
        if "graphbolt" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "dgl" or m.startswith("dgl.")]:
        del sys.modules[name]
    sys.modules["dgl.graphbolt"] = types.ModuleType("dgl.graphbolt")
    print("DGL: GraphBolt's native library is not built for this torch; using DGL without GraphBolt")
    return importlib.import_module("dgl")


def dgl_graphs(dgl, typed: Path, plain: Path) -> tuple:
    """The plain store as a DGL graph and the typed one as a DGL heterograph (per-type local ids),
    with the stores' train edges and weights in ``edata["w"]``."""
    import torch

    from strata import Store

    s = Store(plain)
    e = np.asarray(s.edges())
    g = dgl.graph(
        (torch.from_numpy(e[:, 0].astype(np.int64)), torch.from_numpy(e[:, 1].astype(np.int64))), num_nodes=s.num_nodes
    )
    g.edata["w"] = torch.from_numpy(np.array(s.edge_weights()))
    t = Store(typed)
    e = np.asarray(t.edges())
    w = np.array(t.edge_weights())
    offsets = t.node_type_offsets
    names = t.node_types
    data, weights = {}, {}
    for r, (src_t, rel, dst_t) in enumerate(t.edge_types):
        sel = e[:, 1] == r
        so, do = offsets[names.index(src_t)], offsets[names.index(dst_t)]
        data[(src_t, rel, dst_t)] = (torch.from_numpy(e[sel, 0] - so), torch.from_numpy(e[sel, 2] - do))
        weights[(src_t, rel, dst_t)] = torch.from_numpy(w[sel])
    counts = {n: int(offsets[i + 1] - offsets[i]) for i, n in enumerate(names)}
    h = dgl.heterograph(data, num_nodes_dict=counts)
    for et, ws in weights.items():
        h.edges[et].data["w"] = ws
    return g, h


def dgl_pass(dgl, graph, batches: list[np.ndarray], *, hetero: bool, weighted: bool) -> tuple:
    """One pass of DGL's block sampler over ``batches``: (sampled nodes, i.e. ``input_nodes``,
    edges of the blocks, seconds)."""
    import torch

    if hetero:
        fanouts = [dict.fromkeys(graph.canonical_etypes, f) for f in reversed(FANOUTS)]
    else:
        fanouts = list(reversed(FANOUTS))
    sampler = dgl.dataloading.NeighborSampler(fanouts, prob="w" if weighted else None)
    nodes, edges, start = 0, 0, time.perf_counter()
    for b in batches:
        seeds = {"paper": torch.from_numpy(b)} if hetero else torch.from_numpy(b)
        inputs, _, blocks = sampler.sample_blocks(graph, seeds)
        nodes += sum(len(v) for v in inputs.values()) if hetero else len(inputs)
        edges += sum(b.num_edges() for b in blocks)
    return nodes, edges, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500_000)
    ap.add_argument("--edges", type=int, default=5_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--no-peer", action="store_true", help="skip DGL's sampler")
    args = ap.parse_args()
    dgl = None if args.no_peer else load_dgl()
    threads = args.threads or os.cpu_count()
    if dgl is not None:
        # The same thread count for both samplers (DGL's OpenMP pool, Strata's `threads`).
        dgl.utils.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix="bench-sampler-", dir=args.work))
    try:
        info = write_inputs(work, args.nodes, args.edges)
        typed, plain = convert(work)
        rng = np.random.default_rng(1)
        batches = [rng.choice(info["papers"], size=BATCH, replace=False) for _ in range(args.batches)]
        modes = {
            "uniform": (plain, {}, False),
            "weighted": (plain, {"weighted": True}, False),
            "temporal uniform": (plain, {"temporal_strategy": "uniform"}, False),
            "temporal last": (plain, {"temporal_strategy": "last"}, False),
            "typed (per edge type)": (typed, {}, True),
            "typed + weighted": (typed, {"weighted": True}, True),
        }
        # Each round runs every mode once, Strata's then DGL's pass back to back, so a change in
        # the machine's load hits both alike; the first round is untimed (it builds DGL's CSC).
        runs = {}
        for name, (store, options, hetero) in modes.items():
            sampler = NeighborSampler(store, FANOUTS, threads=args.threads, **options)
            temporal = "temporal_strategy" in options
            runs[name] = [partial(strata_pass, sampler, batches, hetero=hetero, temporal=temporal)]
        if dgl is not None:
            dgl.seed(0)
            g, h = dgl_graphs(dgl, typed, plain)
            peers = {
                "uniform": (g, False, False),
                "weighted": (g, False, True),
                "typed (per edge type)": (h, True, False),
                "typed + weighted": (h, True, True),
            }
            for name, (graph, hetero, weighted) in peers.items():
                runs[name].append(partial(dgl_pass, dgl, graph, batches, hetero=hetero, weighted=weighted))
        passes = {name: [[] for _ in fns] for name, fns in runs.items()}
        for rnd in range(args.repeats + 1):
            for name, fns in runs.items():
                for k, fn in enumerate(fns):
                    result = fn()
                    if rnd:
                        passes[name][k].append(result)
        results = {}
        for name, (mine, *peer) in passes.items():
            results[name] = summary(mine)
            if peer:
                results[name]["dgl"] = summary(peer[0])
            for who, r in [("", results[name]), ("DGL ", results[name].get("dgl"))]:
                if r is not None:
                    print(f"{who + name:24s} {r['nodes_per_s']:>12,.0f} nodes/s {r['edges_per_s']:>12,.0f} edges/s")
        base = results["uniform"]["nodes_per_s"]
        for r in results.values():
            r["ratio_to_uniform"] = r["nodes_per_s"] / base
        peer = f"DGL {dgl.__version__}" if dgl is not None else "no peer (DGL did not import)"
        record = {"machine": machine(), "args": vars(args) | {"work": str(args.work)}, "peer": peer, "results": results}
        save("gnn-sampler", record)
        rows = "\n".join(peer_row(name, r, args.batches) for name, r in results.items())
        update_doc(
            "gnn-sampler",
            f"Sampler throughput (`benches/bench_sampler.py`, {args.nodes:,} nodes, {args.edges:,} edges, "
            f"{args.batches} batches of {BATCH} seeds, fanouts 15,10, {threads} thread{'s' if threads > 1 else ''} "
            f"each, median of {args.repeats}):\n\n"
            f"Peer: {peer}.\n\n"
            "| mode | sampled nodes/s | ratio to uniform | sampled edges/s | nodes per batch | edges per batch "
            "| DGL nodes/s | Strata / DGL | DGL nodes per batch |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + rows,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def peer_row(name: str, r: dict, batches: int) -> str:
    """One table row: Strata's figures, then DGL's where it has the mode."""
    row = (
        f"| {name} | {r['nodes_per_s']:,.0f} | {r['ratio_to_uniform']:.2f} | {r['edges_per_s']:,.0f} | "
        f"{r['nodes_per_pass'] / batches:,.0f} | {r['edges_per_pass'] / batches:,.0f} |"
    )
    d = r.get("dgl")
    if d is None:
        return row + " n/a | | |"
    ratio = r["nodes_per_s"] / d["nodes_per_s"]
    return row + f" {d['nodes_per_s']:,.0f} | {ratio:.2f} | {d['nodes_per_pass'] / batches:,.0f} |"


if __name__ == "__main__":
    main()
