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

Not compared here: a peer sampler. PyG's own samplers need pyg-lib or torch-sparse, which do not
install for this torch (issue 19); DGL was not tried in this run.

Results go to bench-results/gnn-sampler.json and the gnn-sampler section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
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


def measure(sampler: NeighborSampler, batches: list[np.ndarray], repeats: int, *, hetero: bool, temporal: bool) -> dict:
    """Median sampled nodes/s (and edges/s) over ``repeats`` passes over ``batches``."""
    rates, edge_rates = [], []
    for _ in range(repeats):
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
        seconds = time.perf_counter() - start
        rates.append(nodes / seconds)
        edge_rates.append(edges / seconds)
    return {
        "nodes_per_s": float(np.median(rates)),
        "edges_per_s": float(np.median(edge_rates)),
        "nodes_per_pass": nodes,
        "edges_per_pass": edges,
        "rates": rates,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500_000)
    ap.add_argument("--edges", type=int, default=5_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
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
        results = {}
        for name, (store, options, hetero) in modes.items():
            sampler = NeighborSampler(store, FANOUTS, threads=args.threads, **options)
            temporal = "temporal_strategy" in options
            results[name] = measure(sampler, batches, args.repeats, hetero=hetero, temporal=temporal)
            r = results[name]
            print(f"{name:24s} {r['nodes_per_s']:>12,.0f} nodes/s {r['edges_per_s']:>12,.0f} edges/s")
        base = results["uniform"]["nodes_per_s"]
        for r in results.values():
            r["ratio_to_uniform"] = r["nodes_per_s"] / base
        record = {"machine": machine(), "args": vars(args) | {"work": str(args.work)}, "results": results}
        save("gnn-sampler", record)
        rows = "\n".join(
            f"| {name} | {r['nodes_per_s']:,.0f} | {r['ratio_to_uniform']:.2f} | {r['edges_per_s']:,.0f} | "
            f"{r['nodes_per_pass'] / args.batches:,.0f} | {r['edges_per_pass'] / args.batches:,.0f} |"
            for name, r in results.items()
        )
        update_doc(
            "gnn-sampler",
            f"Sampler throughput (`benches/bench_sampler.py`, {args.nodes:,} nodes, {args.edges:,} edges, "
            f"{args.batches} batches of {BATCH} seeds, fanouts 15,10, median of {args.repeats}):\n\n"
            "| mode | sampled nodes/s | ratio to uniform | sampled edges/s | nodes per batch | edges per batch |\n"
            "|---|---|---|---|---|---|\n" + rows,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
