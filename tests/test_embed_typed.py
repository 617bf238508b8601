"""PyTorch-BigGraph's entity types through the CLI and the Python API: per-type partitions with an
unpartitioned type held in memory, negatives and ranking of the right type, featurized entities
(feature bags converted with --node-bags, checked by strata check), and the options and inputs
that cannot apply, which exit 2 naming them."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import first_in_child, in_process
from strata.embed import Run, import_pbg, train
from typed_kg import FILMS, GENRES, PEOPLE, WORDS, typed_kg

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_typed")

SMALL = ["--dim", "16", "--chunk-size", "100", "--negatives", "32", "--epochs", "3", "-q"]


@pytest.fixture(scope="module")
def typed(tmp_path_factory) -> Path:
    from conftest import run_strata

    d = tmp_path_factory.mktemp("typed")
    run_strata("convert", *typed_kg(d), "-o", d / "kg.strata")
    return d / "kg.strata"


def names(store: Path) -> list[str]:
    offsets = np.load(store / "node_names_offsets.npy")
    data = np.load(store / "node_names_bytes.npy").tobytes()
    return [data[a:b].decode() for a, b in itertools.pairwise(offsets)]


def test_the_store_keeps_each_films_bag_and_check_reads_it(typed, tmp_path, strata_cli):
    m = json.loads((typed / "manifest.json").read_text())
    film = m["node_types"][1]
    assert film["name"] == "film" and film["bags"] == {"num_features": WORDS, "entries": 2 * FILMS}
    offsets = np.load(typed / "bag_offsets_t1.npy")
    assert offsets[0] == 0 and offsets[-1] == 2 * FILMS and np.all(np.diff(offsets) == 2)
    assert "no problems" in strata_cli("check", typed).stdout
    # A feature id out of range is found by strata check, naming the array.
    broken = tmp_path / "broken.strata"
    shutil.copytree(typed, broken, ignore=shutil.ignore_patterns("partitions", "runs"))
    feats = np.load(broken / "bag_features_t1.npy", mmap_mode="r+")
    feats[3] = WORDS
    feats.flush()
    proc = strata_cli("check", broken, check=False)
    assert proc.returncode == 2 and "bag_features_t1" in proc.stdout + proc.stderr, proc.stdout


def test_bad_bags_exit_2_naming_file_and_line(typed, tmp_path, strata_cli, capsys):
    # The first command in a child process, the rest in this one (tests/cli_in_process.py).
    strata_cli = first_in_child(strata_cli, capsys)
    d = tmp_path
    args = typed_kg(d)

    def refused(bags: str, *extra: str) -> str:
        (d / "bags.tsv").write_text(bags)
        proc = strata_cli("convert", *args, *extra, "-o", d / "bad.strata", check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (d / "bad.strata").exists()
        return proc.stderr

    assert "bags.tsv:2" in refused("f1\tw1\nnobody\tw2\n") and "nobody" in refused("f1\tw1\nnobody\tw2\n")
    assert "line 1" in refused("f1\tw1\nf1\tw2\n")
    assert "node_bags" in refused("f1\tw1\n", "--node-bags", f"actor={d / 'bags.tsv'}")
    assert "lists no features" in refused("f1\n")


@pytest.fixture(scope="module")
def pinned_run(typed, tmp_path_factory) -> Path:
    """A run of people and films in 2 partitions each, the genres held in memory."""
    from conftest import run_strata

    run = tmp_path_factory.mktemp("typed-run") / "run"
    run_strata(
        "embed", "train", typed, "--run-dir", run, *SMALL,
        "--entity-partitions", "person=2", "film=2", "genre=1", "--buffer", "2", "--ordering", "sequential",
    )  # fmt: skip
    return run


def test_an_unpartitioned_type_stays_in_memory_and_answers_have_the_right_type(typed, pinned_run, tmp_path, strata_cli):
    run = pinned_run
    meta = json.loads((run / "run.json").read_text())
    plan = {p["name"]: p for p in meta["memory_plan"]["parts"]}
    assert f"{GENRES} rows" in plan["in-memory entity types"]["detail"], plan
    types = {t["name"]: t for t in meta["partitioning"]["types"]}
    assert meta["partitioning"]["partitions"] == 2
    assert [types[n]["partitioned"] for n in ("person", "film", "genre")] == [True, True, False]
    assert meta["layout"]["pinned"] == {"region": 2, "rows": GENRES}
    assert meta["test"]["mrr"] > 0.1, meta["test"]
    # Predictions of (person, likes, ?) are films only, and of (?, has_genre, genre) films too.
    node = names(typed)
    films = {n for n in node if n.startswith("f")}
    got = json.loads(
        strata_cli("embed", "predict", run, "--head", "p3", "--relation", "0", "--top", "8", "--json").stdout
    )
    assert {r["name"] for r in got["predictions"]} <= films, got
    got = json.loads(
        strata_cli("embed", "predict", run, "--tail", "g1", "--relation", "2", "--top", "5", "--json").stdout
    )
    assert {r["name"] for r in got["predictions"]} <= films, got
    # Export holds every node, in id order, the genres' rows from the pinned region.
    strata_cli("embed", "export", run, "--out", tmp_path / "emb")
    emb = np.load(tmp_path / "emb" / "embeddings.npy")
    assert emb.shape == (PEOPLE + FILMS + GENRES, 16) and np.all(np.any(emb != 0, axis=1))
    # A PyTorch-BigGraph checkpoint holds one entity type: refused, naming the option to change.
    proc = strata_cli("embed", "export", run, "--format", "pbg", "--out", tmp_path / "pbg", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "entity types (person, film, genre)" in proc.stderr and "entity_types = false" in proc.stderr
    assert not (tmp_path / "pbg").exists()


def test_an_untyped_run_of_a_typed_store_goes_through_pbg_and_back(typed, tmp_path, strata_cli):
    pytest.importorskip("h5py")
    flat = tmp_path / "flat"
    strata_cli("embed", "train", typed, "--run-dir", flat, *SMALL, "--no-entity-types", "--partitions", "2")
    Run(flat).export(tmp_path / "flat.pbg", format="pbg")
    import_pbg({"checkpoint": str(tmp_path / "flat.pbg"), "store": str(typed), "out": str(tmp_path / "back")})
    # One PBG entity type: the imported run is one table of every node, as the exported one was.
    back = Run(tmp_path / "back")
    assert back.meta["config"]["entity_types"] is False and "types" not in back.meta["partitioning"]
    for run, out in ((flat, "a"), (tmp_path / "back", "b")):
        Run(run).export(tmp_path / out)
    assert np.array_equal(np.load(tmp_path / "a" / "embeddings.npy"), np.load(tmp_path / "b" / "embeddings.npy"))
    assert back.evaluate("test")["metrics"]["mrr"] > 0.0


def test_a_served_typed_run_answers_each_query_with_its_own_type(typed, pinned_run, tmp_path, strata_cli):
    from serve_process import Server

    node = names(typed)
    server = Server(tmp_path / "state", "--embedding", f"films={pinned_run}", "--memory", "256M")
    try:
        with server.client() as c:
            info = c.status()["embeddings"][0]
            assert (info["partitions"], info["resident_partitions"]) == (2, 2)
            # One request, three answer types: films (likes), people (follows), genres (has_genre).
            heads = ["p3", "p7", "f5"]
            got = c.top_k("films", heads, [0, 1, 2], k=3)
            assert [q["name"] for q in got] == heads
            kinds = [{a["name"][0] for a in q["predictions"]} for q in got]
            assert kinds == [{"f"}, {"p"}, {"g"}], got
            want = json.loads(
                strata_cli("embed", "predict", pinned_run, "--head", "f5", "--relation", "2", "--top", "3",
                           "--json").stdout
            )["predictions"]  # fmt: skip
            assert [a["node"] for a in got[2]["predictions"]] == [a["node"] for a in want]
            assert np.allclose([a["score"] for a in got[2]["predictions"]], [a["score"] for a in want], rtol=1e-6)
            # Heads of (?, has_genre, genre) are films, read from the genres in the pinned region.
            got = c.top_k("films", ["g1"], 2, k=4, heads=True)
            assert {a["name"] for a in got[0]["predictions"]} <= {n for n in node if n.startswith("f")}
            # Neighbours are of each node's own type, as the CLI's; any_type searches them all.
            got = c.neighbors("films", ["p3", "g1"], k=3, metric="cos")
            assert [{a["name"][0] for a in q["neighbors"]} for q in got["results"]] == [{"p"}, {"g"}], got
            every = c.neighbors("films", ["p3"], k=60, any_type=True)["results"][0]["neighbors"]
            assert len({a["name"][0] for a in every}) > 1
    finally:
        server.stop()


def nearest_by_cos(emb: np.ndarray, q: int, candidates: range, top: int) -> list[int]:
    """The ``top`` candidates nearest to row ``q`` by cosine (``q`` left out), by brute force."""
    ids = np.array([c for c in candidates if c != q])
    rows = emb[ids] / np.linalg.norm(emb[ids], axis=1, keepdims=True)
    sims = rows @ (emb[q] / np.linalg.norm(emb[q]))
    return ids[np.argsort(-sims, kind="stable")[:top]].tolist()


def test_neighbours_are_of_the_query_nodes_own_type_unless_any_type(typed, pinned_run, tmp_path, strata_cli):
    from conftest import needs

    node = names(typed)
    kinds = {"p": range(PEOPLE), "f": range(PEOPLE, PEOPLE + FILMS), "g": range(PEOPLE + FILMS, len(node))}
    assert all(node[i][0] == k for k, ids in kinds.items() for i in ids)
    strata_cli("embed", "export", pinned_run, "--out", tmp_path / "emb")
    emb = np.load(tmp_path / "emb" / "embeddings.npy")
    p3, everyone = node.index("p3"), range(len(node))
    queries = ["p3", "f5", "g1", "p7", "f30"]
    got = Run(pinned_run).neighbors(queries, top=3, metric="cos")
    assert [q["name"] for q in got["results"]] == queries
    for q in got["results"]:
        want = nearest_by_cos(emb, q["node"], kinds[q["name"][0]], 3)
        assert [a["node"] for a in q["neighbors"]] == want, (q, want)
    # --any-type through the CLI: the nearest of every node, whatever its type.
    out = json.loads(
        strata_cli("embed", "neighbors", pinned_run, "--node", "p3", "--top", "8", "--metric", "cos", "--any-type",
                   "--json").stdout
    )  # fmt: skip
    assert [a["node"] for a in out["results"][0]["neighbors"]] == nearest_by_cos(emb, p3, everyone, 8)
    # The approximate index keeps one graph per type and answers within the type the same way.
    needs("usearch")
    strata_cli("embed", "index", pinned_run, "--out", tmp_path / "idx", "--metric", "cos")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert [p["name"] for p in meta["parts"]] == ["person", "film", "genre"]
    out = json.loads(
        strata_cli("embed", "neighbors", pinned_run, "--index", tmp_path / "idx", "--node", "g1", "--node", "f5",
                   "--top", "3", "--json").stdout
    )  # fmt: skip
    assert [{a["name"][0] for a in q["neighbors"]} for q in out["results"]] == [{"g"}, {"f"}], out
    assert [a["node"] for a in out["results"][0]["neighbors"]] == nearest_by_cos(emb, node.index("g1"), kinds["g"], 3)
    out = json.loads(
        strata_cli("embed", "neighbors", pinned_run, "--index", tmp_path / "idx", "--node", "p3", "--top", "8",
                   "--any-type", "--json").stdout
    )  # fmt: skip
    assert [a["node"] for a in out["results"][0]["neighbors"]] == nearest_by_cos(emb, p3, everyone, 8)


def test_featurized_films_are_the_mean_of_their_words(typed, tmp_path):
    run = train(
        store=typed, run_dir=tmp_path / "feat", dim=16, chunk_size=100, negatives=32, epochs=3,
        featurized=["film"], entity_partitions=["person=2"], buffer=2, ordering="sequential",
    )  # fmt: skip
    meta = json.loads((tmp_path / "feat" / "run.json").read_text())
    # The films' words are the pinned region's rows (genres are partitioned as people are).
    assert meta["layout"]["pinned"] == {"region": 2, "rows": WORDS}
    assert run.test["mrr"] > 0.05, run.test
    run.export(tmp_path / "emb", format="npy")
    emb = np.load(tmp_path / "emb" / "embeddings.npy")
    node = names(typed)
    first, last = node.index("f0"), node.index(f"f{FILMS - 1}")
    # Two films with the same bag have the same embedding; films differ otherwise.
    assert np.array_equal(emb[first], emb[last])
    assert not np.array_equal(emb[first], emb[node.index("f1")])
    # Evaluating the finished run reads the films through their words as training did.
    best = meta["best"]["epoch"]
    again = Run(tmp_path / "feat").evaluate("valid")["metrics"]
    assert again["mrr"] == pytest.approx(meta["history"][best - 1]["valid"]["mrr"], abs=1e-9)
    sampled = Run(tmp_path / "feat").evaluate("test", protocol="sampled")["metrics"]
    assert 0.0 < sampled["mrr"] <= 1.0 and sampled["protocol"] == "sampled"


def test_a_bf16_typed_run_reads_its_pinned_features_widened(typed, tmp_path, strata_cli):
    run = train(
        store=typed, run_dir=tmp_path / "half", dim=16, chunk_size=100, negatives=32, epochs=3,
        featurized=["film"], entity_partitions=["person=2"], buffer=2, ordering="sequential",
        table_dtype="bf16",
    )  # fmt: skip
    meta = json.loads((tmp_path / "half" / "run.json").read_text())
    assert meta["layout"]["dtype"] == "bf16" and meta["layout"]["pinned"] == {"region": 2, "rows": WORDS}
    assert run.test["mrr"] > 0.05, run.test
    run.export(tmp_path / "emb", format="npy")
    emb = np.load(tmp_path / "emb" / "embeddings.npy")
    node = names(typed)
    films = [i for i, n in enumerate(node) if n.startswith("f")]
    others = [i for i, n in enumerate(node) if not n.startswith("f")]
    # People and genres are bf16 rows widened (low 16 bits zero); films are means of widened words.
    assert not (emb[others].view(np.uint32) & 0xFFFF).any() and emb[others].any()
    assert np.array_equal(emb[node.index("f0")], emb[node.index(f"f{FILMS - 1}")])
    assert np.all(np.any(emb[films] != 0, axis=1))
    best = meta["best"]["epoch"]
    again = Run(tmp_path / "half").evaluate("valid")["metrics"]
    assert again["mrr"] == pytest.approx(meta["history"][best - 1]["valid"]["mrr"], abs=1e-9)
    got = json.loads(
        strata_cli("embed", "predict", tmp_path / "half", "--head", "p3", "--relation", "0", "--top", "5",
                   "--json").stdout
    )  # fmt: skip
    assert {r["name"][0] for r in got["predictions"]} == {"f"}, got


def test_typed_negatives_can_be_turned_off(typed, tmp_path, strata_cli):
    meta = json.loads(
        strata_cli(
            "embed", "train", typed, "--run-dir", tmp_path / "r", *SMALL, "--no-typed-negatives",
            "--no-typed-eval", "--json-summary",
        ).stdout
    )  # fmt: skip
    assert meta["config"]["typed_negatives"] is False and meta["test"]["mrr"] > 0.0


def test_options_entity_types_cannot_take_exit_2_naming_them(typed, kg, tmp_path, strata_cli, capsys):
    def refused(store: Path, *args: str) -> str:
        # The command line in this process: the same parser, checks and exit code as a child's.
        code, out = in_process(["embed", "train", store, "--run-dir", tmp_path / "r", *SMALL, *args], capsys)
        assert code == 2 and "Traceback" not in out, out
        assert not (tmp_path / "r").exists()
        return out

    # One refusal in a child process: its exit status and stderr.
    args = ["--run-dir", tmp_path / "r", *SMALL, "--entity-partitions", "actor=2"]
    proc = strata_cli("embed", "train", typed, *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "embed.train.entity_partitions" in proc.stderr and not (tmp_path / "r").exists()
    assert "same number of partitions" in refused(typed, "--entity-partitions", "person=2", "film=3")
    assert "integer >= 1" in refused(typed, "--entity-partitions", "person=0")
    assert "embed.train.partitions" in refused(typed, "--entity-partitions", "person=2", "--partitions", "3")
    assert "no feature bags" in refused(typed, "--featurized", "person")
    assert "unpartitioned" in refused(typed, "--featurized", "film", "--entity-partitions", "film=2")
    assert "no node types" in refused(kg, "--entity-partitions", "x=1")
    assert "entity_types is false" in refused(typed, "--no-entity-types", "--featurized", "film")
    # Featurized types do not combine with --init-from yet (their rows are features).
    base = tmp_path / "base"
    strata_cli("embed", "train", typed, "--run-dir", base, *SMALL)
    assert "featurized" in refused(typed, "--init-from", str(base), "--featurized", "film")


def test_init_from_carries_rows_into_an_unpartitioned_type(typed, pinned_run, tmp_path, strata_cli):
    """A run of one partition seeds a run whose genres are held in memory (the pinned region),
    and that run seeds one of one partition again: every node's row is carried."""

    def table(run: Path) -> np.ndarray:
        out = run.parent / (run.name + "-npy")
        strata_cli("embed", "export", run, "--out", out, "--overwrite", "-q")
        return np.load(out / "embeddings.npy")

    runs = [pinned_run, tmp_path / "one", tmp_path / "back"]
    for origin, run, extra in [
        (runs[0], runs[1], ["--partitions", "1"]),
        (runs[1], runs[2], ["--entity-partitions", "person=2", "film=2", "genre=1", "--buffer", "2",
                            "--ordering", "sequential"]),
    ]:  # fmt: skip
        # lr 1e-9: the epoch moves a row by some 1e-9 a real, so the seeded run holds its origin.
        strata_cli("embed", "train", typed, "--run-dir", run, "--init-from", origin, *SMALL[:-3], "--epochs", "1",
                   "--lr", "1e-9", "-q", *extra)  # fmt: skip
        np.testing.assert_allclose(table(run), table(origin), rtol=1e-6, atol=1e-7)
