"""``strata reorder``: the orders are bijections with their defining properties, and a reordered
store maps back to its input through ``original_id`` (edges, CSR/CSC, features, labels, splits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli_in_process import strata_in_process
from conftest import run_strata

ORDERS = ("degree", "bfs", "rcm", "glist", "community")


def random_graph(rng: np.random.Generator, n: int) -> np.ndarray:
    """Edges ``(E, 2)`` over ``n`` nodes: a random graph on the first 70%, a path on the next 20%
    (a second component), and the last 10% isolated; ids shuffled."""
    a = int(0.7 * n)
    dense = rng.integers(0, a, size=(3 * a, 2))
    path = np.stack([np.arange(a, int(0.9 * n) - 1), np.arange(a + 1, int(0.9 * n))], axis=1)
    shuffle = rng.permutation(n)
    return shuffle[np.concatenate([dense, path])]


def build_store(tmp_path: Path, seed: int, n: int, symmetrize: bool) -> Path:
    from strata.config import ConvertConfig, Size
    from strata.convert import convert

    rng = np.random.default_rng(seed)
    raw = tmp_path / f"raw-{seed}"
    raw.mkdir()
    np.save(raw / "edges.npy", random_graph(rng, n))
    np.save(raw / "features.npy", rng.standard_normal((n, 5)).astype(np.float32))
    np.save(raw / "labels.npy", rng.integers(0, 4, n).astype(np.int32))
    split = rng.permutation(n)
    np.save(raw / "train_idx.npy", split[: n // 2])
    np.save(raw / "valid_idx.npy", split[n // 2 : 3 * n // 4])
    np.save(raw / "test_idx.npy", split[3 * n // 4 :])
    out = tmp_path / f"g-{seed}.strata"
    convert(ConvertConfig(inputs=[raw], out=out, symmetrize=symmetrize, num_nodes=n, memory=Size(64 << 20)))
    return out


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("seed", range(4))
def test_orders_are_permutations(order, seed):
    from strata.reorder import compute_order

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    edges = random_graph(rng, n) if n > 10 else rng.integers(0, n, size=(n, 2))
    both = np.concatenate([edges, edges[:, ::-1]])
    both = both[np.argsort(both[:, 0], kind="stable")]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(both[:, 0], minlength=n))))
    perm = compute_order(indptr, both[:, 1].astype(np.int64), order)
    assert perm.dtype == np.int64
    assert np.array_equal(np.sort(perm), np.arange(n))


def path_adjacency(n: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A path through ``ids[0], ids[1], ...`` as a symmetric CSR over ``n`` nodes."""
    pairs = np.stack([ids[:-1], ids[1:]], axis=1)
    both = np.concatenate([pairs, pairs[:, ::-1]])
    both = both[np.lexsort((both[:, 1], both[:, 0]))]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(both[:, 0], minlength=n))))
    return indptr, both[:, 1].astype(np.int64)


@pytest.mark.parametrize("order", ["bfs", "rcm"])
def test_traversals_lay_a_shuffled_path_out_in_a_line(order):
    from strata.reorder import compute_order

    n = 200
    ids = np.random.default_rng(1).permutation(n)
    indptr, indices = path_adjacency(n, ids)
    perm = compute_order(indptr, indices, order)
    new = np.empty(n, dtype=np.int64)
    new[perm] = np.arange(n)
    assert np.abs(new[ids[:-1]] - new[ids[1:]]).max() == (2 if order == "bfs" else 1)


def test_community_order_lays_each_planted_community_out_contiguously():
    """Three cliques of different sizes with shuffled ids, joined by single edges: label
    propagation finds each clique, and the order puts the cliques one after another (largest
    first), each by decreasing degree."""
    from strata.reorder import compute_order

    sizes = [40, 25, 10]
    n = sum(sizes)
    ids = np.random.default_rng(5).permutation(n)
    cliques = np.split(ids, np.cumsum(sizes)[:-1])
    pairs = [(u, v) for c in cliques for u in c for v in c if u != v]
    pairs += [(cliques[0][0], cliques[1][0]), (cliques[1][1], cliques[2][0])]
    both = np.array(sorted({*pairs, *[(v, u) for u, v in pairs]}))
    indptr = np.concatenate(([0], np.cumsum(np.bincount(both[:, 0], minlength=n))))
    indices = both[:, 1].astype(np.int64)
    perm = compute_order(indptr, indices, "community")
    new = np.empty(n, dtype=np.int64)
    new[perm] = np.arange(n)
    start = 0
    for c in cliques:
        assert sorted(new[c]) == list(range(start, start + len(c)))
        start += len(c)
    degree = np.diff(indptr)
    assert (np.diff(degree[perm[: sizes[0]]]) <= 0).all()


def test_degree_order_is_by_decreasing_degree_then_id():
    from strata.reorder import compute_order

    indptr = np.array([0, 1, 4, 5, 7, 7])
    indices = np.array([1, 0, 3, 3, 1, 1, 2])
    assert compute_order(indptr, indices, "degree").tolist() == [1, 3, 0, 2, 4]


