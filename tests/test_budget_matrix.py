"""Every command keeps its ``--memory`` budget, page cache included.

Each row runs one command under ``memlimit`` (a memory cgroup that counts anonymous memory and
page cache) with the limit set to the command's budget plus one fixed overhead that no plan can
see: the interpreter and the extension's code pages (the .so is ~48 MiB). The command must
finish (a cgroup over its limit kills it) and the peak memlimit reports must stay within that
limit. ``gnn train`` plans torch's runtime itself: the process's anonymous memory measured
when the store is opened, and a fixed 96 MiB for the code pages of torch's libraries in use.
The rest of those libraries (~1 GiB mapped with the CUDA build, and the read-ahead of its
import) is clean page cache that the cgroup reclaims at its limit, so that row runs under the
same fixed overhead as every other, and its peak sits at the limit when torch's pages start
cold; anonymous memory past the plan is not reclaimable and gets the run killed. Inputs are
several times the budget where the plan's minimum allows it, so the out-of-core paths run: sorted runs and
several encode passes of the name dictionary, bucketed CSR/CSC, grid spools, partitioned
embeddings, features read from disk.

The rows and their measured peaks are in docs/reliability.md ("Memory budgets").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# What a process costs beyond any plan: Python (~25 MiB), the extension's code pages and
# allocator slack. Measured: `strata convert` of a two-line file peaks at 61-69 MiB.
OVERHEAD = 80 * MiB


def strata(*args) -> list[str]:
    return [sys.executable, "-m", "strata", *map(str, args)]


def from_iec(text: str) -> int:
    return int(subprocess.run(["numfmt", "--from=iec", text], capture_output=True, text=True, check=True).stdout)


def to_iec(n: int) -> str:
    return subprocess.run(["numfmt", "--to=iec", str(n)], capture_output=True, text=True, check=True).stdout.strip()


def peak_of(stderr: str) -> int:
    m = re.search(r"memlimit: peak (\S+) of limit", stderr)
    assert m, f"memlimit reported no peak:\n{stderr[-2000:]}"
    return from_iec(m.group(1))


def limit_for(budget: int) -> int:
    return budget + OVERHEAD


def check_run(proc: subprocess.CompletedProcess | subprocess.Popen, stderr: str, limit: int, what: str) -> int:
    """Asserts the command finished on its own (not killed by the cgroup) within ``limit``."""
    assert proc.returncode == 0, (
        f"{what} failed under a {limit // MiB} MiB limit ({proc.returncode}):\n{stderr[-3000:]}"
    )
    peak = peak_of(stderr)
    # memlimit prints the peak rounded up to a tenth of its unit (1.3G for 1.25 GiB): a peak that
    # reaches the limit, as one that lives on reclaimable page cache does, reads above the exact
    # limit. Round the limit the same way, so only a peak truly past it fails.
    assert peak <= from_iec(to_iec(limit)), f"{what} peaked at {peak // MiB} MiB, over {limit // MiB} MiB"
    print(f"budget matrix: {what}: limit {limit // MiB} MiB, peak {peak / MiB:.0f} MiB")
    return peak


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Inputs in every format, and the stores the engines run on (built without a limit)."""
    d = tmp_path_factory.mktemp("budget")

    def run(*args):
        subprocess.run(strata(*args, "-q"), check=True, capture_output=True)

    run("generate", "kg", "--out", d / "kg", "--entities", 100_000, "--triples", 1_000_000)
    for fmt, name in (("tsv", "r.tsv"), ("bin32", "r.bin"), ("npy", "r.npy")):
        run("generate", "rmat", "--out", d / name, "--scale", 16, "--format", fmt)
    (d / "r.csv").write_text((d / "r.tsv").read_text().replace("\t", ","))
    run("generate", "sbm", "--out", d / "sbm", "--nodes", 50_000, "--feature-dim", 128)
    run("convert", d / "kg", "--relations", "--out", d / "kg.strata", "--memory", "256M")
    run("convert", d / "r.bin", "--out", d / "r.strata", "--memory", "256M")
    run("convert", d / "sbm", "--out", d / "sbm.strata", "--memory", "256M")
    return d


