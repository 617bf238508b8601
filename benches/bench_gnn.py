"""Questions: does GraphSAGE trained on batches whose features come from disk reach the published
accuracy on Cora and CiteSeer, and match the same model with every feature row in RAM (G1)? How
fast does Strata's loader serve batches when the features are far larger than memory, against
the memory-mapped gather of PyG and DGL and against Strata with every row in RAM (G2)? What does
each mechanism contribute (G3), and how long does a GraphSAGE epoch take end to end (G4; both in
`gnn_ablations.py`)? Does data-parallel training under torchrun keep G1's accuracy and scale
the G2 graph's training throughput with 2 ranks (G5, `gnn_dist_bench.py`)?

    python benches/bench_gnn.py [--only g1,g2,g3,g4,g5] [--seeds 5] [--epochs 20] [--g2-nodes 10000000]
        [--g2-limit 1000M] [--g2-batches 60] [--work DIR]

G1: 2-layer GraphSAGE (mean), fanouts 25,10, the standard Planetoid split, mean test accuracy over
seeds. "disk": the feature tiers are capped at a tenth of the feature matrix (`--feature-memory`),
so most rows are read from the SSD each epoch; "RAM": every row is in the hot set.

G2: loader throughput on a generated power-law graph (`strata generate sbm`, 64 classes, mean
degree 10, exponent 2.2, 256 float32 features per node; 10M nodes make 10.2 GB of features, five
times the 1950M memlimit), symmetrized. The same batches (1024 train seeds each, fanouts 15,10,
shuffled, same seed) through three loaders, each a `gnn_loader_driver.py` process: (i) Strata
under the memlimit with the rest of the limit as its budget, (ii) a NumPy sampler over the
store's CSC memmaps and `features[nodes]` on the memory-mapped feature matrix under the same
memlimit, (iii) Strata with every row in RAM and no memlimit. Reported: sampled feature rows/s
and seeds/s over the loop, MB/s read from storage, the loader's setup time, and (i)'s random
reads per second against the device profile's 4 KiB IOPS at queue depth 128.

Results go to bench-results/gnn-g{1,2,3,4,5}.json and the gnn-g1 to gnn-g5 sections of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from common import REPO, SHARED, machine, memlimit_available, save, strata, timed, update_doc
from strata.io import load_profile
from strata.units import fmt_bytes, parse_size

DRIVER = Path(__file__).resolve().parent / "gnn_loader_driver.py"

SAGE = ["--model", "sage", "--fanouts", "25,10", "--batch-size", "64", "--hidden", "256", "--lr", "0.01",
        "--weight-decay", "5e-4", "--dropout", "0.5", "--device", "cpu"]  # fmt: skip


def run(store: Path, run_dir: Path, seed: int, epochs: int, feature_memory: str, extra: tuple = SAGE) -> dict:
    """One `strata gnn train` with the options ``extra`` (G1's GraphSAGE by default)."""
    res = timed(strata("gnn", "train", store, "--run-dir", run_dir, *extra, "--epochs", epochs, "--seed", seed,
                       "--feature-memory", feature_memory, "-q", "--json-summary"))  # fmt: skip
    rec = json.loads(res["stdout"])
    last = rec["history"][-1]
    return {
        "test_accuracy": rec["test"]["accuracy"],
        "best_epoch": rec["best"]["epoch"],
        "epoch_seconds": statistics.median(h["seconds"] for h in rec["history"]),
        "tiers": last["pipeline"]["tiers"],
        "data_wait_fraction": last["data_wait_fraction"],
    }


def g1(args) -> None:
    rows = {}
    for name in ("cora", "citeseer"):
        store = args.work / f"{name}.strata"
        if not store.exists():
            timed(strata("convert", SHARED / "datasets" / "planetoid", "--name", name, "--out", store, "-q"))
        manifest = json.loads((store / "manifest.json").read_text())
        features = manifest["arrays"]["features"]
        feature_bytes = features["shape"][0] * features["shape"][1] * (4 if features["dtype"] == "float32" else 2)
        cap = str(feature_bytes // 10)
        for label, feature_memory in (("disk", cap), ("RAM", "0")):
            runs = [
                run(store, args.work / f"run-{name}-{label}", s, args.epochs, feature_memory) for s in range(args.seeds)
            ]
            accs = [r["test_accuracy"] for r in runs]
            rows[f"{name} {label}"] = {
                "accuracies": accs,
                "mean": statistics.mean(accs),
                "runs": runs,
                "feature_bytes": feature_bytes,
                "feature_memory": int(feature_memory),
            }
            print(f"G1 {name} {label}: mean test accuracy {statistics.mean(accs):.4f} {accs}", flush=True)
    save("gnn-g1", {"machine": machine(), "seeds": args.seeds, "epochs": args.epochs, "rows": rows})
    lines = [
        "### G1: Cora and CiteSeer, features from disk vs in RAM (`benches/bench_gnn.py`)",
        "",
        f"2-layer GraphSAGE (mean), 256 hidden, fanouts 25,10, batch 64, Adam lr 0.01, weight decay 5e-4, dropout "
        f"0.5, {args.epochs} epochs, test accuracy at the best validation epoch, mean of {args.seeds} seeds. disk: "
        "feature tiers capped at a tenth of the feature matrix.",
        "",
        "| dataset | features | feature tiers | mean test accuracy | per seed | rows from disk (last epoch) | "
        "median epoch (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in rows.items():
        name, label = key.split()
        t = r["runs"][-1]["tiers"]
        disk = t["disk_rows"] / max(t["rows"], 1)
        tiers = f"{r['feature_memory'] / 2**20:.2f} MiB" if r["feature_memory"] else "all rows"
        lines.append(
            f"| {name} | {r['feature_bytes'] / 2**20:.1f} MiB | {tiers} | {r['mean']:.4f} | "
            f"{', '.join(f'{a:.3f}' for a in r['accuracies'])} | {100 * disk:.0f}% | "
            f"{statistics.median(x['epoch_seconds'] for x in r['runs']):.2f} |"
        )
    lines += [
        "",
        "The two columns agree exactly because a batch's sample and rows do not depend on which tier serves them "
        "(sampling is a pure function of seed, batch, layer and node): the data path changes where bytes come from, "
        "not what the model sees.",
        "",
    ]
    for name in ("cora", "citeseer"):
        d = rows[f"{name} disk"]["mean"] - rows[f"{name} RAM"]["mean"]
        lines.append(f"- {name}: disk minus RAM {100 * d:+.2f} points.")
    update_doc("gnn-g1", "\n".join(lines))


def g2_store(args) -> Path:
    """The G2 graph, generated and converted once (the store is kept in the work dir)."""
    name = f"sbm-n{args.g2_nodes}-deg{args.g2_avg_degree:g}-f{args.g2_feature_dim}"
    store = args.work / f"{name}.strata"
    if store.exists():
        return store
    raw = args.work / f"{name}-raw"
    gen = ["--nodes", args.g2_nodes, "--classes", 64, "--avg-degree", args.g2_avg_degree,
           "--feature-dim", args.g2_feature_dim, "--power-law", 2.2]  # fmt: skip
    print(f"G2: generating {raw.name} and converting it to {store.name}", flush=True)
    timed(strata("generate", "sbm", "--out", raw, *gen, "--overwrite", "-q"))
    # The directory holds edges.npy, features.npy, labels.npy and the *_idx.npy node splits.
    timed(strata("convert", raw, "--symmetrize", "--out", store, "--memory", "4G", "-q"))
    shutil.rmtree(raw)  # the store has every array of it; regenerating is deterministic
    return store


def drive(store: Path, mode: str, memory: int, limit: str | None, args, extra: tuple = ()) -> dict:
    """One loader in its own process; derives the throughput figures from its JSON."""
    # Under too tight a limit a process can thrash (page faults on its own code) for a very long
    # time instead of being killed; `timeout` bounds that.
    cmd = ["timeout", "--signal=KILL", args.g2_timeout, sys.executable, DRIVER, store, "--mode", mode,
           "--memory", memory, "--batches", args.g2_batches, "--batch-size", args.g2_batch_size,
           "--fanouts", "15,10", "--seed", args.g2_seed]  # fmt: skip
    if args.g2_window is not None:
        cmd += ["--window", args.g2_window]
    cmd += list(extra)
    try:
        res = timed([str(c) for c in cmd], limit)
    except SystemExit as e:  # killed by the memlimit or the timeout, or a crash: recorded, not fatal
        return {"error": str(e)[-2000:], "limit": limit}
    out = json.loads(res["stdout"])
    out |= {"limit": limit, "peak_bytes": res["peak_bytes"], "process_seconds": res["seconds"]}
    if "error" in out:
        return out
    secs = out["seconds"]
    if mode == "strata":
        tiers = out["stats"]["tiers"]
        out["bytes_read"] = tiers["disk_bytes_read"]
        out["disk_requests"] = tiers["disk_requests"]
        out["io_busy_fraction"] = out["stats"]["io_busy_secs"] / secs
    else:
        out["bytes_read"] = out["proc_read_bytes"]
        out["gather_rows_per_second"] = out["rows"] / out["gather_seconds"]
    out["rows_per_second"] = out["rows"] / secs
    out["seeds_per_second"] = out["seeds"] / secs
    out["mb_per_second"] = out["bytes_read"] / secs / 1e6
    return out


def read_ahead_kb(path: Path) -> int | None:
    """The read-ahead window of the block device holding ``path`` (what a memmap fault reads)."""
    dev = os.stat(path).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for candidate in (sys_dev / "queue" / "read_ahead_kb", sys_dev.resolve().parent / "queue" / "read_ahead_kb"):
        if candidate.exists():
            return int(candidate.read_text())
    return None


def qd128_iops(store: Path, work: Path) -> float | None:
    """The device profile's 4 KiB random-read IOPS at queue depth 128 (measured once if absent)."""
    if load_profile(store) is None:
        timed(strata("bench-disk", "--dir", work, "-q"))
    profile = load_profile(store) or {}
    return next((q["iops"] for q in profile.get("rand_read_4k", []) if q["queue_depth"] == 128), None)


def g2(args) -> None:
    store = g2_store(args)
    manifest = json.loads((store / "manifest.json").read_text())
    shape = manifest["arrays"]["features"]["shape"]
    feature_bytes = shape[0] * shape[1] * (4 if manifest["features"]["dtype"] == "float32" else 2)
    limit = args.g2_limit if memlimit_available() else None
    memory = parse_size(args.g2_limit) - parse_size(args.g2_reserve)
    # All rows resident: the budget is only a ceiling the plan fills as far as it needs.
    ram_memory = 2 * feature_bytes + (4 << 30)
    loaders = {}
    runs = (
        ("strata", "strata", memory, limit, ()),
        ("mmap", "mmap", memory, limit, ()),
        ("mmap_random", "mmap", memory, limit, ("--advice", "random")),
        ("ram", "strata", ram_memory, None, ()),
    )
    for key, mode, mem, lim, extra in runs:
        loaders[key] = r = drive(store, mode, mem, lim, args, extra)
        if "error" in r:
            print(f"G2 {key}: FAILED: {r['error'].splitlines()[0]}", flush=True)
        else:
            print(f"G2 {key}: {r['rows_per_second']:,.0f} rows/s, {r['seeds_per_second']:,.0f} seeds/s, "
                  f"{r['mb_per_second']:,.1f} MB/s read, setup {r['setup_seconds']:.2f} s", flush=True)  # fmt: skip
    iops = qd128_iops(store, args.work)
    res = {
        "machine": machine(),
        "read_ahead_kb": read_ahead_kb(store),
        "store": str(store),
        "graph": {
            "nodes": manifest["graph"]["num_nodes"],
            "topology_edges": manifest["graph"]["num_topology_edges"],
            "avg_degree": args.g2_avg_degree,
            "power_law": 2.2,
            "classes": 64,
            "feature_dim": shape[1],
            "feature_bytes": feature_bytes,
        },
        "limit": limit,
        "reserve": args.g2_reserve,
        "memory": memory,
        "batches": args.g2_batches,
        "batch_size": args.g2_batch_size,
        "timeout": args.g2_timeout,
        "fanouts": [15, 10],
        "seed": args.g2_seed,
        "window": args.g2_window,
        "profile_qd128_iops": iops,
        "loaders": loaders,
    }
    res["targets"] = g2_targets(res)
    save("gnn-g2", res)
    update_doc("gnn-g2", g2_markdown(res))


def timed_out(run: dict) -> bool:
    """Killed by the per-loader timeout (exit 137 from ``timeout --signal=KILL``)."""
    return not ok(run) and "failed (137)" in run["error"]


def ok(run: dict) -> bool:
    return "error" not in run


def speedup(a: dict, b: dict) -> float | None:
    """Rows/s of run ``a`` over run ``b``; None when either failed."""
    return a["rows_per_second"] / b["rows_per_second"] if ok(a) and ok(b) else None


def g2_targets(res: dict) -> dict:
    """The issue's targets: None where a figure is missing (a loader failed, no profile)."""
    s, m, r = (res["loaders"][k] for k in ("strata", "mmap", "ram"))
    achieved = s["disk_requests"] / s["seconds"] if ok(s) else None
    vs_mmap = speedup(s, m)
    if vs_mmap is None and ok(s) and timed_out(m):
        # The baseline did not finish the batches Strata served: its rate is below rows / timeout.
        vs_mmap = s["rows_per_second"] / (s["rows"] / res["timeout"])
    return {
        "vs_mmap": vs_mmap,
        "vs_mmap_is_lower_bound": speedup(s, m) is None and vs_mmap is not None,
        "vs_mmap_random": speedup(s, res["loaders"].get("mmap_random", {"error": "absent"})),
        "vs_ram": speedup(s, r),
        "achieved_iops": achieved,
        "iops_fraction": achieved / res["profile_qd128_iops"] if achieved and res["profile_qd128_iops"] else None,
        "features_over_limit": res["graph"]["feature_bytes"] / parse_size(res["limit"]) if res["limit"] else None,
    }


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def verdict(x: float | None, target: float, what: str) -> str:
    if x is None:
        return f"- {what}: not measured (see above): **not met**."
    return f"- {what}: {x:.2f} -> **{'met' if x >= target else 'not met'}**."


def g2_markdown(res: dict) -> str:
    g, t, lo = res["graph"], res["targets"], res["loaders"]
    limit = f"`memlimit {res['limit']}`" if res["limit"] else "no memlimit (memlimit unavailable here)"
    lines = [
        "### G2: loader throughput, features 5x the memory limit (`benches/bench_gnn.py --only g2`)",
        "",
        f"{res['machine']['nproc']} cores ({res['machine']['cpu']}), {res['machine']['ram_gib']} GiB RAM. Degree-"
        f"corrected SBM, {g['nodes']:,} nodes, {g['classes']} classes, mean degree {g['avg_degree']:g}, power law "
        f"{g['power_law']}, symmetrized ({g['topology_edges']:,} CSC entries); {g['feature_dim']} float32 features "
        f"per node: {fmt_bytes(g['feature_bytes'])}. {res['batches']} batches of {res['batch_size']} train seeds, "
        f"fanouts 15,10, shuffled, seed {res['seed']}; every batch's `x` summed. Strata and the memmap baseline run "
        f"under {limit} (page cache included, cold start); Strata's budget is the limit less "
        f"{res['reserve']} for the interpreter ({fmt_bytes(res['memory'])}). The memmap baseline samples with "
        "NumPy over the CSC memmaps (same semantics: every known node's neighbours, uniform without replacement) "
        "and gathers `features[nodes]` from `np.load(mmap_mode='r')` (as is, and with `madvise(MADV_RANDOM)`, since "
        f"this disk's read-ahead is {res.get('read_ahead_kb', '?')} KiB); it builds no blocks. Neither imports "
        "torch. In RAM: Strata with every feature row in its hot set, no memlimit. rows/s: sampled nodes "
        "(feature rows in `x`) per second of the loop over the batches, setup excluded; ratios are of rows/s.",
        "",
        "| loader | rows/s | seeds/s | MB/s read | setup s | ratio vs mmap | ratio vs in-RAM |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "strata": "Strata, memlimit",
        "mmap": "NumPy memmap, memlimit",
        "mmap_random": "NumPy memmap + MADV_RANDOM, memlimit",
        "ram": "Strata, all rows in RAM",
    }
    for key, name in names.items():
        r = lo[key]
        if timed_out(r) and ok(lo["strata"]):
            bound = lo["strata"]["rows"] / res["timeout"]
            lines.append(
                f"| {name} | < {bound:,.0f} (killed after {res['timeout']} s, before finishing the "
                f"{res['batches']} batches) | | | | | |"
            )
            continue
        if not ok(r):
            lines.append(f"| {name} | failed: {r['error'].splitlines()[0][:300]} | | | | | |")
            continue
        vs_mmap, vs_ram = (speedup(r, lo[k]) for k in ("mmap", "ram"))
        lines.append(
            f"| {name} | {r['rows_per_second']:,.0f} | {r['seeds_per_second']:,.0f} | {r['mb_per_second']:,.1f} | "
            f"{r['setup_seconds']:.2f} | {fmt_ratio(vs_mmap)} | {fmt_ratio(vs_ram)} |"
        )
    m = lo["mmap"]
    if ok(m):
        lines.append(
            f"| NumPy memmap, gather only | {m['gather_rows_per_second']:,.0f} | | "
            f"{m['bytes_read'] / m['gather_seconds'] / 1e6:,.1f} | | | |"
        )
    lines += [
        "",
        "| loader | batches | rows/batch | loop s | first batch s | read | requests | peak memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, name in names.items():
        r = lo[key]
        if not ok(r):
            continue
        peak = fmt_bytes(r["peak_bytes"]) if r.get("peak_bytes") else f"{fmt_bytes(r['peak_rss_bytes'])} RSS"
        lines.append(
            f"| {name} | {r['batches']} | {r['rows'] / r['batches']:,.0f} | {r['seconds']:.2f} | "
            f"{r['first_batch_seconds']:.2f} | {fmt_bytes(r['bytes_read'])} | {r.get('disk_requests', '-')} | {peak} |"
        )
    lines.append("")
    s = lo["strata"]
    if ok(s):
        p = s["setup_phases"]
        lines.append(
            f"Strata's setup under the memlimit: topology and plan {p['topology_and_plan']:.2f} s, hot-set ranking "
            f"(reverse PageRank) {p['hot_ranking']:.2f} s, loading the hot set {p['hot_loading']:.2f} s. Plan: "
            + " ".join(line.strip() for line in s["plan_lines"])
        )
        lines.append("")
    if ok(m):
        lines.append(
            f"The memmap loop's {m['seconds']:.2f} s: {m['sample_seconds']:.2f} s sampling, "
            f"{m['gather_seconds']:.2f} s in `features[nodes]`, {m['major_faults']:,} major page faults."
        )
        lines.append("")
    if t["achieved_iops"] is not None:
        profile = f"{res['profile_qd128_iops']:,.0f}" if res["profile_qd128_iops"] else "unknown (no QD 128 in profile)"
        frac = "-" if t["iops_fraction"] is None else f"{100 * t['iops_fraction']:.0f}%"
        lines.append(
            f"Achieved random reads (Strata under the memlimit): {s['disk_requests']:,} requests in "
            f"{s['seconds']:.2f} s = {t['achieved_iops']:,.0f}/s, {frac} of the device profile's 4 KiB IOPS at queue "
            f"depth 128 ({profile}); mean request "
            f"{fmt_bytes(s['bytes_read'] / max(s['disk_requests'], 1))}; "
            f"the I/O stage was busy {100 * s['io_busy_fraction']:.0f}% of the loop."
        )
        lines.append("")

    lines += [
        "Targets:",
        "",
        verdict(
            t["vs_mmap"],
            2.0,
            "Strata >= 2x the memmap baseline (rows/s"
            + (", a lower bound: the baseline timed out)" if t.get("vs_mmap_is_lower_bound") else ")"),
        ),
        verdict(t.get("vs_mmap_random"), 2.0, "Strata >= 2x the memmap baseline with MADV_RANDOM (rows/s)"),
        verdict(t["vs_ram"], 0.5, "Strata >= 0.5x Strata in RAM (rows/s)"),
        verdict(t["iops_fraction"], 0.85, "random-read IOPS >= 85% of the profile at QD 128 while disk-bound"),
    ]
    if t["features_over_limit"] is not None:
        x = t["features_over_limit"]
        lines.append(f"- setup: features {x:.1f}x the memlimit (required >= 5x: {'yes' if x >= 5 else '**no**'}).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only", default="g1,g2,g3,g4,g5", help="comma-separated subset of g1,g2,g3,g4,g5 and g2r (G2 reordered)"
    )
    ap.add_argument("--seeds", type=int, default=5, help="G1: training seeds")
    ap.add_argument("--epochs", type=int, default=20, help="G1: epochs per run")
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "gnn")
    ap.add_argument("--g2-nodes", type=int, default=10_000_000)
    ap.add_argument("--g2-avg-degree", type=float, default=10.0)
    ap.add_argument("--g2-feature-dim", type=int, default=256)
    ap.add_argument("--g2-limit", default="1950M", help="memlimit of Strata and the memmap baseline")
    ap.add_argument(
        "--g2-reserve", default="150M", help="left to the Python interpreter: Strata's budget is the limit less this"
    )
    ap.add_argument("--g2-batches", type=int, default=30)
    ap.add_argument("--g2-batch-size", type=int, default=1024)
    ap.add_argument(
        "--g2-window", type=int, default=2, help="Strata's look-ahead window (each pinned batch holds its rows)"
    )
    ap.add_argument("--g2-seed", type=int, default=0)
    ap.add_argument(
        "--g2-orders",
        default="none,degree,bfs,rcm,glist,community",
        help="G2R: node orders measured (none: the generated ids)",
    )
    ap.add_argument("--g2-repeats", type=int, default=3, help="G2R: loader runs per store (the median is reported)")
    ap.add_argument("--g2-timeout", type=int, default=600, help="seconds before a loader process is killed")
    ap.add_argument("--g4-seeds", type=int, default=102_400, help="G4: train seeds in the measured epoch")
    ap.add_argument("--g4-hidden", type=int, default=128, help="G4: GraphSAGE hidden units")
    ap.add_argument("--g4-reserve", default="700M", help="G4: left to Python and torch; the loader gets the rest")
    ap.add_argument("--g5-memory", default="1500M", help="G5: each process's loader budget")
    ap.add_argument("--g5-rounds", type=int, default=3, help="G5: alternating rounds of 1 process and 2 ranks")
    args = ap.parse_args()
    only = set(args.only.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    if "g1" in only:
        g1(args)
    if "g2" in only:
        g2(args)
    if "g2r" in only:
        import gnn_reorder

        gnn_reorder.g2r(args, g2_store(args), drive)
    if only & {"g3", "g4"}:
        import gnn_ablations

        if "g3" in only:
            gnn_ablations.g3(args, g2_store(args), drive)
        if "g4" in only:
            gnn_ablations.g4(args, g2_store(args))
    if "g5" in only:
        import gnn_dist_bench

        gnn_dist_bench.g5(args, g2_store(args))


if __name__ == "__main__":
    main()
