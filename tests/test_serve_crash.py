"""Durability of ``strata serve`` under ``kill -9``: a client mutates a graph while the server is
killed at a random moment, over and over (with folds into new store versions happening in
between); after each restart every acknowledged mutation is there, the one in flight is there
entirely or not at all (a batch of mutations, ``Mutate``, included: all of it or none of it),
and the served graph and its store version on disk are consistent."""

from __future__ import annotations

import copy
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import symmetric_sbm_store
from serve_process import Server
from strata import Store
from strata.serve import Client, Mutations
from strata.serve.client import ServiceError

NODES, DIM = 800, 8
ROUNDS = 6
GRAPH = "g"


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("crash-sbm")
    return symmetric_sbm_store(d, nodes=NODES, classes="4", dim=DIM, avg_degree=6)


class Truth:
    """What the graph must hold: the store plus every acknowledged mutation. Mutations add
    vertices, update added vertices, and add and remove edges into added vertices (so the
    in-neighbours of an added vertex are exactly the edges added here)."""

    def __init__(self, base_nodes: int, base_edges: int):
        self.base_nodes, self.base_edges = base_nodes, base_edges
        self.num_nodes = base_nodes
        self.rows: dict[int, np.ndarray] = {}  # added vertex -> last acknowledged row
        self.edges: set[tuple[int, int]] = set()
        self.in_flight: tuple | None = None  # the call under way when the server died
        self.acknowledged = 0
        self.batches = 0  # acknowledged batches (`Mutate`), of `acknowledged`
        self.in_flight_applied = 0
        self.in_flight_lost = 0

    def apply(self, op: tuple) -> None:
        kind, payload = op
        if kind == "batch":
            for one in payload:
                self.apply(one)
        elif kind == "add":
            for row in payload:
                self.rows[self.num_nodes] = row
                self.num_nodes += 1
        elif kind == "update":
            ids, rows = payload
            self.rows.update(zip(ids, rows, strict=True))
        elif kind == "add_edges":
            self.edges.update(payload)
        else:
            self.edges.difference_update(payload)


def next_op(truth: Truth, rng: random.Random, nprng: np.random.Generator) -> tuple:
    added = list(truth.rows)
    r = rng.random()
    if len(added) < 4 or r < 0.3:
        # Distinctive rows: no two are alike, so a row tells which mutation wrote it.
        return ("add", list(nprng.standard_normal((rng.randint(1, 3), DIM)).astype(np.float32)))
    if r < 0.8 and truth.edges and rng.random() < 0.35:
        return ("remove_edges", rng.sample(sorted(truth.edges), min(len(truth.edges), rng.randint(1, 2))))
    if r < 0.6:
        pairs: list[tuple[int, int]] = []
        want = rng.randint(1, 3)
        while len(pairs) < want:
            pair = (rng.randrange(truth.num_nodes), rng.choice(added))
            if pair not in truth.edges and pair not in pairs:
                pairs.append(pair)
        return ("add_edges", pairs)
    ids = rng.sample(added, rng.randint(1, 2))
    return ("update", (ids, list(nprng.standard_normal((len(ids), DIM)).astype(np.float32))))


def next_batch(truth: Truth, rng: random.Random, nprng: np.random.Generator) -> tuple:
    """A batch whose later mutations need the earlier ones: an addition first (so the number
    of vertices tells whether the batch is there), then 1 to 5 more, each drawn against the
    graph as the ones before it leave it."""
    after = copy.deepcopy(truth)
    ops = [("add", list(nprng.standard_normal((rng.randint(1, 3), DIM)).astype(np.float32)))]
    after.apply(ops[0])
    for _ in range(rng.randint(1, 5)):
        ops.append(next_op(after, rng, nprng))
        after.apply(ops[-1])
    return ("batch", ops)