@pytest.mark.parametrize("symmetrize", [True, False], ids=["symmetrized", "directed"])
@pytest.mark.parametrize("order", ORDERS)
def test_reordered_store_maps_back_to_its_input(tmp_path, order, symmetrize):
    from strata import Store
    from strata.reorder import reorder_store
    from strata.store import check_store

    for seed in range(2):
        src = build_store(tmp_path, seed + (10 if symmetrize else 0), 150 + 37 * seed, symmetrize)
        out = tmp_path / f"r-{seed}-{order}.strata"
        summary = reorder_store(src, out, order)
        a, b = Store(src), Store(out)
        orig = b.original_id
        assert np.array_equal(np.sort(orig), np.arange(a.num_nodes))
        assert check_store(out)["ok"], check_store(out)
        for split in a.num_edges:
            assert np.array_equal(orig[b.edges(split)], a.edges(split))
        for direction in ("csr", "csc"):
            (ip_a, ix_a), (ip_b, ix_b) = getattr(a, direction)(), getattr(b, direction)()
            for v in range(b.num_nodes):
                old = orig[v]
                assert np.array_equal(orig[ix_b[ip_b[v] : ip_b[v + 1]]], ix_a[ip_a[old] : ip_a[old + 1]])
        assert np.array_equal(b.features, a.features[orig])
        assert np.array_equal(b.labels, a.labels[orig])
        for split in ("train", "valid", "test"):
            assert np.array_equal(orig[b.node_split(split)], a.node_split(split))
        assert b.node_name(5) == str(orig[5])
        assert summary["nodes"] == a.num_nodes
        if order in ("bfs", "rcm"):
            assert summary["mean_edge_span_after"] < summary["mean_edge_span_before"]


def test_the_orders_are_the_sections_choices():
    from strata.reorder import ORDERS as offered

    assert offered == ORDERS


def test_cli_prints_its_memory_plan_and_refuses_a_budget_below_it(tmp_path):
    src = build_store(tmp_path, 3, 400, False)
    proc = run_strata("reorder", src, "--out", tmp_path / "r.strata", "--order", "community", "--memory", "64M")
    assert "reorder budget 64.0 MiB: planned" in proc.stderr, proc.stderr
    assert "community over" in proc.stderr, proc.stderr
    small = run_strata(
        "reorder", src, "--out", tmp_path / "s.strata", "--order", "bfs", "--memory", "16K", "-q", check=False
    )
    assert small.returncode == 2, small.stderr
    assert "memory budget of 16.0 KiB is too small" in small.stderr and "reorder.memory" in small.stderr
    assert "Traceback" not in small.stderr and not (tmp_path / "s.strata").exists()


def test_cli_refuses_a_bad_order_naming_the_option(tmp_path):
    proc = run_strata(
        "reorder", tmp_path / "in.strata", "--out", tmp_path / "o.strata", "--order", "gorder", check=False
    )
    assert proc.returncode == 2
    assert "--order" in proc.stderr and "gorder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_refuses_named_stores_and_reorders_a_reordered_one(tmp_path, capsys):
    # The first refusal in a child process, the other commands in this one (tests/cli_in_process.py).
    cli = strata_in_process(capsys)
    text = tmp_path / "named.tsv"
    text.write_text("a\tb\nb\tc\n")
    cli("convert", text, "--out", tmp_path / "named.strata", "-q")
    proc = run_strata(
        "reorder", tmp_path / "named.strata", "--out", tmp_path / "o.strata", "--order", "bfs", check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert "node name table" in proc.stderr and "Traceback" not in proc.stderr
    src = build_store(tmp_path, 0, 60, True)
    cli("reorder", src, "--out", tmp_path / "r.strata", "--order", "rcm", "-q")
    from strata import Store

    # Reordered again: original_id still names the first input's ids (it was refused).
    cli("reorder", tmp_path / "r.strata", "--out", tmp_path / "rr.strata", "--order", "bfs", "-q")
    first, twice = Store(src), Store(tmp_path / "rr.strata")
    back = np.asarray(twice.original_id)[np.asarray(twice.edges())]
    assert sorted(map(tuple, back.tolist())) == sorted(map(tuple, np.asarray(first.edges()).tolist()))
    exists = cli("reorder", src, "--out", tmp_path / "r.strata", "--order", "bfs", check=False)
    assert exists.returncode == 2 and "--overwrite" in exists.stderr
    cli("reorder", src, "--out", tmp_path / "r.strata", "--order", "bfs", "--overwrite", "-q")
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


def test_a_store_that_fails_its_check_is_not_reordered(tmp_path, capsys):
    """A damaged store (its CSC no longer the CSR's transpose) is refused as the engines refuse
    it, naming the problem: reordering it would publish the damage under a new digest, its
    node ids renumbered out of line with the original's."""
    cli = strata_in_process(capsys)
    src = build_store(tmp_path, 1, 60, False)
    indices = np.load(src / "csc_indices.npy", mmap_mode="r+")
    indices[7] = (indices[7] + 1) % 60
    indices.flush()
    del indices
    proc = cli("reorder", src, "--out", tmp_path / "r.strata", "--order", "bfs", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "fails `strata check`" in proc.stderr and "csc_indices.npy" in proc.stderr
    assert not (tmp_path / "r.strata").exists()
