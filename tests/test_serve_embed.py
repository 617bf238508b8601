"""`strata serve` hosting an embedding run: top-k, scores and neighbours through a real server
equal `strata embed predict`, `score` and `neighbors` on the same run (a 6-partition table of
which the server keeps 2 resident), registrations survive a restart, and bad requests get their
status codes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_in_process import strata_in_process
from conftest import run_strata
from serve_process import Server
from strata.embed import Run
from strata.serve import ServiceError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_serve_embed")

TOKEN = "embserve-secret"
TRAIN = ["--epochs", "1", "--dim", "16", "--chunk-size", "200", "--negatives", "64", "-q"]


@pytest.fixture(scope="module")
def trained(kg, tmp_path_factory):
    """A ComplEx run of 6 partitions (reciprocal relations) and its store's names."""
    d = tmp_path_factory.mktemp("serve-embed")
    run_strata("embed", "train", kg, "--run-dir", d / "run", "--partitions", "6", "--buffer", "3",
               "--model", "complex", *TRAIN)  # fmt: skip
    run_strata("embed", "export", d / "run", "--out", d / "npy", "-q")
    names = (d / "npy" / "node_names.txt").read_text().splitlines()
    rel_names = (d / "npy" / "relation_names.txt").read_text().splitlines()
    return d / "run", names, rel_names


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    """A server with a token that registered the run at start with 2 of 6 partitions resident
    (8 MiB of query scratch, the relations, two 12 KiB partitions), and at most 25 answers per query."""
    run, _, _ = trained
    state = tmp_path_factory.mktemp("serve-embed-state")
    s = Server(state, "--embedding", f"kg={run}", "--embedding-memory", "8220K", "--max-k", "25",
               "--token", TOKEN, "--memory", "256M")  # fmt: skip
    yield s
    s.stop()


def cli_json(capsys, *args) -> dict:
    """``strata ARGS --json``'s answer, the command run in this process (tests/cli_in_process.py):
    the same command line as a child's, without the start-up of one for each query."""
    return json.loads(strata_in_process(capsys)(*args, "--json", "-q").stdout)


def test_top_k_equals_embed_predict(trained, server, capsys):
    run, names, rel_names = trained
    with server.client(token=TOKEN) as c:
        info = c.status()["embeddings"][0]
        assert (info["name"], info["model"], info["num_nodes"]) == ("kg", "complex", 400)
        assert (info["partitions"], info["resident_partitions"]) == (6, 2), "the table is scanned through 2 slots"
        heads = [names[3], names[150], names[399]]
        for filtered in (False, True):
            got = c.top_k("kg", heads, rel_names[2], k=7, filtered=filtered)
            assert [q["name"] for q in got] == heads
            for q in got:
                extra = ["--exclude-known"] if filtered else []
                want = cli_json(capsys, "embed", "predict", run, "--head", q["name"], "--relation", rel_names[2],
                                "--top", "7", *extra)["predictions"]  # fmt: skip
                assert [a["node"] for a in q["predictions"]] == [a["node"] for a in want]
                assert [a["known"] for a in q["predictions"]] == [a["known"] for a in want]
                assert np.allclose([a["score"] for a in q["predictions"]], [a["score"] for a in want], rtol=1e-6)
        # Heads of (?, relation, tail), by id, one relation per query.
        got = c.top_k("kg", [5, 6], [1, 4], k=4, heads=True)
        for q, rel in zip(got, [1, 4], strict=True):
            want = cli_json(capsys, "embed", "predict", run, "--tail", names[q["node"]], "--relation", rel_names[rel],
                            "--top", "4")["predictions"]  # fmt: skip
            assert [a["name"] for a in q["predictions"]] == [a["name"] for a in want]


