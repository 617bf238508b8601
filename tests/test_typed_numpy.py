"""Typed NumPy conversion end to end: a directory in the typed layout through ``strata convert``,
OGB/PyG-style dicts through ``strata.convert.convert_dicts``, and OGB's heterogeneous raw layout
(ogbn-mag) through ``strata datasets`` from a local server; every store checked against NumPy
and by ``strata check``; bad inputs exit 2 naming the file, leaving no store."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_strata
from datasets_fixtures import FileServer, csv_lines, gz, write_zip
from strata.config import FetchConfig, load
from strata.convert import convert_dicts
from strata.datasets import ogb
from strata.datasets.download import extract
from strata.datasets.fetch import fetch
from strata.errors import ConfigError, InputError
from strata.store import Store, check_store

# Not in sorted order: the dict order is the id order.
COUNTS = {"paper": 30, "author": 20, "institution": 4}
ETYPES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("author", "affiliated_with", "institution")]


def graph(seed: int = 0) -> dict:
    """A small random typed graph as OGB/PyG-style dicts (local ids)."""
    rng = np.random.default_rng(seed)
    sizes = (60, 45, 25)
    edges = {
        et: np.stack([rng.integers(0, COUNTS[et[0]], e), rng.integers(0, COUNTS[et[2]], e)])
        for et, e in zip(ETYPES, sizes, strict=True)
    }
    labels = rng.integers(0, 5, COUNTS["paper"])
    labels[::7] = -1
    perm = rng.permutation(COUNTS["paper"])
    return {
        "num_nodes_dict": dict(COUNTS),
        "edge_index_dict": edges,
        "node_feat_dict": {
            "paper": rng.standard_normal((30, 8)).astype(np.float32),
            "author": rng.standard_normal((20, 3)),
        },
        "node_label_dict": {"paper": labels},
        "split_dict": {"train": {"paper": perm[:15]}, "valid": {"paper": perm[15:20]}, "test": {"paper": perm[20:]}},
        "edge_weight_dict": {et: rng.random(e).astype(np.float32) for et, e in zip(ETYPES, sizes, strict=True)},
        "edge_time_dict": {et: rng.integers(-1000, 1000, e) for et, e in zip(ETYPES, sizes, strict=True)},
    }


def write_typed_dir(d, g: dict) -> None:
    """``g`` in the typed NumPy directory layout (docs/convert.md), edge arrays alternating
    between (2, E) and (E, 2)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "node_types.tsv").write_text("".join(f"{n}\t{c}\n" for n, c in g["num_nodes_dict"].items()))
    (d / "edge_types.tsv").write_text("".join(f"{s}\t{r}\t{t}\n" for s, r, t in g["edge_index_dict"]))
    for k, (et, e) in enumerate(g["edge_index_dict"].items()):
        np.save(d / f"edges_e{k}.npy", e if k % 2 == 0 else np.ascontiguousarray(e.T.astype(np.int32)))
        np.save(d / f"edge_weights_e{k}.npy", g["edge_weight_dict"][et])
        np.save(d / f"edge_times_e{k}.npy", g["edge_time_dict"][et])
    names = list(g["num_nodes_dict"])
    for name, x in g["node_feat_dict"].items():
        np.save(d / f"features_t{names.index(name)}.npy", x)
    for name, y in g["node_label_dict"].items():
        np.save(d / f"labels_t{names.index(name)}.npy", y)
    for split, per_type in g["split_dict"].items():
        for name, ids in per_type.items():
            np.save(d / f"node_{split}_t{names.index(name)}.npy", ids)


def global_edges(g: dict) -> np.ndarray:
    """The (src, etype, dst) rows a typed store holds for ``g``: local ids shifted by their
    type's offset, edge types in dict order."""
    names = list(g["num_nodes_dict"])
    offsets = np.cumsum([0, *g["num_nodes_dict"].values()])
    return np.concatenate(
        [
            np.stack([e[0] + offsets[names.index(s)], np.full(e.shape[1], k), e[1] + offsets[names.index(d)]], 1)
            for k, ((s, _, d), e) in enumerate(g["edge_index_dict"].items())
        ]
    )


