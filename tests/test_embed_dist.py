"""Distributed embedding training: the scheduler's policy as a pure function, and
`strata embed train` under torchrun with two ranks on loopback (docs/distributed.md)."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import zlib

import pytest

from conftest import needs, run_strata
from strata.embed import dist
from strata.embed.dist_policy import POLICIES, EpochState, grant, grant_lock_server, release, simulate
from strata.errors import ConfigError
from torchrun_env import free_port, rank_env

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1", "-q"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_locks_partitions_and_hands_out_every_bucket_once(policy):
    choose = POLICIES[policy]
    rng = random.Random(7)
    for trial in range(40):
        n = rng.randint(1, 9)
        ranks = rng.randint(1, 4)
        capacities = [rng.randint(2, 4) for _ in range(ranks)]
        state = EpochState(n)
        held: list[set[int]] = [set() for _ in range(ranks)]
        handed: list[tuple[int, int]] = []
        finished = [False] * ranks
        for _ in range(20 * n * n * ranks + 100):
            if all(finished):
                break
            r = rng.choice([q for q in range(ranks) if not finished[q]])
            if held[r] and rng.random() < 0.2:
                # A rank may give partitions back between buckets (a wait, or memory pressure).
                part = rng.choice(sorted(held[r]))
                release(state, r, [part])
                held[r].discard(part)
                continue
            g = choose(state, r, held[r], capacities[r])
            if g.kind == "bucket":
                assert set(g.evict) <= held[r] and not set(g.evict) & set(g.bucket)
                release(state, r, g.evict)
                held[r] = (held[r] - set(g.evict)) | set(g.bucket)
                assert len(held[r]) <= capacities[r], (trial, r, held[r])
                handed.append(g.bucket)
            else:
                release(state, r, sorted(held[r]))
                held[r] = set()
                finished[r] = g.kind == "done"
            owners = [p for h in held for p in h]
            assert len(owners) == len(set(owners)), f"a partition held by two ranks: {held}"
            assert all(state.holder[p] == q for q, h in enumerate(held) for p in h)
        assert all(finished), trial
        assert sorted(handed) == [(a, b) for a in range(n) for b in range(n)], trial


def test_policy_prefers_resident_partitions_and_evicts_the_spent_ones():
    state = EpochState(4)
    first = grant(state, 0, set(), 3)
    assert first.kind == "bucket" and first.evict == () and first.written == ()
    held = set(first.bucket)
    # While buckets among the held partitions remain, none needs a load.
    while any((a, b) not in state.done for a in held for b in held):
        g = grant(state, 0, held, 3)
        assert set(g.bucket) <= held, g
    # Rank 1 cannot take a bucket touching rank 0's partitions.
    other = grant(state, 1, set(), 2)
    assert other.kind == "bucket" and not set(other.bucket) & held
    # A partition written back is read from the epoch's output table by its next holder.
    release(state, 1, sorted(set(other.bucket)))
    again = grant(state, 1, set(), 2)
    assert set(again.written) == set(again.bucket) & set(other.bucket)
    with pytest.raises(ValueError, match="which the scheduler gave it not"):
        grant(state, 1, {next(iter(held))}, 2)


def _best_bucket_by_scan(state: EpochState, rank: int, held: set[int], capacity: int):
    """``grant``'s documented order by brute force over every bucket: fewest loads, fewest
    evictions, most buckets left among the partitions kept, then the seeded tie-break."""
    free = [p for p in range(state.partitions) if state.holder.get(p, rank) == rank]
    best = None
    for a, b in itertools.product(free, free):
        if (a, b) in state.done:
            continue
        after = held | {a, b}
        evictions = max(0, len(after) - capacity)
        spent = sorted(held - {a, b}, key=lambda p: (_left(state, p, after), p))[:evictions]
        keep = after - set(spent)
        left = sum(1 for x in keep for y in keep if (x, y) not in state.done and (x, y) != (a, b))
        key = (len({a, b} - held), evictions, -left, state.tie_break[(a, b)])
        if best is None or key < best[0]:
            best = (key, (a, b), tuple(spent))
    return None if best is None else best[1:]


def _left(state: EpochState, p: int, after: set[int]) -> int:
    return sum(1 for q in after for x in {(p, q), (q, p)} if x not in state.done)


def test_policy_grant_equals_a_scan_of_every_bucket():
    # grant scores buckets stage by stage (no load, one, two); the answer must be the one a
    # scan of all n^2 buckets in the documented order gives.
    rng = random.Random(7)
    for trial in range(600):
        n, capacity = rng.randint(2, 8), rng.randint(2, 5)
        state = EpochState(n, seed=trial)
        density = rng.random()
        state.done = {(a, b) for a in range(n) for b in range(n) if rng.random() < density}
        held = set(rng.sample(range(n), rng.randint(0, min(capacity, n))))
        state.holder = {p: 0 for p in held} | {p: 1 for p in range(n) if p not in held and rng.random() < 0.3}
        expected = _best_bucket_by_scan(state, 0, held, capacity)
        kind = "done" if len(state.done) == n * n else "wait" if expected is None else "bucket"
        g = grant(state, 0, held, capacity)
        assert g.kind == kind, trial
        if kind == "bucket":
            assert (g.bucket, g.evict) == expected, trial


def test_lock_server_keeps_only_the_bucket_and_follows_pbg_affinity():
    state = EpochState(4)
    assert grant_lock_server(state, 0, set(), 3).bucket == (0, 0)
    # PBG's affinity: same left partition first (twice the weight of the same right one).
    g = grant_lock_server(state, 0, {0}, 3)
    assert g.bucket == (0, 1) and g.evict == ()
    # With a buffer of 3 it still evicts what is outside the bucket, although (1, 0) and (1, 1)
    # are left; the affinity policy keeps 1 and adds 2.
    g = grant_lock_server(state, 0, {0, 1}, 3)
    assert g.bucket == (0, 2) and g.evict == (1,)
    release(state, 0, [1])
    ours = EpochState(4, done={(0, 0), (0, 1)}, holder={0: 0, 1: 0})
    assert grant(ours, 0, {0, 1}, 3).evict == ()
    # Rank 1 cannot take a bucket touching rank 0's partitions; it gets the first free one.
    assert grant_lock_server(state, 1, set(), 2).bucket == (1, 1)
    assert grant_lock_server(state, 1, {1}, 2).bucket == (1, 3)
    with pytest.raises(ValueError, match="which the scheduler gave it not"):
        grant_lock_server(state, 1, {0}, 2)


def test_simulated_loads_with_a_buffer_of_three_beat_the_lock_server():
    for ranks in (1, 2, 3):
        pbg = simulate(16, [2] * ranks, policy="lock_server")
        ours = simulate(16, [3] * ranks)
        assert sum(pbg.buckets) == sum(ours.buckets) == 256
        assert sum(ours.loads) < sum(pbg.loads), (ranks, ours, pbg)


def test_environment_detection():
    assert dist.from_environment(5, {}) is None
    assert dist.from_environment(5, {"WORLD_SIZE": "1", "RANK": "0"}) is None
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        dist.from_environment(5, {"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"})
    with pytest.raises(ConfigError, match="RANK=2"):
        dist.from_environment(5, {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert dist.follower({"WORLD_SIZE": "2", "RANK": "1"}) and not dist.follower({"WORLD_SIZE": "2", "RANK": "0"})


def train_two_ranks(kg, run, *options: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``strata embed train KG --run-dir RUN OPTIONS`` (and the SMALL ones) in two ranks under
    torchrun on loopback, meeting at a free port, without restarts; the finished launch."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "-m", "strata", "embed", "train", str(kg), "--run-dir", str(run), *options, *SMALL,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=rank_env())


#: What the runs checked by ``checked`` train with, beside their own options.
TWO_EPOCHS = ["--epochs", "2", "--dist-timeout", "60", "--dist-prefetch"]


def train_and_check(kg, run, buckets: int, mrr: float, *options: str) -> dict:
    """Two ranks train RUN for two epochs with OPTIONS: the launch succeeds, the record passes
    check_epochs with ``buckets`` buckets an epoch, and the test MRR is above ``mrr``; the record."""
    proc = train_two_ranks(kg, run, *TWO_EPOCHS, "--negative-pool", "resident", *options)
    return checked(proc, run, buckets, mrr)


def checked(proc: subprocess.CompletedProcess, run, buckets: int, mrr: float) -> dict:
    """``proc``, a finished two-rank launch training RUN for two epochs, succeeded, its record
    passes check_epochs with ``buckets`` buckets an epoch, and the test MRR is above ``mrr``;
    the record."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    meta = check_epochs(run, buckets)
    out = run_strata("embed", "eval", run, "--json", "--split", "test").stdout
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert json.loads(out)["metrics"]["mrr"] > mrr
    return meta


