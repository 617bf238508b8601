"""The on-paper model of docs/distributed.md: communication volume and epoch time of a
distributed embedding epoch on 4 to 64 machines, from measured per-thread rates.

    python benches/dist_model.py [--threads 16] [--network-gbit 10] [--buffer-gib 16]
        [--kg-rate 50000] [--social-rate 205000]

Per machine: ``threads`` trainer threads at the measured edges/s per thread, a buffer of 3
partitions within ``buffer_gib``, and a network link of ``network_gbit``. A partition is
``nodes / P`` rows of ``dim`` float32 embeddings plus as many Adagrad accumulators. Partition
loads per epoch are ``P**2`` times the loads per bucket of the real policy, simulated for 32
partitions and min(W, 8) ranks (``dist_policy.simulate``); every load is fetched from the
partition's owner and sent back on eviction (owner mode); a machine fetches and evicts its
share and serves its owned partitions to the others, so each direction of its link carries
``2 * loads * partition bytes / W`` per epoch (a little less: loads of its own partitions stay
local). Relations are all-reduced (ring: twice the
relation bytes per rank) every 4 buckets a rank trains. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import math

from strata.embed.dist_policy import simulate

#: name -> (nodes, edges, relations, dim, rate key). Sizes as Legend's Table 4 gives them
#: (/work/shared/papers/legend.txt): Freebase86M 86.1M nodes, 304.7M edges, 14,824 relations;
#: Twitter 41.6M nodes, 1.46B edges; both at 100 dimensions.
GRAPHS = {
    "Freebase86m": (86.1e6, 304.7e6, 14824, 100, "kg"),
    "Twitter": (41.6e6, 1.46e9, 1, 100, "social"),
}
MACHINES = (4, 8, 16, 32, 64)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=16, help="trainer threads per machine")
    ap.add_argument("--network-gbit", type=float, default=10.0, help="each machine's link, Gbit/s")
    ap.add_argument("--buffer-gib", type=float, default=16.0, help="memory for a machine's 3 partitions")
    ap.add_argument("--kg-rate", type=float, default=50000, help="edges/s per thread, B1's settings")
    ap.add_argument("--social-rate", type=float, default=205000, help="edges/s per thread, Dot 100, 100 negatives")
    args = ap.parse_args()
    print("\n".join(model(args)))


if __name__ == "__main__":
    main()
