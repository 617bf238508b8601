"""The bucket scheduler's policy for distributed runs, as pure functions (see docs/distributed.md).

PyTorch-BigGraph's lock server hands a trainer a bucket whose partitions no other trainer holds,
preferring buckets that keep the partitions it already has. Strata's ranks keep a buffer of
``capacity`` partitions (not just the current bucket's two), so here a rank locks everything
resident in its buffer, and the policy also says which of them to evict to make room.

``grant`` answers one request, ``release`` records partitions written back. ``grant_lock_server``
is PyTorch-BigGraph's own lock server, for comparison on the same runs; ``POLICIES`` names both
(``[embed.train] dist_policy``). ``simulate`` runs a policy for several ranks with given bucket
times, without processes, to count loads.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
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
    #: Rank -> the bucket it was last granted this epoch (PBG's ``old_bucket``).
    last: dict[int, Bucket] = field(default_factory=dict)
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
    held = _checked(state, rank, held, capacity)
    n = state.partitions
    if len(state.done) == n * n:
        return Grant("done")
    new = [p for p in range(n) if p not in held and state.holder.get(p, rank) == rank]
    mine = sorted(held)
    # Loads come first in the order, so the buckets are scored stage by stage, from those
    # needing no load to those needing two, and the first stage with one wins: a rank whose
    # buffer still has work scores c^2 buckets, or 2cn, instead of all n^2 (at n = 190 the
    # full scan made each grant seconds of Python).
    stages = (
        ((a, b) for a in mine for b in mine),
        itertools.chain(((q, q) for q in new), (x for p in mine for q in new for x in ((p, q), (q, p)))),
        ((a, b) for a in new for b in new if a != b),
    )
    for buckets in stages:
        best = None
        for a, b in buckets:
            if (a, b) in state.done:
                continue
            need = {a, b}
            evictions = max(0, len(held | need) - capacity)
            after = held | need
            evict = sorted(held - need, key=lambda p: (_left_with(state, p, after - {p}), p))[:evictions]
            keep = after - set(evict)
            left = sum(1 for x in keep for y in keep if (x, y) not in state.done and (x, y) != (a, b))
            key = (evictions, -left, state.tie_break[(a, b)])
            if best is None or key < best[0]:
                best = (key, (a, b), tuple(evict))
        if best is not None:
            _, bucket, evict = best
            return _hand_out(state, rank, held, bucket, evict)
    return Grant("wait")


def grant_lock_server(state: EpochState, rank: int, held: set[int] | frozenset[int], capacity: int) -> Grant:
    """PyTorch-BigGraph's ``LockServer.acquire_bucket`` as an answer to the same request.

    The buffer is the current bucket: every held partition outside the granted bucket is
    evicted, whatever ``capacity`` allows. The bucket is the first one not handed out whose
    partitions no other rank holds, in lexicographic order, stably sorted by PBG's affinity to
    the rank's last bucket ``(l, r)``: twice "same left partition" plus "same right partition"
    (a bucket ``(r, l)`` counts as no affinity, as in PBG, although both partitions are
    resident). PBG's ``init_tree`` option (the first epoch grows from partition 0) is off by
    default there and not modelled. Raises ``ValueError`` as ``grant`` does."""
    held = _checked(state, rank, held, capacity)
    n = state.partitions
    if len(state.done) == n * n:
        return Grant("done")
    free = {p for p in range(n) if state.holder.get(p, rank) == rank}
    candidates = [(a, b) for a in sorted(free) for b in sorted(free) if (a, b) not in state.done]
    if not candidates:
        return Grant("wait")
    old = state.last.get(rank)
    if old is not None:
        candidates.sort(key=lambda x: -(2 * (x[0] == old[0]) + (x[1] == old[1])))
    bucket = candidates[0]
    return _hand_out(state, rank, held, bucket, tuple(sorted(held - {*bucket})))


#: The scheduler's policies by name (``[embed.train] dist_policy``); each answers
#: ``(state, rank, held, capacity)`` with a ``Grant``.
POLICIES: dict[str, Callable[[EpochState, int, set[int], int], Grant]] = {
    "affinity": grant,
    "lock_server": grant_lock_server,
}


def _checked(state: EpochState, rank: int, held, capacity: int) -> set[int]:
    """``held`` as a set, after refusing a request no rank following the protocol can make."""
    if capacity < 2:
        raise ValueError(f"rank {rank}: a buffer of {capacity} partition(s) cannot hold a bucket's two")
    held = set(held)
    if len(held) > capacity:
        raise ValueError(f"rank {rank} holds {len(held)} partitions in a buffer of {capacity}")
    for p in held:
        if not 0 <= p < state.partitions or state.holder.get(p) != rank:
            raise ValueError(f"rank {rank} reports holding partition {p}, which the scheduler gave it not")
    return held


def _hand_out(state: EpochState, rank: int, held: set[int], bucket: Bucket, evict: tuple[int, ...]) -> Grant:
    """Records ``bucket`` as handed out to ``rank`` (its partitions held by it) and answers it;
    of the partitions it must load, those already written back come from the epoch's table."""
    state.done.add(bucket)
    state.last[rank] = bucket
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


def simulate(
    partitions: int, capacities: list[int], seconds=lambda rank, bucket: 1.0, policy: str = "affinity", seed: int = 0
) -> Simulation:
    """One epoch (number ``seed``) of ``POLICIES[policy]`` with ``len(capacities)`` ranks, rank
    ``r`` with a buffer of ``capacities[r]``, training a bucket in ``seconds(rank, bucket)``
    (simulated time; swaps take none). A rank told to wait releases everything and asks again
    when the next rank finishes its bucket. Returns the counts."""
    choose = POLICIES[policy]
    ranks = len(capacities)
    state = EpochState(partitions, seed=seed)
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
        g = choose(state, r, held[r], capacities[r])
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
