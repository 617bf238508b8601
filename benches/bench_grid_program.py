"""Question: how close to the native PageRank does PageRank written as a vertex program
(examples/pagerank_program.py) run, in memory and out of core; and how fast would the other
way of running a program be, per-block vectorised NumPy?

    python benches/bench_grid_program.py [--scales 20,22] [--rounds 3] [--iterations 10]
        [--only mem,ooc,numpy] [--work DIR]

Graphs: Graph500 R-MAT (as bench_grid.py makes them), the directed `col` grid (P automatic).
Each round runs, alternating and each in its own process (grid_driver.py): the native PageRank
and the program in memory (edge blocks resident, no memlimit), then both out of core (memlimit
a quarter of the grid's edge file, at least 144 MiB, the budget that minus 48 MiB, edge blocks
streamed from disk every pass); and NumPy per block in memory: the grid's edges loaded into memory, each
block's messages gathered with fancy indexing from a view of its source chunk's values and
summed with ``np.bincount`` into its destination chunk, as a program written as per-block NumPy
callbacks would run at best (one thread holds the GIL; no Rust-to-Python call costs counted).
Reported: the median of the compute seconds over the rounds, the ratio to native, the largest
relative difference of the ranks from the native ones, and the 1-minute load average before
each run. Results go to bench-results/grid-program.json and the grid-program section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_grid import OVERHEAD, WORK, drive, edge_file_bytes, prepare, table
from common import REPO, machine, memlimit_available, save, update_doc

PROGRAM = REPO / "examples" / "pagerank_program.py"


def numpy_pagerank(grid: Path, iterations: int, out: Path) -> float:
    """PageRank (networkx's, as the native one) by per-block NumPy over the grid's files;
    writes the ranks to ``out`` and returns the seconds of the iterations."""
    m = json.loads((grid / "grid.json").read_text())
    p, cs, n = m["partitions"], m["chunk_size"], m["num_vertices"]
    edges = np.load(grid / "edges.npy")
    index = np.load(grid / "block_index.npy")
    deg = np.load(grid / "out_degree.npy").astype(np.float32)
    blocks = []
    for pos in range(p * p):
        a, b = int(index[pos]), int(index[pos + 1])
        if a == b:
            continue
        major, minor = divmod(pos, p)
        i, j = (minor, major) if m["order"] == "column" else (major, minor)
        blocks.append((i * cs, j * cs, min(cs, n - j * cs), edges[a:b, 0], edges[a:b, 1]))
    d = np.float32(0.85)
    rank = np.full(n, 1.0 / n, dtype=np.float32)
    dangling_v = deg == 0
    inv = np.where(dangling_v, 0, 1 / np.maximum(deg, 1)).astype(np.float32)
    contrib = rank * inv
    t0 = time.perf_counter()
    for _ in range(iterations):
        acc = np.zeros(n, dtype=np.float32)
        for sb, db, dlen, src, dst in blocks:
            messages = contrib[sb : sb + cs][src]
            acc[db : db + dlen] += np.bincount(dst, weights=messages, minlength=dlen).astype(np.float32)
        dangling = float(rank[dangling_v].sum(dtype=np.float64))
        rank = ((1 - d) / n + d * (acc + dangling / n)).astype(np.float32)
        contrib = rank * inv
    seconds = time.perf_counter() - t0
    np.save(out, rank)
    return seconds


def load1() -> float:
    return os.getloadavg()[0]


def max_rel_diff(got: Path, want: Path) -> float:
    g, w = np.load(got).astype(np.float64), np.load(want).astype(np.float64)
    return float((np.abs(g - w) / np.maximum(w, 1e-30)).max())


def one(store: Path, case: str, iterations: int, limit: int | None) -> dict:
    """One run of ``case`` (native, program or numpy) with its figures."""
    load = load1()
    if case == "numpy":
        cmd = [sys.executable, __file__, "--numpy-run", store / "grids" / "col", iterations, store / "numpy-rank.npy"]
        t = time.monotonic()
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True)
        return {
            "seconds": json.loads(proc.stdout)["seconds"],
            "wall_seconds": time.monotonic() - t,
            "load1": load,
            "rank": str(store / "numpy-rank.npy"),
        }
    memory = (limit - OVERHEAD) if limit else 16 << 30
    extra = {"program": PROGRAM} if case == "program" else {}
    res = drive(store, "program" if case == "program" else "pagerank", "col", memory, limit=limit,
                keep_resident=0 if limit else 1, iterations=iterations, **extra)  # fmt: skip
    s = res["summary"]
    return {
        "seconds": s["compute_seconds"],
        "wall_seconds": res["wall_seconds"],
        "edges_per_s": s["edges_per_second"],
        "gb_disk": s["bytes_disk"] / 1e9,
        "vertex_windowed": s["vertex_windowed"],
        "peak_mb": (res["peak_bytes"] or 0) / 2**20,
        "load1": load,
        "rank": s["arrays"][0],
    }


def compare(store: Path, cases: list[str], rounds: int, iterations: int, limit: int | None) -> dict:
    """``rounds`` rounds of ``cases`` alternating; medians, ratios to native and differences."""
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(rounds):
        for case in cases:
            r = one(store, case, iterations, limit)
            # Each run writes its ranks over the last; keep this round's difference to native.
            if case != "native":
                r["max_rel_diff"] = max_rel_diff(Path(r["rank"]), Path(runs["native"][-1]["rank"]))
            runs[case].append(r)
    out = {}
    native = statistics.median(r["seconds"] for r in runs["native"])
    for case, rs in runs.items():
        med = statistics.median(r["seconds"] for r in rs)
        out[case] = {
            "seconds_median": med,
            "seconds": [r["seconds"] for r in rs],
            "ratio_to_native": med / native,
            "load1": [r["load1"] for r in rs],
            "max_rel_diff": max((r.get("max_rel_diff", 0.0) for r in rs), default=0.0),
            **{k: rs[0][k] for k in ("vertex_windowed", "gb_disk", "peak_mb") if k in rs[0]},
        }
        print(f"  {case}: {med:.3f} s ({med / native:.2f}x native), load {out[case]['load1']}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", default="20,22")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--only", default="mem,ooc,numpy")
    p.add_argument("--work", type=Path, default=WORK, help="where the RMAT stores are made (and reused)")
    p.add_argument("--numpy-run", nargs=3, metavar=("GRID", "ITERATIONS", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.numpy_run:
        grid, iterations, out = a.numpy_run
        print(json.dumps({"seconds": numpy_pagerank(Path(grid), int(iterations), Path(out))}))
        return
    only = set(a.only.split(","))
    if "ooc" in only and not memlimit_available():
        raise SystemExit("memlimit is not available: out-of-core runs need shared/tools/memlimit beside the checkout")
    env = {"machine": machine(), "command": " ".join(sys.argv)}
    results = {}
    for scale in (int(s) for s in a.scales.split(",")):
        store, _ = prepare(scale, a.work)
        if "mem" in only or "numpy" in only:
            cases = ["native"] + ["program"] * ("mem" in only) + ["numpy"] * ("numpy" in only)
            print(f"scale {scale}, in memory:", flush=True)
            results[f"{scale}/memory"] = compare(store, cases, a.rounds, a.iterations, None)
        if "ooc" in only:
            # A quarter of the edge file, but room for the interpreter and a small budget.
            limit = max(edge_file_bytes(store, "col") // 4, OVERHEAD + (96 << 20))
            print(f"scale {scale}, out of core (memlimit {limit >> 20} MiB):", flush=True)
            res = compare(store, ["native", "program"], a.rounds, a.iterations, limit)
            res["memlimit_mb"] = limit / 2**20
            results[f"{scale}/out-of-core"] = res
    save("grid-program", {**env, "results": results})
    update_doc(
        "grid-program", f"### Vertex programs: PageRank as a program (`{env['command']}`)\n\n" + doc_table(results)
    )


def doc_table(results: dict) -> str:
    rows = []
    for key, res in results.items():
        for case, r in res.items():
            if not isinstance(r, dict):
                continue
            vertex = {True: "windows", False: "memory"}.get(r.get("vertex_windowed"), "numpy arrays")
            rows.append((key, case, vertex, f"{r['seconds_median']:.3f}", f"{r['ratio_to_native']:.2f}x",
                         f"{r['max_rel_diff']:.1e}", " ".join(f"{x:.1f}" for x in r["load1"])))  # fmt: skip
    header = ("scale/where", "run", "vertex data", "compute s (median)", "vs native", "max rel. diff", "load (1 min)")
    return table(rows, header)


if __name__ == "__main__":
    main()
