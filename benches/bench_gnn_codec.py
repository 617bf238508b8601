"""Question: what do feature rows held encoded in the GNN hot set and cache (`feature_codec`
f16, int8 with a scale per row) cost in accuracy, and what do they buy in rows held, hit rate
and loader throughput under a fixed budget?

    python benches/bench_gnn_codec.py [--only acc,loader] [--seeds 2] [--epochs 10]
        [--graphs cora,citeseer,sbm] [--g2-nodes 500000] [--g2-limit 450M] [--g2-batch-size 256]
        [--g2-repeats 3] [--work DIR]

acc: `strata gnn train` with f32, f16 and int8, the same seeds and epochs for each codec, every
feature row in the hot set (so every row the model sees went through the codec: the largest
effect the codec can have). Cora and CiteSeer with G1's GraphSAGE (fanouts 25,10, batch 64,
256 hidden, Adam 0.01, weight decay 5e-4, dropout 0.5), and a generated SBM graph (`strata
generate sbm`: 4,000 nodes, 8 classes, 32 float32 features, default noise 0.55) with fanouts
10,5, batch 256 and 64 hidden. Mean test accuracy at the best validation epoch.

loader: G2 scaled down (`bench_gnn.py --only g2` is 10M nodes under 1950M): the power-law SBM
graph of `--g2-nodes` nodes with 256 float32 features per node, its loader under `memlimit
--g2-limit` with the limit less `--g2-reserve` as its budget, once per codec, the same batches
(`--g2-batches` of `--g2-batch-size` seeds, fanouts 15,10). Reported: rows the hot set and the
cache hold, the share of sampled rows they served, rows/s.

Results go to bench-results/gnn-codec.json and the gnn-codec section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

from bench_gnn import SAGE, drive, g2_store, run
from common import REPO, RESULTS, SHARED, machine, memlimit_available, save, strata, timed, update_doc
from strata.units import parse_size

CODECS = ("f32", "f16", "int8")

SBM_TRAIN = ["--model", "sage", "--fanouts", "10,5", "--batch-size", "256", "--hidden", "64", "--lr", "0.01",
             "--weight-decay", "5e-4", "--dropout", "0.5", "--device", "cpu"]  # fmt: skip


def stores(args) -> dict[str, tuple[Path, list]]:
    """The accuracy graphs of ``--graphs`` (converted once into the work dir) and the training
    options of each."""
    out = {}
    for name in {"cora", "citeseer"} & args.graphs:
        store = args.work / f"{name}.strata"
        if not store.exists():
            timed(strata("convert", SHARED / "datasets" / "planetoid", "--name", name, "--out", store, "-q"))
        out[name] = (store, SAGE)
    if "sbm" not in args.graphs:
        return out
    store = args.work / "sbm-acc.strata"
    if not store.exists():
        raw = args.work / "sbm-acc-raw"
        timed(strata("generate", "sbm", "--out", raw, "--nodes", 4_000, "--classes", 8, "--feature-dim", 32,
                     "--overwrite", "-q"))  # fmt: skip
        timed(strata("convert", raw, "--symmetrize", "--out", store, "-q"))
        shutil.rmtree(raw)  # the store has every array of it; regenerating is deterministic
    out["sbm"] = (store, SBM_TRAIN)
    return out


def accuracy(args) -> dict:
    rows = {}
    for name, (store, options) in stores(args).items():
        for codec in CODECS:
            extra = (*options, "--feature-codec", codec)
            runs = [
                run(store, args.work / f"run-codec-{name}-{codec}", s, args.epochs, "0", extra)
                for s in range(args.seeds)
            ]
            accs = [r["test_accuracy"] for r in runs]
            tiers = runs[-1]["tiers"]
            rows[f"{name} {codec}"] = {"accuracies": accs, "mean": statistics.mean(accs), "tiers": tiers}
            print(f"codec acc {name} {codec}: {statistics.mean(accs):.4f} {accs}", flush=True)
    return rows


def loader(args) -> dict:
    store = g2_store(args)
    manifest = json.loads((store / "manifest.json").read_text())
    shape = manifest["arrays"]["features"]["shape"]
    limit = args.g2_limit if memlimit_available() else None
    memory = parse_size(args.g2_limit) - parse_size(args.g2_reserve)
    runs: dict[str, list] = {c: [] for c in CODECS}
    # Rounds alternate the codecs, so that a change in the machine's load hits each of them.
    for _ in range(args.g2_repeats):
        for codec in CODECS:
            r = drive(store, "strata", memory, limit, args, ("--set", f'feature_codec="{codec}"'))
            runs[codec].append(r)
            if "error" in r:
                print(f"codec loader {codec}: FAILED: {r['error'].splitlines()[0]}", flush=True)
                continue
            t = r["stats"]["tiers"]
            print(f"codec loader {codec}: hot {r['plan']['hot_rows']:,} cache {r['plan']['cache_rows']:,} rows; "
                  f"served in memory {served(t):.1%}; {r['rows_per_second']:,.0f} rows/s", flush=True)  # fmt: skip
    return {
        "nodes": shape[0],
        "feature_dim": shape[1],
        "feature_bytes": shape[0] * shape[1] * 4,
        "limit": limit,
        "memory": memory,
        "batches": args.g2_batches,
        "batch_size": args.g2_batch_size,
        "repeats": args.g2_repeats,
        "runs": runs,
    }


def median_rate(runs: list) -> float | None:
    """The median rows/s of the runs that completed (None when none did)."""
    rates = [r["rows_per_second"] for r in runs if "error" not in r]
    return statistics.median(rates) if rates else None


def served(tiers: dict) -> float:
    """Share of the sampled rows the hot set and the cache served."""
    return (tiers["hot_rows"] + tiers["cache_rows"]) / max(tiers["rows"], 1)


def markdown(res: dict) -> str:
    lines = ["### Compressed feature rows (`benches/bench_gnn_codec.py`)", ""]
    acc = res.get("accuracy")
    if acc:
        lines += [
            f"Test accuracy at the best validation epoch, mean of {res['seeds']} seed(s), the same for each codec, "
            f"{res['epochs']} epochs, every feature row in the hot set, so every row the model saw was encoded and "
            "decoded. Cora and CiteSeer: G1's GraphSAGE; SBM: 4,000 nodes, 8 classes, 32 features, fanouts 10,5, "
            "batch 256, 64 hidden.",
            "",
            "| graph | f32 | f16 | int8 | f16 - f32 | int8 - f32 | int8 per seed |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in (g for g in ("cora", "citeseer", "sbm") if f"{g} f32" in acc):
            m = {c: acc[f"{name} {c}"]["mean"] for c in CODECS}
            per_seed = ", ".join(f"{a:.3f}" for a in acc[f"{name} int8"]["accuracies"])
            lines.append(
                f"| {name} | {m['f32']:.4f} | {m['f16']:.4f} | {m['int8']:.4f} | "
                f"{100 * (m['f16'] - m['f32']):+.2f} points | {100 * (m['int8'] - m['f32']):+.2f} points | "
                f"{per_seed} |"
            )
        lines.append("")
    ld = res.get("loader")
    if ld:
        limit = f"`memlimit {ld['limit']}`" if ld["limit"] else "no memlimit (memlimit unavailable here)"
        lines += [
            "G2 scaled down (G2 itself: 10M nodes, features 5.2x its 1950M limit): "
            f"{ld['nodes']:,} nodes, {ld['feature_dim']} float32 features "
            f"({ld['feature_bytes'] / 2**30:.2f} GiB, {ld['feature_bytes'] / parse_size(ld['limit'] or '1G'):.1f}x "
            f"the limit), {limit} with a loader budget of {ld['memory'] / 2**20:.0f} MiB, {ld['batches']} batches of "
            f"{ld['batch_size']} seeds, fanouts 15,10, the same batches for each codec; rows/s is the median of "
            f"{ld['repeats']} runs, the codecs alternating. Served in memory: the share of sampled rows the hot set "
            "and the cache served (median; the cache's share moves a little with the pipeline's timing).",
            "",
            "| codec | bytes a row held | hot-set rows | cache rows | served in memory | hot-set hits | rows/s |"
            " rows/s vs f32 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        base = median_rate(ld["runs"]["f32"])
        for codec in CODECS:
            done = [r for r in ld["runs"][codec] if "error" not in r]
            if not done:
                lines.append(f"| {codec} | failed: {ld['runs'][codec][0]['error'].splitlines()[0]} | | | | | | |")
                continue
            p, rate = done[0]["plan"], median_rate(done)
            tiers = [r["stats"]["tiers"] for r in done]
            in_memory = statistics.median(served(t) for t in tiers)
            hot = statistics.median(t["hot_rows"] / max(t["rows"], 1) for t in tiers)
            vs = f"{rate / base:.2f}x" if base else "-"
            lines.append(
                f"| {codec} | {p['held_row_bytes']} | {p['hot_rows']:,} | {p['cache_rows']:,} | {in_memory:.1%} | "
                f"{hot:.1%} | {rate:,.0f} | {vs} |"
            )
        lines.append("")
    m, load = res["machine"], res["load_average"]
    lines.append(
        f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB, shared with other engineers' builds and "
        f"tests: load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (1, 5, 15 minutes) when the last part "
        "ended. Compare the codecs within one table, not the rates with other sections."
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="acc,loader", help="comma-separated subset of acc,loader")
    ap.add_argument("--seeds", type=int, default=2, help="acc: training seeds (the same for each codec)")
    ap.add_argument("--epochs", type=int, default=10, help="acc: epochs per run")
    ap.add_argument("--graphs", default="cora,citeseer,sbm", help="acc: comma-separated subset of cora,citeseer,sbm")
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "gnn")
    ap.add_argument("--g2-nodes", type=int, default=500_000)
    ap.add_argument("--g2-avg-degree", type=float, default=10.0)
    ap.add_argument("--g2-feature-dim", type=int, default=256)
    ap.add_argument("--g2-limit", default="450M", help="the loader's memlimit")
    ap.add_argument("--g2-reserve", default="150M", help="left to the interpreter: the budget is the limit less this")
    ap.add_argument("--g2-batches", type=int, default=20)
    ap.add_argument("--g2-batch-size", type=int, default=256)
    ap.add_argument("--g2-window", type=int, default=2, help="the loader's look-ahead window")
    ap.add_argument("--g2-seed", type=int, default=0)
    ap.add_argument("--g2-repeats", type=int, default=3, help="loader runs per codec (the median is reported)")
    ap.add_argument("--g2-timeout", type=int, default=600, help="seconds before a loader process is killed")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.graphs = set(args.graphs.split(","))
    only = set(args.only.split(","))
    acc = accuracy(args) if "acc" in only else {}
    ld = loader(args) if "loader" in only else None
    # What this run did not measure keeps its last results (read when this run is done, so
    # that parts and graphs may also run side by side).
    saved = RESULTS / "gnn-codec.json"
    res = json.loads(saved.read_text()) if saved.exists() else {}
    res["machine"] = machine()
    res["load_average"] = os.getloadavg()
    if acc:
        res |= {"seeds": args.seeds, "epochs": args.epochs, "accuracy": res.get("accuracy", {}) | acc}
    if ld:
        res["loader"] = ld
    save("gnn-codec", res)
    update_doc("gnn-codec", markdown(res))


if __name__ == "__main__":
    main()
