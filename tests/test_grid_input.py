"""Grids built straight from an input edge list (`strata grid build INPUT --out DIR`, issue 21
item 6): from bin32 pairs, NumPy arrays and text (integer ids, names, a weight column), the grid
files are those a store's build writes, and `strata run` on the grid directory (in memory,
streamed from disk, with far memory, over two ranks) gives the store's results; bad input exits 2
naming the file and the edge and leaves nothing, and a killed build leaves no grid that opens."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import first_in_child
from conftest import needs, run_strata
from strata.config import ConvertConfig
from strata.convert import convert
from strata.errors import ConfigError, InputError, StoreExistsError
from strata.grid import build_grid, format_build, run
from torchrun_env import free_port, rank_env

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_grid_input")

N = 2000
ARRAYS = ("edges", "block_index", "out_degree", "in_degree")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A random directed graph of N vertices (the last 50 without edges) as bin32 pairs, a
    NumPy array, a TSV of integer ids with weights and a TSV of names; the store converted from
    the array with its plain, symmetric and weighted grids (4 x 4 blocks)."""
    d = tmp_path_factory.mktemp("gridinput")
    rng = np.random.default_rng(7)
    edges = rng.integers(0, N - 50, size=(16_000, 2), dtype=np.int64)
    weights = rng.uniform(0.5, 4.0, size=len(edges)).astype(np.float32)
    edges.astype(np.int32).tofile(d / "e.bin")
    np.save(d / "e.npy", edges)
    lines = "".join(f"{u}\t{v}\t{w!r}\n" for (u, v), w in zip(edges.tolist(), weights.tolist(), strict=True))
    (d / "w.tsv").write_text("# src dst weight\n" + lines)
    (d / "names.tsv").write_text("".join(f"v{u}\tv{v}\n" for u, v in edges.tolist()))
    store = d / "g.strata"
    convert(ConvertConfig(inputs=[d / "e.npy"], out=store, num_nodes=N))
    build_grid(store=store, name="d", partitions=4)
    build_grid(store=store, name="s", partitions=4, symmetrize=True)
    build_grid(store=store, name="w", partitions=4, weighted=True, weight_seed=3)
    wstore = d / "w.strata"
    convert(ConvertConfig(inputs=[d / "w.tsv"], out=wstore, columns="src,dst,weight", num_nodes=N))
    build_grid(store=wstore, name="w", partitions=4, weighted=True)
    return {"dir": d, "edges": edges, "store": store, "wstore": wstore}


def same_files(a: Path, b: Path, arrays=ARRAYS) -> None:
    for name in arrays:
        assert (a / f"{name}.npy").read_bytes() == (b / f"{name}.npy").read_bytes(), name


