"""``strata serve`` keeps its budget whatever one request asks (issue 15, item 1): a server under
a memory cgroup a little above its ``--memory`` gets requests whose replies or working memory
would be gigabytes (a million feature rows of a Cora-sized graph, samples with hundreds of hops,
a million analysis targets, mutations near the message limit, an all-neighbour model whose
groups must be split) and answers each with a clear status naming the limit and the computed
size, streams more rows than its whole budget in pieces, and goes on answering normal calls.
The cgroup would kill it at its first overrun."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import symmetric_sbm_store
from serve_process import Server
from strata.serve.client import ServiceError
from test_serve import SERVER_RUNTIME, StoreArrays, numpy_sage, served_graph_bytes

#: Cora's shape: 2,708 vertices with 1,433 float32 features (5.7 KB a row).
NODES, DIM, CLASSES = 2708, 1433, 7
MEMORY = 128 << 20
#: What the process holds besides --memory: the interpreter with NumPy and the extension
#: (about 60 MB of code and data) and the allocator's slack. The cgroup counts page cache too
#: (the state directory's writes).
OVERHEAD = 96 << 20
#: What the executor counts for a sampled vertex of the all-neighbour model (hidden 12):
#: its input row and activations as wide as the input.
ROW_BYTES = 28 + 4 * (DIM + 3 * DIM)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("serve-wide")
    return symmetric_sbm_store(d, nodes=NODES, classes=CLASSES, dim=DIM, avg_degree=10)


def two_hop_sizes(store: StoreArrays) -> np.ndarray:
    """How many vertices sampling every in-neighbour, two hops out, reaches from each vertex."""
    ptr, idx = np.asarray(store.indptr), np.asarray(store.indices)
    sizes = np.empty(store.num_nodes, dtype=np.int64)
    for v in range(store.num_nodes):
        hop1 = idx[ptr[v] : ptr[v + 1]]
        hop2 = [idx[ptr[u] : ptr[u + 1]] for u in hop1]
        sizes[v] = len(np.unique(np.concatenate([[v], hop1, *hop2])))
    return sizes


def refused(fn, *args, **kw) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        fn(*args, **kw)
    return e.value


def test_huge_requests_are_refused_within_the_budget(tmp_path, wide, limiter):
    limit = MEMORY + OVERHEAD
    args = [f"g={wide}", "--memory", MEMORY, "--max-message", "64M", "--fold-after", "3600"]
    server = Server(tmp_path / "state", *args, wrap=[limiter, limit])
    try:
        c = server.client(timeout=120)
        # The plan: the runtime and the graph off the top, then an eighth each of the rest for
        # the working memory and the executor; messages up to half the working memory.
        status = c.status()
        working = (MEMORY - SERVER_RUNTIME - served_graph_bytes(status["graphs"][0])) // 8
        executor, max_message = working, working // 2
        assert (status["working_capacity_bytes"], status["max_message_bytes"]) == (working, max_message)
        c.register_model("m", numpy_sage(tmp_path / "m.npz", in_dim=DIM, out_dim=CLASSES, fanouts=(10, 5)))
        c.register_model("all", numpy_sage(tmp_path / "all.npz", in_dim=DIM, out_dim=CLASSES, fanouts=(-1, -1)))
        million = np.arange(1_000_000) % NODES
        sent_before = c.status()["bytes_out"]

        # A million feature rows in one reply: 5.7 GB, refused before anything is built.
        e = refused(c._call, "GetFeatures", graph="g", ids=million.tolist())
        reply = 1_000_000 * DIM * 4 + 64
        assert e.code == "OUT_OF_RANGE" and f"{reply} bytes" in e.message and f"{max_message} bytes" in e.message, e
        # Nothing was sent for it: the counters hold only what went out.
        assert c.status()["bytes_out"] - sent_before < 4096

        # The same rows stream in pieces within the limit: 50,000 rows are 287 MB, more than
        # the whole budget, and come back equal to the store's.
        features = StoreArrays(wide).features
        ids = (np.arange(50_000) * 7) % NODES
        pieces = 0
        at = 0
        for t in c._stream("StreamFeatures", graph="g", ids=ids.tolist()):
            assert t.ByteSize() <= max_message
            piece = np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))
            assert np.array_equal(piece[:3], features[ids[at : at + 3]])
            at += len(piece)
            pieces += 1
        assert at == len(ids) and pieces > 30

        # Samples: a million (repeated) seeds, and two hundred hops from every vertex.
        e = refused(c.sample_neighbors, "g", million, [5])
        assert e.code == "OUT_OF_RANGE" and "SampleNeighbors of 1000000 seeds" in e.message, e
        e = refused(c.sample_neighbors, "g", range(NODES), [1_000_000] * 200)
        assert e.code == "OUT_OF_RANGE" and f"limit of {max_message} bytes" in e.message, e
        # Every neighbour of every vertex, eight hops out, fits and is answered.
        nb = c.sample_neighbors("g", range(NODES), [-1] * 8)
        assert len(nb.blocks) == 8

        # Analyses: a result over the message limit, and one that fits it but not the memory.
        e = refused(c.analyze, "g", "m", "classification", million)
        assert e.code == "OUT_OF_RANGE" and "GraphAnalysis" in e.message, e
        e = refused(c.analyze, "g", "m", "classification", million[:150_000])
        assert e.code == "RESOURCE_EXHAUSTED" and f"the {working} bytes of the server's working memory" in e.message
        # An all-neighbour model: fused groups are split to fit the executor's share, and a
        # vertex whose neighbourhood alone is over it fails alone, with the sizes.
        sizes = two_hop_sizes(StoreArrays(wide))
        small = [v for v in np.argsort(sizes) if sizes[v] * ROW_BYTES < executor // 4][:300]
        assert len(small) == 300
        assert c.classify("g", "all", small)[1].shape == (300, CLASSES)
        hub = int(np.argmax(sizes))
        assert sizes[hub] * ROW_BYTES > executor  # the graph's largest hub (1,189 vertices two hops out)
        e = refused(c.classify, "g", "all", [hub])
        assert e.code == "ANALYSIS_FAILED" and f"the {executor} bytes of the executor" in e.message, e

        # Mutations: a message over the limit is refused while it is decoded; one under it
        # that needs more working memory than there is, before it is applied.
        e = refused(c.add_vertices, "g", np.ones((max_message // (4 * DIM) + 1, DIM), np.float32))
        assert e.code == "OUT_OF_RANGE", e
        e = refused(c.add_vertices, "g", np.ones((max_message // (4 * DIM) - 1, DIM), np.float32))
        assert e.code == "RESOURCE_EXHAUSTED" and "AddVertex needs" in e.message, e

        # Normal calls go on, and the refused ones left nothing reserved.
        assert np.array_equal(c.get_features("g", [0, 1, 2]), features[[0, 1, 2]])
        assert c.classify("g", "m", [0, 1, 2])[1].shape == (3, CLASSES)
        assert c.add_vertices("g", np.ones((2, DIM), np.float32)).tolist() == [NODES, NODES + 1]
        status = c.status()
        assert status["working_used_bytes"] == 0 and status["working_capacity_bytes"] == working
        assert status["graphs"][0]["num_nodes"] == NODES + 2
        c.close()
        assert server.stop() == 0, server.stderr
    finally:
        server.kill()
    peak = re.search(r"memlimit: peak (\S+) of limit", server.stderr)
    assert peak, server.stderr
    print(f"serve under memlimit {limit >> 20} MiB (--memory {MEMORY >> 20} MiB): peak {peak.group(1)}")