def check_against_numpy(path, g: dict) -> None:
    """The store at ``path`` holds ``g``: global ids, edge types, attributes, per-type data."""
    s = Store(path)
    names = list(g["num_nodes_dict"])
    assert s.node_types == names and s.edge_types == list(g["edge_index_dict"])
    offsets = np.cumsum([0, *g["num_nodes_dict"].values()])
    np.testing.assert_array_equal(s.node_type_offsets, offsets)
    np.testing.assert_array_equal(s.edges("train"), global_edges(g))
    np.testing.assert_array_equal(s.edge_weights("train"), np.concatenate(list(g["edge_weight_dict"].values())))
    np.testing.assert_array_equal(s.edge_times("train"), np.concatenate(list(g["edge_time_dict"].values())))
    for name, x in g["node_feat_dict"].items():
        np.testing.assert_array_equal(s.type_array("features", name), x.astype(np.float32))
    assert s.type_array("features", "institution") is None
    for name, y in g["node_label_dict"].items():
        np.testing.assert_array_equal(s.type_array("labels", name), y)
        assert s.node_type_info(name)["labels"]["num_classes"] == y.max() + 1
    for split, per_type in g["split_dict"].items():
        for name, ids in per_type.items():
            np.testing.assert_array_equal(s.type_array(f"node_{split}", name), ids)
    assert check_store(path)["ok"]


def test_a_typed_directory_converts_through_the_cli(tmp_path, strata_cli):
    g = graph()
    write_typed_dir(tmp_path / "in", g)
    # A given valid split for one edge type, with its weights and times.
    np.save(tmp_path / "in" / "valid_edges_e0.npy", np.array([[1, 2], [3, 4]]))
    np.save(tmp_path / "in" / "valid_edge_weights_e0.npy", np.array([0.5, 1.5]))
    np.save(tmp_path / "in" / "valid_edge_times_e0.npy", np.array([7, 8]))
    out = tmp_path / "g.strata"
    strata_cli("convert", tmp_path / "in", "--out", out, "--memory", "4M", "-q")
    check_against_numpy(out, g)
    s = Store(out)
    np.testing.assert_array_equal(s.edges("valid"), [[1, 0, 3], [2, 0, 4]])
    np.testing.assert_array_equal(s.edge_weights("valid"), np.array([0.5, 1.5], np.float32))
    assert strata_cli("check", out, "-q").returncode == 0


def test_dicts_convert_through_the_python_api(tmp_path):
    g = graph(seed=1)
    summary = convert_dicts(tmp_path / "d.strata", **g, memory="8M")
    assert summary["num_nodes"] == sum(COUNTS.values()) and summary["num_relations"] == len(ETYPES)
    check_against_numpy(tmp_path / "d.strata", g)
    assert not list(tmp_path.glob(".d.strata-arrays-*"))
    # PyG's y_dict with OGB's float labels (NaN unlabelled) and (count, 1) shape.
    y = g["node_label_dict"]["paper"].astype(np.float64)
    y[y < 0] = np.nan
    g2 = {k: v for k, v in g.items() if k != "node_label_dict"}
    convert_dicts(tmp_path / "y.strata", **g2, y_dict={"paper": y[:, None]})
    np.testing.assert_array_equal(
        Store(tmp_path / "y.strata").type_array("labels", "paper"), g["node_label_dict"]["paper"]
    )


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"edge_index_dict": {("paper", "cites", "venue"): np.zeros((2, 1), int)}}, "'venue' is not a node type"),
        ({"node_feat_dict": {"venue": np.zeros((1, 1))}}, "node_feat_dict: 'venue' is not declared"),
        ({"split_dict": {"training": {"paper": [0]}}}, "unknown split 'training'"),
        ({"edge_weight_dict": {("a", "b", "c"): [1.0]}}, "edge_weight_dict: ('a', 'b', 'c') is not declared"),
        ({"edge_index_dict": {ETYPES[0]: np.zeros((3, 2), int)}}, r"expected shape (2, E) of local ids, found (3, 2)"),
    ],
)
def test_bad_dicts_are_refused_by_name(tmp_path, change, needle):
    g = {**graph(), "edge_weight_dict": None, "edge_time_dict": None, **change}
    with pytest.raises((ConfigError, InputError)) as err:
        convert_dicts(tmp_path / "bad.strata", **g)
    assert needle in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def bad_writes() -> np.ndarray:
    """The author-writes-paper edges with edge 1's author one past the author count."""
    e = graph()["edge_index_dict"][ETYPES[1]].copy()
    e[0, 1] = COUNTS["author"]
    return e


