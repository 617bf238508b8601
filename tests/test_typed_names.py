"""Typed text conversions whose edges hold node names, end to end through the CLI and
``strata.Store``: each node type's id range holds its names sorted, names are looked up within
a node type, the summary names the types, and every bad input exits 2 naming file, line and
field with no store left (docs/formats.md, "Node names in a typed store")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata, typed_text_inputs
from strata.store import Store, check_store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_typed_names")

NODE_TYPES = "paper\nauthor\n"
EDGE_TYPES = "paper\tcites\tpaper\nauthor\twrites\tpaper\n"
# "ann" is an author; "p2" is a paper and also an author's name.
EDGES = "p3,cites,p1,100\nann,writes,p1,10\np2,cites,p1,50\np2,writes,p3,20\n"
COLUMNS = "src,rel,dst,time"


def inputs(d: Path, edges: str = EDGES, node_types: str = NODE_TYPES, edge_types: str = EDGE_TYPES):
    return typed_text_inputs(d, edges, node_types, edge_types)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("typednames")
    types = inputs(d)
    proc = run_strata("convert", d / "edges.csv", "--columns", COLUMNS, *types, "--out", d / "g.strata")
    return d / "g.strata", proc.stdout


def test_each_type_holds_its_names_sorted(converted):
    path, _ = converted
    s = Store(path)
    assert s.is_typed and s.graph["node_names"]
    # Papers p1, p2, p3 take ids 0..3; authors ann, p2 take 3..5.
    assert [(t["name"], t["offset"], t["count"]) for t in s.manifest["node_types"]] == [
        ("paper", 0, 3),
        ("author", 3, 2),
    ]
    assert [s.node_name(i) for i in range(s.num_nodes)] == ["p1", "p2", "p3", "ann", "p2"]
    np.testing.assert_array_equal(s.edges("train"), [[2, 0, 0], [3, 1, 0], [1, 0, 0], [4, 1, 2]])
    np.testing.assert_array_equal(s.edge_times("train"), [100, 10, 50, 20])
    assert check_store(path)["ok"]


def test_names_are_looked_up_within_a_node_type(converted):
    s = Store(converted[0])
    assert s.node_id("p2", "paper") == 1
    assert s.node_id("p2", node_type="author") == 4
    assert s.node_id("ann") == 3
    assert s.node_id("ann", "paper") is None
    assert s.node_id("nobody") is None
    with pytest.raises(ValueError, match=r"'p2' names nodes of several node types \(paper, author\)"):
        s.node_id("p2")
    np.testing.assert_array_equal(s.node_type_of([4, 0, 3]), [1, 0, 1])
    # An id past the last node was the last type's, and -1 was type -1.
    for bad in ([5], [0, -1]):
        with pytest.raises(IndexError, match=rf"node id {bad[-1]} is out of range \(0..5\)"):
            s.node_type_of(bad)
    with pytest.raises(TypeError, match="nodes must be integer ids, got an array of float64"):
        s.node_type_of([0.5])
    with pytest.raises(ValueError, match="kind must be one of features, labels, node_train, node_valid, node_test"):
        s.type_array("label", "paper")


def test_the_summary_names_node_and_edge_types(converted):
    _, stdout = converted
    assert (
        "among 5 nodes of 2 types (paper 3, author 2) and 2 edge types (paper, cites, paper), "
        "(author, writes, paper) from 1 text input file"
    ) in stdout, stdout


def test_one_edge_type_needs_no_relation_column(tmp_path, strata_cli):
    types = inputs(tmp_path, "u1\tu2\nu2\tu3\n", "user\n", "user\tfollows\tuser\n")
    strata_cli("convert", tmp_path / "edges.csv", *types, "--out", tmp_path / "f.strata", "-q")
    s = Store(tmp_path / "f.strata")
    assert s.edge_types == [("user", "follows", "user")] and s.node_id("u3", "user") == 2


BAD_INPUTS = [
    ("p1,cites,p2,1\np1,likes,p2,1\n", None, None, ["edges.csv:2:", "unknown relation 'likes'"]),
    ("p1,cites,p2,1\np1,cites,,1\n", None, None, ["edges.csv:2:", "the dst field is empty"]),
    ("p1,cites,p2,x\n", None, None, ["edges.csv:1:", "time 'x' is not an integer"]),
    (None, "paper\t3\nauthor\n", None, ["node_types.tsv:2:", "node type 'author' lacks a count"]),
    (
        None,
        None,
        "paper\tcites\tpaper\nauthor\tcites\tpaper\n",
        ["edge_types.tsv: relation 'cites' names two edge types, (paper, cites, paper) and (author, cites, paper)"],
    ),
    (None, "paper\t3\nauthor\t2\n", None, ["option ids:", "node_types.tsv gives each node type a count", "hold names"]),
]


@pytest.mark.parametrize(("edges", "node_types", "edge_types", "needles"), BAD_INPUTS)
def test_bad_named_input_names_file_line_and_field(tmp_path, strata_cli, edges, node_types, edge_types, needles):
    types = inputs(tmp_path, edges or EDGES, node_types or NODE_TYPES, edge_types or EDGE_TYPES)
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", tmp_path / "edges.csv", "--columns", COLUMNS, *types, "--out", out, "-q", check=False)
    assert proc.returncode == 2, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_integer_ids_need_counts(tmp_path, strata_cli):
    types = inputs(tmp_path, "0,cites,1,5\n")
    proc = strata_cli("convert", tmp_path / "edges.csv", "--columns", COLUMNS, *types, "--ids", "int",
                      "--out", tmp_path / "o.strata", check=False)  # fmt: skip
    assert proc.returncode == 2 and "integer global ids need a NAME<TAB>COUNT line per node type" in proc.stderr
    assert not (tmp_path / "o.strata").exists()


def edge_files(d: Path, files: dict[str, str]) -> list[str]:
    """Writes one edge file per edge type ``"SRC:REL:DST": text``; returns the --edges-of specs."""
    specs = []
    for i, (triple, text) in enumerate(files.items()):
        (d / f"e{i}.tsv").write_text(text)
        specs.append(f"{triple}={d / f'e{i}.tsv'}")
    return specs


def test_one_file_per_edge_type_with_names(tmp_path, strata_cli):
    (tmp_path / "node_types.tsv").write_text(NODE_TYPES)
    specs = edge_files(tmp_path, {"author:writes:paper": "ann\tp1\np2\tp3\n", "paper:cites:paper": "p3\tp1\np2\tp1\n"})
    out = tmp_path / "g.strata"
    strata_cli("convert", "--edges-of", *specs, "--node-types", tmp_path / "node_types.tsv", "--out", out, "-q")
    s = Store(out)
    # Without --edge-types, the edge types are the files' in the order given.
    assert s.edge_types == [("author", "writes", "paper"), ("paper", "cites", "paper")]
    assert [s.node_name(i) for i in range(s.num_nodes)] == ["p1", "p2", "p3", "ann", "p2"]
    np.testing.assert_array_equal(s.edges("train"), [[3, 0, 0], [4, 0, 2], [2, 1, 0], [1, 1, 0]])
    assert check_store(out)["ok"]


def test_integer_ids_in_a_per_edge_type_file_are_local_to_their_node_type(tmp_path, strata_cli):
    types = inputs(tmp_path, "", "paper\t3\nauthor\t2\n")
    specs = edge_files(tmp_path, {"author:writes:paper": "0\t2\n1\t0\n", "paper:cites:paper": "2\t1\n"})
    out = tmp_path / "g.strata"
    strata_cli("convert", "--edges-of", *specs, *types, "--out", out, "-q")
    s = Store(out)
    assert s.edge_types == [("paper", "cites", "paper"), ("author", "writes", "paper")]
    # Author 0 is global id 3: the node types file's order, not the files'.
    np.testing.assert_array_equal(s.edges("train"), [[3, 1, 2], [4, 1, 0], [2, 0, 1]])


@pytest.mark.parametrize(
    ("files", "extra", "needles"),
    [
        ({"author:writes:paper": "0\t2\n2\t0\n"}, [], ["e0.tsv:2:", "src id 2 is out of range: node type 'author'"]),
        ({"author:writes:venue": "0\t1\n"}, [], ["edges_of:", "destination type 'venue' is not a node type"]),
        (
            {"author:likes:paper": "0\t1\n"},
            ["--edge-types", "{dir}/edge_types.tsv"],
            ["edge type (author, likes, paper) is not declared"],
        ),
        ({"author:writes:paper": "0\twrites\t1\n"}, ["--columns", "src,rel,dst"], ["hold no rel column"]),
        ({"author:writes": "0\t1\n"}, [], ["convert.edges_of: expected SRC_TYPE:RELATION:DST_TYPE=FILE"]),
    ],
)
def test_bad_per_edge_type_files_exit_2(tmp_path, strata_cli, files, extra, needles):
    inputs(tmp_path, "", "paper\t3\nauthor\t2\n")
    specs = edge_files(tmp_path, files)
    extra = [e.format(dir=tmp_path) for e in extra]
    out = tmp_path / "o.strata"
    proc = strata_cli("convert", "--edges-of", *specs, "--node-types", tmp_path / "node_types.tsv", *extra,
                      "--out", out, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr and not out.exists()
