"""G5s: remote feature rows for split features (docs/distributed.md, "Features that do not fit
on one machine"): how fast a rank gets rows another rank owns over torch.distributed RPC
(TensorPipe on loopback), against the same rows from its own tiers.

    python benches/bench_feature_split.py [--nodes 100000] [--dim 256] [--repeats 15]
        [--sizes 256,1024,4096,16384] [--work DIR]

A generated SBM store (``--nodes`` nodes, ``--dim`` float32 features) is opened by two
processes with its features split (each holds its half in its hot set, so the figures are the
transport's, not the disk's). For each request size (distinct rows per request, as a batch
asks one owner), three cases, each ``--repeats`` times, median reported:

- 1 rank: rank 0 gathers rows it owns from its own tiers (what every row costs unsplit);
- 2 ranks, one fetching: rank 0 fetches rows rank 1 owns, one request at a time, rank 1 idle
  but serving;
- 2 ranks, both fetching: each rank fetches the other's rows at the same time (a training
  step's pattern: every rank both asks and serves).

Results go to bench-results/gnn-g5-split.json and the gnn-g5-split section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from common import REPO, machine, median, save, strata, timed, update_doc

CASES = ("1 rank, own rows", "2 ranks, one fetching", "2 ranks, both fetching")


def measure(cases: dict, sizes: list[int], repeats: int) -> dict:
    """Median seconds per request of each case and size. ``cases`` maps a name to
    ``(ids_of, get)``: ``get(ids_of(size))`` is one request. The cases and sizes alternate
    within each round, so that the machine's load swings reach every case alike."""
    seconds = {name: {size: [] for size in sizes} for name in cases}
    for _ in range(repeats):
        for size in sizes:
            for name, (ids_of, get) in cases.items():
                ids = ids_of(size)
                t = time.perf_counter()
                get(ids)
                seconds[name][size].append(time.perf_counter() - t)
    return {name: {size: median(s) for size, s in by_size.items()} for name, by_size in seconds.items()}


def worker(store: str, rank: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    """One of the two ranks: opens ``store`` split, runs the cases in step with the other rank
    (keys in the rendezvous store), writes its medians to ``out``."""
    import numpy as np
    import torch

    from strata.gnn import features
    from strata.gnn.loader import GnnData

    tcp = torch.distributed.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=600))
    features.start_rpc(rank, 2, tcp, 600)
    data = GnnData(store, split=(rank, 2), fanouts=[5], batch_size=64, memory="1G", hot_share=1.0)
    n = data.num_nodes
    rng = np.random.default_rng(rank)
    mine, other = features.owned_range(n, rank, 2), features.owned_range(n, 1 - rank, 2)

    def draw(lo_hi):
        return lambda size: rng.choice(np.arange(*lo_hi), size=size, replace=False)

    result = {"plan": data.plan}
    # One request each way first: TensorPipe connects lazily, on a pair's first call.
    data.split.gather(draw(other)(1))
    if rank == 0:
        alone = {CASES[0]: (draw(mine), data.split.local_rows), CASES[1]: (draw(other), data.split.gather)}
        result |= measure(alone, sizes, repeats)
        tcp.set("both", "go")
    else:
        tcp.wait(["both"])
    result |= measure({CASES[2]: (draw(other), data.split.gather)}, sizes, repeats)
    result["remote"] = data.split.stats()
    features.shutdown()
    Path(out).write_text(json.dumps(result))


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default="256,1024,4096,16384")
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "gnn")
    ap.add_argument("--worker", nargs=3, metavar=("STORE", "RANK", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        store, rank, port = args.worker
        worker(store, int(rank), int(port), sizes, args.repeats, args.out)
        return
    store = args.work / f"sbm-n{args.nodes}-f{args.dim}.strata"
    if not store.exists():
        raw = args.work / f"sbm-n{args.nodes}-f{args.dim}-raw"
        timed(strata("generate", "sbm", "--out", raw, "--nodes", args.nodes, "--classes", 16,
                     "--feature-dim", args.dim, "--avg-degree", 10, "-q"))  # fmt: skip
        timed(strata("convert", raw, "--symmetrize", "--out", store, "-q"))
    sys.path.insert(0, str(REPO / "tests"))
    from torchrun_env import free_port

    port, outs = free_port(), [args.work / f"g5-split-rank{r}.json" for r in range(2)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    load_before = load_average()
    cmd = [sys.executable, __file__, "--sizes", args.sizes, "--repeats", str(args.repeats)]
    procs = [
        subprocess.Popen([*cmd, "--worker", str(store), str(r), str(port), "--out", str(outs[r])], env=env)
        for r in range(2)
    ]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"a rank failed ({p.returncode})")
    load_after = load_average()
    ranks = [json.loads(o.read_text()) for o in outs]
    row_bytes = ranks[0]["plan"]["row_bytes"]
    rows = []
    for size in sizes:
        key = str(size)
        local = ranks[0][CASES[0]][key]
        for case in CASES:
            secs = [r[case][key] for r in ranks if case in r]
            s = median(secs)
            rows.append({"case": case, "rows_per_request": size, "seconds": s, "rows_per_second": size / s,
                         "mb_per_second": size * row_bytes / s / 1e6, "vs_own_rows": local / s})  # fmt: skip
    result = {"machine": machine(), "nodes": args.nodes, "dim": args.dim, "row_bytes": row_bytes,
              "repeats": args.repeats, "load_average": [load_before, load_after], "rows": rows,
              "ranks": ranks}  # fmt: skip
    save("gnn-g5-split", result)
    lines = [
        "### G5s: remote feature rows, split features (`benches/bench_feature_split.py`)",
        "",
        f"{args.nodes:,} nodes x {args.dim} float32 ({row_bytes} B a row), each rank's half in its hot set; "
        f"TensorPipe RPC on loopback, one request at a time per rank, median of {args.repeats}; "
        f"1-minute load average {load_before:.1f} before, {load_after:.1f} after (machine shared with builds).",
        "",
        "| case | rows per request | ms per request | rows/s | MB/s | vs own rows |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['rows_per_request']:,} | {1000 * r['seconds']:.2f} | "
                     f"{r['rows_per_second']:,.0f} | {r['mb_per_second']:,.0f} | "
                     f"{r['vs_own_rows']:.2f}x |")  # fmt: skip
    update_doc("gnn-g5-split", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
