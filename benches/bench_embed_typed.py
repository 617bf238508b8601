"""Question: what do PyTorch-BigGraph's entity types buy on a typed knowledge graph?

    python benches/bench_embed_typed.py [--users 50000] [--items 10000] [--epochs 5] [--rounds 3]
        [--only typed,dist] [--work /work/bench/embtypes]

A generated typed graph with planted structure (users, items, categories, item words): each item
belongs to a cluster (its category is the cluster's), each user likes items of two preferred
clusters (90%) or any item, follows users with the same preferences, and items are similar to
items of their cluster; each item's words are its cluster's words and a noise word. Three
questions, each answered by runs side by side in one go, alternating the cases over rounds:

- **typed negatives**: a run whose uniform negatives come from the corrupted side's type (the
  default) against one drawing them from every node (`--no-typed-negatives`); both ranked
  against the answer's type (filtered, typed_eval);
- **an unpartitioned small type**: users and items in 8 partitions with categories held in
  memory (`--entity-partitions category=1`) against every type in 8 partitions (buffer 3,
  legend): the memory plan, partition loads per epoch, epoch time and MRR;
- **featurized entities**: a tenth of the items are *cold*: none of their edges is in the train
  split and their `likes` edges are the test split. Items as plain rows (a cold item's row is
  never trained) against items as the mean of their words (`--featurized item`).
- **under torchrun** (`dist`): 8 partitions with the categories held whole, and with the items
  featurized too (the pinned region then holds their words), on one process and on two ranks
  (torchrun on loopback, one thread each): every rank trains the pinned region and the relation
  rounds sum its changes, so the rounds' bytes grow with it. Epoch seconds, test MRR, rounds
  and bytes each rank sent.

Results go to bench-results/embed-typed.json (embed-typed-dist.json for `dist`) and the
embed-typed (embed-typed-dist) section of docs/benchmarks.md, with the 1-minute load average
before each run (the machine is shared: "under load").
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

from bench_embed import train
from common import machine, median, save, strata, timed, update_doc

SETTINGS = [
    "--model", "complex", "--dim", "64", "--negatives", "256", "--chunk-size", "1000", "--lr", "0.1",
    "--eval-max-queries", "4000", "--memory", "2G",
]  # fmt: skip
CLUSTERS, CATEGORIES, WORDS_PER_CLUSTER, NOISE_WORDS = 200, 50, 4, 200


def generate(work: Path, users: int, items: int, seed: int) -> dict:
    """Writes the graph's edge lists: ``all.tsv`` (every edge), ``cold/{train,test}.tsv``
    (the cold-item split), the types files and the items' word bags."""
    rng = random.Random(seed)
    cluster = [rng.randrange(CLUSTERS) for _ in range(items)]
    by_cluster: list[list[int]] = [[] for _ in range(CLUSTERS)]
    for i, c in enumerate(cluster):
        by_cluster[c].append(i)
    prefs = [(rng.randrange(CLUSTERS), rng.randrange(CLUSTERS)) for _ in range(users)]
    by_pref: dict[tuple, list[int]] = {}
    for u, p in enumerate(prefs):
        by_pref.setdefault(p, []).append(u)
    cold = set(rng.sample(range(items), items // 10))
    edges = []  # (src, rel, dst, cold)
    for u, p in enumerate(prefs):
        for _ in range(10):
            c = p[rng.randrange(2)] if rng.random() < 0.9 else rng.randrange(CLUSTERS)
            pool = by_cluster[c] or [rng.randrange(items)]
            i = pool[rng.randrange(len(pool))]
            edges.append((f"u{u}", "likes", f"i{i}", i in cold))
        peers = by_pref[p]
        for _ in range(2):
            edges.append((f"u{u}", "follows", f"u{peers[rng.randrange(len(peers))]}", False))
    for i, c in enumerate(cluster):
        edges.append((f"i{i}", "in_category", f"c{c % CATEGORIES}", i in cold))
        for _ in range(2):
            j = by_cluster[c][rng.randrange(len(by_cluster[c]))]
            edges.append((f"i{i}", "similar", f"i{j}", i in cold or j in cold))
    rng.shuffle(edges)
    work.mkdir(parents=True, exist_ok=True)
    (work / "node_types.tsv").write_text("user\nitem\ncategory\n")
    (work / "edge_types.tsv").write_text(
        "user\tlikes\titem\nuser\tfollows\tuser\nitem\tin_category\tcategory\nitem\tsimilar\titem\n"
    )
    words = [
        f"i{i}\t"
        + " ".join([*(f"w{cluster[i]}_{k}" for k in range(WORDS_PER_CLUSTER)), f"n{rng.randrange(NOISE_WORDS)}"])
        for i in range(items)
    ]
    (work / "bags.tsv").write_text("\n".join(words) + "\n")
    line = lambda e: f"{e[0]}\t{e[1]}\t{e[2]}\n"  # noqa: E731
    (work / "all.tsv").write_text("".join(map(line, edges)))
    (work / "cold").mkdir(exist_ok=True)
    (work / "cold" / "train.tsv").write_text("".join(line(e) for e in edges if not e[3]))
    test = [e for e in edges if e[3] and e[1] == "likes"]
    (work / "cold" / "valid.tsv").write_text("".join(map(line, test[: len(test) // 4])))
    (work / "cold" / "test.tsv").write_text("".join(map(line, test[len(test) // 4 :])))
    return {"users": users, "items": items, "cold_items": len(cold), "edges": len(edges), "cold_test": len(test)}


def convert(work: Path, out: Path, inputs: list, *extra) -> Path:
    if not out.exists():
        types = ["--node-types", work / "node_types.tsv", "--edge-types", work / "edge_types.tsv"]
        bags = ["--node-bags", f"item={work / 'bags.tsv'}"]
        timed(strata("convert", *inputs, "--columns", "src,rel,dst", *types, *bags, "--out", out, "-q", *extra))
    return out


def loaded_train(store: Path, run_dir: Path, args: list) -> dict:
    """A fresh run with the 1-minute load average before it."""
    load = os.getloadavg()[0]
    meta = train(store, run_dir, args)
    meta["load1"] = load
    return meta


def summary(meta: dict) -> dict:
    h = meta["history"]
    plan = {p["name"]: p["bytes"] for p in meta["memory_plan"]["parts"]}
    return {
        "test_mrr": meta["test"]["mrr"],
        "test_hits10": meta["test"]["hits@10"],
        "epoch_seconds": median([e["seconds"] for e in h]),
        "partition_loads": median([e["partition_loads"] for e in h]),
        "bytes_read": median([e["partition_bytes_read"] for e in h]),
        "io_wait_fraction": median([e["io_wait_fraction"] for e in h]),
        "buffer_bytes": plan.get("partition buffer", 0),
        "in_memory_types_bytes": plan.get("in-memory entity types", 0),
        "load1": meta["load1"],
    }


def side_by_side(cases: dict, store: Path, work: Path, rounds: int) -> dict:
    """Each case once per round, the order reversed every other round; per case the runs'
    summaries."""
    out: dict = {k: [] for k in cases}
    for r in range(rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            meta = loaded_train(store, work / f"run-{name}", [*cases[name], "--seed", str(r)])
            out[name].append(summary(meta))
            s = out[name][-1]
            mrr, secs, load = s["test_mrr"], s["epoch_seconds"], s["load1"]
            print(f"round {r} {name}: test MRR {mrr:.4f}, epoch {secs:.2f} s, load {load:.1f}")
    return out


def medians(runs: list[dict]) -> dict:
    return {k: median([r[k] for r in runs]) for k in runs[0]}


def stores(args) -> tuple[dict, Path]:
    """The generated graph's figures and its typed store (split 90/5/5)."""
    graph = generate(args.work / "data", args.users, args.items, 0)
    data = args.work / "data"
    return graph, convert(data, args.work / "typed.strata", [data / "all.tsv"], "--split", "0.9,0.05,0.05")


#: The `dist` question's cases: processes, and the types held whole beside the categories.
DIST_CASES = {
    "1 process": (1, []),
    "2 ranks": (2, []),
    "1 process, items featurized": (1, ["--featurized", "item"]),
    "2 ranks, items featurized": (2, ["--featurized", "item"]),
}


def dist_summary(meta: dict) -> dict:
    """A run's figures for the `dist` question: per-epoch medians and the ranks' rounds and bytes."""
    h = meta["history"]
    ranks = [r for e in h for r in e.get("ranks", [])]
    plan = {p["name"]: p["bytes"] for p in meta["memory_plan"]["parts"]}
    return {
        "test_mrr": meta["test"]["mrr"],
        "epoch_seconds": median([e["seconds"] for e in h]),
        "relation_rounds": median([r["relation_rounds"] for r in ranks]) if ranks else 0,
        "bytes_sent": median([r["bytes_sent"] for r in ranks]) if ranks else 0,
        "pinned_bytes": plan.get("in-memory entity types", 0),
        "load1": meta["loadavg"][0],
    }


def dist_question(args) -> dict:
    """The `dist` question: each case of :data:`DIST_CASES` once per round, alternating."""
    from bench_dist import run as launch

    graph, store = stores(args)
    base = [*SETTINGS, "--epochs", str(args.epochs), "--partitions", "8", "--buffer", "3"]
    base += ["--entity-partitions", "category=1", "--negative-pool", "resident"]
    out: dict = {k: [] for k in DIST_CASES}
    for r in range(args.rounds):
        for name in list(DIST_CASES) if r % 2 == 0 else list(reversed(DIST_CASES)):
            ranks, extra = DIST_CASES[name]
            meta = launch(store, args.work / "run-dist", [*base, *extra, "--seed", r], ranks, None)
            out[name].append(dist_summary(meta))
            s = out[name][-1]
            print(f"round {r} {name}: test MRR {s['test_mrr']:.4f}, epoch {s['epoch_seconds']:.2f} s")
    return {"graph": graph, "settings": base, "runs": out, "medians": {k: medians(v) for k, v in out.items()}}


def dist_markdown(res: dict, info: dict, cmd: str) -> str:
    m, g = res["medians"], res["graph"]
    loads = [r["load1"] for v in res["runs"].values() for r in v]
    rows = [
        f"| {name} | {s['test_mrr']:.4f} | {s['epoch_seconds']:.2f} | {s['relation_rounds']:.0f} | "
        f"{s['bytes_sent'] / 2**20:.2f} | {s['pinned_bytes'] / 2**20:.2f} |"
        for name, s in m.items()
    ]
    speed = lambda a, b: m[a]["epoch_seconds"] / max(m[b]["epoch_seconds"], 1e-9)  # noqa: E731
    per_round = lambda k: m[k]["bytes_sent"] / max(m[k]["relation_rounds"], 1) / 2**20  # noqa: E731
    return "\n".join(
        [
            "### Entity types under torchrun: the pinned region on every rank "
            "(`benches/bench_embed_typed.py --only dist`)",
            "",
            f"{info['nproc']} cores ({info['cpu']}); 1-minute load average {min(loads):.1f} to {max(loads):.1f} "
            f"before the runs. Command: `{cmd}`. The typed graph above ({g['users']:,} users, {g['items']:,} items, "
            f"{g['edges']:,} edges), ComplEx 64 reals, 256 negatives from the resident partitions, 8 partitions "
            "(buffer 3), the categories held whole; torchrun on loopback, one thread a process. Medians of "
            f"{len(next(iter(res['runs'].values())))} rounds (the cases alternate).",
            "",
            "| case | test MRR | epoch s | relation rounds a rank | MiB a rank sent an epoch | pinned region MiB |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Two ranks against one process: {speed('1 process', '2 ranks'):.2f}x with the categories held whole, "
            f"{speed('1 process, items featurized', '2 ranks, items featurized'):.2f}x with the items' words too. "
            "Every relation round sums the pinned region's changes with the relation rows', so what a rank sends "
            f"grows with the region: {per_round('2 ranks, items featurized'):.2f} MiB a round with the items' "
            f"words against {per_round('2 ranks'):.2f} MiB with the categories alone (scheduler messages "
            "included).",
        ]
    )


def run(args) -> dict:
    graph, store = stores(args)
    data = args.work / "data"
    cold = convert(
        data,
        args.work / "cold.strata",
        [data / "cold" / "train.tsv"],
        "--valid",
        data / "cold" / "valid.tsv",
        "--test",
        data / "cold" / "test.tsv",
    )
    base = [*SETTINGS, "--epochs", str(args.epochs)]
    parted = [*base, "--partitions", "8", "--buffer", "3", "--ordering", "legend"]
    res = {"graph": graph, "settings": base}
    res["negatives"] = side_by_side(
        {"typed": [*base, "--partitions", "1"], "untyped": [*base, "--partitions", "1", "--no-typed-negatives"]},
        store,
        args.work,
        args.rounds,
    )
    res["pinned"] = side_by_side(
        {"category-in-memory": [*parted, "--entity-partitions", "category=1"], "all-partitioned": parted},
        store,
        args.work,
        args.rounds,
    )
    # Cold items are never in a train edge: validation picks the best epoch on cold items too.
    res["featurized"] = side_by_side(
        {"plain": [*base, "--partitions", "1"], "featurized": [*base, "--partitions", "1", "--featurized", "item"]},
        cold,
        args.work,
        args.rounds,
    )
    res["medians"] = {q: {k: medians(v) for k, v in res[q].items()} for q in ("negatives", "pinned", "featurized")}
    return res


def markdown(res: dict, info: dict, cmd: str) -> str:
    m = res["medians"]
    g = res["graph"]
    loads = [r["load1"] for q in ("negatives", "pinned", "featurized") for v in res[q].values() for r in v]
    row = lambda name, s: (  # noqa: E731
        f"| {name} | {s['test_mrr']:.4f} | {s['test_hits10']:.4f} | {s['epoch_seconds']:.2f} | "
        f"{s['partition_loads']:.0f} | {s['bytes_read'] / 2**20:.1f} | {s['buffer_bytes'] / 2**20:.1f} | "
        f"{s['in_memory_types_bytes'] / 2**20:.2f} |"
    )
    neg, pin, feat = m["negatives"], m["pinned"], m["featurized"]
    lines = [
        "### Entity types: typed negatives, an unpartitioned type, featurized entities "
        "(`benches/bench_embed_typed.py`)",
        "",
        f"{info['nproc']} cores ({info['cpu']}), **under load**: shared with other engineers' builds and tests "
        f"(1-minute load average {min(loads):.1f} to {max(loads):.1f} before the runs). Command: `{cmd}`. "
        f"A generated typed graph: {g['users']:,} users, {g['items']:,} items, {CATEGORIES} categories, "
        f"{g['edges']:,} edges (likes, follows, in_category, similar) with planted clusters; ComplEx, 64 reals, "
        "256 negatives, softmax, Adagrad lr 0.1, filtered ranking against the answer's type on 4,000 test queries. "
        f"Medians of {len(res['negatives']['typed'])} rounds (seeds 0, 1, ...; the cases alternate within a round).",
        "",
        "| case | test MRR | Hits@10 | epoch s | loads/epoch | MiB read/epoch | buffer MiB | in-memory types MiB |",
        "|---|---|---|---|---|---|---|---|",
        row("typed negatives (1 partition)", neg["typed"]),
        row("untyped negatives (1 partition)", neg["untyped"]),
        row("8 partitions, categories in memory", pin["category-in-memory"]),
        row("8 partitions, all types partitioned", pin["all-partitioned"]),
        row("cold items: plain rows", feat["plain"]),
        row("cold items: featurized (mean of words)", feat["featurized"]),
        "",
        f"Typed negatives: test MRR {neg['typed']['test_mrr']:.4f} against {neg['untyped']['test_mrr']:.4f} "
        f"drawing from every node ({neg['typed']['test_mrr'] / max(neg['untyped']['test_mrr'], 1e-9):.2f}x). "
        f"Categories in memory: {pin['category-in-memory']['bytes_read'] / 2**20:.1f} MiB of partitions read per epoch "
        f"against {pin['all-partitioned']['bytes_read'] / 2**20:.1f} (the same schedule of loads; a category's "
        "edges need only the other end's partition), epoch "
        f"{pin['category-in-memory']['epoch_seconds'] / max(pin['all-partitioned']['epoch_seconds'], 1e-9):.2f}x the "
        f"all-partitioned one, MRR {pin['category-in-memory']['test_mrr']:.4f} against "
        f"{pin['all-partitioned']['test_mrr']:.4f}. Cold items ({g['cold_items']:,} items without a train edge, "
        f"{g['cold_test']:,} of their likes edges held out): featurized MRR {feat['featurized']['test_mrr']:.4f} "
        f"against {feat['plain']['test_mrr']:.4f} with plain rows.",
        "",
        "Reading: users are most of the nodes, so untyped negatives of a `likes` tail are mostly users, easy to "
        "rank below an item; typed ones are all items. A type as small as the categories saves no partition bytes "
        "held in memory (its rows are a sliver of each partition, and the ordering's loads are the same); what the "
        "pinned region buys is a small type that is hit by many edges staying put while the large types stream. A "
        "cold item's plain row is its random start; its words were trained through the warm items that share them.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=50_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/work/bench/embtypes"))
    ap.add_argument("--only", default="typed,dist", help="typed (the first three questions), dist, or both")
    args = ap.parse_args()
    info = machine()
    only = set(args.only.split(","))
    cmd = (
        f"python benches/bench_embed_typed.py --users {args.users} --items {args.items} "
        f"--epochs {args.epochs} --rounds {args.rounds}"
    )
    if "typed" in only:
        res = run(args)
        save("embed-typed", {"machine": info, **res})
        update_doc("embed-typed", markdown(res, info, cmd))
        print(json.dumps(res["medians"], indent=2))
    if "dist" in only:
        res = dist_question(args)
        save("embed-typed-dist", {"machine": info, **res})
        update_doc("embed-typed-dist", dist_markdown(res, info, f"{cmd} --only dist"))
        print(json.dumps(res["medians"], indent=2))


if __name__ == "__main__":
    main()
