"""A bf16 node table (`[embed.train] table_dtype = "bf16"`) through the CLI: half the table
bytes, training that learns, and every reader (eval, predict, export, PBG export, neighbors,
strata serve, --init-from) widening it to float32; bad values and a resume with another dtype
refused cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_strata

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_bf16")

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "-q"]


def region_bytes(layout: dict, value_bytes: int) -> int:
    """A partition region's bytes (docs/formats.md, "Embedding run tables")."""
    raw = layout["rows"] * (layout["dim"] + layout["state_per_row"]) * value_bytes
    return -(-raw // 4096) * 4096


@pytest.fixture(scope="module")
def bf16_run(kg, tmp_path_factory):
    run = tmp_path_factory.mktemp("bf16") / "run"
    args = ["--run-dir", run, "--epochs", "3", "--partitions", "5", "--buffer", "3", "--table-dtype", "bf16"]
    meta = json.loads(run_strata("embed", "train", kg, *args, *SMALL, "--json-summary").stdout)
    return run, meta


def test_bf16_table_is_half_the_bytes_and_learns(bf16_run):
    run, meta = bf16_run
    layout = meta["layout"]
    assert layout["dtype"] == "bf16"
    parts = meta["partitioning"]["partitions"]
    assert (run / meta["current"]["table"]).stat().st_size == parts * region_bytes(layout, 2)
    # 400 candidates: a random ranking has an MRR near 0.015 (the f32 test reaches 0.2 too).
    assert meta["test"]["mrr"] > 0.2, meta["test"]


def test_bf16_readers_see_the_widened_values(bf16_run, tmp_path, strata_cli):
    run, meta = bf16_run
    strata_cli("embed", "export", run, "--out", tmp_path / "npy", "-q")
    emb = np.load(tmp_path / "npy" / "embeddings.npy")
    assert emb.dtype == np.float32 and emb.shape == (400, 16)
    # Widened bf16 values: the low 16 bits of every float are zero.
    assert not (emb.view(np.uint32) & 0xFFFF).any() and emb.any()
    got = json.loads(strata_cli("embed", "eval", run, "--json", "--split", "test", "-q").stdout)
    assert got["metrics"]["mrr"] == pytest.approx(meta["test"]["mrr"], abs=1e-9)
    names = (tmp_path / "npy" / "node_names.txt").read_text().splitlines()
    near = json.loads(
        strata_cli(
            "embed", "neighbors", run, "--node", names[5], "--top", "3", "--metric", "dot", "--json", "-q"
        ).stdout
    )
    key = emb @ emb[5]
    key[5] = -np.inf
    assert [n["node"] for n in near["results"][0]["neighbors"]] == list(np.lexsort((np.arange(400), -key))[:3])


def test_bf16_pbg_export_and_serving_read_the_widened_rows(bf16_run, tmp_path, strata_cli):
    h5py = pytest.importorskip("h5py")
    from serve_process import Server
    from strata.embed import Run

    run, meta = bf16_run
    Run(run).export(tmp_path / "npy")
    emb = np.load(tmp_path / "npy" / "embeddings.npy")
    names = (tmp_path / "npy" / "node_names.txt").read_text().splitlines()
    rels = (tmp_path / "npy" / "relation_names.txt").read_text().splitlines()
    index = {n: i for i, n in enumerate(names)}
    # The PBG checkpoint holds the widened rows, float32, under the entities' names.
    Run(run).export(tmp_path / "pbg", format="pbg")
    seen = 0
    for p in range(meta["partitioning"]["partitions"]):
        part = json.loads((tmp_path / "pbg" / f"entity_names_all_{p}.json").read_text())
        with h5py.File(tmp_path / "pbg" / f"embeddings_all_{p}.v1.h5", "r") as f:
            rows = f["embeddings"][...]
        assert rows.dtype == np.float32 and np.array_equal(rows, emb[[index[n] for n in part]])
        seen += len(part)
    assert seen == len(names)
    # A served bf16 run answers as the CLI does.
    server = Server(tmp_path / "state", "--embedding", f"half={run}", "--memory", "256M")
    try:
        with server.client() as c:
            got = c.top_k("half", [names[3]], rels[1], k=5)[0]["predictions"]
    finally:
        server.stop()
    want = json.loads(
        strata_cli("embed", "predict", run, "--head", names[3], "--relation", rels[1], "--top", "5", "--json").stdout
    )["predictions"]
    assert [a["node"] for a in got] == [a["node"] for a in want]
    assert np.allclose([a["score"] for a in got], [a["score"] for a in want], rtol=1e-6)


def test_init_from_converts_between_dtypes(kg, bf16_run, tmp_path, strata_cli):
    run, _ = bf16_run
    wide = tmp_path / "wide"
    meta = json.loads(
        strata_cli(
            "embed",
            "train",
            kg,
            "--run-dir",
            wide,
            "--epochs",
            "1",
            "--eval-every",
            "0",
            "--init-from",
            run,
            *SMALL,
            "--json-summary",
        ).stdout
    )
    assert meta["layout"]["dtype"] == "f32"


def test_bad_table_dtypes_are_refused(kg, bf16_run, tmp_path, strata_cli):
    run, _ = bf16_run
    bad = strata_cli(
        "embed", "train", kg, "--run-dir", tmp_path / "r", "-p", "embed.train.table_dtype=fp8", check=False
    )
    assert bad.returncode == 2 and "embed.train.table_dtype" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "r").exists()
    other = strata_cli(
        "embed",
        "train",
        kg,
        "--run-dir",
        run,
        "--epochs",
        "4",
        "--partitions",
        "5",
        *SMALL,
        check=False,
    )
    assert other.returncode == 2 and "different embed.train.table_dtype" in other.stderr
