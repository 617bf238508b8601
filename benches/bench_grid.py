"""Questions: how fast do Strata's grid algorithms run when the graph is in memory (R1), out of
core under a memlimit of a quarter of the grid (R2), and with a far-memory tier holding a ratio
of the footprint while the local memlimit holds only the rest (R3)?

    python benches/bench_grid.py [--scales 22,24] [--only r1,r2,r3,r3t,farcpu,algos,comp] [--repeats 1]
        [--r3-scale 24] [--far-cases tcp/tcp/256K,uring/tcp/4M,...] [--data DIR]
        [--algos ppr,scc,...] [--nx-scale 14] [--gridgraph DIR]

Graphs: Graph500 R-MAT (`strata generate rmat`, a=0.57, b=c=0.19, edge factor 16), converted to a
store, then two grids built by `strata grid build` with P chosen automatically: the directed one
(PageRank, BFS from the highest-degree vertex) and a symmetric one (WCC). Each run is a
`grid_driver.py` process.

R1: no memlimit, edge blocks resident. R2: memlimit = a quarter of the grid's edge file, the run's
budget that minus 48 MiB for the interpreter; edge blocks that do not fit stream from disk each
pass, and vertex data that does not fit next to the fetch buffers goes to windows. Reported:
edges/s (edge and vertex passes together), time, bytes read, and the disk throughput of the
passes against the device profile's sequential read bandwidth.
R3: a `strata farmem serve` process on loopback (outside the memlimit); the compute process under
a memlimit of (1 - R) of the run's footprint plus 96 MiB, for R = 0.5, 0.7, 0.9 (0.9 is below the
vertex data's share at scale 24, so its limit is the smallest that holds vertex data); the
chunk-size curve (64 KiB to 4 MiB) and prefetch on/off at R = 0.7; then prefetch on/off with a
one-way delay of 0, 250 and 1000 us added in each direction. The kernel here is built without
netem (CONFIG_NET_SCH_NETEM unset, so `tc qdisc ... netem delay` is refused), so the delay comes
from a relay (`cargo run --example delay_relay` of strata-farmem) that holds every chunk it
forwards for the delay, without capping throughput.

`--only r3t` (the far-memory transports) runs R3 at ratio 0.7 for each
`--far-cases` case CLIENT/SERVER/CHUNK (client and server transport, tcp or uring, and the
chunk size; default: the old tcp/tcp/256K, tcp/tcp/4M, uring/tcp/4M and uring/uring/4M) side by
side with the all-local run, the cases alternating over `--repeats` rounds, one memory server
per server transport; recorded per run: compute seconds, the compute process's CPU seconds, the
server process's CPU seconds over the run (from /proc/PID/stat: the preload's writes and every
pass's reads) and the 1-minute load average; into bench-results/grid-r3t.json and the grid-r3t
section. `--only farcpu` runs `cargo run --release --example farmem_bench` of strata-farmem:
CPU seconds per GB read of client and server for every transport pair at 256 KiB and 4 MiB
chunks, alternating over `--repeats` rounds, into the grid-farcpu section. `--data DIR` reads the
R-MAT stores from DIR instead of bench-data/grid, and `--runs DIR` is where r3t's runs write
their output (default bench-data/grid-runs; never into the stores).

`--only comp` measures compressed grids (`--compression packed|byte`): the
codes' bytes per edge and one core's decode rate (`cargo run --release --example codec_bench` of
strata-grid, on the `col` grid and on the same graph reordered by `strata reorder --order
community`, a graph whose ids follow its communities as a crawled or reordered real graph's do),
then PageRank in memory (R1, plain) and out of core (R2's memlimit, plain and each code) side by
side, the cases alternating over `--repeats` rounds, the 1-minute load average recorded with each
run; into bench-results/grid-comp.json and the grid-comp section.

`--only algos` runs R1 and R2 for the analytics algorithms (ppr from the BFS root, scc and
hyperanf on the directed grid; mis, radii, triangles, lpa (10 rounds) and betweenness (8 sampled
sources in one batch) on the symmetric one), or those `--algos` names, alternating R1 and R2 over
`--repeats` rounds, with the 1-minute load average before each run, into
bench-results/grid-algos.json and the grid-algos section (grid-algos-NAME-... for a subset). Then,
side by side in one run and alternating over the rounds:
- networkx on RMAT scale `--nx-scale` (14: networkx holds the graph as Python dicts) for the
  algorithms it has (triangles: `triangles`; lpa: `label_propagation_communities`, semi-synchronous,
  so other rounds; betweenness: `betweenness_centrality(k=8)`; mis: `maximal_independent_set`; scc:
  `strongly_connected_components`), networkx timed in this process on a graph it built from the
  store beforehand, Strata as an in-memory run (its compute seconds, and the process's wall time);
- GridGraph's `mis` and `radii` (examples/mis.cpp and radii.cpp of thu-pacman/GridGraph) when
  `--gridgraph DIR` names a GridGraph checkout built with `make` (on recent g++ add
  `CXXFLAGS="-O3 -std=c++11 -fopenmp -include functional -I$PWD"`): the symmetric graph is written
  as its binary edge list and cut by its `preprocess` into as many partitions as Strata's grid,
  then both run in memory and under the R2 memlimit (GridGraph with a 1 GB budget, its smallest).
  GridGraph's radii draws its 64 sources from the clock and then runs a second sweep from the
  farthest vertices found, and its mis keeps the lower id of two neighbours, so they do other work
  than Strata's seeded ones: the table compares time and passes.

Results go to bench-results/grid-r{1,2,3}.json and the grid-r1..r3 sections of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import REPO, RESULTS, machine, memlimit_available, save, strata, timed, update_doc
from strata import _native
from strata.io import load_profile

DRIVER = Path(__file__).resolve().parent / "grid_driver.py"
RELAY = REPO / "target" / "release" / "examples" / "delay_relay"
FARMEM_BENCH = REPO / "target" / "release" / "examples" / "farmem_bench"
CODEC_BENCH = REPO / "target" / "release" / "examples" / "codec_bench"
CODECS = ("packed", "byte")
WORK = REPO / "bench-data" / "grid"
RUNS = REPO / "bench-data" / "grid-runs"
OVERHEAD = 48 << 20
DELAYS_US = (0, 250, 1000)


def prepare(scale: int, work: Path = WORK) -> tuple[Path, int]:
    """The store of RMAT scale ``scale`` in ``work`` with its `col` and `sym` grids, and the
    BFS root."""
    store = work / f"rmat{scale}.strata"
    work.mkdir(parents=True, exist_ok=True)
    if not store.exists():
        raw = work / f"rmat{scale}.bin"
        subprocess.run(strata("generate", "rmat", "--scale", scale, "--out", raw, "-q", "--overwrite"), check=True)
        subprocess.run(strata("convert", raw, "--format", "bin32", "--num-nodes", 2**scale, "--out", store,
                              "--memory", "8G", "-q"), check=True)  # fmt: skip
        raw.unlink()
    for name, sym in (("col", False), ("sym", True)):
        if not (store / "grids" / name / "grid.json").exists():
            _native.grid_build({"store": str(store), "name": name, "symmetrize": sym, "memory": 4 << 30})
    deg = np.load(store / "grids" / "col" / "out_degree.npy", mmap_mode="r")
    return store, int(np.argmax(deg))


def prepare_coded(store: Path) -> None:
    """The `col-packed` and `col-byte` grids of ``store``: `col` compressed by each code."""
    for codec in CODECS:
        if not (store / "grids" / f"col-{codec}" / "grid.json").exists():
            _native.grid_build({"store": str(store), "name": f"col-{codec}", "compression": codec,
                                "memory": 4 << 30})  # fmt: skip


def prepare_reordered(scale: int) -> Path:
    """RMAT ``scale`` reordered by `strata reorder --order community`, with its `col` grid."""
    store, _ = prepare(scale)
    out = WORK / f"rmat{scale}-community.strata"
    if not out.exists():
        subprocess.run(strata("reorder", store, "--order", "community", "--out", out, "-q"), check=True)
    if not (out / "grids" / "col" / "grid.json").exists():
        _native.grid_build({"store": str(out), "name": "col", "memory": 4 << 30})
    return out


def codec_bench(grid: Path, repeats: int) -> list[dict]:
    """codec_bench's lines on the plain grid ``grid`` (bytes per edge, one core's decode rate)."""
    res = timed([str(CODEC_BENCH), str(grid), str(repeats)])
    return [json.loads(line) for line in res["stdout"].splitlines()]


def comp(scales: list[int], repeats: int) -> dict:
    """Codes and out-of-core PageRank on compressed grids (see the module documentation)."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "strata-grid", "--example", "codec_bench"],
                   cwd=REPO, check=True)  # fmt: skip
    out: dict = {"codes": {}, "runs": {}}
    for scale in scales:
        store, _ = prepare(scale)
        prepare_coded(store)
        for label, s in ((f"rmat{scale}", store), (f"rmat{scale}-community", prepare_reordered(scale))):
            for line in codec_bench(s / "grids" / "col", repeats):
                out["codes"][f"{label}/{line['codec']}"] = line
                print(f"codes {label} {line['codec']}: {line['bytes_per_edge']:.2f} B/edge, "
                      f"{line['decode_gb_per_s']:.2f} GB/s", flush=True)  # fmt: skip
        limit = edge_file_bytes(store, "col") // 4
        cases = [("r1", "col", None), ("r2_none", "col", limit)] + [(f"r2_{c}", f"col-{c}", limit) for c in CODECS]
        rounds: dict = {name: [] for name, _, _ in cases}
        for r in range(repeats):
            # Alternate: each round starts one case later.
            for name, grid, lim in cases[r % len(cases) :] + cases[: r % len(cases)]:
                run = drive(store, "pagerank", grid, (lim - OVERHEAD) if lim else 16 << 30, limit=lim)
                f = figures(run)
                f["load_1min"] = os.getloadavg()[0]
                f["cpu_seconds"] = run["cpu_seconds"]
                s = run["summary"]
                f["bytes_per_edge"] = s["stored_bytes_per_edge"]
                f["decode_seconds"] = s["decode_seconds"]
                f["decode_gb_per_s"] = (
                    s["edges_decoded"] * 8 / s["decode_seconds"] / 1e9 if s["decode_seconds"] else 0.0
                )
                rounds[name].append(f)
                print(f"comp scale {scale} round {r} {name}: {f['seconds']:.2f} s (load {f['load_1min']:.1f})",
                      flush=True)  # fmt: skip
        res = {}
        for name, runs in rounds.items():
            med = {k: statistics.median(f[k] for f in runs) for k in ("seconds", "cpu_seconds", "gb_disk",
                   "disk_mb_s_median", "decode_gb_per_s", "bytes_per_edge", "load_1min", "peak_mb")}  # fmt: skip
            pairs = zip(runs, rounds["r1"], strict=True)
            med["vs_r1"] = statistics.median(f["seconds"] / base["seconds"] for f, base in pairs)
            med["vs_none"] = statistics.median(
                f["seconds"] / base["seconds"] for f, base in zip(runs, rounds["r2_none"], strict=True)
            )
            med["runs"] = runs
            res[name] = med
        res["memlimit_mb"] = limit / 2**20
        out["runs"][str(scale)] = res
    return out


