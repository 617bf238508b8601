"""Two commits side by side in one run, alternating:
`python benches/compare.py --base 8e098da --only b1,g2,r1,s1 --rounds 3`.

Each commit is checked out as a detached worktree under bench-data/compare/SHA and its
extension is built there with cargo; the package then runs from that tree's python/ folder on
PYTHONPATH, so no virtual environment is needed. Each benchmark runs from its own tree's
benches/, so both sides run their own commit's benchmark code on data they generate
themselves. Rounds alternate (base, head, base, head, ...), so a drift in the machine's load
falls on both sides. The figures of every round, their medians and the head/base ratio of the
medians are printed as a Markdown table and saved to bench-results/compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import REPO, SHARED, machine, median, save

TREES = REPO / "bench-data" / "compare"


@dataclass(frozen=True)
class Bench:
    """One benchmark: the script and arguments to run, the result file it writes under
    bench-results/, and the figures to compare, read from that file."""

    args: tuple[str, ...]
    result: str
    figures: Callable[[dict], dict[str, float]]


def _kg(res: dict) -> dict[str, float]:
    out = {}
    for run in ("B1 FB15k-237", "B1 WN18RR", "B2 FB15k-237"):
        r = res["runs"][run]
        out[f"{run} test MRR"] = r["test"]["mrr"]
        out[f"{run} edges/s"] = r["edges_per_second"]
    return out


def _g2(res: dict) -> dict[str, float]:
    out = {}
    for loader in ("strata", "ram"):
        r = res["loaders"][loader]
        out[f"G2 {loader} seeds/s"] = r["seeds_per_second"]
    out["G2 strata MB/s read"] = res["loaders"]["strata"]["mb_per_second"]
    return out


def _r1(res: dict) -> dict[str, float]:
    return {f"R1 {key} edges/s": r["edges_per_s"] for key, r in res["results"].items()}


def _s1(res: dict) -> dict[str, float]:
    return {
        "S1 near-data targets/s": res["near-data"]["targets_per_s"],
        "S1 pull targets/s": res["pull"]["targets_per_s"],
        "S1 near-data bytes/target": res["near-data"]["bytes_per_target"],
    }


BENCHES = {
    "b1": Bench(("bench_embed.py", "--only", "b1"), "embed-kg", _kg),
    "g2": Bench(("bench_gnn.py", "--only", "g2", "--g2-nodes", "1000000"), "gnn-g2", _g2),
    "r1": Bench(("bench_grid.py", "--only", "r1", "--scales", "22", "--repeats", "3"), "grid-r1", _r1),
    "s1": Bench(("bench_serve.py", "--only", "s1"), "serve-s1", _s1),
}


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def checkout(rev: str) -> Path:
    """A built worktree of ``rev`` (reused when it is already there and built)."""
    sha = git("rev-parse", "--short=12", rev)
    tree = TREES / sha
    native = tree / "python" / "strata" / "_native.abi3.so"
    if not tree.exists():
        TREES.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(tree), sha)
    # The benchmarks look for shared/ (datasets, memlimit) beside their checkout's parent.
    link = TREES / "shared"
    if not link.exists():
        link.symlink_to(SHARED.resolve())
    if not native.exists():
        print(f"building {sha} (cargo build --release -p strata-py) ...", flush=True)
        env = {**os.environ, "PYO3_PYTHON": sys.executable}
        subprocess.run(
            ["cargo", "build", "--release", "--quiet", "-p", "strata-py", "--features", "pyo3/extension-module"],
            cwd=tree,
            env=env,
            check=True,
        )
        (tree / "target" / "release" / "lib_native.so").replace(native)
    return tree


def run_once(tree: Path, bench: Bench) -> dict:
    """Runs ``bench`` in ``tree``; returns its result file's contents and the wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree / "python")}
    t = time.monotonic()
    proc = subprocess.run([sys.executable, *bench.args], cwd=tree / "benches", env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(bench.args)} failed in {tree} ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads((tree / "bench-results" / f"{bench.result}.json").read_text())
    return {"seconds": time.monotonic() - t, "figures": bench.figures(result)}


def markdown(rows: dict[str, dict[str, list[float]]], base: str, head: str) -> str:
    lines = [
        f"| figure | {base} (each round) | {head} (each round) | median, {base} | median, {head} | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for label, sides in rows.items():
        b, h = sides["base"], sides["head"]
        mb, mh = median(b), median(h)
        ratio = f"{mh / mb:.3f}" if mb else "-"
        lines.append(f"| {label} | {', '.join(f'{x:.4g}' for x in b)} | {', '.join(f'{x:.4g}' for x in h)} "
                     f"| {mb:.4g} | {mh:.4g} | {ratio} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--head", default="HEAD", help="the commit under test")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each benchmark on each side, alternating")
    args = ap.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise SystemExit(f"--only: unknown benchmark {', '.join(unknown)} (expected some of {', '.join(BENCHES)})")
    trees = {"base": checkout(args.base), "head": checkout(args.head)}
    shas = {side: tree.name for side, tree in trees.items()}
    rows: dict[str, dict[str, list[float]]] = {}
    for name in names:
        for k in range(args.rounds):
            for side, tree in trees.items():
                load = os.getloadavg()[0]
                got = run_once(tree, BENCHES[name])
                print(f"{name} round {k + 1} {side} {shas[side]}: {got['seconds']:.0f} s, load {load:.1f}", flush=True)
                for label, value in got["figures"].items():
                    rows.setdefault(label, {"base": [], "head": []})[side].append(value)
    table = markdown(rows, shas["base"], shas["head"])
    save("compare", {"machine": machine(), "base": shas["base"], "head": shas["head"], "rows": rows})
    print(table)


if __name__ == "__main__":
    main()