@pytest.mark.parametrize(
    "name, array, needle",
    [
        ("edges_e1.npy", bad_writes(), "edge 1: src id 20 is outside [0, 20): node type 'author'"),
        ("edges_e7.npy", np.zeros((2, 1), int), "edge type 7 is not declared"),
        ("edges_paper.npy", np.zeros((2, 1), int), "not a typed NumPy input name"),
        ("edge_weights_e0.npy", np.ones(3), "weights must have shape (60,)"),
        ("features_t0.npy", np.ones((29, 8)), "features must have shape (30, dim): node type 'paper' has 30 nodes"),
        ("edges_e2.npy", np.zeros((2, 25), np.float32), "edge ids must be integers, found float32"),
    ],
)
def test_bad_typed_directories_exit_2_naming_the_file(tmp_path, name, array, needle):
    d = tmp_path / "in"
    write_typed_dir(d, graph())
    np.save(d / name, array)
    proc = run_strata("convert", d, "--out", tmp_path / "bad.strata", check=False)
    assert proc.returncode == 2, proc.stderr
    assert name in proc.stderr and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(p.name.startswith((".bad", "bad")) for p in tmp_path.iterdir())


def mag_zip(path, g: dict, *, split_kind: str = "time"):
    """``g`` (with sorted node types) in OGB's heterogeneous CSV layout, as ogbn-mag ships it."""
    names = list(g["num_nodes_dict"])
    members = {
        "mag/raw/num-node-dict.csv.gz": gz(
            (",".join(names) + "\n" + ",".join(str(c) for c in g["num_nodes_dict"].values()) + "\n").encode()
        ),
        "mag/raw/triplet-type-list.csv.gz": gz(csv_lines(g["edge_index_dict"])),
        "mag/raw/nodetype-has-label.csv.gz": gz(
            (",".join(names) + "\n" + ",".join(str(n in g["node_label_dict"]) for n in names) + "\n").encode()
        ),
    }
    for et, e in g["edge_index_dict"].items():
        rel = "mag/raw/relations/" + "___".join(et)
        members[f"{rel}/edge.csv.gz"] = gz(csv_lines(e.T))
        members[f"{rel}/num-edge-list.csv.gz"] = gz(b"%d\n" % e.shape[1])
        members[f"{rel}/edge_reltype.csv.gz"] = gz(csv_lines([[0]] * e.shape[1]))
        members[f"{rel}/edge_year.csv.gz"] = gz(csv_lines([[t] for t in g["edge_time_dict"][et]]))
    for name, x in g["node_feat_dict"].items():
        members[f"mag/raw/node-feat/{name}/node-feat.csv.gz"] = gz(csv_lines([[repr(float(v)) for v in r] for r in x]))
    for name, y in g["node_label_dict"].items():
        members[f"mag/raw/node-label/{name}/node-label.csv.gz"] = gz(csv_lines([[v] for v in y]))
        members[f"mag/raw/node-feat/{name}/node_year.csv.gz"] = gz(csv_lines([[2000]] * len(y)))
    flags = ",".join(names) + "\n" + ",".join(str(n in g["split_dict"]["train"]) for n in names) + "\n"
    members[f"mag/split/{split_kind}/nodetype-has-split.csv.gz"] = gz(flags.encode())
    for split, per_type in g["split_dict"].items():
        for name, ids in per_type.items():
            members[f"mag/split/{split_kind}/{name}/{split}.csv.gz"] = gz(csv_lines([[v] for v in ids]))
    return write_zip(path, members)


