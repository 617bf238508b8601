"""End to end through the CLI on the real datasets: FB15k-237, WN18RR, Cora, CiteSeer."""

from __future__ import annotations

import numpy as np
import pytest

from strata import Store


def test_fb15k237(tmp_path, shared_datasets, strata_cli):
    out = tmp_path / "fb.strata"
    proc = strata_cli("convert", shared_datasets / "fb15k-237", "--relations", "--out", out, "--memory", "256M")
    assert "Converted 310,116 edges (272,115 train / 17,535 valid / 20,466 test)" in proc.stdout
    assert "among 14,541 nodes and 237 relations" in proc.stdout
    store = Store(out)
    assert store.num_nodes == 14541
    assert store.num_relations == 237
    assert store.num_edges == {"train": 272115, "valid": 17535, "test": 20466}
    # Names round-trip: the first training triple of the file.
    first = (shared_datasets / "fb15k-237" / "train.txt").read_text().split("\n", 1)[0].split("\t")
    h, r, t = store.edges("train")[0]
    assert (store.node_name(h), store.relation_names[r], store.node_name(t)) == tuple(first)
    assert store.node_id(first[0]) == h
    assert store.node_id("/m/not-an-entity") is None
    # Every array is a valid NumPy file whose data starts at byte 4096 (aligned for O_DIRECT).
    for name, info in store.manifest["arrays"].items():
        with open(out / info["file"], "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f) if major == 1 else np.lib.format.read_array_header_2_0(f)
            assert f.tell() == 4096, name
        assert np.load(out / info["file"], mmap_mode="r").shape == tuple(info["shape"])
    # CSR agrees with the train edges.
    indptr, indices = store.csr()
    edges = np.asarray(store.edges("train"))
    order = np.argsort(edges[:, 0], kind="stable")
    assert np.array_equal(np.asarray(indices), edges[order, 2])
    assert np.array_equal(np.diff(indptr), np.bincount(edges[:, 0], minlength=store.num_nodes))
    info = strata_cli("info", out, "--memory", "1G").stdout
    assert "14,541 (named)" in info and "embed budget 1.00 GiB" in info


def test_wn18rr_keeps_leading_zero_ids_as_names(tmp_path, shared_datasets, strata_cli):
    out = tmp_path / "wn.strata"
    strata_cli("convert", shared_datasets / "wn18rr", "--relations", "--out", out)
    store = Store(out)
    assert store.num_nodes == 40943
    assert store.num_relations == 11
    assert store.num_edges == {"train": 86835, "valid": 3034, "test": 3134}
    assert store.node_name(0).startswith("0")


@pytest.mark.parametrize(
    ("name", "nodes", "edges", "dim", "classes", "class_counts"),
    [
        ("cora", 2708, 10556, 1433, 7, [351, 217, 418, 818, 426, 298, 180]),
        ("citeseer", 3327, 9104, 3703, 6, None),
    ],
)
def test_planetoid(tmp_path, shared_datasets, strata_cli, name, nodes, edges, dim, classes, class_counts):
    out = tmp_path / f"{name}.strata"
    strata_cli("convert", shared_datasets / "planetoid", "--name", name, "--out", out)
    store = Store(out)
    assert store.num_nodes == nodes
    assert store.num_edges == {"train": edges}
    assert store.features.shape == (nodes, dim)
    assert store.manifest["labels"]["num_classes"] == classes
    splits = {s: len(store.node_split(s)) for s in ("train", "valid", "test")}
    assert splits == {"train": 20 * classes, "valid": 500, "test": 1000}
    labels = np.asarray(store.labels)
    if class_counts:
        assert np.bincount(labels).tolist() == class_counts
    # The graph is undirected without self-loops, as PyG's processing makes it.
    e = np.asarray(store.edges("train"))
    assert not np.any(e[:, 0] == e[:, 1])
    fwd = set(map(tuple, e.tolist()))
    assert all((d, s) in fwd for s, d in fwd)
    # Features are the bag-of-words rows: binary, at least one word per non-isolated node.
    x = np.asarray(store.features)
    assert set(np.unique(x)) <= {0.0, 1.0}