# (id, budget, arguments after the command's name; {d} is the data folder, {o} a fresh output)
CONVERT = [
    ("text-string-ids", "8M", ["{d}/kg", "--relations"]),  # 17 MiB of TSV triples, 100k names
    ("text-int-ids", "8M", ["{d}/r.tsv"]),  # 12 MiB, 1M edges
    ("csv-int-ids", "8M", ["{d}/r.csv"]),
    ("numpy", "8M", ["{d}/r.npy"]),  # 8 MiB
    ("bin32", "8M", ["{d}/r.bin"]),
]

ENGINES = [
    ("grid-build", "80M", ["grid", "build", "{d}/r.strata", "--overwrite"]),
    ("run-pagerank", "80M", ["run", "pagerank", "{d}/r.strata", "--iterations", "3"]),
    ("run-wcc", "96M", ["run", "wcc", "{d}/r.strata"]),
    # 24 MiB of feature rows gathered in chunks the budget leaves, beside the community order.
    ("reorder", "24M", ["reorder", "{d}/sbm.strata", "--out", "{o}", "--order", "community"]),
    (
        "embed-train",
        # The table (24 MiB at dim 64) is split into 8 partitions beside the fixed part, 3
        # resident: 14 swaps, 276 MiB of I/O. At 100M it took 54 partitions and 1.9 GiB of
        # swaps (22 CPU s) for the same check: that the run keeps its budget out of core.
        "120M",
        "embed train {d}/kg.strata --run-dir {o} --dim 64 --epochs 1 --eval-every 0 --negatives 25".split(),
    ),
]


def expand(args: list, d: Path, o: Path) -> list[str]:
    return [str(a).format(d=d, o=o) for a in args]


@pytest.mark.parametrize("budget,args", [pytest.param(b, a, id=i) for i, b, a in CONVERT])
def test_convert_keeps_its_budget(limiter, data, tmp_path, budget, args):
    limit = limit_for(int(subprocess.check_output(["numfmt", "--from=iec", budget])))
    cmd = strata("convert", *expand(args, data, tmp_path), "--out", tmp_path / "g.strata", "--memory", budget, "-q")
    proc = subprocess.run([str(limiter), str(limit), *cmd], capture_output=True, text=True)
    check_run(proc, proc.stderr, limit, f"convert {args[0]}")


def test_typed_convert_keeps_its_budget(limiter, tmp_path):
    """A typed NumPy directory with weights and times: its CSR/CSC carry each edge's id, type,
    weight and time (32 bytes an edge in the fill), each side's columns written from slices as
    large as the plan allows. 2.4M edges at 128 MiB make three adjacency slices a side of up to
    35 MiB; staging a whole slice per column (as before) got the run killed under its limit."""
    rng = np.random.default_rng(0)
    d = tmp_path / "typed"
    d.mkdir()
    (d / "node_types.tsv").write_text("paper\t60000\nauthor\t40000\n")
    (d / "edge_types.tsv").write_text("paper\tcites\tpaper\nauthor\twrites\tpaper\n")
    e = 1_200_000
    for k, src_count in enumerate((60_000, 40_000)):
        np.save(
            d / f"edges_e{k}.npy",
            np.stack([rng.integers(0, src_count, e), rng.integers(0, 60_000, e)]).astype(np.int32),
        )
        np.save(d / f"edge_weights_e{k}.npy", rng.random(e, dtype=np.float32))
        np.save(d / f"edge_times_e{k}.npy", rng.integers(0, 1 << 40, e))
    budget = 128 * MiB
    limit = limit_for(budget)
    cmd = strata("convert", d, "--out", tmp_path / "g.strata", "--memory", budget, "-q")
    proc = subprocess.run([str(limiter), str(limit), *cmd], capture_output=True, text=True)
    check_run(proc, proc.stderr, limit, "convert typed numpy (weights, times)")


@pytest.mark.parametrize("budget,args", [pytest.param(b, a, id=i) for i, b, a in ENGINES])
def test_engine_keeps_its_budget(limiter, data, tmp_path, budget, args):
    limit = limit_for(int(subprocess.check_output(["numfmt", "--from=iec", budget])))
    cmd = strata(*expand(args, data, tmp_path / "run"), "--memory", budget, "-q")
    proc = subprocess.run([str(limiter), str(limit), *cmd], capture_output=True, text=True)
    check_run(proc, proc.stderr, limit, " ".join(args[:2]))