def mag_graph() -> dict:
    """A graph as OGB's loader returns it: node and edge types sorted, float32 features,
    labelled papers only, integer edge years, no weights."""
    g = graph(seed=2)
    order = sorted(g["num_nodes_dict"])
    g["num_nodes_dict"] = {n: COUNTS[n] for n in order}
    g["edge_index_dict"] = dict(sorted(g["edge_index_dict"].items()))
    g["edge_time_dict"] = {et: g["edge_time_dict"][et] for et in g["edge_index_dict"]}
    g["edge_weight_dict"] = None
    g["node_feat_dict"] = {"paper": g["node_feat_dict"]["paper"]}
    g["node_label_dict"] = {"paper": np.where(g["node_label_dict"]["paper"] < 0, 0, g["node_label_dict"]["paper"])}
    return g


def test_ogb_heterogeneous_layout_through_datasets(tmp_path):
    g = mag_graph()
    root = tmp_path / "srv"
    mag_zip(root / "ogbn-mag" / "mag.zip", g)
    with FileServer(root) as server:
        result = fetch(load(FetchConfig, flags={"name": "ogbn-mag", "dir": tmp_path / "data", "mirror": server.url}))
    s = Store(result.store)
    assert s.node_types == ["author", "institution", "paper"]
    np.testing.assert_array_equal(s.edges("train"), global_edges(g))
    np.testing.assert_array_equal(s.edge_times("train"), np.concatenate(list(g["edge_time_dict"].values())))
    assert s.edge_weights("train") is None
    np.testing.assert_array_equal(s.type_array("features", "paper"), g["node_feat_dict"]["paper"])
    np.testing.assert_array_equal(s.type_array("labels", "paper"), g["node_label_dict"]["paper"])
    np.testing.assert_array_equal(s.type_array("node_valid", "paper"), g["split_dict"]["valid"]["paper"])
    assert s.type_array("labels", "author") is None
    assert check_store(result.store)["ok"]
    assert not list(result.store.parent.glob(".ogbn-mag-staging-*"))


def test_ogb_heterogeneous_staging_in_small_chunks_and_bad_ids(tmp_path):
    g = mag_graph()
    extract(mag_zip(tmp_path / "mag.zip", g), tmp_path / "raw")
    root = ogb.find_root(tmp_path / "raw")
    assert ogb.is_hetero(root)
    (tmp_path / "staging").mkdir()
    staged = ogb.stage_hetero(root, tmp_path / "staging", 64)
    assert (staged / "node_types.tsv").read_text() == "author\t20\ninstitution\t4\npaper\t30\n"
    k = list(g["edge_index_dict"]).index(("paper", "cites", "paper"))
    np.testing.assert_array_equal(
        np.load(staged / f"edges_e{k}.npy"), g["edge_index_dict"][("paper", "cites", "paper")].T
    )
    np.testing.assert_array_equal(np.load(staged / "labels_t2.npy"), g["node_label_dict"]["paper"])
    # An author id past the author count, in the relation's own file.
    rel = root / "raw" / "relations" / "author___writes___paper" / "edge.csv.gz"
    rel.write_bytes(gz(b"0,1\n20,3\n"))
    (rel.parent / "num-edge-list.csv.gz").write_bytes(gz(b"2\n"))
    (rel.parent / "edge_year.csv.gz").write_bytes(gz(b"1\n2\n"))
    (tmp_path / "again").mkdir()
    with pytest.raises(
        InputError, match=r"author___writes___paper/edge.csv.gz: line 2: node id 20 is outside \[0, 20\)"
    ):
        ogb.stage_hetero(root, tmp_path / "again", 1 << 20)
