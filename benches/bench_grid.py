"""Questions: how fast do Strata's grid algorithms run when the graph is in memory (R1), out of
core under a memlimit of a quarter of the grid (R2), and with a far-memory tier holding a ratio
of the footprint while the local memlimit holds only the rest (R3)?

    python benches/bench_grid.py [--scales 22,24] [--only r1,r2,r3,algos] [--repeats 1] [--r3-scale 24]

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

`--only algos` runs R1 and R2 for the algorithms of issue 21 (ppr from the BFS root, scc and
hyperanf on the directed grid, mis and radii on the symmetric one) into bench-results/grid-algos.json and the
grid-algos section.

Results go to bench-results/grid-r{1,2,3}.json and the grid-r1..r3 sections of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
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
WORK = REPO / "bench-data" / "grid"
OVERHEAD = 48 << 20
DELAYS_US = (0, 250, 1000)


def prepare(scale: int) -> tuple[Path, int]:
    """The store of RMAT scale ``scale`` with its `col` and `sym` grids, and the BFS root."""
    store = WORK / f"rmat{scale}.strata"
    WORK.mkdir(parents=True, exist_ok=True)
    if not store.exists():
        raw = WORK / f"rmat{scale}.bin"
        subprocess.run(strata("generate", "rmat", "--scale", scale, "--out", raw, "-q", "--overwrite"), check=True)
        subprocess.run(strata("convert", raw, "--format", "bin32", "--num-nodes", 2**scale, "--out", store,
                              "--memory", "8G", "-q"), check=True)  # fmt: skip
        raw.unlink()
    for name, sym in (("col", False), ("sym", True)):
        if not (store / "grids" / name / "grid.json").exists():
            _native.grid_build({"store": str(store), "name": name, "symmetrize": sym, "memory": 4 << 30})
    deg = np.load(store / "grids" / "col" / "out_degree.npy", mmap_mode="r")
    return store, int(np.argmax(deg))


def edge_file_bytes(store: Path, grid: str) -> int:
    return (store / "grids" / grid / "edges.npy").stat().st_size


def drive(store: Path, algo: str, grid: str, memory: int, limit: int | None = None, **kw) -> dict:
    args = [sys.executable, DRIVER, store, algo, "--grid", grid, "--memory", memory]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", v]
    res = timed([str(a) for a in args], limit=f"{limit // (1 << 20)}M" if limit else None)
    out = json.loads(res["stdout"])
    out["wall_seconds"] = res["seconds"]
    out["peak_bytes"] = res["peak_bytes"]
    return out


def figures(run: dict) -> dict:
    s, its = run["summary"], run["iterations"]
    disk_rates = [i["pass"]["bytes_disk"] / i["pass"]["seconds"] / 1e6 for i in its if i["pass"]["bytes_disk"]]
    far_rates = [i["pass"]["bytes_far"] / i["pass"]["seconds"] / 1e6 for i in its if i["pass"]["bytes_far"]]
    return {
        "seconds": s["compute_seconds"],
        "wall_seconds": run["wall_seconds"],
        "edges_per_s": s["edges_per_second"],
        "iterations": s["iterations"],
        "gb_disk": s["bytes_disk"] / 1e9,
        "gb_far": s["bytes_far"] / 1e9,
        "gb_local": s["bytes_local"] / 1e9,
        "disk_mb_s_median": statistics.median(disk_rates) if disk_rates else 0.0,
        "far_mb_s_median": statistics.median(far_rates) if far_rates else 0.0,
        "peak_mb": (run["peak_bytes"] or 0) / 2**20,
        "far_failure": s.get("far_failure"),
    }


def best_of(runs: list[dict]) -> dict:
    """Median figures over repeats (by compute seconds)."""
    fs = sorted((figures(r) for r in runs), key=lambda f: f["seconds"])
    return fs[len(fs) // 2]


ALGOS = (("pagerank", "col"), ("wcc", "sym"), ("bfs", "col"))
# Issue 21's algorithms (`--only algos`): R1 and R2 side by side, each on the grid it needs.
MORE_ALGOS = (("ppr", "col"), ("scc", "col"), ("mis", "sym"), ("radii", "sym"), ("hyperanf", "col"))
VERTEX_BYTES = {"pagerank": 16, "wcc": 9, "bfs": 17}


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(capacity: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from strata import _native; _native.farmem_serve({{'listen': '127.0.0.1:{port}', "
            f"'capacity': {capacity}}})",
        ]
    )
    return proc, wait_listening(port)


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
    a = p.parse_args()
    if not memlimit_available():
        raise SystemExit("memlimit is not available: R2 and R3 need ../shared/tools/memlimit")
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
    if "algos" in only:
        in_memory = r1(scales, a.repeats, MORE_ALGOS)
        res = {"r1": in_memory, "r2": r2(scales, a.repeats, in_memory, MORE_ALGOS)}
        save("grid-algos", {**env, "results": res})
        update_doc("grid-algos", f"### More algorithms (`{env['command']}`)\n\n" + algos_table(res, seq))
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


def algos_table(res: dict, seq: float) -> str:
    """In memory (R1) and out of core (R2) side by side, per algorithm."""
    rows = []
    for k, mem in res["r1"].items():
        ooc = res["r2"][k]
        share = f" ({ooc['disk_mb_s_median'] / seq:.0%})" if seq else ""
        rows.append((k, mem["iterations"], f"{mem['edges_per_s'] / 1e6:.0f}M", f"{mem['seconds']:.2f}",
                     f"{ooc['memlimit_mb']:.0f} MiB", "windows" if ooc["vertex_windowed"] else "memory",
                     f"{ooc['edges_per_s'] / 1e6:.0f}M", f"{ooc['seconds']:.2f}", f"{ooc['time_vs_r1']:.2f}x",
                     f"{ooc['gb_disk']:.2f}", f"{ooc['disk_mb_s_median']:.0f}{share}"))  # fmt: skip
    return table(rows, ("scale/algorithm", "passes", "R1 edges/s", "R1 s", "R2 memlimit", "R2 vertex data",
                        "R2 edges/s", "R2 s", "R2 vs R1", "R2 GB read", "disk MB/s (of seq)"))  # fmt: skip


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
