"""`strata gnn train` on typed stores (docs/gnn.md, "Typed graphs"): rgcn and sage_hetero learn a
generated heterogeneous graph from disk, a node type without features trains through its
learned vector, and bad typed options exit 2 naming the option."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import in_process
from conftest import needs, run_strata, save_aligned

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_train_typed")

needs("torch")

SIZES = ["--papers", 800, "--authors", 1000, "--institutions", 40, "--fields", 80, "--classes", 4]
COMMON = ["--fanouts", "5,5", "--batch-size", "128", "--hidden", "32", "--device", "cpu", "--torch-threads", "1"]


@pytest.fixture(scope="module")
def mag(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("typed") / "mag.strata"
    run_strata("generate", "hetsbm", "--out", out, *SIZES, "--feature-dim", 16, "--paper-feature-noise", 2.0, "-q")
    return out


def without_features(store: Path, node_type: int, out: Path) -> Path:
    """A copy of ``store`` whose node type ``node_type`` has no features (manifest and file)."""
    shutil.copytree(store, out)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["node_types"][node_type]["features"]
    entry = manifest["arrays"].pop(f"features_t{node_type}")
    (out / entry["file"]).unlink()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def with_author_labels(store: Path, out: Path) -> Path:
    """A copy of ``store`` where authors have labels too (all class 0)."""
    shutil.copytree(store, out)
    manifest = json.loads((out / "manifest.json").read_text())
    count = manifest["node_types"][1]["count"]
    manifest["node_types"][1]["labels"] = {"num_classes": 4}
    manifest["arrays"]["labels_t1"] = {"file": "labels_t1.npy", "dtype": "int32", "shape": [count]}
    save_aligned(out / "labels_t1.npy", np.zeros(count, dtype=np.int32))
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_rgcn_learns_from_disk_and_reports_the_run(mag, tmp_path):
    run = tmp_path / "run"
    proc = run_strata("gnn", "train", mag, "--model", "rgcn", "--epochs", "4", "--run-dir", run, *COMMON)
    record = json.loads((run / "run.json").read_text())
    assert record["test"]["accuracy"] > 0.6, proc.stdout  # 4 classes: chance is about 0.25
    assert record["plan"]["target_type"] == "paper" and record["plan"]["topology"] > 0
    assert record["plan"]["fanouts"]["author:writes:paper"] == [5, 5]
    last = record["history"][-1]
    tiers = last["pipeline"]["tiers"]
    # Every sampled row of a featured type is read from its file: 16 float32 per row.
    assert tiers["disk_rows"] == tiers["rows"] > 0 and tiers["disk_bytes_read"] == 64 * tiers["rows"]
    assert last["sampled_nodes_per_second"] > 0 and len((run / "metrics.jsonl").read_text().splitlines()) == 4
    parts = {p["name"]: p["bytes"] for p in record["memory_plan"]["parts"]}
    assert parts["topology"] == record["plan"]["topology"] and parts["runtime"] > 0
    assert parts["batches"] == record["plan"]["batches"] > 0 and parts["training"] == record["plan"]["training"] > 0
    assert record["memory_plan"]["minimum"] == sum(parts.values())
    assert "typed store: classify paper nodes" in proc.stdout + proc.stderr
    assert "test accuracy" in proc.stdout


def test_sage_hetero_with_a_fanout_table_and_a_featureless_type(mag, tmp_path):
    store = without_features(mag, 1, tmp_path / "no-author-features.strata")
    run = tmp_path / "run"
    table = "paper:cites:paper=3,3;author:writes:paper=0,5"
    proc = run_strata(
        "gnn", "train", store, "--model", "sage_hetero", "--epochs", "4", "--run-dir", run,
        "--edge-fanouts", table, *COMMON,
    )  # fmt: skip
    record = json.loads((run / "run.json").read_text())
    assert record["test"]["accuracy"] > 0.6, proc.stdout
    assert record["plan"]["features"]["author"] is None
    assert record["plan"]["fanouts"]["paper:cites:paper"] == [3, 3]
    assert record["plan"]["fanouts"]["author:writes:paper"] == [0, 5]
    assert "node type author: no features: one learned vector" in proc.stdout + proc.stderr


def test_bad_typed_options_exit_2_naming_the_option(mag, capsys):
    # The command line in this process, which has imported torch already (a child would import
    # it again; tests/test_gnn_train.py checks a child's exit status); the other refusals are
    # checked through the API below.
    args = ["--edge-fanouts", "paper:wrote:paper=5,5"]
    code, out = in_process(["gnn", "train", mag, "--model", "rgcn", "--epochs", "1", *args], capsys)
    assert code == 2, out
    assert "gnn.train.edge_fanouts: unknown edge type(s) paper:wrote:paper" in out and "Traceback" not in out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"edge_fanouts": {"paper:cites:paper": [5]}}, "gnn.train.edge_fanouts: paper:cites:paper must have 2"),
        ({"edge_fanouts": "paper:cites"}, "gnn.train.edge_fanouts: expected src:rel:dst=F,F"),
        ({"edge_fanouts": {"paper:cites": [5, 5]}}, "gnn.train.edge_fanouts: expected keys like"),
        ({"target_type": "venue"}, "gnn.train.target_type: .* has no node type 'venue'"),
        ({"target_type": "author"}, "gnn.train.target_type: node type 'author'"),
        ({"model": "sage"}, "gnn.train.model: .* it trains rgcn or sage_hetero"),
        ({"feature_codec": "int8"}, "gnn.train.feature_codec: .* is a typed store"),
    ],
)
def test_bad_typed_options_in_process(mag, options, message):
    from strata.errors import ConfigError
    from strata.gnn.train import train

    with pytest.raises(ConfigError, match=message):
        train(store=mag, **{"model": "rgcn", "epochs": 1, **options})


def test_the_target_type_must_be_named_when_several_have_labels(mag, tmp_path):
    from strata.errors import ConfigError
    from strata.gnn.typed import target_type
    from strata.store import Store

    store = Store(with_author_labels(mag, tmp_path / "two-labelled.strata"))
    with pytest.raises(ConfigError, match=r"gnn.train.target_type: .* labels for several node types \(paper, author\)"):
        target_type(store, None)
    assert target_type(store, "author") == 1 and target_type(Store(mag), None) == 0


def test_the_plan_sizes_batches_no_smaller_than_training_makes_them(mag):
    from strata.gnn.typed import BATCHES_ALIVE, TypedGnnData, fanout_dict
    from strata.store import Store

    fanouts = fanout_dict(Store(mag), [5, 5], None)
    data = TypedGnnData(mag, 0, fanouts, batch_size=128, memory=8 << 30, seed=3, threads=1)
    shape = data._largest_batch()
    loader = data.loader("train", epoch=1)
    try:
        for batch in loader:
            assert len(batch.nodes) <= shape.nodes
            for block, (src, dst, edges) in zip(batch.blocks, shape.blocks, strict=True):
                assert block.num_src <= src and block.num_dst <= dst and len(block.src) <= edges
    finally:
        loader.close()
    assert data.plan["batches"] == BATCHES_ALIVE * shape.bytes() and data.plan["training"] == 0
    costs = {"fixed_bytes": 100, "layers": [{"src_row": 1, "dst_row": 10, "edge": 100}] * 2}
    (s0, d0, e0), (s1, d1, e1) = shape.blocks
    assert shape.training_bytes(costs) == 100 + s0 + 10 * d0 + 100 * e0 + s1 + 10 * d1 + 100 * e1


def test_fanouts_the_budget_cannot_train_are_refused_before_an_epoch(mag, tmp_path):
    from strata.errors import ConfigError
    from strata.gnn.train import train

    run = tmp_path / "deep"
    with pytest.raises(ConfigError, match=r"gnn\.train\.memory: budget 1\.00 GiB cannot hold .* batches alive at once "
                       r".* and training one .* lower --batch-size, the fanouts"):  # fmt: skip
        train(store=mag, model="rgcn", epochs=1, fanouts=[-1] * 4, hidden=1024, memory="1G", run_dir=run)
    assert not run.exists()
