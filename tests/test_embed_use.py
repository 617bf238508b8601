"""Using a trained embedding run: `strata embed neighbors`, `score` and `export --format parquet`,
checked against NumPy on the run's own npy export (a partitioned run scanned through a buffer
smaller than the table), with bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import strata_in_process
from conftest import needs, run_strata, without
from strata.embed import Run
from strata.errors import ConfigError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_use")

TRAIN = ["--epochs", "1", "--dim", "16", "--chunk-size", "200", "--negatives", "64", "-q"]


@pytest.fixture(scope="module")
def trained(kg, tmp_path_factory):
    """A DistMult run of 6 partitions, 3 resident at a time, and its npy export."""
    d = tmp_path_factory.mktemp("use")
    run_strata("embed", "train", kg, "--run-dir", d / "run", "--partitions", "6", "--buffer", "3",
               "--model", "distmult", *TRAIN)  # fmt: skip
    run_strata("embed", "export", d / "run", "--out", d / "npy", "-q")
    emb = np.load(d / "npy" / "embeddings.npy")
    rels = np.load(d / "npy" / "relations.npy")
    names = (d / "npy" / "node_names.txt").read_text().splitlines()
    rel_names = (d / "npy" / "relation_names.txt").read_text().splitlines()
    return d / "run", emb, rels, names, rel_names


def brute_force(emb: np.ndarray, q: int, metric: str, k: int) -> tuple[list[int], np.ndarray]:
    """The k nearest rows of row q (itself left out), nearest first (ties: lower id), and their
    similarity (cos, dot) or distance (l2)."""
    x = emb.astype(np.float64)
    if metric == "dot":
        key = x @ x[q]
    elif metric == "cos":
        key = (x @ x[q]) / (np.linalg.norm(x, axis=1) * np.linalg.norm(x[q]))
    else:
        key = -np.linalg.norm(x - x[q], axis=1)
    key[q] = -np.inf
    order = np.lexsort((np.arange(len(x)), -key))[:k]
    return list(order), (-key[order] if metric == "l2" else key[order])


@pytest.mark.parametrize("metric", ["cos", "dot", "l2"])
def test_neighbors_match_numpy_brute_force(trained, strata_cli, metric):
    """Three query nodes share one scan of 6 partitions through a 3-partition buffer; each list
    equals NumPy's on the exported table."""
    run, emb, _, names, _ = trained
    queries = [names[3], names[150], names[399]]
    args = ["--node", *queries, "--top", "7", "--metric", metric, "--json", "-q"]
    result = json.loads(strata_cli("embed", "neighbors", run, *args).stdout)
    assert result["metric"] == metric and result["scans"] == 1
    assert result["partitions_read"] == 6, "each of the 6 partitions is read once through 3 slots"
    assert [r["name"] for r in result["results"]] == queries
    for r in result["results"]:
        want, values = brute_force(emb, r["node"], metric, 7)
        got = [n["node"] for n in r["neighbors"]]
        assert got == want, (metric, r["name"])
        assert [n["name"] for n in r["neighbors"]] == [names[i] for i in want]
        assert np.allclose([n["score"] for n in r["neighbors"]], values, rtol=1e-4, atol=1e-4)


def test_neighbors_python_api_default_metric_and_nodes_file(trained, tmp_path):
    run, emb, _, names, _ = trained
    (tmp_path / "nodes.txt").write_text(f"{names[10]}\n\n{names[20]}\n")
    r = Run(run).neighbors(names[5], top=3, nodes_file=tmp_path / "nodes.txt")
    assert r["metric"] == "cos", "DistMult compares directions"
    assert [q["node"] for q in r["results"]] == [5, 10, 20]
    assert [n["node"] for n in r["results"][1]["neighbors"]] == brute_force(emb, 10, "cos", 3)[0]
    text = Run(run).neighbors(names[7], top=2, metric="l2")["results"][0]
    assert text["name"] == names[7] and len(text["neighbors"]) == 2


def test_neighbors_bad_inputs(trained, strata_cli, tmp_path, capsys):
    cli = strata_in_process(capsys)  # the commands after the first: in this process
    run, _, _, names, _ = trained
    none = strata_cli("embed", "neighbors", run, check=False)
    assert none.returncode == 2 and "--node" in none.stderr
    unknown = cli("embed", "neighbors", run, "--node", "no-such-node", check=False)
    assert unknown.returncode == 2 and "node 'no-such-node' is not in store" in unknown.stderr
    assert "embedding table" not in unknown.stdout + unknown.stderr, "refused before the plan is shown"
    (tmp_path / "nodes.txt").write_text(f"{names[1]}\nnope\n")
    in_file = cli("embed", "neighbors", run, "--nodes-file", tmp_path / "nodes.txt", check=False)
    assert in_file.returncode == 2 and "nodes.txt line 2" in in_file.stderr and "'nope'" in in_file.stderr
    metric = cli("embed", "neighbors", run, "--node", names[1], "--metric", "l1", check=False)
    assert metric.returncode == 2 and "metric" in metric.stderr
    zero = cli("embed", "neighbors", run, "--node", names[1], "--top", "0", check=False)
    assert zero.returncode == 2 and "top" in zero.stderr