def test_score_and_neighbors_equal_the_cli(trained, server, capsys):
    run, names, rel_names = trained
    triples = [(names[7], rel_names[2], names[9]), (names[0], rel_names[5], names[399])]
    with server.client(token=TOKEN) as c:
        scores = c.score("kg", [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples])
        assert scores.dtype == np.float32
        assert np.allclose(scores, Run(run).score(triples), rtol=1e-6)
        by_id = c.score("kg", [7, 0], 2, [9, 9])
        assert by_id[0] == scores[0]
        for metric in ("model", "l2"):
            got = c.neighbors("kg", [names[3], names[200]], k=6, metric=metric)
            want = cli_json(capsys, "embed", "neighbors", run, "--node", names[3], "--node", names[200], "--top", "6",
                            "--metric", metric)  # fmt: skip
            assert got["metric"] == want["metric"]
            for g, w in zip(got["results"], want["results"], strict=True):
                assert [n["node"] for n in g["neighbors"]] == [n["node"] for n in w["neighbors"]]
                assert np.allclose([n["score"] for n in g["neighbors"]], [n["score"] for n in w["neighbors"]])


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        (lambda c, n, r: c.top_k("nope", [n[0]], r[0]), "NOT_FOUND", "embedding run 'nope' is not registered"),
        (lambda c, n, r: c.top_k("kg", [n[0]], "no-such-rel"), "NOT_FOUND", "relations[0]: relation 'no-such-rel'"),
        (lambda c, n, r: c.top_k("kg", ["no-such-node"], r[0]), "NOT_FOUND", "nodes[0]: node 'no-such-node'"),
        (lambda c, n, r: c.top_k("kg", [400], r[0]), "INVALID_ARGUMENT", "node id 400 is out of range"),
        (lambda c, n, r: c.top_k("kg", [0], 99), "INVALID_ARGUMENT", "relation id 99 is out of range"),
        (lambda c, n, r: c.top_k("kg", [0], r[0], k=26), "RESOURCE_EXHAUSTED", "(--max-k)"),
        (lambda c, n, r: c.top_k("kg", [0], r[0], k=0), "INVALID_ARGUMENT", "k: 0"),
        (lambda c, n, r: c.top_k("kg", [0, 1, 2], [0, 1], k=3), "INVALID_ARGUMENT", "2 given for 3 queries"),
        (lambda c, n, r: c.top_k("kg", [], r[0]), "INVALID_ARGUMENT", "nodes: empty"),
        (lambda c, n, r: c.neighbors("kg", [0], metric="l1"), "INVALID_ARGUMENT", "metric"),
        (lambda c, n, r: c.score("kg", [0, 1], 0, [2]), "INVALID_ARGUMENT", "1 given for 2 heads"),
        (lambda c, n, r: c.register_embedding("other", "/nonexistent"), "PERMISSION_DENIED", "not under a data root"),
    ],
)
def test_bad_requests(trained, server, call, code, message):
    _, names, rel_names = trained
    with server.client(token=TOKEN) as c:
        with pytest.raises(ServiceError) as e:
            call(c, names, rel_names)
        assert e.value.code == code and message in e.value.message
        assert c.top_k("kg", [0], 0, k=1), "the server keeps serving"


def test_unauthenticated_and_duplicate_registration(trained, server):
    run, _, rel_names = trained
    with server.client(token="") as c, pytest.raises(ServiceError) as e:
        c.top_k("kg", [0], rel_names[0])
    assert e.value.code == "UNAUTHENTICATED"
    with server.client(token=TOKEN) as c, pytest.raises(ServiceError) as e:
        c.register_embedding("kg", run)
    assert e.value.code == "ALREADY_EXISTS"


def test_a_run_whose_store_lies_outside_the_roots_is_refused(kg, trained, tmp_path):
    run, _, _ = trained
    server = Server(tmp_path / "state", "--memory", "128M", "--data-root", run)
    try:
        with server.client() as c, pytest.raises(ServiceError) as e:
            c.register_embedding("kg", run)
        assert e.value.code == "PERMISSION_DENIED" and "the store this run was trained on" in e.value.message
        assert str(kg) not in e.value.message
    finally:
        server.stop()


def test_registration_survives_a_restart_and_unregisters(kg, trained, tmp_path):
    run, names, rel_names = trained
    roots = ["--data-root", run, "--data-root", kg]
    server = Server(tmp_path / "state", "--memory", "128M", *roots)
    try:
        with server.client() as c:
            info = c.register_embedding("last", run, checkpoint="last")
            assert info["resident_partitions"] == 6 and info["checkpoint"] == "last"
            before = c.top_k("last", names[10], rel_names[3], k=5)
            with pytest.raises(ServiceError) as e:
                c.register_embedding("huge", run, memory="1M")
            assert e.value.code == "RESOURCE_EXHAUSTED" and "minimum" in e.value.message
    finally:
        server.stop()
    server = Server(tmp_path / "state", "--memory", "128M", *roots)
    try:
        with server.client() as c:
            assert [e["name"] for e in c.status()["embeddings"]] == ["last"]
            assert c.top_k("last", names[10], rel_names[3], k=5) == before
            c.unregister_embedding("last")
            assert c.status()["embeddings"] == []
            with pytest.raises(ServiceError) as e:
                c.top_k("last", names[10], rel_names[3])
            assert e.value.code == "NOT_FOUND"
    finally:
        server.stop()
    assert list((tmp_path / "state" / "embeddings").iterdir()) == []
