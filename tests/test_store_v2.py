"""Store format 2 end to end: a typed, weighted and timestamped graph converted through the CLI
and read through NumPy and ``strata.Store``; plain stores still version 1; each bad input
refused with file, line and field, exit 2 and no store (docs/formats.md, "Version 2")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata, typed_text_inputs
from strata.errors import StoreFormatError
from strata.store import Store, check_store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_store_v2")

NODE_TYPES = "paper\t4\nauthor\t2\n"
EDGE_TYPES = "paper\tcites\tpaper\nauthor\twrites\tpaper\n"
EDGES = "0,cites,1,0.5,100\n4,writes,1,2.0,10\n2,cites,1,1.5,50\n5,writes,0,1.0,20\n3,cites,0,0.25,-5\n"
COLUMNS = "src,rel,dst,weight,time"


def inputs(d: Path, edges: str = EDGES, node_types: str = NODE_TYPES, edge_types: str = EDGE_TYPES):
    return typed_text_inputs(d, edges, node_types, edge_types)


@pytest.fixture(scope="module")
def typed(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("typed")
    types = inputs(d)
    run_strata("convert", d / "edges.csv", "--columns", COLUMNS, *types, "--out", d / "cit.strata", "-q")
    return d / "cit.strata"


def test_typed_store_reads_through_numpy(typed):
    m = json.loads((typed / "manifest.json").read_text())
    assert m["format_version"] == 2
    assert m["node_types"] == [
        {"name": "paper", "offset": 0, "count": 4},
        {"name": "author", "offset": 4, "count": 2},
    ]
    assert m["edge_types"][1] == {"src_type": 1, "relation": "writes", "dst_type": 0}
    assert m["edge_attributes"] == {"weights": True, "times": True}
    ld = lambda n: np.load(typed / f"{n}.npy", mmap_mode="r")  # noqa: E731
    np.testing.assert_array_equal(ld("edges_train"), [[0, 0, 1], [4, 1, 1], [2, 0, 1], [5, 1, 0], [3, 0, 0]])
    np.testing.assert_array_equal(ld("edge_weights_train"), np.array([0.5, 2.0, 1.5, 1.0, 0.25], np.float32))
    np.testing.assert_array_equal(ld("edge_times_train"), [100, 10, 50, 20, -5])
    # Paper 1's in-neighbours: the citing papers (type 0) before the author (type 1).
    np.testing.assert_array_equal(ld("csc_indptr"), [0, 2, 5, 5, 5, 5, 5])
    np.testing.assert_array_equal(ld("csc_indices"), [3, 5, 0, 2, 4])
    np.testing.assert_array_equal(ld("csc_etype"), [0, 1, 0, 0, 1])
    assert ld("csc_etype").dtype == np.uint8
    np.testing.assert_array_equal(ld("csc_eid"), [4, 3, 0, 2, 1])
    np.testing.assert_array_equal(ld("csc_times"), [-5, 20, 100, 50, 10])
    np.testing.assert_array_equal(ld("csr_eid"), [0, 2, 4, 1, 3])


def test_typed_store_through_the_python_api_and_check(typed, strata_cli):
    s = Store(typed)
    assert s.format_version == 2 and s.is_typed
    assert s.node_types == ["paper", "author"]
    assert s.edge_types == [("paper", "cites", "paper"), ("author", "writes", "paper")]
    np.testing.assert_array_equal(s.node_type_offsets, [0, 4, 6])
    np.testing.assert_array_equal(s.node_type_of([0, 3, 4, 5]), [0, 0, 1, 1])
    assert s.node_type_info("author")["offset"] == 4
    cols = s.topology_columns("csc")
    assert sorted(cols) == ["eid", "etype", "times", "weights"]
    assert isinstance(cols["weights"], np.memmap)
    np.testing.assert_array_equal(cols["weights"], np.array([0.25, 1.0, 0.5, 1.5, 2.0], np.float32))
    np.testing.assert_array_equal(s.edge_weights("train"), s.array("edge_weights_train"))
    assert s.type_array("features", "paper") is None
    assert s.edge_attributes == {"weights": True, "times": True}
    assert check_store(typed)["ok"]
    assert strata_cli("check", typed, "-q").returncode == 0
    info = strata_cli("info", typed).stdout
    assert "node type     author: ids 4..6" in info and "edge type 1   (author, writes, paper)" in info


def test_plain_stores_stay_version_1(tmp_path, strata_cli):
    (tmp_path / "e.tsv").write_text("0\t1\n1\t2\n2\t0\n")
    strata_cli("convert", tmp_path / "e.tsv", "--out", tmp_path / "g.strata", "-q")
    m = json.loads((tmp_path / "g.strata" / "manifest.json").read_text())
    assert m["format_version"] == 1
    assert not {"node_types", "edge_types", "edge_attributes"} & set(m)
    assert not any(k.endswith(("_eid", "_etype")) for k in m["arrays"])
    s = Store(tmp_path / "g.strata")
    assert not s.is_typed and s.node_types == [] and s.topology_columns("csr") == {}


def test_a_random_split_keeps_each_edge_with_its_weight_and_time(tmp_path, strata_cli):
    rows = [(u, v) for u in range(6) for v in range(6) if u != v]
    (tmp_path / "e.tsv").write_text("".join(f"{u}\t{v}\t{u * 10 + v}\t{-u * 100 - v}\n" for u, v in rows))
    out = tmp_path / "s.strata"
    strata_cli("convert", tmp_path / "e.tsv", "--columns", "src,dst,weight,time", "--split", "0.5,0.25,0.25",
               "--out", out, "-q")  # fmt: skip
    s = Store(out)
    assert sum(s.num_edges.values()) == len(rows)
    for split in ("train", "valid", "test"):
        e = s.edges(split)
        np.testing.assert_array_equal(s.edge_weights(split), e[:, 0] * 10 + e[:, 1])
        np.testing.assert_array_equal(s.edge_times(split), -e[:, 0] * 100 - e[:, 1])
    assert check_store(out)["ok"]


def test_a_weight_column_alone_makes_an_untyped_version_2_store(tmp_path, strata_cli):
    (tmp_path / "e.tsv").write_text("0\t1\t0.5\n1\t2\t1.5\n2\t0\t2\n")
    out = tmp_path / "w.strata"
    strata_cli("convert", tmp_path / "e.tsv", "--columns", "src,dst,weight", "--symmetrize", "--out", out, "-q")
    s = Store(out)
    assert s.format_version == 2 and not s.is_typed
    np.testing.assert_array_equal(s.array("csr_weights"), np.array([0.5, 2, 0.5, 1.5, 1.5, 2], np.float32))
    assert check_store(out)["ok"]


BAD_INPUTS = [
    ("0,cites,1,0.5,1\n0,cites,2,abc,1\n", None, None, ["edges.csv:2:", "weight 'abc' is not a number"]),
    ("0,cites,1,1e39,1\n", None, None, ["edges.csv:1:", "weight '1e39' is not a finite float32"]),
    ("0,cites,1,1,1.5\n", None, None, ["edges.csv:1:", "time '1.5' is not an integer"]),
    ("0,cites,1,1,99999999999999999999\n", None, None, ["time '99999999999999999999' is out of the int64 range"]),
    ("0,likes,1,1,1\n", None, None, ["edges.csv:1:", "unknown relation 'likes'"]),
    (
        "0,cites,1,1,1\n4,cites,1,1,1\n",
        None,
        None,
        ["edges.csv:2:", "'cites' is declared as (paper, cites, paper), but src 4 is a 'author' node (ids 4..6)"],
    ),
    ("0,writes,1,1,1\n", None, None, ["edges.csv:1:", "src 0 is a 'paper' node"]),
    ("0,cites,7,1,1\n", None, None, ["edges.csv:1:", "dst id 7 is out of range: num_nodes is 6"]),
    ("0,cites,1,1,1\n", None, "paper\tcites\tvenue\n", ["edge_types.tsv:1:", "'venue' is not a node type"]),
    ("0,cites,1,1,1\n", "paper\tfour\n", None, ["node_types.tsv:1:", "count 'four' of node type 'paper'"]),
]


@pytest.mark.parametrize(("edges", "node_types", "edge_types", "needles"), BAD_INPUTS)
def test_bad_typed_input_names_file_line_and_field(tmp_path, strata_cli, edges, node_types, edge_types, needles):
    types = inputs(tmp_path, edges, node_types or NODE_TYPES, edge_types or EDGE_TYPES)
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", tmp_path / "edges.csv", "--columns", COLUMNS, *types, "--out", out, "-q", check=False)
    assert proc.returncode == 2, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_typed_graphs_refuse_symmetrize(tmp_path, strata_cli):
    types = inputs(tmp_path)
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", tmp_path / "edges.csv", "--columns", COLUMNS, *types, "--symmetrize", "--out", out,
                      check=False)  # fmt: skip
    assert proc.returncode == 2 and "symmetrize: is not supported for typed graphs" in proc.stderr, proc.stderr
    assert not out.exists()


def test_open_names_the_manifest_field_at_fault(typed, tmp_path):
    bad = tmp_path / "bad.strata"
    shutil.copytree(typed, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["node_types"][1]["offset"] = 5
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(
        StoreFormatError, match=r"node_types\[1\] \('author'\) starts at id 5 but the types before it end at 4"
    ):
        Store(bad)
    m["node_types"][1]["offset"] = 4
    del m["arrays"]["csc_etype"]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreFormatError, match="lists no 'csc_etype' array"):
        Store(bad)
    report = check_store(bad)
    assert not report["ok"]