@pytest.fixture(scope="module")
def banked_run(kg, tmp_path_factory) -> tuple[subprocess.CompletedProcess, object]:
    """Two ranks training the complex model with the default ``all`` negative pool, whose
    banks they share and sum at every relation round (``--bank-sync-every 1``), and the
    lookahead: one launch for the complex case of the train-commit-evaluate test and for the
    banks test. The finished launch and its run directory."""
    needs("torch")
    run = tmp_path_factory.mktemp("banked") / "run"
    proc = train_two_ranks(kg, run, *TWO_EPOCHS, "--partitions", "4", "--relation-sync-every", "2", "--model",
                           "complex", "--bank-sync-every", "1")  # fmt: skip
    return proc, run


# A model without relation parameters (dot) still joins the relation rounds for their "done"
# count; its MRR on a knowledge graph is lower, as it ignores the relation. The complex model's
# run is the banks test's (negative banks shared), the dot model's keeps the resident pool and
# draws negatives per edge (LibKGE's sampling) rather than per chunk.
@pytest.mark.parametrize(("model", "mrr"), [("complex", 0.05), ("dot", 0.025)])
def test_two_ranks_under_torchrun_train_commit_and_evaluate(kg, tmp_path, request, model, mrr):
    needs("torch")
    if model == "complex":
        proc, run = request.getfixturevalue("banked_run")
        meta = checked(proc, run, 16, mrr)
    else:
        meta = train_and_check(kg, tmp_path / "run", 16, mrr, "--partitions", "4", "--relation-sync-every", "2",
                               "--model", model, "--no-shared-negatives")  # fmt: skip
        assert meta["config"]["shared_negatives"] is False
    # Rank 0 planned torch and gloo as measured, and the lookahead's slot (one: with 4
    # partitions and a buffer of 3, a grant loads at most one partition).
    parts = {p["name"]: p for p in meta["memory_plan"]["parts"]}
    assert parts["torch + gloo"]["bytes"] > 96 << 20 and "RssAnon" in parts["torch + gloo"]["detail"]
    assert parts["prefetch slots"]["detail"].startswith("1 x")
    assert all(r["prefetched_loads"] <= r["partition_loads"] for e in meta["history"] for r in e["ranks"])


