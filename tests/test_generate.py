"""Generators through the CLI: determinism, outputs that convert, refusals naming the option."""

from __future__ import annotations

import hashlib

import numpy as np

from strata import Store


def digest(path):
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def test_rmat_is_deterministic_and_converts(tmp_path, strata_cli):
    a, b, c = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin"
    strata_cli("generate", "rmat", "--scale", "12", "--out", a, "-q")
    strata_cli("generate", "rmat", "--scale", "12", "--out", b, "--threads", "1", "-q")
    strata_cli("generate", "rmat", "--scale", "12", "--out", c, "--seed", "2", "-q")
    assert digest(a) == digest(b) != digest(c)
    assert a.stat().st_size == 16 * 4096 * 8
    strata_cli("convert", a, "--out", tmp_path / "a.strata", "--num-nodes", 4096, "-q")
    s = Store(tmp_path / "a.strata")
    assert s.num_nodes == 4096 and s.num_edges == {"train": 65536}
    assert s.manifest["stats"]["out_degree"]["max"] > 20 * s.manifest["stats"]["out_degree"]["median"]
    # --overwrite replaces an earlier output, never a store's own file (it replaced the manifest).
    strata_cli("generate", "rmat", "--scale", "5", "--out", a, "--overwrite", "-q")
    assert a.stat().st_size == 16 * 32 * 8
    manifest = (tmp_path / "a.strata" / "manifest.json").read_bytes()
    into = strata_cli(
        "generate", "rmat", "--scale", "5", "--out", tmp_path / "a.strata" / "manifest.json", "--overwrite", check=False
    )
    assert into.returncode == 2 and "manifest.json is a file of a store" in into.stderr
    assert (tmp_path / "a.strata" / "manifest.json").read_bytes() == manifest


def test_kg_converts_with_its_splits(tmp_path, strata_cli):
    raw = tmp_path / "kg"
    strata_cli("generate", "kg", "--out", raw, "--entities", "500", "--relations", "10", "--triples", "20000", "-q")
    strata_cli("convert", raw, "--relations", "--out", tmp_path / "kg.strata", "-q")
    s = Store(tmp_path / "kg.strata")
    assert s.num_relations == 10
    assert s.num_nodes <= 500
    assert s.num_edges == {"train": 18000, "valid": 1000, "test": 1000}


def test_sbm_converts_with_features_labels_and_splits(tmp_path, strata_cli):
    raw = tmp_path / "sbm"
    strata_cli(
        "generate",
        "sbm",
        "--out",
        raw,
        "--nodes",
        "3000",
        "--classes",
        "5",
        "--feature-dim",
        "16",
        "--feature-dtype",
        "float16",
        "-q",
    )
    strata_cli("convert", raw, "--symmetrize", "--out", tmp_path / "sbm.strata", "-q")
    s = Store(tmp_path / "sbm.strata")
    assert s.num_nodes == 3000
    assert s.features.shape == (3000, 16) and s.features.dtype == np.float16
    assert s.manifest["labels"]["num_classes"] == 5
    assert {k: len(s.node_split(k)) for k in ("train", "valid", "test")} == {"train": 1800, "valid": 600, "test": 600}
    assert s.graph["symmetrized"] and s.manifest["arrays"]["csc_indices"] == s.manifest["arrays"]["csr_indices"]
    # Homophily survives conversion: most edges join nodes of one class.
    e = np.asarray(s.edges())
    labels = np.asarray(s.labels)
    assert (labels[e[:, 0]] == labels[e[:, 1]]).mean() > 0.7


def test_sizes_beyond_the_disk_are_refused_before_writing(tmp_path, strata_cli):
    """Options asking for more than the disk holds are refused at once, naming the free space
    and the least the output takes, and leave nothing behind (not minutes of writing until the
    disk is full)."""
    cases = [
        ("rmat", "--scale", "5", "--edge-factor", "999999999999999", "--out", tmp_path / "r.tsv"),
        ("rmat", "--scale", "40", "--format", "npy", "--out", tmp_path / "r.npy"),
        ("sbm", "--nodes", "99999999999999", "--out", tmp_path / "s"),
        ("kg", "--entities", "1000000000000", "--triples", "20000000000000", "--out", tmp_path / "k"),
    ]
    for args in cases:
        proc = strata_cli("generate", *args, "-q", check=False)
        assert proc.returncode == 2, proc.stderr
        assert f"the filesystem of {tmp_path} has" in proc.stderr and "free, too little" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
