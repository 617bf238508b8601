"""Question: what does hosting an embedding run in `strata serve` save per query against the
command line, where each `strata embed predict` / `neighbors` call starts Python, opens the
checkpoint and reads the table before it scans, and how many queries a second does one request
of 64 queries serve?

    python benches/bench_serve_embed.py [--repeats 7] [--work DIR]

- S-E1: FB15k-237 (14,541 entities, 237 relations), ComplEx 100 reals, one epoch (the cost of a
  query does not depend on the quality), one partition. Cases, alternated round by round:
  the CLI (`strata embed predict --head X --relation R --top 10`, `strata embed neighbors --node X
  --top 10`, each a new process), and the server (the run registered whole, a `Client` kept
  open): `EmbeddingTopK` and `EmbeddingNeighbors` with 1 and 64 query nodes per request. The
  1-minute load average is recorded with every round.

Results go to bench-results/serve-embed.json and the serve-embed section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from common import SHARED, machine, median, save, strata, timed, update_doc
from strata import Store
from strata.embed import Run
from strata.serve import Client

COMPLEX = ["--model", "complex", "--dim", "100", "--chunk-size", "1000", "--negatives", "200", "--epochs", "1",
           "--partitions", "1", "--eval-protocol", "sampled", "--eval-max-queries", "1000"]  # fmt: skip
BATCH = 64


def prepare(work: Path) -> Path:
    """Converts FB15k-237 and trains the run once; returns the run directory."""
    store, run = work / "fb15k237.strata", work / "run-complex"
    if not store.exists():
        timed(strata("convert", SHARED / "datasets" / "fb15k-237", "--relations", "--out", store, "-q"))
    if not (run / "run.json").exists():
        timed(strata("embed", "train", store, "--run-dir", run, "--fresh", *COMPLEX, "-q"))
    return run


def start_server(run: Path, state: Path) -> tuple[subprocess.Popen, str]:
    cmd = strata("serve", "--embedding", f"fb={run}", "--listen", "127.0.0.1:0", "--state-dir", state,
                 "--memory", "1G")  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[2]
    raise SystemExit("strata serve did not start")


def load1() -> float:
    return os.getloadavg()[0]


def measure(run: Path, work: Path, repeats: int) -> dict:
    store = Store(Run(run).meta["store"])
    n = store.num_nodes
    names = [store.node_name((i * 7919) % n) for i in range(BATCH)]
    rel = store.relation_names[3]
    state = work / "serve-state"
    subprocess.run(["rm", "-rf", str(state)], check=True)
    proc, addr = start_server(run, state)
    times: dict[str, list[float]] = {}
    loads = []

    def clock(case: str, f) -> None:
        t = time.perf_counter()
        f()
        times.setdefault(case, []).append(time.perf_counter() - t)

    cli = [sys.executable, "-m", "strata", "embed"]

    def cli_call(*args) -> None:
        subprocess.run([*cli, *map(str, args), "-q"], check=True, capture_output=True)

    try:
        with Client(addr, timeout=600) as c:
            c.top_k("fb", names[:1], rel, k=10)  # the first scan reads the table
            for r in range(repeats):
                loads.append(load1())
                q = names[r % BATCH]
                clock("CLI predict, 1 query", lambda q=q: cli_call("predict", run, "--head", q, "--relation", rel))
                clock("server TopK, 1 query", lambda q=q: c.top_k("fb", [q], rel, k=10))
                clock(f"server TopK, {BATCH} queries", lambda: c.top_k("fb", names, rel, k=10))
                clock("CLI neighbors, 1 query", lambda q=q: cli_call("neighbors", run, "--node", q))
                clock("server Neighbors, 1 query", lambda q=q: c.neighbors("fb", [q], k=10))
                clock(f"server Neighbors, {BATCH} queries", lambda: c.neighbors("fb", names, k=10))
                print(f"round {r + 1}/{repeats}, load {loads[-1]:.2f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    out = {}
    for case, ts in times.items():
        queries = BATCH if case.endswith(f"{BATCH} queries") else 1
        out[case] = {
            "seconds": median(ts),
            "ms_per_query": median(ts) * 1000 / queries,
            "queries_per_s": queries / median(ts),
        }
    out["_load1"] = {"median": median(loads), "min": min(loads), "max": max(loads)}
    return out


def markdown(result: dict, info: dict, repeats: int) -> str:
    load = result["_load1"]
    cli_p = result["CLI predict, 1 query"]["seconds"]
    cli_n = result["CLI neighbors, 1 query"]["seconds"]
    lines = [
        "## S-E1 Embedding queries through `strata serve` against the CLI",
        "",
        "Question: what does hosting a run in the server save per query against `strata embed predict` / "
        "`neighbors`, each a new process that opens the checkpoint and reads the table? FB15k-237, ComplEx 100 "
        f"reals, one partition; medians of {repeats} rounds, the cases alternated within each round, under load "
        f"(1-minute load average {load['median']:.2f}, {load['min']:.2f} to {load['max']:.2f}). Machine: "
        f"{info['nproc']} cores, {info['ram_gib']} GiB, {info['cpu']}.",
        "",
        "```",
        f"python benches/bench_serve_embed.py --repeats {repeats}",
        "```",
        "",
        "A TopK request reads every split's edges once to mark (or with `filtered` leave out) the known answers, "
        "as `strata embed predict` does; that read is most of a one-query TopK (inferred, not profiled: "
        "Neighbors, which reads no edges, scans the same table in 8 ms), and 64 queries share it.",
        "",
        "| case | ms per call | ms per query | queries/s | vs the CLI |",
        "|---|---|---|---|---|",
    ]
    for case, r in result.items():
        if case.startswith("_"):
            continue
        base = cli_p if "TopK" in case or "predict" in case else cli_n
        lines.append(
            f"| {case} | {r['seconds'] * 1000:.1f} | {r['ms_per_query']:.2f} | {r['queries_per_s']:.1f} | "
            f"{base * 1000 / r['ms_per_query']:.1f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--work", type=Path, default=Path("bench-work/serve-embed"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    run = prepare(args.work)
    info = machine()
    result = measure(run, args.work, args.repeats)
    save("serve-embed", {"machine": info, "repeats": args.repeats, "result": result})
    update_doc("serve-embed", markdown(result, info, args.repeats))
    print(markdown(result, info, args.repeats))


if __name__ == "__main__":
    main()
