"""Question: how many CPU seconds does a `strata` process spend before and besides its work, and
what did a change to the command line's start-up buy?

    python benches/bench_cli_start.py [--tree LABEL=PYTHON_DIR ...] [--repeats 7] [--work DIR]

Each tree is a `python/` folder of a Strata checkout (default: this one's), run with this
interpreter and PYTHONPATH set to it, so two trees compare with the same extension and packages
(copy the built `_native.abi3.so` into the other tree's `python/strata/`). The commands run on a
small generated knowledge graph (200 entities, 2,000 triples) where the work is a few
milliseconds: what they cost is their start. Each cell is the median of `--repeats` runs of the
child's user + system CPU seconds (getrusage), the trees alternating; the last column is the
last tree's over the first's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: label -> arguments; each runs in the work directory, where the graph, store and run are.
COMMANDS = {
    "--help": ["--help"],
    "info STORE": ["info", "kg.strata"],
    "generate kg (200 triples)": "generate kg --out g --entities 50 --triples 200 --overwrite -q".split(),
    "grid info STORE": ["grid", "info", "kg.strata"],
    "embed eval RUN": ["embed", "eval", "run", "-q"],
}


def cpu_seconds(args: list[str], tree: Path, cwd: Path) -> float:
    """User + system CPU seconds of one `strata ARGS` child run from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "strata", *args], cwd=cwd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"strata {' '.join(args)} (PYTHONPATH={tree}) failed:\n{proc.stderr[-2000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def prepare(work: Path) -> None:
    """The graph, its store and a one-epoch run the commands read."""
    steps = [
        ["generate", "kg", "--out", "kg", "--entities", "200", "--relations", "5", "--triples", "2000", "-q",
         "--overwrite"],
        ["convert", "kg", "--relations", "--out", "kg.strata", "-q", "--overwrite"],
        ["embed", "train", "kg.strata", "--run-dir", "run", "--epochs", "1", "--dim", "8", "-q", "--fresh"],
    ]  # fmt: skip
    for args in steps:
        cpu_seconds(args, REPO / "python", work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", metavar="LABEL=PYTHON_DIR", help="a tree to run (repeatable)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this tree": str(REPO / "python")}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepare(work)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for label, cmd in COMMANDS.items():
                for name, tree in trees.items():
                    times.setdefault((label, name), []).append(cpu_seconds(cmd, Path(tree), work))
    names = list(trees)
    print("| command | " + " | ".join(names) + (" | ratio |" if len(names) > 1 else " |"))
    print("|---|" + "---:|" * (len(names) + (len(names) > 1)))
    for label in COMMANDS:
        medians = [statistics.median(times[(label, n)]) for n in names]
        ratio = [f"{medians[-1] / medians[0]:.2f}"] if len(names) > 1 else []
        print(f"| `strata {label}` | " + " | ".join([f"{m:.2f}" for m in medians] + ratio) + " |")


if __name__ == "__main__":
    main()