def call(c: Client, op: tuple, truth: Truth) -> None:
    kind, payload = op
    if kind == "batch":
        batch = Mutations()
        for one_kind, one in payload:
            if one_kind == "add":
                batch.add_vertices(np.stack(one))
            elif one_kind == "update":
                batch.update_vertices(one[0], np.stack(one[1]))
            elif one_kind == "add_edges":
                batch.add_edges([u for u, _ in one], [v for _, v in one])
            else:
                batch.remove_edges([u for u, _ in one], [v for _, v in one])
        c.mutate(GRAPH, batch)
    elif kind == "add":
        ids = c.add_vertices(GRAPH, np.stack(payload))
        assert ids.tolist() == list(range(truth.num_nodes, truth.num_nodes + len(payload)))
    elif kind == "update":
        c.update_vertices(GRAPH, payload[0], np.stack(payload[1]))
    elif kind == "add_edges":
        c.add_edges(GRAPH, [u for u, _ in payload], [v for _, v in payload])
    else:
        c.remove_edges(GRAPH, [u for u, _ in payload], [v for _, v in payload])


class Mutator(threading.Thread):
    """Mutates until the server dies, recording each acknowledged mutation in ``truth`` and
    the one under way in ``truth.in_flight``."""

    def __init__(self, c: Client, truth: Truth, seed: int):
        super().__init__(daemon=True)
        self.c, self.truth = c, truth
        self.rng, self.nprng = random.Random(seed), np.random.default_rng(seed)
        self.first_ack = threading.Event()
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.ended_by: str | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                batch = self.rng.random() < 0.25
                op = (next_batch if batch else next_op)(self.truth, self.rng, self.nprng)
                self.truth.in_flight = op
                try:
                    call(self.c, op, self.truth)
                except ServiceError as e:
                    self.ended_by = e.code
                    if e.code != "UNAVAILABLE":
                        raise
                    return
                self.truth.in_flight = None
                self.truth.apply(op)
                self.truth.acknowledged += 1
                self.truth.batches += batch
                self.first_ack.set()
        except BaseException as e:  # reported by the test
            self.failure = e
        finally:
            self.first_ack.set()


def in_neighbours(c: Client, vertices: list[int]) -> dict[int, list[int]]:
    nb = c.sample_neighbors(GRAPH, vertices, [-1])
    (block,) = nb.blocks
    return {
        v: sorted(int(u) for u in nb.nodes[block.indices[block.indptr[i] : block.indptr[i + 1]]])
        for i, v in enumerate(vertices)
    }


def resolve_in_flight(c: Client, truth: Truth) -> None:
    """Applies the mutation the server died during when the restarted server shows it, after
    checking it is there entirely or not at all."""
    op, truth.in_flight = truth.in_flight, None
    if op is None:
        return
    kind, payload = op
    info = graph_status(c)
    if kind == "batch":
        # Whether its leading addition is there tells whether the batch is; verify() then
        # finds any part of it missing (or, when it is not there, any part present).
        added = sum(len(rows) for k, rows in payload if k == "add")
        assert info["num_nodes"] in (truth.num_nodes, truth.num_nodes + added), (info, added)
        applied = info["num_nodes"] == truth.num_nodes + added
    elif kind == "add":
        assert info["num_nodes"] in (truth.num_nodes, truth.num_nodes + len(payload)), (info, len(payload))
        applied = info["num_nodes"] == truth.num_nodes + len(payload)
        if applied:
            ids = list(range(truth.num_nodes, truth.num_nodes + len(payload)))
            assert np.array_equal(c.get_features(GRAPH, ids), np.stack(payload))
    elif kind == "update":
        ids, rows = payload
        got = c.get_features(GRAPH, ids)
        applied = np.array_equal(got, np.stack(rows))
        assert applied or np.array_equal(got, np.stack([truth.rows[i] for i in ids])), "a half-applied update"
    else:
        dsts = sorted({v for _, v in payload})
        present = in_neighbours(c, dsts)
        there = [u in present[v] for u, v in payload]
        assert all(there) or not any(there), f"a half-applied {kind}: {payload} -> {there}"
        applied = all(there) == (kind == "add_edges")
    if applied:
        truth.apply(op)
        truth.in_flight_applied += 1
    else:
        truth.in_flight_lost += 1


def graph_status(c: Client) -> dict:
    (info,) = c.status()["graphs"]
    assert info["name"] == GRAPH
    return info