def test_score_matches_distmult_by_hand_in_input_order(trained, strata_cli, tmp_path):
    run, emb, rels, names, rel_names = trained
    triples = [
        (names[7], rel_names[2], names[9]),
        (names[0], rel_names[5], names[399]),
        (names[9], rel_names[2], names[7]),
    ]
    lines = ["# head relation tail", *("\t".join(t) for t in triples)]
    (tmp_path / "t.tsv").write_text("\n".join(lines) + "\n")
    printed = strata_cli("embed", "score", run, tmp_path / "t.tsv", "-q").stdout.splitlines()
    strata_cli("embed", "score", run, tmp_path / "t.tsv", "--out", tmp_path / "s.tsv", "-q")
    written = (tmp_path / "s.tsv").read_text().splitlines()
    assert printed == written and len(written) == 3
    index = {n: i for i, n in enumerate(names)}
    rindex = {n: i for i, n in enumerate(rel_names)}
    for line, (h, r, t) in zip(written, triples, strict=True):
        fields = line.split("\t")
        assert fields[:3] == [h, r, t]
        # DistMult: sum_k h_k r_k t_k.
        want = float(np.sum(emb[index[h]] * rels[rindex[r]] * emb[index[t]]))
        assert float(fields[3]) == pytest.approx(want, rel=1e-4, abs=1e-5)
    api = Run(run).score(triples)
    assert api == pytest.approx([float(line.split("\t")[3]) for line in written], rel=1e-6)


def test_score_bad_inputs_name_line_and_field(trained, kg, strata_cli, tmp_path, capsys):
    cli = strata_in_process(capsys)  # the commands after the first: in this process
    run, _, _, names, rel_names = trained
    (tmp_path / "bad.tsv").write_text(f"{names[1]}\t{rel_names[0]}\t{names[2]}\n{names[1]}\tno-rel\t{names[2]}\n")
    bad = strata_cli("embed", "score", run, tmp_path / "bad.tsv", "--out", tmp_path / "o.tsv", check=False)
    assert bad.returncode == 2 and "bad.tsv line 2, field relation" in bad.stderr and "no-rel" in bad.stderr
    assert not (tmp_path / "o.tsv").exists() and not list(tmp_path.glob(".o.tsv*")), "nothing half-written"
    (tmp_path / "short.tsv").write_text(f"{names[1]}\t{rel_names[0]}\n")
    short = cli("embed", "score", run, tmp_path / "short.tsv", check=False)
    assert short.returncode == 2 and "short.tsv line 1: expected 3 fields" in short.stderr
    missing = cli("embed", "score", run, tmp_path / "none.tsv", check=False)
    assert missing.returncode == 2 and "none.tsv" in missing.stderr
    with pytest.raises(ConfigError, match="triple 0, field tail"):
        Run(run).score([(names[1], rel_names[0], "nobody")])
    # --out: not a directory, not a file of a store or run (`--out STORE/manifest.json` replaced
    # the store's manifest); the input itself may be replaced, once its scores are complete.
    (tmp_path / "good.tsv").write_text(f"{names[1]}\t{rel_names[0]}\t{names[2]}\n")
    for out, message in [
        (tmp_path, "is a directory; give the path of a file"),
        (Path(kg) / "manifest.json", f"is a file of a store ({kg})"),
        (Path(run) / "run.json", f"is a file of a run ({run})"),
    ]:
        before = out.read_bytes() if out.is_file() else None
        refused = cli("embed", "score", run, tmp_path / "good.tsv", "--out", out, check=False)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert (out.read_bytes() if out.is_file() else None) == before
    cli("embed", "score", run, tmp_path / "good.tsv", "--out", tmp_path / "good.tsv")
    assert (tmp_path / "good.tsv").read_text().count("\t") == 3


def test_parquet_export_equals_the_npy_export(trained, tmp_path, strata_cli):
    pq = needs("pyarrow.parquet")
    run, emb, rels, names, rel_names = trained
    strata_cli("embed", "export", run, "--out", tmp_path / "pq", "--format", "parquet", "-q")
    table = pq.read_table(tmp_path / "pq" / "embeddings.parquet")
    assert table.column("id").to_pylist() == list(range(400))
    assert table.column("name").to_pylist() == names
    assert np.array_equal(np.array(table.column("embedding").to_pylist(), dtype=np.float32), emb)
    relations = pq.read_table(tmp_path / "pq" / "relations.parquet")
    assert relations.column("name").to_pylist() == rel_names + [f"{r}_inverse" for r in rel_names]
    assert np.array_equal(np.array(relations.column("embedding").to_pylist(), dtype=np.float32), rels)
    meta = json.loads((tmp_path / "pq" / "export.json").read_text())
    assert meta["file_format"] == "parquet" and "embeddings.parquet" in meta["files"]