def check_epochs(run, buckets: int) -> dict:
    """The run's record after a 2-epoch, 2-rank run: every bucket trained once per epoch, the
    ranks' figures, and the commit chain (each epoch starts from the table the one before it
    committed, and the last table file is what its record says)."""
    meta = json.loads((run / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["current"]["epoch"] == 2
    data = (run / meta["current"]["table"]).read_bytes()
    parts = meta["partitioning"]["partitions"]
    size = len(data) // parts
    for before, record in zip([None, *meta["history"][:-1]], meta["history"], strict=True):
        ranks = record["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        # Every bucket of the grid is trained once per epoch, by one rank or the other.
        assert sum(r["buckets"] for r in ranks) == buckets
        assert record["partition_loads"] == sum(r["partition_loads"] for r in ranks) >= 4
        assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 and r["relation_rounds"] >= 1 for r in ranks)
        for r in ranks:
            assert 0 <= r["partition_wait_seconds"] <= r["seconds"]
            assert r["partition_wait_share"] == pytest.approx(r["partition_wait_seconds"] / r["seconds"])
            assert r["partition_bytes_loaded"] == r["partition_loads"] * size
        if before is not None:
            assert record["table_crc"]["start"] == before["table_crc"]["end"]
    crcs = b"".join(zlib.crc32(data[p * size : (p + 1) * size]).to_bytes(4, "little") for p in range(parts))
    assert f"{zlib.crc32(crcs):08x}" == meta["history"][-1]["table_crc"]["end"]
    return meta


def test_prefetching_ranks_with_pbg_lock_server_train_every_bucket_once(kg, tmp_path):
    """PBG's lock server evicts every partition outside the bucket, so with a buffer of 2 and
    two prefetch slots nearly every grant is loaded ahead while the bucket before it trains."""
    needs("torch")
    meta = train_and_check(kg, tmp_path / "run", 64, 0.05, "--partitions", "8", "--buffer", "2", "--ordering",
                           "sequential", "--dist-policy", "lock_server")  # fmt: skip
    assert sum(r["prefetched_loads"] for e in meta["history"] for r in e["ranks"]) > 0


def test_a_rank_whose_memory_cannot_hold_torch_fails_naming_the_figure(kg, tmp_path):
    needs("torch")
    proc = train_two_ranks(kg, tmp_path / "run", "--partitions", "4", "--negative-pool", "resident", "--memory",
                           "200M", "--dist-timeout", "30", timeout=200)  # fmt: skip
    assert proc.returncode != 0
    assert "memory budget 200 MiB cannot hold this rank's process: torch and gloo take" in proc.stderr, proc.stderr[
        -3000:
    ]
    assert "exitcode  : 2" in proc.stderr and "Traceback" not in proc.stderr.split("exitcode")[0], proc.stderr[-3000:]


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_rank_whose_peer_never_arrives_names_the_address(kg, tmp_path, rank):
    """Rank 1 alone cannot reach rank 0's store; rank 0 alone hosts it and waits for rank 1,
    which never starts. Both fail within dist_timeout naming the store's address."""
    needs("torch")
    port = free_port()
    env = rank_env() | {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    proc = run_strata(
        "embed", "train", kg, "--run-dir", tmp_path / "run", "--partitions", "4", "--negative-pool", "resident",
        "--dist-timeout", "3", *SMALL, check=False, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}" in proc.stderr and "within 3 s" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_two_ranks_share_negative_banks(banked_run):
    """The default ``all`` negative pool with 4 partitions and a buffer of 3 keeps negative
    banks; two ranks share them (blocks summed at each epoch's start, pending gradient summed
    at every relation round and applied by the partition's holder, blocks refreshed from their
    holders at the same rounds, leftover gradient flushed
    by each partition's owner) and every epoch still commits one chain of holdings per
    partition. The owner-mode test covers banks without the per-round sums."""
    proc, run = banked_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    meta = json.loads((run / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["config"]["negative_pool"] == "all"
    assert meta["config"]["bank_sync_every"] == 1
    banks = [part for part in meta["memory_plan"]["parts"] if part["name"] == "negative banks"]
    assert banks and banks[0]["bytes"] > 0, meta["memory_plan"]
    history = meta["history"]
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(sum(r["buckets"] for r in h["ranks"]) == 16 for h in history)
    assert history[1]["table_crc"]["start"] == history[0]["table_crc"]["end"]
    out = run_strata("embed", "eval", run, "--json", "--split", "test").stdout
    assert json.loads(out)["metrics"]["mrr"] > 0.05