def verify(c: Client, truth: Truth, base_features: np.ndarray) -> dict:
    """Every acknowledged mutation is visible and the graph is consistent."""
    resolve_in_flight(c, truth)
    info = graph_status(c)
    assert info["num_nodes"] == truth.num_nodes
    assert info["live_nodes"] == truth.num_nodes
    assert info["num_edges"] == truth.base_edges + len(truth.edges)
    assert info["last_lsn"] >= truth.acknowledged
    added = sorted(truth.rows)
    if added:
        assert np.array_equal(c.get_features(GRAPH, added), np.stack([truth.rows[v] for v in added]))
        want: dict[int, list[int]] = {v: [] for v in added}
        for u, v in truth.edges:
            want[v].append(u)
        assert in_neighbours(c, added) == {v: sorted(us) for v, us in want.items()}
    assert np.array_equal(c.get_features(GRAPH, range(truth.base_nodes)), base_features)
    # The whole graph samples, with every edge between existing vertices.
    nb = c.sample_neighbors(GRAPH, range(truth.num_nodes), [-1])
    (block,) = nb.blocks
    assert block.indptr[-1] == info["num_edges"]
    assert sorted(nb.nodes.tolist()) == list(range(truth.num_nodes))
    return info


def check_version_on_disk(state: Path) -> None:
    """The store version CURRENT names is complete: it opens, every array's dtype, shape and size
    checked (in this process: `strata info` opens it the same way, after a start-up of its own)."""
    graph_dir = state / "graphs" / GRAPH
    current = json.loads((graph_dir / "CURRENT").read_text())
    assert Store(graph_dir / f"v{current['version']:08d}").num_nodes >= NODES


def test_acknowledged_mutations_survive_kill_9(tmp_path, sbm):
    state = tmp_path / "state"
    args = [f"{GRAPH}={sbm}", "--fold-records", "20", "--fold-after", "0.5", "--memory", "40M"]
    manifest = json.loads((sbm / "manifest.json").read_text())
    base_features = np.load(sbm / manifest["arrays"]["features"]["file"])
    truth = Truth(NODES, manifest["graph"]["num_topology_edges"])
    rng = random.Random(20240611)
    versions = set()
    for round_ in range(ROUNDS):
        server = Server(state, *args)
        mutator = None
        try:
            with Client(server.addr, timeout=30) as c:
                info = verify(c, truth, base_features)
                versions.add(info["version"])
                mutator = Mutator(c, truth, seed=round_)
                mutator.start()
                assert mutator.first_ack.wait(60), "no mutation was acknowledged within 60 s"
                time.sleep(rng.uniform(0.05, 0.8))
                server.kill()
                mutator.join(60)
                assert not mutator.is_alive(), "the mutation client hangs after the server died"
                if mutator.failure is not None:
                    raise mutator.failure
                assert mutator.ended_by == "UNAVAILABLE"
        finally:
            if mutator is not None:
                mutator.stopping.set()
            server.kill()
        check_version_on_disk(state)

    # Finally: wait for a fold, die right after it, and come back once more.
    server = Server(state, *args)
    try:
        with Client(server.addr, timeout=30) as c:
            info = verify(c, truth, base_features)
            deadline = time.monotonic() + 60
            while info["pending_log_records"] or info["version"] in versions:
                assert time.monotonic() < deadline, f"no fold within 60 s: {info}"
                time.sleep(0.1)
                info = graph_status(c)
            versions.add(info["version"])
    finally:
        server.kill()
    check_version_on_disk(state)
    server = Server(state, *args)
    try:
        with Client(server.addr, timeout=30) as c:
            info = verify(c, truth, base_features)
            assert info["pending_log_records"] == 0
        assert server.stop() == 0, "".join(server.err)
    finally:
        server.kill()
    graph_dir = state / "graphs" / GRAPH
    assert sorted(p.name for p in graph_dir.iterdir() if p.name.startswith("v")) == [f"v{info['version']:08d}"]
    assert truth.acknowledged >= ROUNDS and truth.batches > 0
    print(
        f"crash loop: {truth.acknowledged} acknowledged calls ({truth.batches} batches) over {ROUNDS} kills, "
        f"{truth.in_flight_applied} in-flight applied / {truth.in_flight_lost} lost, versions {sorted(versions)}, "
        f"{truth.num_nodes - NODES} vertices and {len(truth.edges)} edges added"
    )
