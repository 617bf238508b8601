"""``strata serve``'s batched mutation RPC (``Mutate``) end to end through the Python client: a
batch is applied in order and acknowledged as one log record, a refused mutation anywhere in it
leaves the graph unchanged (and names its index), empty and oversized batches are refused with
the limit they break, and an acknowledged batch survives a restart."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import symmetric_sbm_store
from serve_process import serving
from strata.serve import Client, Mutations, _proto
from strata.serve.client import ServiceError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_serve_batch")

NODES, DIM = 400, 8


@pytest.fixture(scope="module")
def sbm(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch-sbm")
    return symmetric_sbm_store(d, nodes=NODES, classes="4", dim=DIM, avg_degree=6)


def refused(fn, *args, **kwargs) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        fn(*args, **kwargs)
    return e.value


def graph_info(c: Client) -> dict:
    (info,) = c.status()["graphs"]
    return info


def in_neighbours(c: Client, vertices: list[int]) -> dict[int, list[int]]:
    nb = c.sample_neighbors("g", vertices, [-1])
    (block,) = nb.blocks
    return {
        v: sorted(int(u) for u in nb.nodes[block.indices[block.indptr[i] : block.indptr[i + 1]]])
        for i, v in enumerate(vertices)
    }


def snapshot(c: Client, vertices: list[int]) -> tuple:
    """What a client can see of ``vertices`` and the graph's counters."""
    info = graph_info(c)
    return (
        (info["num_nodes"], info["live_nodes"], info["num_edges"], info["last_lsn"]),
        in_neighbours(c, vertices),
        c.get_features("g", vertices).tolist(),
    )


def test_a_batch_applies_in_order_as_one_record(tmp_path, sbm):
    rows = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    with serving(tmp_path / "state", f"g={sbm}") as server:
        c = server.client()
        edges_before = graph_info(c)["num_edges"]
        # Later mutations use what earlier ones did: the new vertices, an edge added just before.
        batch = (
            Mutations()
            .add_vertices(rows)
            .add_edges([1, 2, NODES], [NODES, NODES, NODES + 1])
            .remove_edges([2], [NODES])
            .update_vertices([NODES + 2, 5], rows[:2] * -1)
            .add_vertices(rows[:1])
        )
        assert len(batch) == 5
        done = c.mutate("g", batch)
        assert done.lsn == 1 and graph_info(c)["last_lsn"] == 1, "the whole batch is one log record"
        assert done.applied == [3, 3, 1, 2, 1]
        assert [ids.tolist() for ids in done.ids] == [[NODES, NODES + 1, NODES + 2], [], [], [], [NODES + 3]]
        want_rows = np.vstack([rows[:2], -rows[:2], rows[:1]])
        vertices = [NODES, NODES + 1, NODES + 2, 5, NODES + 3]
        assert np.array_equal(c.get_features("g", vertices), want_rows)
        assert in_neighbours(c, [NODES, NODES + 1]) == {NODES: [1], NODES + 1: [NODES]}
        info = graph_info(c)
        assert (info["num_nodes"], info["num_edges"]) == (NODES + 4, edges_before + 2)
        # A single mutation after it is checked against all of it, and gets the next lsn.
        assert c.remove_edges("g", [1], [NODES]) == 2
        seen = snapshot(c, vertices)
        c.close()
        assert server.stop() == 0, server.stderr
    with serving(tmp_path / "state") as server:
        c = server.client()
        assert snapshot(c, vertices) == seen
        c.close()
        assert server.stop() == 0, server.stderr


