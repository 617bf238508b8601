"""The on-paper models of docs/distributed.md, from rates measured on this machine: a
distributed embedding epoch (``--only embed``) and a data-parallel GNN epoch at ogbn-papers100M
size (``--only gnn``) on 4 to 64 machines.

    python benches/dist_model.py [--only embed,gnn] [--threads 16] [--network-gbit 10]
        [--buffer-gib 16] [--kg-rate 50000] [--social-rate 205000]
        [--gnn-row-rate 216600] [--gnn-rows-per-seed 150] [--gnn-iops 102833] [--gnn-hit 0.36]

Embeddings:

Per machine: ``threads`` trainer threads at the measured edges/s per thread, a buffer of 3
partitions within ``buffer_gib``, and a network link of ``network_gbit``. A partition is
``nodes / P`` rows of ``dim`` float32 embeddings plus as many Adagrad accumulators. Partition
loads per epoch are ``P**2`` times the loads per bucket of the real policy, simulated for 32
partitions and min(W, 8) ranks (``dist_policy.simulate``); every load is fetched from the
partition's owner and sent back on eviction (owner mode); a machine fetches and evicts its
share and serves its owned partitions to the others, so each direction of its link carries
``2 * loads * partition bytes / W`` per epoch (a little less: loads of its own partitions stay
local). Relations are all-reduced (ring: twice the
relation bytes per rank) every 4 buckets a rank trains.

GNN (DistributedDataParallel, ``strata gnn train`` under torchrun): every machine trains
``train seeds / W`` seeds per epoch; a seed brings ``rows_per_seed`` sampled rows, trained at
``row_rate`` rows/s per thread end to end (sampling, gathering and the model: G4's in-RAM run).
Feature rows come from memory (replicated, the rows fit a machine's RAM), from the machine's
own SSD (replicated; the rows missing the hot set and cache, ``1 - hit``, one 4 KiB read each
at ``iops``), or from their owners (split features, ``--dist-features split``: ``(W - 1) / W``
of the rows cross the network, no remote cache). Each step all-reduces the gradients (ring:
``2 (W - 1) / W`` model bytes, ``2 (W - 1)`` latencies). Data and compute overlap (the
loader's pipeline); the all-reduce is counted apart. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math

from strata.embed.dist_policy import simulate

#: name -> (nodes, edges, relations, dim, rate key). Sizes as Legend's Table 4 gives them
#: ("Efficient Graph Embedding at Scale", PVLDB 18(1)): Freebase86M 86.1M nodes, 304.7M edges, 14,824 relations;
#: Twitter 41.6M nodes, 1.46B edges; both at 100 dimensions.
GRAPHS = {
    "Freebase86m": (86.1e6, 304.7e6, 14824, 100, "kg"),
    "Twitter": (41.6e6, 1.46e9, 1, 100, "social"),
}
MACHINES = (4, 8, 16, 32, 64)
#: ogbn-papers100M (OGB): nodes, directed edges, train seeds, features, classes.
PAPERS100M = (111_059_956, 1_615_685_872, 1_207_179, 128, 172)
SIM_PARTITIONS = 32


@functools.cache
def loads_per_bucket(ranks: int, policy: str, capacity: int) -> float:
    """Partition loads per bucket of one simulated epoch of 32 partitions (at most 8 ranks)."""
    sim = simulate(SIM_PARTITIONS, [capacity] * min(ranks, 8), policy=policy)
    return sum(sim.loads) / SIM_PARTITIONS**2


def model(args) -> list[str]:
    link = args.network_gbit * 1e9 / 8
    rate = {"kg": args.kg_rate, "social": args.social_rate}
    lines = [
        "| graph | machines | partitions | partition (GiB) | loads per epoch (PBG lock server) | "
        "moved per machine (GiB) | transfer (s) | relations all-reduced per machine (GiB) | compute (s) | "
        "epoch, overlapped (s) | epoch, not overlapped (s) | PBG lock server, not overlapped (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (nodes, edges, relations, dim, kind) in GRAPHS.items():
        table = nodes * dim * 4 * 2
        for w in MACHINES:
            # Enough partitions that 3 fit the buffer and every machine has 4 to choose from.
            p = max(4 * w, math.ceil(3 * table / (args.buffer_gib * 2**30)))
            part = table / p
            ours = loads_per_bucket(w, "affinity", 3) * p * p
            pbg = loads_per_bucket(w, "lock_server", 2) * p * p
            moved = 2 * ours * part / w
            moved_pbg = 2 * pbg * part / w
            rel = 2 * relations * 2 * dim * 4 * 2 * (p * p / w / 4) if relations > 1 else 0.0
            transfer = (moved + rel) / link
            compute = edges / (w * args.threads * rate[kind])
            lines.append(
                f"| {name} | {w} | {p} | {part / 2**30:.2f} | {ours:,.0f} ({pbg:,.0f}) | {moved / 2**30:,.0f} | "
                f"{transfer:,.0f} | {rel / 2**30:.1f} | {compute:,.0f} | {max(compute, transfer):,.0f} | "
                f"{compute + transfer:,.0f} | {compute + (moved_pbg + rel) / link:,.0f} |"
            )
    return lines


def sage_params(features: int, hidden: int, classes: int, layers: int) -> int:
    """Parameters of a GraphSAGE (mean) model: per layer a self and a neighbour weight and a bias."""
    dims = [features] + [hidden] * (layers - 1) + [classes]
    return sum(2 * a * b + b for a, b in itertools.pairwise(dims))


def gnn_model(args) -> list[str]:
    link = args.network_gbit * 1e9 / 8
    nodes, _, seeds, features, classes = PAPERS100M
    row_bytes = features * 4
    model_bytes = 4 * sage_params(features, args.gnn_hidden, classes, 2)
    lines = [
        f"ogbn-papers100M: {nodes:,} nodes, {seeds:,} train seeds, {features} float32 features "
        f"({nodes * row_bytes / 2**30:.0f} GiB); GraphSAGE 2 layers, hidden {args.gnn_hidden} "
        f"({model_bytes / 2**20:.2f} MiB of gradients per step), batch {args.gnn_batch} per rank, "
        f"{args.gnn_rows_per_seed} rows per seed; {args.threads} threads per machine at "
        f"{args.gnn_row_rate:,.0f} rows/s each; {args.network_gbit:g} Gbit/s links, "
        f"{args.latency_us:g} us latency.",
        "",
        "| machines | seeds per machine | compute (s) | SSD reads (s) | remote rows per machine (GiB) | "
        "network (s) | all-reduce (s) | epoch, features in RAM (s) | epoch, features on SSD (s) | "
        "epoch, split features (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in MACHINES:
        mine = seeds / w
        rows = mine * args.gnn_rows_per_seed
        compute = rows / (args.threads * args.gnn_row_rate)
        ssd = rows * (1 - args.gnn_hit) / args.gnn_iops
        remote = rows * (w - 1) / w * row_bytes
        network = remote / link
        steps = math.ceil(mine / args.gnn_batch)
        allreduce = steps * (2 * (w - 1) / w * model_bytes / link + 2 * (w - 1) * args.latency_us * 1e-6)
        lines.append(
            f"| {w} | {mine:,.0f} | {compute:.2f} | {ssd:.1f} | {remote / 2**30:.2f} | {network:.2f} | "
            f"{allreduce:.2f} | {compute + allreduce:.2f} | {max(compute, ssd) + allreduce:.1f} | "
            f"{max(compute, network) + allreduce:.2f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="embed,gnn", help="comma-separated subset of embed,gnn")
    ap.add_argument("--threads", type=int, default=16, help="trainer threads per machine")
    ap.add_argument("--network-gbit", type=float, default=10.0, help="each machine's link, Gbit/s")
    ap.add_argument("--buffer-gib", type=float, default=16.0, help="memory for a machine's 3 partitions")
    ap.add_argument("--kg-rate", type=float, default=50000, help="edges/s per thread, B1's settings")
    ap.add_argument("--social-rate", type=float, default=205000, help="edges/s per thread, Dot 100, 100 negatives")
    ap.add_argument(
        "--gnn-row-rate",
        type=float,
        default=216_600,
        help="sampled rows/s per thread end to end (G4 in RAM, quiet: 10,390 seeds/s x 41.7 rows per seed "
        "on 2 threads)",
    )
    ap.add_argument("--gnn-rows-per-seed", type=float, default=150, help="distinct rows a seed samples (15,10)")
    ap.add_argument("--gnn-iops", type=float, default=102_833, help="4 KiB random reads/s of a machine's SSD (G2)")
    ap.add_argument("--gnn-hit", type=float, default=0.36, help="share of rows from the hot set and cache (G4)")
    ap.add_argument("--gnn-hidden", type=int, default=256)
    ap.add_argument("--gnn-batch", type=int, default=1024, help="seeds per step and rank")
    ap.add_argument("--latency-us", type=float, default=50.0, help="one message's latency, microseconds")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if "embed" in only:
        print("\n".join(model(args)))
    if "gnn" in only:
        print("\n".join(gnn_model(args)))


if __name__ == "__main__":
    main()