def test_parquet_export_without_pyarrow_says_how_to_install(trained, tmp_path, monkeypatch):
    without(monkeypatch, "pyarrow")
    with pytest.raises(ConfigError, match=r"pip install pyarrow"):
        Run(trained[0]).export(tmp_path / "x", format="parquet")
    assert not Path(tmp_path / "x").exists()


def test_index_recall_against_the_exact_scan(trained, strata_cli, tmp_path):
    needs("usearch")
    from strata.embed import ann

    run, _, _, names, _ = trained
    built = json.loads(strata_cli("embed", "index", run, "--out", tmp_path / "idx", "--json-summary", "-q").stdout)
    assert built["metric"] == ann.natural_metric(Run(run)) == Run(run).neighbors(names[0], top=1)["metric"] == "cos"
    queries = [names[3], names[150], names[399]]
    args = ["--node", *queries, "--top", "10", "--json", "-q"]
    approx = json.loads(strata_cli("embed", "neighbors", run, *args, "--index", tmp_path / "idx").stdout)
    exact = json.loads(strata_cli("embed", "neighbors", run, *args).stdout)
    hits = 0
    for a, e in zip(approx["results"], exact["results"], strict=True):
        assert a["name"] == e["name"] and len(a["neighbors"]) == 10
        assert a["node"] not in [n["node"] for n in a["neighbors"]]
        truth = {n["node"]: n["score"] for n in e["neighbors"]}
        hits += sum(n["node"] in truth for n in a["neighbors"])
        for n in a["neighbors"]:
            if n["node"] in truth:
                assert n["score"] == pytest.approx(truth[n["node"]], abs=1e-4)
    # 400 nodes and 128 candidates per search: the HNSW search is close to exhaustive.
    assert hits / 30 >= 0.9
    one = ann.Index(tmp_path / "idx").search(names[3], top=4)["results"]
    assert len(one) == 1 and [n["node"] for n in one[0]["neighbors"]] == [
        n["node"] for n in approx["results"][0]["neighbors"][:4]
    ]


def test_index_bad_inputs(trained, kg, strata_cli, tmp_path, monkeypatch, capsys):
    cli = strata_in_process(capsys)  # the commands after the first: in this process
    needs("usearch")
    from strata.embed import ann

    run, _, _, names, _ = trained
    strata_cli("embed", "index", run, "--out", tmp_path / "idx", "--metric", "l2", "-q")
    again = cli("embed", "index", run, "--out", tmp_path / "idx", check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    replaced = cli("embed", "index", run, "--out", tmp_path / "idx", "--metric", "l2", "--overwrite", check=False)
    assert replaced.returncode == 0, replaced.stderr
    own = cli("embed", "index", run, "--out", run, "--overwrite", check=False)
    assert own.returncode == 2 and "is not an earlier index (no index.json)" in own.stderr
    assert (run / "run.json").is_file()
    other = cli("embed", "neighbors", run, "--node", names[1], "--metric", "cos", "--index", tmp_path / "idx",
                check=False)  # fmt: skip
    assert other.returncode == 2 and "compares by l2, not cos" in other.stderr
    unknown = cli("embed", "neighbors", run, "--node", "nope", "--index", tmp_path / "idx", check=False)
    assert unknown.returncode == 2 and "node 'nope' is not in the index" in unknown.stderr
    not_index = cli("embed", "neighbors", run, "--node", names[1], "--index", tmp_path, check=False)
    assert not_index.returncode == 2 and "not a neighbour index" in not_index.stderr
    # Training on after the index was built: its answers were the older epoch's.
    fresh = tmp_path / "fresh"
    cli("embed", "train", kg, "--run-dir", fresh, "--model", "distmult", *TRAIN)
    cli("embed", "index", fresh, "--out", tmp_path / "idx1", "-q")
    cli("embed", "train", kg, "--run-dir", fresh, "--model", "distmult", *TRAIN, "--epochs", "2")
    stale = cli("embed", "neighbors", fresh, "--node", names[1], "--index", tmp_path / "idx1", check=False)
    assert stale.returncode == 2 and "holds epoch 1, but the run's best checkpoint is epoch 2" in stale.stderr
    without(monkeypatch, "usearch")
    with pytest.raises(ConfigError, match=r"pip install usearch"):
        ann.build_index(Run(run), tmp_path / "idx2")
    assert not (tmp_path / "idx2").exists()