def edge_file_bytes(store: Path, grid: str) -> int:
    return (store / "grids" / grid / "edges.npy").stat().st_size


def drive(store: Path, algo: str, grid: str, memory: int, limit: int | None = None, **kw) -> dict:
    args = [sys.executable, DRIVER, store, algo, "--grid", grid, "--memory", memory]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", v]
    for k, v in ALGO_PARAMS.get(algo, {}).items():
        args += ["--param", f"{k}={json.dumps(v)}"]
    load = os.getloadavg()[0]
    res = timed([str(a) for a in args], limit=f"{limit // (1 << 20)}M" if limit else None)
    out = json.loads(res["stdout"])
    out["wall_seconds"] = res["seconds"]
    out["cpu_seconds"] = res["cpu_seconds"]
    out["peak_bytes"] = res["peak_bytes"]
    out["load1"] = load
    return out


def figures(run: dict) -> dict:
    s, its = run["summary"], run["iterations"]
    disk_rates = [i["pass"]["bytes_disk"] / i["pass"]["seconds"] / 1e6 for i in its if i["pass"]["bytes_disk"]]
    far_rates = [i["pass"]["bytes_far"] / i["pass"]["seconds"] / 1e6 for i in its if i["pass"]["bytes_far"]]
    return {
        "seconds": s["compute_seconds"],
        "wall_seconds": run["wall_seconds"],
        "cpu_seconds": run["cpu_seconds"],
        "edges_per_s": s["edges_per_second"],
        "iterations": s["iterations"],
        "gb_disk": s["bytes_disk"] / 1e9,
        "gb_far": s["bytes_far"] / 1e9,
        "gb_local": s["bytes_local"] / 1e9,
        "disk_mb_s_median": statistics.median(disk_rates) if disk_rates else 0.0,
        "far_mb_s_median": statistics.median(far_rates) if far_rates else 0.0,
        "peak_mb": (run["peak_bytes"] or 0) / 2**20,
        "far_failure": s.get("far_failure"),
        "load1": run["load1"],
        "result": {k: v for k, v in s["result"].items() if k != "sources"},
    }