@pytest.mark.parametrize("source", ["e.bin", "e.npy", "w.tsv"])
def test_each_input_format_gives_the_stores_grid(graph, tmp_path, source):
    """bin32, NumPy and text inputs build the very files the store's build wrote."""
    out = tmp_path / "g.grid"
    columns = {"columns": "src,dst,weight"} if source.endswith(".tsv") else {}
    s = build_grid(store=graph["dir"] / source, out=out, partitions=4, num_nodes=N, **columns)
    assert s["num_edges"] == len(graph["edges"]) and s["num_vertices"] == N
    same_files(out, graph["store"] / "grids" / "d")
    names = [st["name"] for st in s["stages"]]
    assert names == (["parse", "spool", "blocks"] if source.endswith(".tsv") else ["spool", "blocks"])
    assert all(st["read_bytes"] > 0 for st in s["stages"])
    assert "spool" in format_build(s) and "MB/s" in format_build(s)
    m = json.loads((out / "grid.json").read_text())
    assert m["provenance"]["input"] == [str(graph["dir"] / source)]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_the_cli_builds_and_runs_on_the_grid_directory(graph, tmp_path):
    """`strata grid build INPUT --out DIR` then `strata run ALGO DIR`: without --num-nodes the
    vertex count is the largest id + 1 (a counting pass), and the runs equal the store's."""
    out = tmp_path / "sym.grid"
    proc = run_strata("grid", "build", graph["dir"] / "e.bin", "--out", out, "--partitions", "4", "--symmetrize")
    assert "Built grid" in proc.stdout and "count" in proc.stdout, proc.stdout
    assert json.loads((out / "grid.json").read_text())["num_vertices"] == N - 50
    run_strata("run", "wcc", out, "--out", tmp_path / "wcc", "-q")
    store_run = run(algorithm="wcc", store=graph["store"], grid="s", out=tmp_path / "ref")
    ref = np.load(tmp_path / "ref" / "component.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "wcc" / "component.npy"), ref[: N - 50])
    assert store_run["edges"] > 0
    info = run_strata("grid", "info", out).stdout
    assert "symmetric" in info and "built from bin32 input" in info
    proc = run_strata("run", "sssp", out, "--out", tmp_path / "sssp", check=False)
    assert proc.returncode == 2 and "has no weights and sssp needs them" in proc.stderr
    assert "strata grid build INPUT --weighted --out DIR" in proc.stderr
    proc = run_strata("run", "pagerank", out, "--grid", "d", "--out", tmp_path / "pr", check=False)
    assert proc.returncode == 2 and "is a grid directory itself" in proc.stderr


@pytest.mark.parametrize("keep", [True, False], ids=["resident", "streamed"])
def test_runs_on_the_input_grid_equal_the_stores(graph, tmp_path, keep):
    """PageRank and drawn-weight SSSP, edge blocks resident or streamed from disk every pass."""
    plain, weighted = tmp_path / "d.grid", tmp_path / "w.grid"
    build_grid(store=graph["dir"] / "e.npy", out=plain, partitions=4, num_nodes=N)
    build_grid(store=graph["dir"] / "e.npy", out=weighted, partitions=4, num_nodes=N, weighted=True, weight_seed=3)
    same_files(weighted, graph["store"] / "grids" / "w", (*ARRAYS, "weights"))
    sssp = {"root": 3, "weight_seed": 3}
    for algorithm, grid, target, array, own in (
        ("pagerank", "d", plain, "rank", {}),
        ("sssp", "w", weighted, "distance", sssp),
    ):
        opts = {"algorithm": algorithm, "keep_resident": keep, "segment": "4K", **own}
        mine = run(store=target, out=tmp_path / f"{algorithm}-grid", **opts)
        ref = run(store=graph["store"], grid=grid, out=tmp_path / f"{algorithm}-store", **opts)
        if algorithm == "pagerank":  # sssp's passes depend on the compute threads' timing
            assert mine["edges"] == ref["edges"]
        a, b = (np.load(tmp_path / f"{algorithm}-{k}" / f"{array}.npy") for k in ("grid", "store"))
        np.testing.assert_array_equal(a, b)


def test_a_compressed_grid_from_the_input_is_the_stores_and_runs_the_same(graph, tmp_path):
    """`--compression packed` with `--out`: the codes a store's compressed build writes, and a
    streamed run on them (every block decoded by the fetchers) gives the plain grid's ranks."""
    out = tmp_path / "c.grid"
    run_strata("grid", "build", graph["dir"] / "e.bin", "--out", out, "--partitions", "4", "--num-nodes", N,
               "--compression", "packed", "-q")  # fmt: skip
    m = json.loads((out / "grid.json").read_text())
    assert m["compression"] == "packed" and m["format_version"] == 2 and "edges" not in m["arrays"]
    build_grid(store=graph["store"], name="dp", partitions=4, compression="packed", overwrite=True)
    same_files(out, graph["store"] / "grids" / "dp", ("edge_codes", "code_index", *ARRAYS[1:]))
    s = run(algorithm="pagerank", store=out, keep_resident=False, segment="4K", out=tmp_path / "pr")
    assert s["compression"] == "packed" and s["edges_decoded"] == s["edges"]
    run(algorithm="pagerank", store=graph["store"], grid="d", out=tmp_path / "ref")
    a, b = (np.load(tmp_path / k / "rank.npy") for k in ("pr", "ref"))
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_text_weights_and_names(graph, tmp_path):
    """A TSV weight column weights the grid as the store's weights do; names keep their table,
    and ppr takes seeds by name."""
    wg = tmp_path / "w.grid"
    build_grid(store=graph["dir"] / "w.tsv", out=wg, columns="src,dst,weight", weighted=True, partitions=4, num_nodes=N)
    assert json.loads((wg / "grid.json").read_text())["weights"] == {"kind": "store"}
    same_files(wg, graph["wstore"] / "grids" / "w", (*ARRAYS, "weights"))
    named = tmp_path / "names.grid"
    build_grid(store=graph["dir"] / "names.tsv", out=named, partitions=2)
    m = json.loads((named / "grid.json").read_text())
    assert {"node_names_offsets", "node_names_bytes"} <= set(m["arrays"])
    names = sorted({f"v{x}" for x in graph["edges"].ravel().tolist()})
    seed = names.index("v7")
    s = run(algorithm="ppr", store=named, seeds="v7", iterations=5, out=tmp_path / "ppr")
    assert s["result"]["seeds"] == [seed]
    with pytest.raises(ConfigError, match=r'no node is named "v99999"'):
        run(algorithm="ppr", store=named, seeds="v99999", out=tmp_path / "bad")


def test_far_memory_and_two_ranks_run_on_the_input_grid(graph, tmp_path):
    """The grid directory works with a memory server and under torchrun like a store's grid."""
    grid = tmp_path / "d.grid"
    build_grid(store=graph["dir"] / "e.bin", out=grid, partitions=4, num_nodes=N)
    local = run(algorithm="pagerank", store=grid, iterations=5, out=tmp_path / "local")
    server = subprocess.Popen(
        [sys.executable, "-m", "strata", "farmem", "serve", "--listen", "127.0.0.1:0", "--capacity", "64M"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        addr = re.match(r"listening on (\S+)", server.stdout.readline()).group(1)
        far = run(algorithm="pagerank", store=grid, iterations=5, far=addr, far_ratio=0.9, segment="16K",
                  out=tmp_path / "far")  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert far["bytes_far"] > 0
    np.testing.assert_array_equal(np.load(tmp_path / "far" / "rank.npy"), np.load(tmp_path / "local" / "rank.npy"))
    needs("torch")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", "-m", "strata", "run", "pagerank",
        str(grid), "--iterations", "5", "--threads", "1", "--memory", "1G", "--out", str(tmp_path / "two"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=rank_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    np.testing.assert_allclose(
        np.load(tmp_path / "two" / "rank.npy"), np.load(tmp_path / "local" / "rank.npy"), rtol=1e-5
    )
    assert local["edges"] == 5 * len(graph["edges"])


def test_bad_input_exits_2_naming_the_file_and_leaves_nothing(graph, tmp_path, capsys):
    # The first command in a child process, the rest in this one (tests/cli_in_process.py).
    cli = first_in_child(run_strata, capsys)
    bad = tmp_path / "bad.bin"
    np.array([0, 1, 2, -4], dtype=np.int32).tofile(bad)
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("0\t1\n2\tx\n")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 12)
    cases = [
        ([bad, "--out", tmp_path / "o"], "bad.bin: pair 1 (byte 8): dst id -4 is negative"),
        ([graph["dir"] / "e.bin", "--out", tmp_path / "o", "--num-nodes", "100"], "src id"),
        ([tsv, "--out", tmp_path / "o", "--ids", "int"], "bad.tsv:2:"),
        ([odd, "--out", tmp_path / "o"], "not a whole number of 8-byte int32 (src, dst) pairs"),
        ([graph["dir"] / "e.bin"], "is not a store; to build a grid straight from an input"),
        ([graph["store"], "--out", tmp_path / "o"], "is a store: its grids go to"),
        ([graph["store"], "--columns", "src,dst,weight"], "grid.build.columns: describes an input edge list"),
        ([graph["dir"] / "e.bin", "--out", tmp_path / "o", "--weighted", "--weight-source", "store"],
         "has no weight column"),
    ]  # fmt: skip
    for args, message in cases:
        proc = cli("grid", "build", *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bin", "bad.tsv", "odd.bin"]
    with pytest.raises(InputError, match="negative"):
        build_grid(store=bad, out=tmp_path / "o")
    build_grid(store=graph["dir"] / "e.bin", out=tmp_path / "o")
    with pytest.raises(StoreExistsError, match="already exists"):
        build_grid(store=graph["dir"] / "e.bin", out=tmp_path / "o")
    build_grid(store=graph["dir"] / "e.bin", out=tmp_path / "o", overwrite=True, partitions=2)


def test_a_killed_build_leaves_no_grid_that_opens(graph, tmp_path):
    """SIGKILL after the spool pass: the output does not exist, the `.partial-PID` directory is
    refused, and the next build removes it."""
    out = tmp_path / "g.grid"
    env = {**os.environ, "STRATA_FAULT": "grid.spooled"}
    args = [sys.executable, "-m", "strata", "grid", "build", str(graph["dir"] / "e.bin"), "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()
    (partial,) = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    proc = run_strata("run", "pagerank", partial, "--out", tmp_path / "r", check=False)
    assert proc.returncode == 2 and "unfinished" in proc.stderr, proc.stderr
    run_strata("grid", "build", graph["dir"] / "e.bin", "--out", out, "-q")
    assert [p.name for p in tmp_path.iterdir()] == ["g.grid"]
