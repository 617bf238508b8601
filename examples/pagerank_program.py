"""PageRank written as a vertex program, checked against Strata's native PageRank.

    python examples/pagerank_program.py STORE [--iterations 20] [--memory 1G] [--rounds 3]
    strata run program STORE --program examples/pagerank_program.py

The program is networkx's PageRank, as the native one computes it: each vertex keeps its rank
and its contribution (rank / out-degree, 0 without out-edges) in float32, every edge sends its
source's contribution, the messages are summed in a float32 accumulator, and each vertex then
takes ``(1 - d) / n + d * (acc + D / n)``, D the rank held by vertices without out-edges (an
aggregate, summed over the vertices after each iteration). Run as a script, it runs the native
PageRank and the program alternately ``--rounds`` times on the same grid and prints the largest
difference of their ranks and the ratio of their compute times (medians).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from strata.grid import VertexProgram, run, run_program

program = VertexProgram(
    "pagerank",
    params={"damping": 0.85},
    values={
        "rank": ("f32", "1 / n"),
        "contrib": ("f32", "where(out_degree > 0, 1 / n / out_degree, 0)"),
    },
    edge="src.contrib",
    combine="sum",
    accumulator="f32",
    apply={
        "rank": "(1 - damping) / n + damping * (acc + dangling / n)",
        "contrib": "where(out_degree > 0, rank / out_degree, 0)",
    },
    aggregates={"dangling": ("sum", "where(out_degree == 0, rank, 0)")},
    iterations=20,
    outputs=["rank"],
)


def compare(store: str | Path, *, iterations: int = 20, rounds: int = 1, out: str | Path, **options) -> dict:
    """Runs the native PageRank and the program alternately ``rounds`` times on ``store`` with
    the ``[run]`` ``options`` (memory, grid, keep_resident, ...), results under ``out``; returns
    the largest absolute and relative differences of their ranks and each one's compute seconds
    per round, with the ratio of the medians (program / native)."""
    out = Path(out)
    native_s, program_s = [], []
    for _ in range(rounds):
        native = run(algorithm="pagerank", store=store, iterations=iterations, out=out / "native", **options)
        native_s.append(native["compute_seconds"])
        ours = run_program(store, program, iterations=iterations, out=out / "program", **options)
        program_s.append(ours.summary["compute_seconds"])
    want = np.load(out / "native" / "rank.npy").astype(np.float64)
    got = np.asarray(ours.values["rank"], dtype=np.float64)
    diff = np.abs(got - want)
    return {
        "max_abs_diff": float(diff.max(initial=0.0)),
        "max_rel_diff": float((diff / np.maximum(want, 1e-30)).max(initial=0.0)),
        "native_seconds": native_s,
        "program_seconds": program_s,
        "ratio": statistics.median(program_s) / max(statistics.median(native_s), 1e-9),
        "edges": ours.summary["edges"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--memory", default="1G")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="where the two runs write (default: a temporary directory)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = compare(args.store, iterations=args.iterations, rounds=args.rounds, out=args.out or tmp, memory=args.memory)
    print(
        f"ranks: largest difference {r['max_abs_diff']:.3g} ({r['max_rel_diff']:.3g} relative); "
        f"compute {statistics.median(r['program_seconds']):.3f} s as a program, "
        f"{statistics.median(r['native_seconds']):.3f} s native: {r['ratio']:.2f}x "
        f"({r['edges']:,} edges, median of {args.rounds})"
    )


if __name__ == "__main__":
    main()