def best_of(runs: list[dict]) -> dict:
    """Median figures over repeats (by compute seconds)."""
    fs = sorted((figures(r) for r in runs), key=lambda f: f["seconds"])
    return fs[len(fs) // 2]


ALGOS = (("pagerank", "col"), ("wcc", "sym"), ("bfs", "col"))
# The analytics algorithms (`--only algos`): R1 and R2 side by side, each on the grid it needs.
MORE_ALGOS = (
    ("ppr", "col"),
    ("scc", "col"),
    ("mis", "sym"),
    ("radii", "sym"),
    ("hyperanf", "col"),
    ("triangles", "sym"),
    ("lpa", "sym"),
    ("betweenness", "sym"),
)
# Parameters of the benchmarked runs besides the defaults.
# Betweenness: one batch of 8 sources (185 B a vertex of vertex data; its windows fit R2's limit).
ALGO_PARAMS = {"lpa": {"rounds": 10}, "betweenness": {"sources": 8, "batch": 8}}
VERTEX_BYTES = {"pagerank": 16, "wcc": 9, "bfs": 17}
# R2 limits below a quarter of the grid that an algorithm's windows cannot fit: HyperANF's 64
# registers a vertex (137 B) need a 122 MiB budget at scale 22's partitions, above the 80 MiB
# that 128 MiB leaves, so it runs out of core under 192 MiB.
R2_LIMIT_FLOOR = {"hyperanf": 192 << 20}


def r1(scales: list[int], repeats: int, algos=ALGOS) -> dict:
    out = {}
    for scale in scales:
        store, root = prepare(scale)
        for algo, grid in algos:
            runs = [drive(store, algo, grid, 16 << 30, root=root) for _ in range(repeats)]
            out[f"{scale}/{algo}"] = best_of(runs)
            print(f"R1 scale {scale} {algo}: {out[f'{scale}/{algo}']['edges_per_s'] / 1e6:.0f}M edges/s", flush=True)
    return out


def r2(scales: list[int], repeats: int, r1_res: dict, algos=ALGOS) -> dict:
    out = {}
    for scale in scales:
        store, root = prepare(scale)
        for algo, grid in algos:
            limit = edge_file_bytes(store, grid) // 4
            runs = [drive(store, algo, grid, limit - OVERHEAD, limit=limit, root=root) for _ in range(repeats)]
            f = best_of(runs)
            f["memlimit_mb"] = limit / 2**20
            f["vertex_windowed"] = runs[0]["summary"]["vertex_windowed"]
            base = r1_res.get(f"{scale}/{algo}")
            f["time_vs_r1"] = f["seconds"] / base["seconds"] if base else None
            out[f"{scale}/{algo}"] = f
            print(f"R2 scale {scale} {algo}: {f['seconds']:.1f} s, disk {f['disk_mb_s_median']:.0f} MB/s", flush=True)
    return out


def algos_r1_r2(scales: list[int], repeats: int, algos) -> dict:
    """R1 and R2 of each algorithm, alternating over ``repeats`` rounds; medians by compute time."""
    runs: dict = {}
    for scale in scales:
        store, root = prepare(scale)
        for _ in range(repeats):
            for algo, grid in algos:
                key = f"{scale}/{algo}"
                limit = max(edge_file_bytes(store, grid) // 4, R2_LIMIT_FLOOR.get(algo, 0))
                mem = drive(store, algo, grid, 16 << 30, root=root)
                ooc = drive(store, algo, grid, limit - OVERHEAD, limit=limit, root=root)
                ooc["memlimit_mb"] = limit / 2**20
                runs.setdefault(key, ([], []))
                runs[key][0].append(mem)
                runs[key][1].append(ooc)
                r1_s, r2_s = mem["summary"]["compute_seconds"], ooc["summary"]["compute_seconds"]
                print(f"{key}: R1 {r1_s:.1f} s, R2 {r2_s:.1f} s (load {ooc['load1']:.1f})", flush=True)
    out: dict = {"r1": {}, "r2": {}}
    for key, (mem, ooc) in runs.items():
        out["r1"][key] = best_of(mem)
        f = best_of(ooc)
        f["memlimit_mb"] = ooc[0]["memlimit_mb"]
        f["vertex_windowed"] = ooc[0]["summary"]["vertex_windowed"]
        f["time_vs_r1"] = f["seconds"] / out["r1"][key]["seconds"]
        out["r2"][key] = f
    return out


def nx_graph(store: Path, directed: bool):
    """The store's edges as a networkx graph (a simple graph: networkx keeps an edge once)."""
    import networkx as nx

    from strata import Store

    st = Store(store)
    g = nx.DiGraph() if directed else nx.Graph()
    g.add_nodes_from(range(st.num_nodes))
    g.add_edges_from(np.asarray(st.edges("train")).tolist())
    return g


def nx_call(algo: str, g) -> None:
    import networkx as nx

    if algo == "triangles":
        sum(nx.triangles(g).values())
    elif algo == "lpa":
        list(nx.community.label_propagation_communities(g))
    elif algo == "betweenness":
        nx.betweenness_centrality(g, k=ALGO_PARAMS["betweenness"]["sources"], seed=0)
    elif algo == "mis":
        nx.maximal_independent_set(g, seed=0)
    elif algo == "scc":
        list(nx.strongly_connected_components(g))


NX_ALGOS = ("triangles", "lpa", "betweenness", "mis", "scc")


def networkx_side_by_side(scale: int, repeats: int, algos) -> dict:
    """Strata in memory and networkx on the same graph, alternating over ``repeats`` rounds."""
    store, root = prepare(scale)
    graphs = {False: nx_graph(store, directed=False), True: nx_graph(store, directed=True)}
    out = {}
    for algo, grid in algos:
        if algo not in NX_ALGOS:
            continue
        ours, theirs, loads = [], [], []
        for _ in range(repeats):
            loads.append(os.getloadavg()[0])
            ours.append(drive(store, algo, grid, 16 << 30, root=root))
            t = time.perf_counter()
            nx_call(algo, graphs[grid == "col"])
            theirs.append(time.perf_counter() - t)
        f = best_of(ours)
        out[f"{scale}/{algo}"] = {
            "strata_seconds": f["seconds"],
            "strata_wall_seconds": f["wall_seconds"],
            "networkx_seconds": statistics.median(theirs),
            "speedup": statistics.median(theirs) / f["seconds"],
            "load1": statistics.median(loads),
        }
        print(f"networkx {scale}/{algo}: strata {f['seconds']:.2f} s, networkx {statistics.median(theirs):.2f} s",
              flush=True)  # fmt: skip
    return out


def gridgraph_grid(gridgraph: Path, store: Path, scale: int) -> Path:
    """GridGraph's grid of the store's symmetric graph (both directions of each edge, self-loops
    once, as Strata's `sym` grid holds it), cut into as many partitions, beside the store (made
    once; its input edge list is deleted)."""
    out = WORK / f"gridgraph-{scale}-sym"
    if (out / "meta").exists():
        return out
    from strata import Store

    edges = np.asarray(Store(store).edges("train")).astype(np.uint32)
    loops = edges[:, 0] == edges[:, 1]
    both = np.concatenate([edges, edges[~loops][:, ::-1]])
    raw = WORK / f"gridgraph-{scale}.bin"
    both.tofile(raw)
    del edges, both
    partitions = json.loads((store / "grids" / "sym" / "grid.json").read_text())["partitions"]
    subprocess.run([gridgraph / "bin" / "preprocess", "-i", raw, "-o", out, "-v", str(2**scale), "-p",
                    str(partitions), "-t", "0"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    raw.unlink()
    return out


def gridgraph_run(gridgraph: Path, algo: str, grid: Path, budget_gb: int, limit: int | None) -> dict:
    load = os.getloadavg()[0]
    res = timed([str(gridgraph / "bin" / algo), str(grid), str(budget_gb)],
                limit=f"{limit // (1 << 20)}M" if limit else None)  # fmt: skip
    seconds = float(re.search(r"time: ([0-9.]+) seconds", res["stdout"]).group(1))
    passes = len(re.findall(r"^\s*\d+: ", res["stdout"], flags=re.M))
    return {"seconds": seconds, "passes": passes, "wall_seconds": res["seconds"], "load1": load}


def gridgraph_side_by_side(gridgraph: Path, scales: list[int], repeats: int) -> dict:
    """Strata's and GridGraph's mis and radii on the symmetric graph, in memory and under the R2
    memlimit, alternating over ``repeats`` rounds."""
    out = {}
    for scale in scales:
        store, root = prepare(scale)
        gg = gridgraph_grid(gridgraph, store, scale)
        limit = edge_file_bytes(store, "sym") // 4
        for algo in ("mis", "radii"):
            cases: dict = {k: [] for k in ("strata_r1", "gridgraph_r1", "strata_r2", "gridgraph_r2")}
            for _ in range(repeats):
                cases["strata_r1"].append(figures(drive(store, algo, "sym", 16 << 30, root=root)))
                cases["gridgraph_r1"].append(gridgraph_run(gridgraph, algo, gg, 16, None))
                cases["strata_r2"].append(figures(drive(store, algo, "sym", limit - OVERHEAD, limit=limit)))
                cases["gridgraph_r2"].append(gridgraph_run(gridgraph, algo, gg, 1, limit))
            row = {}
            for case, fs in cases.items():
                row[case] = {
                    "seconds": statistics.median(f["seconds"] for f in fs),
                    "passes": fs[0].get("passes", fs[0].get("iterations")),
                    "load1": statistics.median(f["load1"] for f in fs),
                }
            row["memlimit_mb"] = limit / 2**20
            out[f"{scale}/{algo}"] = row
            print(f"GridGraph {scale}/{algo}: " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in row.items()
                                                          if isinstance(v, dict)), flush=True)  # fmt: skip
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(capacity: str, transport: str = "tcp") -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from strata import _native; _native.farmem_serve({{'listen': '127.0.0.1:{port}', "
            f"'capacity': {capacity}, 'transport': '{transport}'}})",
        ]
    )
    return proc, wait_listening(port)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_case(case: str) -> tuple[str, str, int]:
    """CLIENT/SERVER/CHUNK, e.g. ``uring/tcp/4M``."""
    parts = case.split("/")
    units = {"K": 1 << 10, "M": 1 << 20}
    if len(parts) != 3 or not set(parts[:2]) <= {"tcp", "uring"} or not re.fullmatch(r"\d+[KM]", parts[2]):
        raise SystemExit(f"--far-cases: expected CLIENT/SERVER/CHUNK such as uring/tcp/4M, got {case!r}")
    return parts[0], parts[1], int(parts[2][:-1]) * units[parts[2][-1]]


def r3_transports(scale: int, repeats: int, cases: list[str], work: Path, runs_dir: Path) -> dict:
    """R3 at ratio 0.7 for each transport case, alternating with the all-local run."""
    store, _ = prepare(scale, work)
    edges = edge_file_bytes(store, "col")
    footprint = edges + 16 * 2**scale + (64 << 20)
    limit = max(int(0.3 * footprint) + OVERHEAD, 16 * 2**scale + (128 << 20) + OVERHEAD)
    parsed = {c: parse_case(c) for c in cases}
    out_dir = runs_dir / f"rmat{scale}"
    servers = {t: start_server(str(edges * 2), t) for t in sorted({p[1] for p in parsed.values()})}
    runs: dict[str, list[dict]] = {"all_local": [], **{c: [] for c in cases}}
    try:
        for r in range(repeats):
            f = figures(drive(store, "pagerank", "col", 16 << 30, iterations=10, out=out_dir))
            runs["all_local"].append(f)
            print(f"R3t round {r} all_local: {f['seconds']:.2f} s (load {f['load1']:.1f})", flush=True)
            for case, (client, server, chunk) in parsed.items():
                proc, addr = servers[server]
                before = process_cpu(proc.pid)
                run = drive(store, "pagerank", "col", limit - OVERHEAD, limit=limit, far=addr, ratio=0.7, chunk=chunk,
                            far_transport=client, iterations=10, out=out_dir)  # fmt: skip
                f = figures(run)
                f["server_cpu_seconds"] = process_cpu(proc.pid) - before
                f["vs_all_local"] = f["seconds"] / runs["all_local"][-1]["seconds"]
                runs[case].append(f)
                print(f"R3t round {r} {case}: {f['seconds']:.2f} s ({f['vs_all_local']:.2f}x local, "
                      f"far {f['far_mb_s_median']:.0f} MB/s, load {f['load1']:.1f})", flush=True)  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    res: dict = {"memlimit_mb": limit / 2**20}
    for name, fs in runs.items():
        keys = ("seconds", "cpu_seconds", "gb_far", "far_mb_s_median", "load1")
        med = {k: statistics.median(f[k] for f in fs) for k in keys}
        if name != "all_local":
            med["vs_all_local"] = statistics.median(f["vs_all_local"] for f in fs)
            med["server_cpu_seconds"] = statistics.median(f["server_cpu_seconds"] for f in fs)
        med["runs"] = fs
        res[name] = med
    return res


def r3t_table(res: dict) -> str:
    rows = []
    for k, v in res.items():
        if not isinstance(v, dict):
            continue
        vs = f"{v['vs_all_local']:.2f}x" if "vs_all_local" in v else ""
        server = f"{v['server_cpu_seconds']:.1f}" if "server_cpu_seconds" in v else ""
        rows.append((k, f"{v['seconds']:.2f}", vs, f"{v['gb_far']:.2f}", f"{v['far_mb_s_median']:.0f}",
                     f"{v['cpu_seconds']:.1f}", server, f"{v['load1']:.1f}"))  # fmt: skip
    head = f"Ratio 0.7 under a memlimit of {res['memlimit_mb']:.0f} MiB; medians of the rounds.\n\n"
    return head + table(rows, ("case (client/server/chunk)", "seconds", "vs all-local", "GB far", "far MB/s",
                               "compute process CPU s", "server CPU s", "load (1 min)"))  # fmt: skip


def far_cpu(repeats: int) -> tuple[str, list]:
    """farmem_bench's table (markdown) and its JSON figures."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "strata-farmem", "--example", "farmem_bench"],
                   cwd=REPO, check=True)  # fmt: skip
    proc = subprocess.run([str(FARMEM_BENCH), "3", str(repeats)], capture_output=True, text=True, check=True)
    lines = proc.stdout.strip().splitlines()
    return "\n".join(lines[:-1]), json.loads(lines[-1])


def start_relay(upstream: str, delay_us: int) -> tuple[subprocess.Popen, str]:
    """A delay relay in front of ``upstream`` (see the module documentation)."""
    port = free_port()
    proc = subprocess.Popen([RELAY, f"127.0.0.1:{port}", upstream, str(delay_us)], stdout=subprocess.DEVNULL)
    return proc, wait_listening(port)


def build_relay() -> None:
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "strata-farmem", "--example", "delay_relay"],
                   cwd=REPO, check=True)  # fmt: skip


def wait_listening(port: int) -> str:
    """Waits until something listens on ``port`` of loopback; returns its address."""
    addr = f"127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return addr
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing started listening on {addr}")


def r3(scale: int, repeats: int) -> dict:
    store, _ = prepare(scale)
    edges = edge_file_bytes(store, "col")
    vertex = 16 * 2**scale
    buffers = 64 << 20
    footprint = edges + vertex + buffers
    minimum = vertex + buffers + (64 << 20) + OVERHEAD
    server, addr = start_server(str(edges * 2))
    out: dict = {"footprint_mb": footprint / 2**20, "vertex_share": vertex / footprint}
    try:
        iters = 10
        local = [drive(store, "pagerank", "col", 16 << 30, iterations=iters) for _ in range(repeats)]
        out["all_local"] = best_of(local)
        disk_limit = edges // 4
        disk = [drive(store, "pagerank", "col", disk_limit - OVERHEAD, limit=disk_limit, iterations=iters)
                for _ in range(repeats)]  # fmt: skip
        out["disk_only_r2_limit"] = best_of(disk)
        out["disk_only_r2_limit"]["memlimit_mb"] = disk_limit / 2**20
        for ratio in (0.5, 0.7, 0.9):
            limit = max(int((1 - ratio) * footprint) + OVERHEAD, minimum)
            runs = [drive(store, "pagerank", "col", limit - OVERHEAD, limit=limit, far=addr, ratio=ratio,
                          iterations=iters) for _ in range(repeats)]  # fmt: skip
            f = best_of(runs)
            f["memlimit_mb"] = limit / 2**20
            f["vs_all_local"] = f["seconds"] / out["all_local"]["seconds"]
            f["vs_disk_only"] = f["seconds"] / out["disk_only_r2_limit"]["seconds"]
            out[f"ratio_{ratio}"] = f
            print(f"R3 ratio {ratio}: {f['seconds']:.1f} s ({f['vs_all_local']:.2f}x local)", flush=True)
        limit = int(0.3 * footprint) + OVERHEAD
        for chunk in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
            f = best_of([drive(store, "pagerank", "col", limit - OVERHEAD, limit=limit, far=addr, ratio=0.7,
                               chunk=chunk, iterations=iters) for _ in range(repeats)])  # fmt: skip
            f["memlimit_mb"] = limit / 2**20
            out[f"chunk_{chunk >> 10}k"] = f
            print(f"R3 chunk {chunk >> 10} KiB: {f['seconds']:.1f} s, far {f['far_mb_s_median']:.0f} MB/s", flush=True)
        for prefetch in (1, 8):
            f = best_of([drive(store, "pagerank", "col", limit - OVERHEAD, limit=limit, far=addr, ratio=0.7,
                               prefetch=prefetch, iterations=iters) for _ in range(repeats)])  # fmt: skip
            f["memlimit_mb"] = limit / 2**20
            out[f"prefetch_{prefetch}"] = f
            print(f"R3 prefetch {prefetch}: {f['seconds']:.1f} s", flush=True)
        build_relay()
        for delay in DELAYS_US:
            relay, relay_addr = start_relay(addr, delay)
            try:
                for prefetch in (1, 8):
                    runs = [drive(store, "pagerank", "col", limit - OVERHEAD, limit=limit, far=relay_addr, ratio=0.7,
                                  prefetch=prefetch, iterations=iters) for _ in range(repeats)]  # fmt: skip
                    f = best_of(runs)
                    f["memlimit_mb"] = limit / 2**20
                    out[f"delay_{delay}us_prefetch_{prefetch}"] = f
                    print(f"R3 delay {delay} us prefetch {prefetch}: {f['seconds']:.1f} s", flush=True)
            finally:
                relay.terminate()
                relay.wait()
    finally:
        server.terminate()
        server.wait()
    return out


def table(rows: list[tuple], header: tuple) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", default="22,24")
    p.add_argument("--only", default="r1,r2,r3")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--r3-scale", type=int, default=24)
    p.add_argument("--far-cases", default="tcp/tcp/256K,tcp/tcp/4M,uring/tcp/4M,uring/uring/4M",
                   help="--only r3t: CLIENT/SERVER/CHUNK cases")  # fmt: skip
    p.add_argument("--data", type=Path, default=WORK, help="where the R-MAT stores are (r3t)")
    p.add_argument("--runs", type=Path, default=RUNS, help="where r3t's runs write their output")
    p.add_argument("--algos", default=",".join(a for a, _ in MORE_ALGOS), help="--only algos: which of them")
    p.add_argument("--nx-scale", type=int, default=14, help="--only algos: the RMAT scale networkx runs on")
    p.add_argument("--gridgraph", type=Path, default=None, help="--only algos: a built GridGraph checkout")
    a = p.parse_args()
    if not memlimit_available():
        raise SystemExit("memlimit is not available: R2 and R3 need shared/tools/memlimit beside the checkout")
    WORK.mkdir(parents=True, exist_ok=True)
    scales = [int(s) for s in a.scales.split(",")]
    only = set(a.only.split(","))
    profile = load_profile(WORK) or {}
    seq = profile.get("seq_read_mb_s", 0.0)
    env = {"machine": machine(), "profile_seq_read_mb_s": seq, "command": " ".join(sys.argv)}
    r1_res = {}
    saved_r1 = RESULTS / "grid-r1.json"
    if "r1" not in only and "r2" in only and saved_r1.exists():
        r1_res = json.loads(saved_r1.read_text())["results"]  # R2 compares with the last R1
    elif "r1" in only or "r2" in only:
        r1_res = r1(scales, a.repeats)
        save("grid-r1", {**env, "results": r1_res})
        update_doc("grid-r1", f"### R1: in memory (`{env['command']}`)\n\n" + r1_table(r1_res))
    if "r2" in only:
        res = r2(scales, a.repeats, r1_res)
        save("grid-r2", {**env, "results": res})
        head = f"### R2: out of core (`{env['command']}`; profile sequential read {seq:.0f} MB/s)\n\n"
        update_doc("grid-r2", head + r2_table(res, seq))
    if "comp" in only:
        res = comp(scales, a.repeats)
        save("grid-comp", {**env, "results": res})
        update_doc("grid-comp", f"### Compressed grids (`{env['command']}`)\n\n" + comp_table(res))
    if "algos" in only:
        names = a.algos.split(",")
        unknown = set(names) - {x for x, _ in MORE_ALGOS}
        if unknown:
            raise SystemExit(f"--algos: not among {[x for x, _ in MORE_ALGOS]}: {sorted(unknown)}")
        chosen = tuple((x, g) for x, g in MORE_ALGOS if x in names)
        section = "grid-algos" + ("" if len(chosen) == len(MORE_ALGOS) else "-" + "-".join(x for x, _ in chosen))
        res = algos_r1_r2(scales, a.repeats, chosen)
        res["networkx"] = networkx_side_by_side(a.nx_scale, a.repeats, chosen)
        if a.gridgraph:
            res["gridgraph"] = gridgraph_side_by_side(a.gridgraph, scales, a.repeats)
        save(section, {**env, "results": res})
        update_doc(section, f"### More algorithms (`{env['command']}`)\n\n" + algos_tables(res, seq))
    if "r3t" in only:
        res = r3_transports(a.r3_scale, a.repeats, a.far_cases.split(","), a.data, a.runs)
        save("grid-r3t", {**env, "results": res})
        head = f"### R3 by far-memory transport, PageRank scale {a.r3_scale} (`{env['command']}`)\n\n"
        update_doc("grid-r3t", head + r3t_table(res))
    if "farcpu" in only:
        text, figs = far_cpu(a.repeats)
        save("grid-farcpu", {**env, "results": figs})
        head = f"### CPU per far GB by transport (`{env['command']}`)\n\n"
        update_doc("grid-farcpu", head + text)
    if "r3" in only:
        res = r3(a.r3_scale, a.repeats)
        save("grid-r3", {**env, "results": res})
        head = f"### R3: far memory, PageRank scale {a.r3_scale} (`{env['command']}`)\n\n"
        update_doc("grid-r3", head + r3_table(res))


def r1_table(res: dict) -> str:
    rows = [(k, f"{v['edges_per_s'] / 1e6:.0f}M", f"{v['seconds']:.2f}", v["iterations"]) for k, v in res.items()]
    return table(rows, ("scale/algorithm", "edges/s", "seconds", "iterations"))


def r2_table(res: dict, seq: float) -> str:
    rows = []
    for k, v in res.items():
        share = f" ({v['disk_mb_s_median'] / seq:.0%})" if seq else ""
        rows.append((k, f"{v['memlimit_mb']:.0f} MiB", "windows" if v["vertex_windowed"] else "memory",
                     f"{v['seconds']:.2f}", f"{v['time_vs_r1']:.2f}x", f"{v['gb_disk']:.2f}",
                     f"{v['disk_mb_s_median']:.0f}{share}", f"{v['peak_mb']:.0f}"))  # fmt: skip
    return table(rows, ("scale/algorithm", "memlimit", "vertex data", "seconds", "vs R1", "GB read",
                        "disk MB/s (of seq)", "peak MiB"))  # fmt: skip


def algos_tables(res: dict, seq: float) -> str:
    """In memory (R1) and out of core (R2) side by side, per algorithm; then networkx and GridGraph."""
    rows = []
    for k, mem in res["r1"].items():
        ooc = res["r2"][k]
        share = f" ({ooc['disk_mb_s_median'] / seq:.0%})" if seq else ""
        rows.append((k, mem["iterations"], f"{mem['edges_per_s'] / 1e6:.0f}M", f"{mem['seconds']:.2f}",
                     f"{mem['load1']:.1f}", f"{ooc['memlimit_mb']:.0f} MiB",
                     "windows" if ooc["vertex_windowed"] else "memory", ooc["iterations"],
                     f"{ooc['edges_per_s'] / 1e6:.0f}M", f"{ooc['seconds']:.2f}", f"{ooc['time_vs_r1']:.2f}x",
                     f"{ooc['gb_disk']:.2f}", f"{ooc['disk_mb_s_median']:.0f}{share}",
                     f"{ooc['load1']:.1f}"))  # fmt: skip
    out = table(rows, ("scale/algorithm", "R1 passes", "R1 edges/s", "R1 s", "R1 load", "R2 memlimit",
                       "R2 vertex data", "R2 passes", "R2 edges/s", "R2 s", "R2 vs R1", "R2 GB read",
                       "disk MB/s (of seq)", "R2 load"))  # fmt: skip
    if res.get("networkx"):
        rows = [(k, f"{v['strata_seconds']:.3f}", f"{v['strata_wall_seconds']:.2f}", f"{v['networkx_seconds']:.2f}",
                 f"{v['speedup']:.0f}x", f"{v['load1']:.1f}") for k, v in res["networkx"].items()]  # fmt: skip
        out += "\n\nnetworkx side by side (Strata in memory; networkx in one Python process on its own graph):\n\n"
        out += table(rows, ("scale/algorithm", "Strata s", "Strata process s", "networkx s", "networkx / Strata",
                            "load"))  # fmt: skip
    if res.get("gridgraph"):
        rows = []
        for k, v in res["gridgraph"].items():
            rows.append((k, *(f"{v[c]['seconds']:.2f} ({v[c]['passes']})" for c in
                              ("strata_r1", "gridgraph_r1", "strata_r2", "gridgraph_r2")),
                         f"{v['memlimit_mb']:.0f} MiB", f"{v['strata_r1']['load1']:.1f}"))  # fmt: skip
        out += "\n\nGridGraph side by side (seconds, and passes in brackets):\n\n"
        out += table(rows, ("scale/algorithm", "Strata R1", "GridGraph R1", "Strata R2", "GridGraph R2",
                            "R2 memlimit", "load"))  # fmt: skip
    return out


def comp_table(res: dict) -> str:
    """Codes (bytes per edge, one core's decode rate), then PageRank in memory and out of core."""
    rows = [(k, f"{v['bytes_per_edge']:.2f}", f"{v['decode_edges_per_s'] / 1e6:.0f}M", f"{v['decode_gb_per_s']:.2f}")
            for k, v in res["codes"].items()]  # fmt: skip
    text = table(rows, ("graph/code", "bytes per edge", "decode edges/s (1 core)", "decode GB/s of records"))
    for scale, runs in res["runs"].items():
        rows = []
        for name, v in runs.items():
            if not isinstance(v, dict):
                continue
            rows.append((f"{scale}/{name}", f"{v['seconds']:.2f}", f"{v['vs_r1']:.2f}x", f"{v['vs_none']:.2f}x",
                         f"{v['cpu_seconds']:.1f}", f"{v['gb_disk']:.2f}", f"{v['disk_mb_s_median']:.0f}",
                         f"{v['bytes_per_edge']:.2f}", f"{v['decode_gb_per_s']:.2f}",
                         f"{v['load_1min']:.1f}"))  # fmt: skip
        text += f"\n\nPageRank, 20 iterations, R2 memlimit {runs['memlimit_mb']:.0f} MiB (medians of the rounds):\n\n"
        text += table(rows, ("scale/case", "seconds", "vs R1", "vs R2 plain", "CPU s", "GB read", "disk MB/s",
                             "B per edge", "decode GB/s per fetcher", "load (1 min)"))  # fmt: skip
    return text


def r3_table(res: dict) -> str:
    rows = []
    for k, v in res.items():
        if not isinstance(v, dict):
            continue
        vs = f"{v['vs_all_local']:.2f}x" if "vs_all_local" in v else ""
        vs_disk = f"{v['vs_disk_only']:.2f}x" if "vs_disk_only" in v else ""
        limit = f"{v['memlimit_mb']:.0f}" if "memlimit_mb" in v else "none"
        rows.append((k, limit, f"{v['seconds']:.2f}", f"{v['gb_far']:.2f}", f"{v['gb_disk']:.2f}",
                     f"{v['far_mb_s_median']:.0f}", vs, vs_disk))  # fmt: skip
    return table(rows, ("setting", "memlimit MiB", "seconds", "GB far", "GB disk", "far MB/s", "vs all-local",
                        "vs disk-only"))  # fmt: skip


if __name__ == "__main__":
    main()
