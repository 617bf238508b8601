"""The bucket scheduler's policy for distributed runs, as pure functions (see docs/distributed.md).

PyTorch-BigGraph's lock server hands a trainer a bucket whose partitions no other trainer holds,
preferring buckets that keep the partitions it already has. Strata's ranks keep a buffer of
``capacity`` partitions (not just the current bucket's two), so here a rank locks everything
resident in its buffer, and the policy also says which of them to evict to make room.

``grant`` answers one request, ``release`` records partitions written back. ``simulate`` runs
the policy for several ranks with given bucket times, without processes, to count loads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

Bucket = tuple[int, int]


@dataclass
class EpochState:
    """What the scheduler knows during one epoch of ``partitions`` node partitions."""

    partitions: int
    #: Seeds the order in which equally good buckets are preferred (the epoch number), so that
    #: successive epochs do not train the partition pairs in the same order.
    seed: int = 0
    #: Buckets handed out this epoch.
    done: set[Bucket] = field(default_factory=set)
    #: Partition -> the rank holding it (resident in that rank's buffer, locked to it).
    holder: dict[int, int] = field(default_factory=dict)
    #: Partitions written back to this epoch's output table (read from there from now on).
    written: set[int] = field(default_factory=set)
    #: Bucket -> its place among equally good ones (a seeded shuffle).
    tie_break: dict[Bucket, int] = field(init=False)

    def __post_init__(self) -> None:
        order = [(a, b) for a in range(self.partitions) for b in range(self.partitions)]
        random.Random(self.seed).shuffle(order)
        self.tie_break = {b: i for i, b in enumerate(order)}


@dataclass(frozen=True)
class Grant:
    """``kind`` is ``bucket`` (train ``bucket`` after evicting ``evict``; of the partitions to
    load, those in ``written`` come from the epoch's output table), ``wait`` (nothing can be
    taken now: release everything and ask again) or ``done`` (every bucket handed out)."""

    kind: str
    bucket: Bucket = (0, 0)
    evict: tuple[int, ...] = ()
    written: tuple[int, ...] = ()


def _left_with(state: EpochState, p: int, others: set[int]) -> int:
    """Buckets not yet handed out between ``p`` and ``others`` (``p`` included)."""
    return sum(1 for q in others | {p} for b in {(p, q), (q, p)} if b not in state.done)


def grant(state: EpochState, rank: int, held: set[int] | frozenset[int], capacity: int) -> Grant:
    """The answer to ``rank`` holding ``held`` (at most ``capacity`` partitions, at least 2).

    Among the buckets not handed out whose partitions no other rank holds: fewest partitions
    to load, then fewest evictions, then the most buckets left among the partitions the rank
    holds afterwards, then the state's seeded tie-break. Evicts the held partitions outside the bucket
    with the fewest buckets left with the rest of the new buffer. Records the bucket as handed
    out and its partitions as held by ``rank``. Raises ``ValueError`` on a request no rank
    following the protocol can make."""
    n = state.partitions
    if capacity < 2:
        raise ValueError(f"rank {rank}: a buffer of {capacity} partition(s) cannot hold a bucket's two")
    held = set(held)
    if len(held) > capacity:
        raise ValueError(f"rank {rank} holds {len(held)} partitions in a buffer of {capacity}")
    for p in held:
        if not 0 <= p < n or state.holder.get(p) != rank:
            raise ValueError(f"rank {rank} reports holding partition {p}, which the scheduler gave it not")
    if len(state.done) == n * n:
        return Grant("done")
    free = [p for p in range(n) if state.holder.get(p, rank) == rank]
    best = None
    for a in free:
        for b in free:
            if (a, b) in state.done:
                continue
            need = {a, b}
            loads = len(need - held)
            evictions = max(0, len(held | need) - capacity)
            after = held | need
            evict = sorted(held - need, key=lambda p: (_left_with(state, p, after - {p}), p))[:evictions]
            keep = after - set(evict)
            left = sum(1 for x in keep for y in keep if (x, y) not in state.done and (x, y) != (a, b))
            key = (loads, evictions, -left, state.tie_break[(a, b)])
            if best is None or key < best[0]:
                best = (key, (a, b), tuple(evict))
    if best is None:
        return Grant("wait")
    _, bucket, evict = best
    state.done.add(bucket)
    loads = sorted({*bucket} - held)
    for p in bucket:
        state.holder[p] = rank
    return Grant("bucket", bucket, evict, tuple(p for p in loads if p in state.written))


def release(state: EpochState, rank: int, parts) -> None:
    """``rank`` wrote ``parts`` back to the epoch's output table and no longer holds them."""
    for p in parts:
        if state.holder.get(p) != rank:
            raise ValueError(f"rank {rank} releases partition {p}, which it does not hold")
        del state.holder[p]
        state.written.add(p)


@dataclass
class Simulation:
    """What ``simulate`` counted: per rank, buckets trained, partition loads and waits."""

    buckets: list[int]
    loads: list[int]
    waits: list[int]


def simulate(partitions: int, capacities: list[int], seconds=lambda rank, bucket: 1.0) -> Simulation:
    """One epoch of the policy with ``len(capacities)`` ranks, rank ``r`` with a buffer of
    ``capacities[r]``, training a bucket in ``seconds(rank, bucket)`` (simulated time; swaps
    take none). A rank told to wait releases everything and asks again when the next rank
    finishes its bucket. Returns the counts."""
    ranks = len(capacities)
    state = EpochState(partitions)
    held: list[set[int]] = [set() for _ in range(ranks)]
    sim = Simulation([0] * ranks, [0] * ranks, [0] * ranks)
    clock = [0.0] * ranks
    finished = [False] * ranks
    # Bounded: every bucket is handed out once, and a rank waits only while another trains.
    for _ in range(4 * partitions * partitions * ranks + 4 * ranks):
        active = [r for r in range(ranks) if not finished[r]]
        if not active:
            break
        r = min(active, key=lambda q: (clock[q], q))
        g = grant(state, r, held[r], capacities[r])
        if g.kind == "bucket":
            release(state, r, g.evict)
            held[r] -= set(g.evict)
            sim.loads[r] += len({*g.bucket} - held[r])
            held[r] |= {*g.bucket}
            sim.buckets[r] += 1
            clock[r] += seconds(r, g.bucket)
            continue
        release(state, r, held[r])
        held[r] = set()
        if g.kind == "done":
            finished[r] = True
            continue
        sim.waits[r] += 1
        # A rank told to wait asks again just after the next training rank finishes its
        # bucket (a rank holding partitions is training one; its clock is when it finishes).
        training = [clock[q] for q in active if q != r and held[q]]
        if not training:
            raise RuntimeError("a rank was told to wait while no rank trains: the policy deadlocked")
        clock[r] = max(clock[r], min(training)) + 1e-9
    else:
        raise RuntimeError("the simulation did not finish within its bound")
    return sim