def gnn_train(data: Path, run: Path, budget: int) -> list[str]:
    cmd = strata("gnn", "train", data / "sbm.strata", "--run-dir", run, "--epochs", 1, "--fanouts", "5", "5")
    return [*cmd, "--batch-size", "512", "--eval-every", "0", "--memory", str(budget), "-q"]


def test_gnn_train_keeps_its_budget(limiter, data, tmp_path):
    pytest.importorskip("torch", reason="gnn train needs torch: pip install -e '.[torch]'")
    # Below the plan's fixed needs (torch's anonymous memory as measured at open and its code
    # pages, training a batch, topology, batch buffers: ~0.55 GiB with torch's CUDA build) the
    # run is refused with the figures; the row then runs at that minimum plus 20 MiB, less
    # than the 24 MiB of features, so that part of them is read from disk.
    refused = subprocess.run(gnn_train(data, tmp_path / "refused", 256 * MiB), capture_output=True, text=True)
    assert refused.returncode == 2, refused.stderr[-2000:]
    for want in ("memory budget 256 MiB cannot hold", "anonymous memory as measured at open", "training a batch"):
        assert want in refused.stderr, refused.stderr[-2000:]
    m = re.search(r"\): (\S+ \S+) in all before any feature row", refused.stderr)
    assert m, refused.stderr[-2000:]
    budget = from_iec(m.group(1).replace(" ", "").removesuffix("iB")) + 20 * MiB
    limit = limit_for(budget)
    proc = subprocess.run(
        [str(limiter), str(limit), *gnn_train(data, tmp_path / "run", budget)], capture_output=True, text=True
    )
    check_run(proc, proc.stderr, limit, f"gnn train (budget {budget / MiB:.0f} MiB)")
    plan = json.loads((tmp_path / "run" / "run.json").read_text())["plan"]
    assert plan["runtime_measured"] and plan["training_bytes"] > 0, plan
    assert 0 < plan["hot_rows"] + plan["cache_rows"] < plan["num_nodes"], "the row must read features from disk"


def test_serve_keeps_its_budget(limiter, data, tmp_path):
    from strata.serve import Client
    from strata.serve.client import TOKEN_ENV

    # The runtime floor (24 MiB) and 24 MiB shared: a 13.5 MiB page cache, which the graph's
    # topology (3.4 MiB) then shrinks; the features alone are 24 MiB.
    budget = 48 * MiB
    limit = limit_for(budget)
    cmd = strata("serve", "--listen", "127.0.0.1:0", "--state-dir", tmp_path / "state", "--memory", budget,
                 "--data-root", data)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.Popen(
        [str(limiter), str(limit), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    addr = None
    for line in proc.stdout:
        if line.startswith("listening on "):
            addr = line.split()[2]
            break
    assert addr, f"strata serve did not start:\n{''.join(err)}"
    try:
        with Client(addr) as c:
            c.register_graph("g", data / "sbm.strata", reorder=False)
            rng = np.random.default_rng(0)
            for _ in range(4):  # every row once, in pieces the reply limit allows
                for ids in np.array_split(rng.permutation(50_000), 10):
                    assert c.get_features("g", ids).shape == (len(ids), 128)
                c.sample_neighbors("g", rng.choice(50_000, 500, replace=False), [10, 5])
    finally:
        # memlimit runs the server as its child: TERM the server, then memlimit reports.
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            os.kill(int(child), signal.SIGTERM)
        proc.stdout.read()
        proc.wait(timeout=60)
        reader.join(timeout=10)
    check_run(proc, "".join(err), limit, "serve")


def test_serve_refuses_a_budget_below_its_minimum(tmp_path):
    cmd = strata("serve", "--listen", "127.0.0.1:0", "--state-dir", tmp_path / "state", "--memory", "16M")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--memory 16.0 MiB is below this server's minimum of 32.0 MiB: runtime 24.0 MiB" in proc.stderr
