"""G3 and G4 of `bench_gnn.py`: the data path's ablations on the G2 graph under the G2 memlimit,
and GraphSAGE trained end to end on it.

G3 runs the G2 Strata loader (same seeds, batches and budget) once per variant, changing one
setting of the baseline at a time: the hot-set ranking (reverse PageRank, pre-sampling, degree,
none), the window depth W, the accumulator (off; and on with a target large enough to merge
batches, since the profile's target is far below one batch's misses here), the pipeline (off:
every stage on the caller's thread), and the hot share. Reported per variant: rows/s, the rows
each tier served, reads, and setup time.

G4 trains GraphSAGE (mean, 2 layers, hidden 128) for one epoch over 102,400 train seeds (100
batches of 1024; the full 6M-seed train split would take hours on 2 cores) with the batches from
Strata under the memlimit (torch included) and, for reference, from Strata with every row in RAM
without a limit. Reported: epoch seconds, the share the model waited for data, loader figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import machine, save, timed, update_doc
from strata.units import fmt_bytes, parse_size

TRAIN_DRIVER = Path(__file__).resolve().parent / "gnn_train_driver.py"

#: (name, what changes, driver --set options, window override or None for the G2 window).
G3_VARIANTS = (
    ("baseline", "reverse PageRank, W from G2, accumulator, pipeline", (), None),
    ("rank: presampling", "hot set ranked by one pre-sampled epoch (Helios)", ("hot_ranking=presampling",), None),
    ("rank: degree", "hot set ranked by in-degree", ("hot_ranking=degree",), None),
    ("rank: none", "no hot set: the whole budget to the dynamic cache", ("hot_ranking=none", "hot_share=0"), None),
    ("W=0", "no look-ahead", (), 0),
    ("W=4", "", (), 4),
    ("W=8", "the default", (), 8),
    ("W=16", "", (), 16),
    ("accumulator off", "each batch read alone", ("accumulator=false",), None),
    ("accumulator, target 131072", "merge batches up to 131,072 distinct rows", ("in_flight_target=131072",), 8),
    ("pipeline off", "stages one after the other on the caller's thread", ("pipeline=false",), None),
    ("hot share 1.0", "the whole feature budget to the hot set", ("hot_share=1.0",), None),
)


def g3(args, store: Path, drive) -> dict:
    """Runs every variant through ``drive`` (bench_gnn's loader process runner)."""
    limit, memory = args.g2_limit, parse_size(args.g2_limit) - parse_size(args.g2_reserve)
    runs = {}
    for name, what, sets, window in G3_VARIANTS:
        extra = [x for s in sets for x in ("--set", s)]
        if window is not None:
            extra += ["--window", str(window)]
        runs[name] = r = drive(store, "strata", memory, limit, args, tuple(extra))
        r["what"] = what
        if "error" in r:
            print(f"G3 {name}: FAILED: {r['error'].splitlines()[0]}", flush=True)
        else:
            print(f"G3 {name}: {r['rows_per_second']:,.0f} rows/s", flush=True)
    res = {"machine": machine(), "limit": limit, "memory": memory, "window": args.g2_window, "runs": runs}
    save("gnn-g3", res)
    update_doc("gnn-g3", g3_markdown(res))
    return res


def _share(t: dict, key: str) -> str:
    return f"{100 * t[key] / max(t['rows'], 1):.1f}%"


def g3_markdown(res: dict) -> str:
    runs = res["runs"]
    base = runs["baseline"]
    lines = [
        "### G3: ablations (`benches/bench_gnn.py --only g3`)",
        "",
        f"The G2 graph, batches and Strata loader under `memlimit {res['limit']}` (budget "
        f"{fmt_bytes(res['memory'])}), one setting changed at a time from the baseline (reverse PageRank hot set, "
        f"hot share 0.5, SIEVE cache, W = {res['window']}, accumulator on, pipeline on). Tier columns: share of "
        "the sampled rows each tier served; reads: merged reads issued and their mean batches; overlap: the stages' "
        "busy seconds per second of the loop.",
        "",
        "| variant | rows/s | vs baseline | hot | cache | disk | reads (batches/read) | overlap | setup s | "
        "in memory |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'].splitlines()[0][:200]} | | | | | | | | |")
            continue
        st, t, p = r["stats"], r["stats"]["tiers"], r["plan"]
        held = (p["hot_rows"] + p["cache_rows"]) / p["num_nodes"]
        ratio = r["rows_per_second"] / base["rows_per_second"] if "error" not in base else float("nan")
        busy = sum(st[k] for k in st if k.endswith("_busy_secs"))
        lines.append(
            f"| {name} | {r['rows_per_second']:,.0f} | {ratio:.2f} | {_share(t, 'hot_rows')} | "
            f"{_share(t, 'cache_rows')} | {_share(t, 'disk_rows')} | {st['reads']} ({st['mean_batches_per_read']:.1f})"
            f" | {busy / st['wall_secs']:.2f} | {r['setup_seconds']:.1f} | {100 * held:.1f}% |"
        )
    return "\n".join(lines)


def g4(args, store: Path) -> dict:
    """GraphSAGE for one epoch under the memlimit and, for reference, with every row in RAM."""
    limit = args.g2_limit
    memory = parse_size(limit) - parse_size(args.g4_reserve)
    manifest = json.loads((store / "manifest.json").read_text())
    shape = manifest["arrays"]["features"]["shape"]
    ram = 2 * shape[0] * shape[1] * 4 + (4 << 30)
    runs = {}
    for key, mem, lim in (("strata", memory, limit), ("ram", ram, None)):
        cmd = [sys.executable, TRAIN_DRIVER, store, "--memory", mem, "--seeds", args.g4_seeds,
               "--hidden", args.g4_hidden, "--window", args.g2_window, "--seed", args.g2_seed]  # fmt: skip
        try:
            res = timed([str(c) for c in cmd], lim)
        except SystemExit as e:
            runs[key] = {"error": str(e)[-2000:], "limit": lim}
            print(f"G4 {key}: FAILED: {str(e).splitlines()[0]}", flush=True)
            continue
        runs[key] = r = json.loads(res["stdout"]) | {"limit": lim, "peak_bytes": res["peak_bytes"]}
        print(f"G4 {key}: epoch {r['seconds']:.1f} s, data wait {100 * r['data_wait_fraction']:.0f}%", flush=True)
    res = {"machine": machine(), "limit": limit, "memory": memory, "reserve": args.g4_reserve, "runs": runs}
    save("gnn-g4", res)
    update_doc("gnn-g4", g4_markdown(res))
    return res


def g4_markdown(res: dict) -> str:
    lines = [
        "### G4: GraphSAGE end to end (`benches/bench_gnn.py --only g4`)",
        "",
        f"The G2 graph; GraphSAGE (mean, 2 layers, hidden {next(iter(res['runs'].values())).get('hidden', '?')}, "
        "dropout 0.5, Adam) trained on the CPU for one epoch over the first 102,400 seeds of a permutation of the "
        "train split (100 batches of 1024, fanouts 15,10; the whole 6M-seed split is 59x this), exactly as "
        f"`strata gnn train` trains an epoch. Under `memlimit {res['limit']}` the whole process counts, torch "
        f"included; the loader's budget is the limit less {res['reserve']} "
        f"({fmt_bytes(res['memory'])}). Data wait: seconds the training loop spent in `next(batches)`.",
        "",
        "| loader | epoch s | data wait s | data wait share | model s | seeds/s | rows/s | hot / cache / disk | "
        "peak memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"strata": "Strata, memlimit", "ram": "Strata, all rows in RAM"}
    for key, name in names.items():
        r = res["runs"].get(key)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'].splitlines()[0][:200]} | | | | | | | |")
            continue
        t = r["pipeline"]["tiers"]
        peak = fmt_bytes(r["peak_bytes"]) if r.get("peak_bytes") else f"{fmt_bytes(r['peak_rss_bytes'])} RSS"
        lines.append(
            f"| {name} | {r['seconds']:.1f} | {r['data_wait_seconds']:.1f} | {100 * r['data_wait_fraction']:.0f}% | "
            f"{r['model_seconds']:.1f} | {r['seeds_per_second']:,.0f} | {r['sampled_nodes_per_second']:,.0f} | "
            f"{_share(t, 'hot_rows')} / {_share(t, 'cache_rows')} / {_share(t, 'disk_rows')} | {peak} |"
        )
    s = res["runs"].get("strata", {})
    if "plan_lines" in s:
        lines += ["", "Plan under the memlimit: " + " ".join(x.strip() for x in s["plan_lines"])]
    return "\n".join(lines)
