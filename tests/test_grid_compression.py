"""Compressed grids (`strata grid build --compression packed|byte`) through the CLI and the
Python API: the same results as a plain grid with blocks resident and streamed from disk, the
manifest and `grid info`, `strata check`, and a corrupt block named in a clear error (exit 2) by
`check` and by `run`.
The fine checks (codes round trip on random and adversarial blocks, every algorithm on
compressed grids against its reference, far memory, ranks) are the engine's Rust tests."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import run_strata
from strata.config import ConvertConfig
from strata.convert import convert
from strata.errors import StoreFormatError
from strata.grid import build_grid, run

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_grid_compression")

N = 2000
CODECS = ("packed", "byte")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store of 30,000 random edges (hubs, self-loops and parallel edges among them) with a
    plain grid and one grid per code, all of 4 x 4 blocks, and a symmetric one plain and packed."""
    d = tmp_path_factory.mktemp("gridcomp")
    rng = np.random.default_rng(4)
    hubs = rng.integers(0, 8, size=(30_000, 2))
    edges = np.where(rng.random((30_000, 2)) < 0.1, hubs, rng.integers(0, N, size=(30_000, 2)))
    np.save(d / "edges.npy", edges)
    out = d / "g.strata"
    convert(ConvertConfig(inputs=[d / "edges.npy"], out=out, num_nodes=N))
    run_strata("grid", "build", out, "--name", "packed", "--partitions", 4, "--compression", "packed", "-q")
    for name in ("none", "byte"):
        build_grid(store=out, name=name, partitions=4, compression=name)
    for name in ("none", "packed"):
        build_grid(store=out, name=f"sym-{name}", partitions=4, symmetrize=True, compression=name)
    return out


def run_grid(store, grid, algorithm, out, keep, **options):
    run(algorithm=algorithm, store=store, grid=grid, segment="8K", out=out, keep_resident=keep, **options)
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_grids_give_the_plain_results(store, tmp_path, codec):
    info = run_strata("grid", "info", store / "grids" / codec).stdout
    assert f"{codec} compression (" in info and "edge_codes" in info
    m = json.loads((store / "grids" / codec / "grid.json").read_text())
    assert m["compression"] == codec and m["format_version"] == 2
    plain = json.loads((store / "grids" / "none" / "grid.json").read_text())
    assert "compression" not in plain and plain["format_version"] == 1
    codes = m["arrays"]["edge_codes"]["shape"][0]
    assert codes < 0.6 * 8 * m["num_edges"], codes
    for keep in (True, False):
        want = run_grid(store, "none", "pagerank", tmp_path / "p", keep)
        got = run_grid(store, codec, "pagerank", tmp_path / codec, keep)
        np.testing.assert_allclose(np.load(got / "rank.npy"), np.load(want / "rank.npy"), rtol=1e-5)
        summary = json.loads((got / "run.json").read_text())["summary"]
        assert summary["compression"] == codec
        assert summary["stored_bytes_per_edge"] == pytest.approx(codes / m["num_edges"])
        if not keep:
            # Every pass reads the codes, and the fetchers decode every edge.
            assert summary["edges_decoded"] == summary["edges"] and summary["decode_seconds"] > 0
            assert summary["bytes_disk"] == summary["iterations"] * codes
            lines = [json.loads(x) for x in (got / "metrics.jsonl").read_text().splitlines()]
            assert all(x["edges_decoded"] == m["num_edges"] for x in lines)
        want = run_grid(store, "none", "bfs", tmp_path / "pb", keep, root=3)
        got = run_grid(store, codec, "bfs", tmp_path / f"{codec}b", keep, root=3)
        assert np.array_equal(np.load(got / "level.npy"), np.load(want / "level.npy"))


@pytest.mark.parametrize(
    ("algorithm", "array", "options"),
    [("triangles", "triangles", {}), ("lpa", "community", {}), ("betweenness", "betweenness", {"sources": 8})],
)
def test_gather_passes_read_compressed_blocks(store, tmp_path, algorithm, array, options):
    """Triangles, lpa and betweenness (their gather passes read the blocks through the fetch
    stage, decoding them) give the plain grid's results on a packed symmetric grid, streamed."""
    got, want = (
        run_grid(store, f"sym-{name}", algorithm, tmp_path / name, False, **options) for name in ("packed", "none")
    )
    summary = json.loads((got / "run.json").read_text())["summary"]
    assert summary["compression"] == "packed" and summary["edges_decoded"] > 0
    np.testing.assert_allclose(np.load(got / f"{array}.npy"), np.load(want / f"{array}.npy"), rtol=1e-9)


def test_check_passes_compressed_grids(store):
    proc = run_strata("check", store)
    assert "no problems" in proc.stdout, proc.stdout


def test_a_corrupt_block_is_named_by_check_and_by_run(store, tmp_path):
    bad = tmp_path / "bad.strata"
    shutil.copytree(store, bad, ignore=shutil.ignore_patterns("runs"))
    grid = bad / "grids" / "packed"
    index = np.load(grid / "code_index.npy")
    codes = np.load(grid / "edge_codes.npy", mmap_mode="r+")
    # The width byte of block 5's first frame: above 64 bits.
    codes[index[5]] = 200
    codes.flush()
    del codes
    proc = run_strata("check", bad, check=False)
    assert proc.returncode == 2, proc.stdout
    assert "grids/packed/edge_codes.npy" in proc.stdout and "block (1, 1)" in proc.stdout, proc.stdout
    assert "frame width 200" in proc.stdout
    proc = run_strata("run", "pagerank", bad, "--grid", "packed", "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "edge_codes.npy block (1, 1)" in proc.stderr and "frame width 200" in proc.stderr, proc.stderr
    # Streamed, the fetch stage finds it.
    with pytest.raises(StoreFormatError, match=r"edge_codes\.npy block \(1, 1\).*frame width 200"):
        run(algorithm="pagerank", store=bad, grid="packed", keep_resident=False, out=tmp_path / "s")


def test_an_unknown_code_is_refused(store):
    proc = run_strata("grid", "build", store, "--compression", "zstd", check=False)
    assert proc.returncode == 2 and "compression" in proc.stderr and "packed" in proc.stderr, proc.stderr
