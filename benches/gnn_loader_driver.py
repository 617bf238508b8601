"""One loader of G2 (`bench_gnn.py --only g2`), run as its own process so that a memlimit caps it
alone; prints one JSON object on stdout.

    python benches/gnn_loader_driver.py STORE --mode strata|mmap [--memory 850M] [--batches 60]

The seeds are the same in every mode: the first ``batches x batch_size`` of a permutation of the
store's train split drawn with ``--seed``, so an epoch over them is exactly the measured batches
(no read-ahead past the last batch is counted).

- ``strata``: the native loader of ``strata.gnn.GnnData`` over those seeds (shuffled, same seed),
  features through Strata's tiers and its O_DIRECT reads. ``--memory`` is the loader's budget;
  a budget the plan refuses is reported as ``{"error": ...}`` rather than a crash.
- ``mmap``: what PyG and DGL do with memory-mapped features: a NumPy uniform neighbour sampler
  (without replacement, Floyd's algorithm, DGL's message-flow semantics like Strata's: each hop
  samples the neighbours of every node known so far) over the store's CSC memmaps, then
  ``features[nodes]`` on the ``np.load(mmap_mode="r")`` feature matrix.
  Strata's loader is not used, so no feature byte goes through Strata.

Both deliver NumPy-visible arrays and touch every batch's features (a sum); neither imports torch,
whose CUDA build maps about 500 MiB of libraries that a memlimit would count against both alike
(the end-to-end G4 includes it). Reported: setup seconds (building the loader:
topology, plan, hot-set ranking and loading; opening the memmaps), the seconds of the loop over
the batches, rows (sampled nodes, i.e. feature rows served), seeds, bytes the process read from
storage (``/proc/self/io``), and the loader's own statistics.
"""

from __future__ import annotations

import argparse
import json
import mmap
import resource
import sys
import time

import numpy as np


