"""One graph-analytics run for bench_grid.py, in its own process (so it can run under memlimit):
prints the run summary and every iteration as one JSON object.

    python benches/grid_driver.py STORE ALGO --grid NAME --memory BYTES [--keep-resident 0|1]
        [--iterations N] [--root V] [--far ADDR --ratio R --chunk BYTES --connections N --far-transport tcp|uring]
        [--prefetch N] [--out DIR]
        [--disk-fetchers N] [--segment BYTES] [--program FILE] [--param KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys

from strata import _native
from strata.grid import load_program


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("algo")
    p.add_argument("--grid", required=True)
    p.add_argument("--memory", type=int, required=True)
    p.add_argument("--keep-resident", type=int, default=1)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--root", type=int, default=0, help="bfs, sssp: the root; ppr: the one seed")
    p.add_argument("--far", default=None)
    p.add_argument("--ratio", type=float, default=0.7)
    p.add_argument("--chunk", type=int, default=256 << 10)
    p.add_argument("--connections", type=int, default=0)
    p.add_argument("--far-transport", default="tcp", choices=("tcp", "uring"))
    p.add_argument("--out", default=None, help="the run's directory (default: STORE/runs/bench-ALGO)")
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--disk-fetchers", type=int, default=None)
    p.add_argument("--segment", type=int, default=0)
    p.add_argument("--program", default=None, help="algo program: the program file (its iterations: --iterations)")
    p.add_argument(
        "--param", action="append", default=[], help="an algorithm parameter of [run], KEY=VALUE (VALUE as JSON)"
    )
    a = p.parse_args()
    # The [run] section's options (strata_grid::config::RunOptions); unset ones take its defaults.
    job = {
        "algorithm": a.algo,
        "store": a.store,
        "grid": a.grid,
        "memory": a.memory,
        "keep_resident": bool(a.keep_resident),
        "segment": a.segment,
        "out": a.out or f"{a.store}/runs/bench-{a.algo}",
    }
    if a.algo in ("pagerank", "ppr"):
        job["iterations"] = a.iterations
    if a.algo == "program":
        job["program"] = load_program(a.program).replace(iterations=a.iterations).to_json()
    if a.algo == "ppr":
        job["seeds"] = [str(a.root)]
    if a.algo in ("bfs", "sssp"):
        job["root"] = a.root
    for param in a.param:
        key, _, value = param.partition("=")
        job[key] = json.loads(value)
    for key in ("prefetch", "disk_fetchers"):
        if getattr(a, key) is not None:
            job[key] = getattr(a, key)
    if a.far:
        job.update(far=a.far, far_ratio=a.ratio, far_chunk=a.chunk, far_connections=a.connections,
                   far_transport=a.far_transport)  # fmt: skip
    iterations = []
    messages = []

    def progress(event, *args):
        if event == "message":
            messages.append(args[0])
        return True

    summary = _native.grid_run(job, progress, iterations.append)
    summary["vertex_windowed"] = summary.pop("placement")["vertex_windowed"]
    json.dump({"summary": summary, "iterations": iterations, "messages": messages}, sys.stdout)


if __name__ == "__main__":
    main()
