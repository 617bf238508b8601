"""`strata generate hetsbm` end to end: the typed store it writes, read through NumPy and
``strata.Store``, passes ``strata check``, is deterministic, and holds the planted signal that
makes a paper's label predictable from its typed neighbours beyond its own features
(docs/generators.md, "hetsbm")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata
from strata.store import Store, check_store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_hetsbm")

CLASSES = 6
SIZES = ["--papers", 3000, "--authors", 4000, "--institutions", 120, "--fields", 600, "--classes", CLASSES]
ARGS = [*SIZES, "--feature-dim", 16, "--time-steps", 20, "-q"]
TYPES = ["paper", "author", "institution", "field_of_study"]
FORWARD = [
    ("author", "affiliated_with", "institution"),
    ("author", "writes", "paper"),
    ("paper", "cites", "paper"),
    ("paper", "has_topic", "field_of_study"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hetsbm") / "mag.strata"
    run_strata("generate", "hetsbm", "--out", out, *ARGS)
    return out


def typed_edges(s: Store, edge_type) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Local (src, dst) ids, weights and times of one edge type."""
    k = s.edge_types.index(edge_type)
    e = np.asarray(s.edges())
    mask = e[:, 1] == k
    offsets = s.node_type_offsets
    src_off = offsets[s.node_type_index(edge_type[0])]
    dst_off = offsets[s.node_type_index(edge_type[2])]
    return e[mask, 0] - src_off, e[mask, 2] - dst_off, s.edge_weights()[mask], s.edge_times()[mask]


def test_store_has_every_type_array_and_passes_check(store):
    s = Store(store)
    assert s.is_typed and s.format_version == 2
    assert s.node_types == TYPES
    reverse = [(d, f"rev_{r}", src) for src, r, d in FORWARD]
    assert s.edge_types == FORWARD + reverse
    assert [s.node_type_info(t)["count"] for t in TYPES] == [3000, 4000, 120, 600]
    for t, count in zip(TYPES, [3000, 4000, 120, 600], strict=True):
        assert s.type_array("features", t).shape == (count, 16)
    labels = s.type_array("labels", "paper")
    assert labels.shape == (3000,) and labels.dtype == np.int32 and set(np.unique(labels)) == set(range(CLASSES))
    assert s.type_array("labels", "author") is None
    splits = {k: s.type_array(f"node_{k}", "paper") for k in ("train", "valid", "test")}
    assert {k: len(v) for k, v in splits.items()} == {"train": 1800, "valid": 600, "test": 600}
    assert s.edge_attributes == {"weights": True, "times": True}
    assert s.edge_weights().shape == s.edge_times().shape == (s.num_edges["train"],)
    assert set(s.topology_columns("csc")) >= {"eid", "etype", "weights", "times"}
    report = check_store(store)
    assert report["ok"] and report["problems"] == 0, report["listed"]
    run_strata("check", store)
    info = run_strata("info", store).stdout
    assert "generator hetsbm" in info and "(paper, rev_cites, paper)" in info


def test_times_follow_publication_order(store):
    s = Store(store)
    _, paper, _, written = typed_edges(s, ("author", "writes", "paper"))
    time = np.full(3000, -1)
    time[paper] = written
    # Every paper has an author, and all of a paper's edges carry its one time.
    assert (time >= 0).all() and (time[paper] == written).all()
    citing, cited, _, t = typed_edges(s, ("paper", "cites", "paper"))
    assert (t == time[citing]).all() and (time[cited] < t).all()
    # The default split is by time: train the oldest papers, test the newest.
    spans = [time[s.type_array(f"node_{k}", "paper")] for k in ("train", "valid", "test")]
    assert spans[0].max() <= spans[1].min() and spans[1].max() <= spans[2].min()


def test_label_is_predictable_from_typed_neighbours_beyond_own_features(store):
    s = Store(store)
    labels = np.asarray(s.type_array("labels", "paper"))
    chance = 1 / CLASSES

    def majority(owner, other, n_owner):
        votes = np.zeros((n_owner, CLASSES))
        np.add.at(votes, owner, np.eye(CLASSES)[labels[other]])
        has = votes.sum(1) > 0
        return (votes.argmax(1) == labels)[has].mean()

    citing, cited, w, _ = typed_edges(s, ("paper", "cites", "paper"))
    by_citations = majority(citing, cited, 3000)
    # Co-authorship: the labels of the other papers of a paper's authors (paper-author-paper).
    author, paper, _, _ = typed_edges(s, ("author", "writes", "paper"))
    per_author = np.zeros((4000, CLASSES))
    np.add.at(per_author, author, np.eye(CLASSES)[labels[paper]])
    votes = np.zeros((3000, CLASSES))
    np.add.at(votes, paper, per_author[author] - np.eye(CLASSES)[labels[paper]])
    has = votes.sum(1) > 0
    by_authors = (votes.argmax(1) == labels)[has].mean()

    # Own features alone: nearest train centroid, on the test papers.
    x = np.asarray(s.type_array("features", "paper"), dtype=np.float64)
    train, test = (np.asarray(s.type_array(f"node_{k}", "paper")) for k in ("train", "test"))
    centroids = np.stack([x[train][labels[train] == c].mean(0) for c in range(CLASSES)])
    own = (((x[test, None, :] - centroids[None]) ** 2).sum(-1).argmin(1) == labels[test]).mean()

    assert own > 2 * chance, own
    assert by_citations > own + 0.15 and by_authors > own + 0.15, (own, by_citations, by_authors)
    # Weights carry the signal too: edges inside a community weigh more.
    same = labels[citing] == labels[cited]
    assert w[same].mean() > 2 * w[~same].mean()


def test_deterministic_and_refuses_bad_options(store, tmp_path):
    again = tmp_path / "again.strata"
    run_strata("generate", "hetsbm", "--out", again, *ARGS, "--threads", 1)
    for name in ("edges_train", "edge_weights_train", "edge_times_train", "csc_indices", "features_t1", "labels_t0"):
        assert (Store(store).array(name) == Store(again).array(name)).all(), name
    proc = run_strata("generate", "hetsbm", "--out", tmp_path / "bad.strata", *SIZES[:-2], "--classes", 1, check=False)
    assert proc.returncode == 2 and "classes" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_strata("generate", "hetsbm", "--out", tmp_path / "b.strata", *SIZES, "--institutions", 3, check=False)
    assert proc.returncode == 2 and "institutions" in proc.stderr, proc.stderr
    assert not (tmp_path / "b.strata").exists()
