"""Every input format that brings features (node features, labels and node splits; edge feature
columns) converts into the same bytes as before its node columns were routed through the
format's plugin (``EdgeSource::node_columns``): each store's arrays and manifest (less its
provenance and timings) are pinned by digest, so a change of any byte fails here."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import needs, run_strata
from strata.convert import convert_dicts
from test_typed_numpy import graph, write_typed_dir

#: What a manifest records of the run rather than of the graph.
VOLATILE = {"provenance", "created", "seconds", "strata_version"}


def digest(store) -> str:
    """One digest of every file of ``store`` (manifest without :data:`VOLATILE` keys; not
    ``digest.json``, which records file times and a hash over the manifest's provenance)."""
    h = hashlib.sha256()
    for path in sorted(p for p in store.rglob("*") if p.is_file() and p.name != "digest.json"):
        data = path.read_bytes()
        if path.name == "manifest.json":
            manifest = {k: v for k, v in json.loads(data).items() if k not in VOLATILE}
            data = json.dumps(manifest, sort_keys=True).encode()
        h.update(f"{path.relative_to(store)}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def edges(rng, n: int, e: int) -> np.ndarray:
    return np.stack([rng.integers(0, n, e), rng.integers(0, n, e)], axis=1)


def numpy_directory(d):
    """A NumPy directory named as PyG and OGB name their arrays (x, y, masks, id arrays)."""
    rng = np.random.default_rng(1)
    d.mkdir()
    np.save(d / "edge_index.npy", edges(rng, 50, 300).T.copy())
    np.save(d / "x.npy", rng.standard_normal((50, 6)))
    labels = rng.integers(0, 4, 50)
    labels[::9] = -1
    np.save(d / "y.npy", labels)
    mask = np.zeros(50, dtype=bool)
    mask[:20] = True
    np.save(d / "train_mask.npy", mask)
    np.save(d / "val_idx.npy", np.arange(20, 30, dtype=np.int32))
    np.save(d / "test_idx.npy", np.arange(30, 50))
    return [d]


def numpy_flags(d):
    """One edge array, its node arrays named by flags, a random node split, float16 features
    kept as float16."""
    rng = np.random.default_rng(2)
    d.mkdir()
    np.save(d / "e.npy", edges(rng, 40, 200).astype(np.int32))
    np.save(d / "f.npy", rng.standard_normal((40, 5)).astype(np.float16))
    np.save(d / "l.npy", rng.integers(-1, 3, 40))
    return [d / "e.npy", "--features", d / "f.npy", "--labels", d / "l.npy", "--node-split", "0.5,0.25,0.25"]


def numpy_typed(d):
    write_typed_dir(d, graph(3))
    return [d]


def text_edge_features(d):
    """Text edges with a weight and two feature columns per edge."""
    rng = np.random.default_rng(4)
    d.mkdir()
    lines = [
        f"{s}\t{t}\t{w:.3f}\t{a:.2f}\t{b:.2f}\n"
        for (s, t), w, a, b in zip(edges(rng, 30, 120), *rng.random((3, 120)), strict=True)
    ]
    (d / "train.tsv").write_text("".join(lines))
    return [d / "train.tsv", "--columns", "src,dst,weight,feat:2"]


#: Each format's inputs, and the digest of its store.
CASES = {
    "numpy-directory": (numpy_directory, "261f8ce55cf4a0cf"),
    "numpy-flags": (numpy_flags, "835c864e9ee205f1"),
    "numpy-typed": (numpy_typed, "6f939f49d8c4f369"),
    "text-edge-features": (text_edge_features, "271122736826d854"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_stores_keep_their_bytes(tmp_path, case):
    make, want = CASES[case]
    args = make(tmp_path / "in")
    out = tmp_path / "out.strata"
    run_strata("convert", *args, "--out", out, "--memory", "64M", "--threads", "2")
    assert digest(out) == want


def test_ogb_dicts_keep_their_bytes(tmp_path):
    out = tmp_path / "dicts.strata"
    convert_dicts(out, **graph(5), memory="64M", threads=2)
    assert digest(out) == "be5f1e158f612851"


def test_parquet_edge_features_keep_their_bytes(tmp_path):
    pq = needs("pyarrow.parquet")
    pa = needs("pyarrow")
    rng = np.random.default_rng(6)
    e = edges(rng, 25, 90)
    table = pa.table({"src": e[:, 0], "dst": e[:, 1], "f0": rng.random(90), "f1": rng.random(90)})
    pq.write_table(table, tmp_path / "train.parquet")
    out = tmp_path / "pq.strata"
    run_strata("convert", tmp_path / "train.parquet", "--columns", "src,dst,feat=f0,feat=f1", "--out", out,
               "--memory", "64M", "--threads", "2")  # fmt: skip
    assert digest(out) == "086c24f283f20513"


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_planetoid_keeps_its_bytes(tmp_path, shared_datasets, name):
    out = tmp_path / f"{name}.strata"
    run_strata("convert", shared_datasets / "planetoid", "--name", name, "--out", out, "--memory", "64M")
    assert digest(out) == {"cora": "19fdd3bca60a2dc6", "citeseer": "0946f55fc1b387df"}[name]
