"""Question: what does splitting a PageRank run over two ranks (torchrun, gloo on loopback) cost
and save against one process, in memory and out of core under a per-rank memlimit: seconds,
bytes exchanged per iteration, and edge bytes each rank reads from disk?

    python benches/bench_grid_dist.py [--scales 22,24] [--repeats 3] [--iterations 20]

Graph: the R-MAT store and `col` grid of bench_grid.py (its `prepare`). Both sides use the same
cores: 1 rank of 2 compute threads against 2 ranks of 1 thread each, alternating per repeat.
In memory: --memory 16G, edge blocks resident. Out of core: each rank under `memlimit` of R2's
budget for PageRank (a quarter of the grid's edge file less R2's 48 MiB allowance: 80 MiB at
scale 22, 464 MiB at 24) plus 512 MiB for the interpreter and torch, edge blocks streamed
from disk every pass (--no-keep-resident). The single process plans within R2's budget; a rank
of the distributed run plans within all of its limit (--memory 592M), since its plan counts what
torch and gloo hold (measured after the group starts) as a part of its own. The machine's 1-minute load
average is recorded before and after each run: other engineers' builds share it.

Results go to bench-results/grid-dist.json and the grid-dist section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_grid import OVERHEAD as R2_OVERHEAD
from bench_grid import edge_file_bytes, prepare
from common import MEMLIMIT, machine, memlimit_available, save, update_doc

#: Bytes the interpreter, numpy and torch take in each rank besides the run's --memory.
OVERHEAD = 512 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(store: Path, ranks: int, memory: int, resident: bool, limit: bool, iterations: int, extra: tuple = ()) -> dict:
    """One run of PageRank with `ranks` ranks and the `extra` options of `strata run`; rank 0's
    run.json figures with the wall time and load."""
    out = Path(tempfile.mkdtemp(prefix="griddist-"))
    keep = "--keep-resident" if resident else "--no-keep-resident"
    planned = memory + OVERHEAD if limit and ranks > 1 else memory
    run = ["-m", "strata", "run", "pagerank", str(store), "--grid", "col", "--memory", str(planned),
           "--threads", str(2 // ranks), "--iterations", str(iterations), keep, "--out", str(out), "-q",
           *extra]  # fmt: skip
    wrap = [str(MEMLIMIT), f"{(memory + OVERHEAD) >> 20}M"] if limit else []
    if ranks == 1:
        cmd = [*wrap, sys.executable, *run]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--rdzv-backend",
               "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", "--no-python",
               *wrap, sys.executable, *run]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    load0 = os.getloadavg()[0]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    record = json.loads((out / "run.json").read_text())
    peaks = re.findall(r"memlimit: peak (\S+) of limit", proc.stderr)
    s = record["summary"]
    exchanged = [h["mb_exchanged"] for h in record["history"]]
    ranks_fig = (s.get("dist") or {"ranks": [{"rank": 0, "bytes_disk": s["bytes_disk"], "edges": s["edges"],
                                               "compute_seconds": s["compute_seconds"]}]})["ranks"]  # fmt: skip
    return {
        "seconds": s["compute_seconds"],
        "wall_seconds": wall,
        "run_seconds": s["seconds"],
        "iterations": s["iterations"],
        "mb_exchanged_per_iteration": statistics.median(exchanged) if exchanged else 0.0,
        "gb_disk_per_rank": [r["bytes_disk"] / 1e9 for r in ranks_fig],
        "edges_per_rank": [r["edges"] for r in ranks_fig],
        "rank_seconds": [r["compute_seconds"] for r in ranks_fig],
        "checkpoints": [r.get("checkpoints") for r in ranks_fig],
        "peaks": peaks,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scales", default="22", help="comma-separated RMAT scales, e.g. 22,24")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=20)
    a = p.parse_args()
    scales = [int(x) for x in a.scales.split(",")]
    res: dict = {}
    cases: list[str] = []
    for scale in scales:
        store, _ = prepare(scale)
        r2_budget = edge_file_bytes(store, "col") // 4 - R2_OVERHEAD
        scale_cases = [("in memory", 16 << 30, True, False)]
        if memlimit_available():
            scale_cases.append(("memlimit", r2_budget, False, True))
        for name, memory, resident, limit in scale_cases:
            case = f"{scale}/pagerank {name}"
            cases.append(case)
            for _ in range(a.repeats):
                for ranks in (1, 2):
                    r = one(store, ranks, memory, resident, limit, a.iterations)
                    r["memory"] = memory
                    res.setdefault(f"{case}/{ranks}", []).append(r)
                    print(f"{case} ranks {ranks}: {r['seconds']:.2f} s, {r['mb_exchanged_per_iteration']:.1f} MB "
                          f"exchanged/iteration, load {r['load_before']:.1f}", flush=True)  # fmt: skip
    summary = {}
    for key, runs in res.items():
        runs = sorted(runs, key=lambda r: r["seconds"])
        summary[key] = runs[len(runs) // 2] | {"all_seconds": [r["seconds"] for r in runs]}
    env = {"machine": machine(), "command": " ".join(["python benches/bench_grid_dist.py", *sys.argv[1:]])}
    save("grid-dist", {"env": env, "scales": scales, "results": summary})
    rows = [
        "| case | ranks | memory per process | seconds (median) | speed-up over 1 rank | MB exchanged / iteration "
        "| GB from disk per rank | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        base = summary[f"{case}/1"]["seconds"]
        for ranks in (1, 2):
            r = summary[f"{case}/{ranks}"]
            memory = "-" if r["memory"] >= 16 << 30 else f"{r['memory'] >> 20} MiB"
            rows.append(
                f"| {case} | {ranks} | {memory} | {r['seconds']:.2f} | {base / r['seconds']:.2f}x | "
                f"{r['mb_exchanged_per_iteration']:.1f} | {' / '.join(f'{g:.2f}' for g in r['gb_disk_per_rank'])} | "
                f"{r['load_before']:.1f}-{r['load_after']:.1f} |"
            )
    update_doc("grid-dist", f"### D1: PageRank over 2 ranks (`{env['command']}`)\n\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