def proc_read_bytes() -> int:
    """Bytes this process caused to be fetched from storage (page faults of memmaps included)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def seed_nodes(store, batches: int, batch_size: int, seed: int) -> np.ndarray:
    train = np.asarray(store.node_split("train"), dtype=np.int64)
    need = batches * batch_size
    if len(train) < need:
        raise SystemExit(f"the train split has {len(train):,} nodes; {batches} batches of {batch_size} need {need:,}")
    return np.random.default_rng(seed).permutation(train)[:need]


def run_strata(args, seeds: np.ndarray) -> dict:
    from strata import io as strata_io
    from strata.gnn import GnnData
    from strata.gnn.loader import node_id_bytes

    events: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def progress(kind, *rest) -> bool:
        if kind in ("message", "stage"):
            events.append((time.monotonic() - t0, f"{kind}: {rest[0]}"))
        return True

    options = {"seed": args.seed, **args.set}
    if args.window is not None:
        options["window"] = args.window
    try:
        data = GnnData(
            args.store, progress, fanouts=args.fanouts, batch_size=args.batch_size, memory=args.memory, **options
        )
    except Exception as e:  # the plan refuses a budget too small for its fixed needs
        return {"error": f"{type(e).__name__}: {e}"}
    setup = time.monotonic() - t0
    # Setup phases from the progress events: the plan is printed once the topology is in RAM;
    # the "hot set" stage starts once the ranking is done and ends with the rows loaded.
    plan_at = next((t for t, m in events if m.startswith("message")), 0.0)
    stage_at = next((t for t, m in events if m.startswith("stage")), plan_at)
    plan = data.plan
    epoch = data._native.epoch(node_id_bytes(seeds), 0, True, False)
    read0 = proc_read_bytes()
    io0 = strata_io.stats()
    rows = seeds_seen = batches = 0
    checksum = 0.0
    first = None
    t1 = time.monotonic()
    for _index, batch_seeds, nodes, _hops, _blocks, features, _stats, _device, _links in epoch:
        checksum += float(np.frombuffer(features, dtype=np.float32).sum())
        rows += len(nodes) // 4
        seeds_seen += len(batch_seeds) // 4
        batches += 1
        if first is None:
            first = time.monotonic() - t1
    seconds = time.monotonic() - t1
    io1 = strata_io.stats()
    return {
        "setup_seconds": setup,
        "setup_phases": {
            "topology_and_plan": plan_at,
            "hot_ranking": stage_at - plan_at,
            "hot_loading": setup - stage_at,
        },
        "seconds": seconds,
        "first_batch_seconds": first,
        "batches": batches,
        "rows": rows,
        "seeds": seeds_seen,
        "checksum": checksum,
        "proc_read_bytes": proc_read_bytes() - read0,
        "plan": plan,
        "plan_lines": data.plan_lines(),
        "all_resident": plan["hot_rows"] + plan["device_rows"] == plan["num_nodes"],
        "setup_messages": [m for _, m in events],
        "stats": epoch.stats(),
        "io": loop_io(io0, io1),
    }


def loop_io(before: dict, after: dict) -> dict:
    """The I/O engine's reads between two of its snapshots (``strata.io.stats()``), and the mean
    number of requests in flight each request found when it was submitted: the device queue's
    depth as the loop kept it."""

    def submitted(s: dict) -> int:
        return s["read_ops"] + s["write_ops"] + s["errors"] + s["in_flight"]

    n0, n1 = submitted(before), submitted(after)
    depth_sum = after["mean_in_flight"] * n1 - before["mean_in_flight"] * n0
    return {
        "read_ops": after["read_ops"] - before["read_ops"],
        "read_bytes": after["read_bytes"] - before["read_bytes"],
        "mean_in_flight": depth_sum / max(n1 - n0, 1),
    }


def sample_hops(indptr, indices, seeds: np.ndarray, fanouts: list[int], rng) -> np.ndarray:
    """The nodes of one mini-batch, seeds first: each hop samples up to ``fanout`` distinct
    in-neighbours (uniformly, without replacement; all of them for ``-1``) of every node known
    so far, and appends the new ones."""
    known = seeds
    for k in fanouts:
        start = np.asarray(indptr[known])
        deg = np.asarray(indptr[known + 1]) - start
        take_all = deg <= k if k >= 0 else np.ones(len(known), dtype=bool)
        # Every neighbour of the nodes with at most k of them.
        s, d = start[take_all], deg[take_all]
        positions = [np.arange(d.sum()) + np.repeat(s - (np.cumsum(d) - d), d)]
        # Floyd's algorithm, vectorised over the other nodes: k distinct offsets in [0, deg).
        s, d = start[~take_all], deg[~take_all]
        if len(s):
            chosen = np.empty((len(s), k), dtype=np.int64)
            for i in range(k):
                j = d - k + i
                t = rng.integers(0, j + 1)
                taken = (chosen[:, :i] == t[:, None]).any(axis=1)
                chosen[:, i] = np.where(taken, j, t)
            positions.append((s[:, None] + chosen).ravel())
        neighbours = np.asarray(indices[np.concatenate(positions)])
        known = np.concatenate([known, np.setdiff1d(neighbours, known).astype(np.int64)])
    return known


def run_mmap(args, seeds: np.ndarray) -> dict:
    from strata.store import Store

    t0 = time.monotonic()
    store = Store(args.store)
    indptr, indices = store.csc()
    features = store.features  # np.load(mmap_mode="r")
    if args.advice == "random":
        # Without it every page fault reads the device's read-ahead window (8 MiB on this VM).
        features._mmap.madvise(mmap.MADV_RANDOM)
    setup = time.monotonic() - t0
    rng = np.random.default_rng(args.seed)
    read0 = proc_read_bytes()
    majflt0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    rows = seeds_seen = batches = 0
    sample_seconds = gather_seconds = 0.0
    checksum = 0.0
    first = None
    t1 = time.monotonic()
    for b in range(args.batches):
        t = time.monotonic()
        batch_seeds = seeds[b * args.batch_size : (b + 1) * args.batch_size]
        nodes = sample_hops(indptr, indices, batch_seeds, args.fanouts, rng)
        t_gather = time.monotonic()
        x = np.asarray(features[nodes])
        gather_seconds += time.monotonic() - t_gather
        sample_seconds += t_gather - t
        checksum += float(x.sum())
        rows += x.shape[0]
        seeds_seen += len(batch_seeds)
        batches += 1
        if first is None:
            first = time.monotonic() - t1
    seconds = time.monotonic() - t1
    return {
        "setup_seconds": setup,
        "seconds": seconds,
        "first_batch_seconds": first,
        "sample_seconds": sample_seconds,
        "gather_seconds": gather_seconds,
        "batches": batches,
        "rows": rows,
        "seeds": seeds_seen,
        "checksum": checksum,
        "proc_read_bytes": proc_read_bytes() - read0,
        "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - majflt0,
    }


def _option(text: str) -> tuple[str, object]:
    """``key=value`` with the value as JSON (``window=4``, ``accumulator=false``) or else a string."""
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--mode", choices=["strata", "mmap"], required=True)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="15,10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory", default="1G", help="strata: the loader's memory budget")
    ap.add_argument("--advice", choices=["default", "random"], default="default", help="mmap: madvise of the features")
    ap.add_argument("--window", type=int, default=None, help="strata: look-ahead window (default the loader's)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="strata: a data-path option (JSON value)"
    )
    args = ap.parse_args()
    args.set = dict(_option(kv) for kv in args.set)
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    from strata.store import Store

    seeds = seed_nodes(Store(args.store), args.batches, args.batch_size, args.seed)
    result = run_strata(args, seeds) if args.mode == "strata" else run_mmap(args, seeds)
    result |= {"mode": args.mode, "memory": args.memory, "window": args.window}
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