def test_a_refused_batch_changes_nothing(tmp_path, sbm):
    rows = np.ones((2, DIM), np.float32)
    with serving(tmp_path / "state", f"g={sbm}", "--max-ids", "10") as server:
        c = server.client()
        c.add_edges("g", [3], [4])
        watched = [0, 1, 3, 4, 5]
        before = snapshot(c, watched)

        def good() -> Mutations:
            return Mutations().add_vertices(rows).remove_vertices([0])

        four_pairs = good()
        for _ in range(4):
            four_pairs.add_edges([1, 2], [3, 4])
        cases = [
            # Refused only because of what the batch did before it.
            ("NOT_FOUND", "mutations[2]: src: vertex 0 was removed", good().add_edges([0], [1])),
            ("NOT_FOUND", "mutations[2]: ids: vertex 0 was removed", good().update_vertices([0], rows[:1])),
            (
                "NOT_FOUND",
                "mutations[3]: edge 3 -> 4 does not exist",
                good().remove_edges([3], [4]).remove_edges([3], [4]),
            ),
            ("INVALID_ARGUMENT", "mutations[2]: dst: vertex 402 is out of range", good().add_edges([1], [NODES + 2])),
            # The single RPCs' own checks, with the index.
            ("INVALID_ARGUMENT", "mutations[2]: features: expected shape (1, 8)", good().update_vertices([1], rows)),
            ("INVALID_ARGUMENT", "mutations[2]: src has 2 ids but dst has 1", good().add_edges([1, 2], [3])),
            ("RESOURCE_EXHAUSTED", "mutations[2]: src: 11 ids in one request", good().add_edges(range(11), range(11))),
            # --max-ids bounds the batch as a whole: 2 + 1 + 4 x 2 ids.
            ("RESOURCE_EXHAUSTED", "mutations (all together): 11 ids", four_pairs),
            ("INVALID_ARGUMENT", "mutations: empty; give at least one", Mutations()),
        ]
        for code, message, batch in cases:
            e = refused(c.mutate, "g", batch)
            assert (e.code, e.message[: len(message)]) == (code, message), e
            assert snapshot(c, watched) == before, message
        # Messages the client would not build: another graph's mutation, no kind at all.
        mutation = _proto.message("Mutation")
        other = mutation(add_edge=_proto.message("EdgeRequest")(graph="other", src=[1], dst=[2]))
        e = refused(c._call, "Mutate", graph="g", mutations=[other])
        want = "mutations[0]: graph: 'other', but the batch is on graph 'g'; leave it empty or the same"
        assert (e.code, e.message) == ("INVALID_ARGUMENT", want)
        e = refused(c._call, "Mutate", graph="g", mutations=[*good()._items, mutation()])
        assert e.code == "INVALID_ARGUMENT" and e.message.startswith("mutations[2]: kind: missing"), e
        assert refused(c.mutate, "nograph", good()).code == "NOT_FOUND"
        assert snapshot(c, watched) == before
        # The graph goes on from where it was: the refused batches left nothing staged.
        assert c.mutate("g", good()).ids[0].tolist() == [NODES, NODES + 1]
        assert graph_info(c)["last_lsn"] == before[0][3] + 1
        c.close()
        assert server.stop() == 0, server.stderr


def test_batches_over_the_message_size_or_the_working_memory_are_refused(tmp_path, sbm):
    with serving(tmp_path / "state", f"g={sbm}", "--memory", "64M") as server:
        c = server.client()
        status = c.status()
        max_message, working = status["max_message_bytes"], status["working_capacity_bytes"]
        row_bytes = 4 * DIM
        # Two additions, together just over the message size: refused while decoding.
        half = max_message // (2 * row_bytes) + 1
        over = Mutations().add_vertices(np.ones((half, DIM), np.float32)).add_vertices(np.ones((half, DIM), np.float32))
        assert refused(c.mutate, "g", over).code == "OUT_OF_RANGE"
        # Just under it, but a batch holds six copies of itself and the working memory is only
        # twice the message size: refused before anything is checked, naming the working memory.
        under = half - 2 * DIM
        rows = np.ones((under, DIM), np.float32)
        big = Mutations().add_vertices(rows).add_vertices(rows)
        e = refused(c.mutate, "g", big)
        assert e.code == "RESOURCE_EXHAUSTED" and "Mutate needs" in e.message and f"{working}" in e.message, e
        status = c.status()
        assert status["working_used_bytes"] == 0
        assert (status["graphs"][0]["num_nodes"], status["graphs"][0]["last_lsn"]) == (NODES, 0)
        c.close()
        assert server.stop() == 0, server.stderr
