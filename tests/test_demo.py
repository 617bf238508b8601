"""`strata demo` (what `make demo` runs) end to end: it trains embeddings out of core and a GNN
with features on disk, runs PageRank over a grid streamed from disk, and prints their results.
The test runs `--small`: every step of `make demo`'s, on smaller graphs, each still out of core."""

from __future__ import annotations

import importlib.util
import json
import os
import re

from conftest import run_strata
from strata.demo import SMALL


def test_demo_trains_out_of_core_and_reports(tmp_path):
    env = {**os.environ, "STRATA_PROFILE_DIR": str(tmp_path / "profiles")}
    proc = run_strata("demo", "--small", "--dir", tmp_path / "demo", env=env)
    out = proc.stdout
    # More partitions on disk than buffer slots: the table does not fit the budget.
    meta = json.loads((tmp_path / "demo" / "kg.strata" / "runs" / "embed" / "run.json").read_text())
    assert meta["partitioning"]["partitions"] > 3
    test_mrr = float(re.search(r"test: filtered MRR (\d\.\d+)", out).group(1))
    assert test_mrr > 0.1, out
    assert re.search(r"median epoch [\d.]+ s", out)
    assert "saved to" in out and list((tmp_path / "profiles").glob("*.json"))
    # The small demo's quick disk profile says a cache may have served it (make demo's 1 GiB does not).
    assert f"measured on a {SMALL.disk_mib} MiB file, which a cache may have served" in out
    assert "<- the held-out answer" in out or re.search(r"   1\. e\d+", out)
    if importlib.util.find_spec("torch") is None:
        assert "skipped: strata.gnn needs PyTorch" in out
    else:
        acc = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
        assert acc > 0.5, out  # 8 communities: chance is about 0.125
        assert re.search(r"loader: [\d,]+ seeds/s, [\d,]+ sampled nodes/s; rows from the hot set", out)
    # PageRank over the grid: edge blocks streamed from disk every iteration, a line per iteration.
    assert "Ran pagerank on grid p8-column" in out and "10 iterations" in out, out
    active = f"{1 << SMALL.grid_scale:,}"
    assert re.search(rf"iter 10  [\d.]+ s  [\d.]+[kMG]? edges/s  active {active}  disk \d+ MB/s", proc.stderr)
    grid_store = tmp_path / "demo" / f"rmat-s{SMALL.grid_scale}.strata"
    run = json.loads((grid_store / "runs" / "grid-pagerank" / "run.json").read_text())
    # Every iteration streams every edge (two int32 each) from disk.
    edge_bytes = (16 << SMALL.grid_scale) * 8
    assert run["format"] == "strata-grid-run" and run["summary"]["bytes_disk"] >= 10 * edge_bytes
    assert run["summary"]["placement"]["local_edge_bytes"] == 0
    assert len(re.findall(r"   \d\. vertex \d+ +rank 0\.\d+  in-degree", out)) == 5
    assert "Demo finished" in out
