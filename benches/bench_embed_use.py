"""Question: how long does an exact neighbour search (`strata embed neighbors`) take on a trained
run, with the table in one resident partition and under a budget that scans it through a buffer
of 3 of 8 partitions, how much does sharing one scan between query nodes save, and what do the
approximate index (`strata embed index`, usearch HNSW) save and cost in recall@10?

    python benches/bench_embed_use.py [--repeats 5] [--rmat-scale 20] [--work DIR]

- N1: FB15k-237 (14,541 entities), ComplEx 100 reals, one epoch (the search does not depend on
  the quality), 1 and 64 query nodes per call, cosine; one partition against 8 with a buffer of 3.
- N1 RMAT (with --rmat-scale S): the same with Dot 64 reals on an RMAT graph of 2^S nodes.
- N1 index: the in-memory run's usearch index (16 links, 128 candidates), opened once; the same
  queries' latency, and recall@10 against the exact scan over 256 query nodes.

Each call is ``Run.neighbors`` in this process: it opens the checkpoint, reads the partitions
(from the page cache after the first call) and scans them. Results go to
bench-results/embed-neighbors.json and the embed-neighbors section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import REPO, SHARED, machine, median, save, strata, timed, update_doc
from strata import Store
from strata.embed import Run, ann

#: One epoch of B1's settings (benches/bench_embed.py).
COMPLEX = ["--model", "complex", "--dim", "100", "--chunk-size", "1000", "--negatives", "1000", "--epochs", "1"]
DOT = ["--model", "dot", "--dim", "64", "--chunk-size", "1000", "--negatives", "100", "--epochs", "1",
       "--eval-protocol", "sampled", "--eval-max-queries", "1000"]  # fmt: skip
LAYOUTS = {
    "in memory (1 partition)": ["--partitions", "1"],
    "scan (8 partitions, buffer 3)": ["--partitions", "8", "--buffer", "3"],
}
QUERIES = (1, 64)


def prepare(store: Path, raw: list[str], work: Path, name: str, model: list[str]) -> dict[str, Path]:
    """Converts the graph once and trains one run per layout; returns {layout: run dir}."""
    if not store.exists():
        timed(strata("convert", *raw, "--out", store, "-q"))
    runs = {}
    for i, (layout, args) in enumerate(LAYOUTS.items()):
        run = work / f"run-{name}-{i}"
        if not (run / "run.json").exists():
            timed(strata("embed", "train", store, "--run-dir", run, "--fresh", *model, *args, "-q"))
        runs[layout] = run
    return runs


def measure(runs: dict[str, Path], repeats: int) -> dict:
    """Median seconds per call for each layout and number of query nodes."""
    out = {}
    for layout, path in runs.items():
        run = Run(path)
        store = Store(run.meta["store"])
        n = run.meta["num_nodes"]
        for q in QUERIES:
            nodes = [store.node_name((i * 7919) % n) for i in range(q)]
            run.neighbors(nodes, top=10, metric="cos")  # warm the page cache
            times, last = [], None
            for _ in range(repeats):
                t = time.perf_counter()
                last = run.neighbors(nodes, top=10, metric="cos")
                times.append(time.perf_counter() - t)
            out[f"{layout}, {q} queries"] = {
                "layout": layout,
                "queries": q,
                "nodes": n,
                "seconds": median(times),
                "ms_per_query": median(times) * 1000 / q,
                "partitions_read": last["partitions_read"],
                "scans": last["scans"],
            }
            print(f"{layout}, {q} queries: {median(times) * 1000:.1f} ms per call")
    return out


def measure_index(run_dir: Path, work: Path, name: str, repeats: int) -> dict:
    """Index build time, search latency per call and recall@10 against the exact scan."""
    run, path = Run(run_dir), work / f"index-{name}"
    t = time.perf_counter()
    ann.build_index(run, path, metric="cos", overwrite=True)
    build = time.perf_counter() - t
    index = ann.Index(path)
    n = run.meta["num_nodes"]
    out = {"build_seconds": build, "nodes": n}
    for q in QUERIES:
        nodes = [index.name((i * 7919) % n) for i in range(q)]
        index.search(nodes, 10)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            index.search(nodes, 10)
            times.append(time.perf_counter() - t)
        out[f"{q} queries"] = {"seconds": median(times), "ms_per_query": median(times) * 1000 / q}
    sample = [index.name((i * 104729) % n) for i in range(256)]
    exact = run.neighbors(sample, top=10, metric="cos")["results"]
    approx = index.search(sample, 10)["results"]
    hits = sum(
        len({x["node"] for x in a["neighbors"]} & {x["node"] for x in e["neighbors"]})
        for a, e in zip(approx, exact, strict=True)
    )
    out["recall@10"] = hits / (10 * len(sample))
    print(f"{name} index: built in {build:.1f} s, recall@10 {out['recall@10']:.3f}")
    return out


def markdown(graphs: dict[str, dict], info: dict, repeats: int) -> str:
    lines = [
        f"### N1: exact neighbour search (`benches/bench_embed_use.py`; {info['nproc']} cores, {info['cpu']}, "
        f"median of {repeats} calls, top 10 by cosine)",
        "",
        "| graph | layout | query nodes | ms per call | ms per query node | partitions read | vs in memory |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for graph, rows in graphs.items():
        index = rows.pop("index")
        for row in rows.values():
            base = rows[f"{next(iter(LAYOUTS))}, {row['queries']} queries"]["seconds"]
            lines.append(
                f"| {graph} ({row['nodes']:,} nodes) | {row['layout']} | {row['queries']} "
                f"| {row['seconds'] * 1000:.1f} | {row['ms_per_query']:.2f} | {row['partitions_read']} "
                f"| {row['seconds'] / base:.2f}x |"
            )
        for q in QUERIES:
            base = rows[f"{next(iter(LAYOUTS))}, {q} queries"]["seconds"]
            r = index[f"{q} queries"]
            lines.append(
                f"| {graph} | usearch index (recall@10 {index['recall@10']:.3f}, built in "
                f"{index['build_seconds']:.1f} s) | {q} | {r['seconds'] * 1000:.2f} | {r['ms_per_query']:.3f} | 0 "
                f"| {r['seconds'] / base:.3f}x |"
            )
    lines += [
        "",
        "Each call opens the checkpoint and reads the whole table (from the page cache: the runs are warm): "
        "the in-memory layout as one partition, the scan layout as 8 partitions through 3 slots, so the column "
        "'vs in memory' is the price of the budget. 64 query nodes share one scan, so the time per query node falls "
        f"with their number. Load average at the end: {os.getloadavg()[0]:.1f} (other engineers' builds share the "
        "cores). The index is opened once and answers from memory without reading the table; its build (an export "
        "plus the HNSW inserts) is paid once.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "embed-use")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rmat-scale", type=int, default=0, help="also an RMAT graph of 2^S nodes (0: not)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    info = machine()
    fb = SHARED / "datasets" / "fb15k-237"
    runs = prepare(args.work / "fb15k-237.strata", [str(fb), "--relations"], args.work, "fb", COMPLEX)
    graphs = {"FB15k-237": measure(runs, args.repeats)}
    graphs["FB15k-237"]["index"] = measure_index(next(iter(runs.values())), args.work, "fb", args.repeats)
    if args.rmat_scale:
        scale = args.rmat_scale
        raw = args.work / f"rmat-s{scale}-e8.bin"
        if not raw.exists():
            timed(strata("generate", "rmat", "--scale", scale, "--edge-factor", 8, "--out", raw, "-q"))
        split = [str(raw), "--num-nodes", str(1 << scale), "--split", "0.98,0.01,0.01"]
        runs = prepare(args.work / f"rmat-s{scale}.strata", split, args.work, f"rmat{scale}", DOT)
        graphs[f"RMAT scale {scale}"] = measure(runs, args.repeats)
        graphs[f"RMAT scale {scale}"]["index"] = measure_index(
            next(iter(runs.values())), args.work, f"rmat{scale}", args.repeats
        )
    save("embed-neighbors", {"machine": info, "repeats": args.repeats, "graphs": graphs})
    update_doc("embed-neighbors", markdown(json.loads(json.dumps(graphs)), info, args.repeats))


if __name__ == "__main__":
    main()
