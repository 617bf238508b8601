"""Question: what does an iteration checkpoint cost a distributed PageRank run, per iteration
and per checkpoint, in milliseconds and bytes, against the same run with checkpoints off?

    python benches/bench_grid_checkpoint.py [--scale 20] [--repeats 3] [--iterations 20]

Graph: the R-MAT store and `col` grid of bench_grid.py (its `prepare`). Two ranks of one
compute thread each under torchrun on loopback, in memory (--memory 16G, edge blocks resident),
through bench_grid_dist.py's `one`. Three cases, alternating within each repeat: checkpoints
off (--no-checkpoints), the default (--checkpoint-seconds 60: on a run this short none is
written, which leaves the cost of agreeing each iteration whether one is due), and one after
every iteration (--checkpoint-seconds 0). A checkpoint's figures are each rank's own
(`checkpoints` in run.json: seconds and bytes of its parts, commit record and collectives
included). Seconds are the run's (`summary.seconds` of rank 0: from the start of the run to its
end, checkpoints included; not the interpreter's and torch's start). The machine's 1-minute
load average is recorded before and after each run.

Results go to bench-results/grid-checkpoint.json and the grid-checkpoint section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench_grid import prepare
from bench_grid_dist import one
from common import machine, save, update_doc

CASES = {
    "off": ("--no-checkpoints",),
    "default (60 s)": (),
    "every iteration": ("--checkpoint-seconds", "0"),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=20)
    a = p.parse_args()
    store, _ = prepare(a.scale)
    res: dict = {name: [] for name in CASES}
    for _ in range(a.repeats):
        for name, extra in CASES.items():
            r = one(store, 2, 16 << 30, True, False, a.iterations, extra)
            res[name].append(r)
            print(f"{name}: {r['run_seconds']:.2f} s, load {r['load_before']:.1f}", flush=True)
    summary = {}
    for name, runs in res.items():
        written = [max(c["written"] for c in r["checkpoints"]) for r in runs]
        per_checkpoint = [
            max(c["seconds"] / c["written"] for c in r["checkpoints"]) * 1e3 if w else 0.0
            for r, w in zip(runs, written, strict=True)
        ]
        summary[name] = {
            "seconds": statistics.median(r["run_seconds"] for r in runs),
            "all_seconds": [r["run_seconds"] for r in runs],
            "checkpoints": written[0],
            "ms_per_checkpoint": statistics.median(per_checkpoint),
            "bytes_per_checkpoint": [c["bytes"] // max(c["written"], 1) for c in runs[0]["checkpoints"]],
            "load": [r["load_before"] for r in runs] + [runs[-1]["load_after"]],
        }
    env = {"machine": machine(), "command": " ".join(["python benches/bench_grid_checkpoint.py", *sys.argv[1:]])}
    save("grid-checkpoint", {"env": env, "scale": a.scale, "iterations": a.iterations, "results": summary})
    base = summary["off"]["seconds"]
    rows = [
        "| checkpoints | seconds (median) | ms per iteration | ratio to off | written | ms per checkpoint "
        "| bytes per checkpoint (rank 0 / rank 1) | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary.items():
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['seconds'] / a.iterations * 1e3:.0f} | {r['seconds'] / base:.2f}x | "
            f"{r['checkpoints']} | {r['ms_per_checkpoint']:.1f} | "
            f"{' / '.join(f'{b:,}' for b in r['bytes_per_checkpoint'])} | "
            f"{min(r['load']):.1f}-{max(r['load']):.1f} |"
        )
    update_doc(
        "grid-checkpoint",
        f"### D1b: iteration checkpoints of a 2-rank PageRank, scale {a.scale} (`{env['command']}`)\n\n"
        + "\n".join(rows),
    )


if __name__ == "__main__":
    main()
