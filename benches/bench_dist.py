"""Question: are two ranks of one thread at least 1.7x as fast as one rank of one thread out of
core, what do the ranks load and send, does Strata's affinity policy load fewer partitions than
PyTorch-BigGraph's lock server on real runs, what does relation staleness cost in MRR, and
how much partition wait does each rank's prefetch of its next grant hide?

    python benches/bench_dist.py [--only b5,b6,banks,b7] [--scale 23] [--edge-factor 12] [--rounds 3]
        [--memory 700M] [--limit 1000M] [--work DIR]

- B5: one epoch of B3's run (Dot, 64 reals, 100 negatives, from the resident partitions) on
  RMAT scale 23 x 12, ``--memory`` per rank: one process with one thread, ``torchrun
  --nproc-per-node 2`` on loopback with one thread per rank and ``--dist-policy affinity``, the
  same with ``lock_server`` (PBG's), and the first two again with every rank under its own
  ``memlimit LIMIT``. Each round runs every
  configuration once, starting one further along each round (alternating); figures are medians
  over the rounds.
- B6: FB15k-237 with B1's settings, 8 partitions, a buffer of 3, ``--negative-pool resident``:
  one process against 2 ranks with ``relation_sync_every`` 1 (the synchronous variant), 4 (the
  default) and 16; filtered test MRR at the best validation epoch.
- B6 banks: the same FB15k-237 runs with negatives drawn uniformly over all nodes through
  negative banks (``--negative-pool all``) on one process and on 2 ranks (with the bank gradient
  summed at the epoch's end only, and at every relation round), beside 2 ranks with resident
  negatives.
- B7: B5's 2-rank affinity run (``--scale``, ``--edge-factor``) for ``--b7-epochs`` epochs with
  ``--b7-partitions`` partitions and ``--memory`` per rank, with ``--dist-prefetch`` and
  ``--no-dist-prefetch``, alternating over ``--rounds``: each rank's partition wait share,
  loads and epoch time, and the per-round ratio of epoch times.

The machine may be shared: every run records the 1-minute load average before and after it,
and the markdown says so. Loads, bytes and MRR do not depend on the load; times do, so re-run
``python benches/bench_dist.py`` on a quiet machine for the speed-up.

Results go to bench-results/dist-*.json and the dist-* sections of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from bench_embed import B1, DOT, convert
from common import MEMLIMIT, REPO, SHARED, machine, median, memlimit_available, save, strata, timed, update_doc
from strata.units import parse_size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    """One thread per process for the maths libraries, gloo on loopback."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def run(store: Path, run_dir: Path, args: list[str], ranks: int, limit: str | None) -> dict:
    """Trains a fresh run on ``ranks`` processes (torchrun on loopback when more than one),
    each under ``memlimit LIMIT`` when given. Returns run.json with the wall time, each
    process's memlimit peak (bytes) and the load average before and after."""
    load_before = os.getloadavg()[0]
    train = [sys.executable, "-m", "strata", "embed", "train", str(store), "--run-dir", str(run_dir), "--fresh", "-q"]
    train += [*map(str, args), "--threads", "1"]
    cmd = ([str(MEMLIMIT), limit] if limit else []) + train
    if ranks > 1:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "0", "--no-python", *cmd,
        ]  # fmt: skip
    res = timed(cmd, env=_env())
    meta = json.loads((run_dir / "run.json").read_text())
    meta["wall_seconds"] = res["seconds"]
    meta["peaks"] = [_bytes(m) for m in re.findall(r"memlimit: peak (\S+) of limit", res["stderr"])]
    meta["loadavg"] = [load_before, os.getloadavg()[0]]
    return meta


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def epoch_figures(meta: dict) -> dict:
    """The epoch's group figures and each rank's (loads, bytes through the group and the disk)."""
    e = meta["history"][-1]
    ranks = e.get("ranks") or [{"rank": 0, **e, "bytes_sent": 0, "bytes_received": 0, "buckets": None, "waits": 0}]
    return {
        "seconds": e["seconds"],
        "edges_per_second": e["edges_per_second"],
        "partition_loads": e["partition_loads"],
        "io_wait_fraction": e["io_wait_fraction"],
        "partitions": meta["partitioning"]["partitions"],
        "ranks": [
            {
                "rank": r["rank"],
                "seconds": r["seconds"],
                "buckets": r["buckets"],
                "partition_loads": r["partition_loads"],
                "waits": r["waits"],
                "bytes_sent": r["bytes_sent"],
                "bytes_received": r["bytes_received"],
                "partition_bytes_read": r["partition_bytes_read"],
                "partition_bytes_written": r["partition_bytes_written"],
                "edge_bytes_read": r["edge_bytes_read"],
            }
            for r in ranks
        ],
    }


def rmat_store(work: Path, scale: int, edge_factor: int) -> Path:
    """B3's graph (the same files bench_embed.py makes)."""
    raw = work / f"rmat-s{scale}-e{edge_factor}.bin"
    if not raw.exists():
        timed(strata("generate", "rmat", "--scale", scale, "--edge-factor", edge_factor, "--out", raw, "-q"))
    return convert(raw, work / f"rmat-s{scale}-e{edge_factor}.strata", "--num-nodes", 1 << scale, "--memory", "4G")


def _graph(store: Path, args) -> dict:
    """The RMAT graph's shape and train edges, for a benchmark's record."""
    manifest = json.loads((store / "manifest.json").read_text())
    return {"scale": args.scale, "edge_factor": args.edge_factor, "edges": manifest["graph"]["num_edges"]["train"]}


#: B5's options past B3's: every B5 run draws its uniform negatives from the resident
#: partitions (B5 was first measured before negative banks were shared across ranks, and
#: keeps its rows comparable; B6 banks measures the banks).
B5_ARGS = ["--epochs", 1, "--eval-every", 0, "--negative-pool", "resident"]

#: B5's configurations: label -> (ranks, scheduler policy, under memlimit).
B5_RUNS = {
    "1 rank": (1, None, False),
    "2 ranks, affinity": (2, "affinity", False),
    "2 ranks, lock_server": (2, "lock_server", False),
    "1 rank, memlimit": (1, None, True),
    "2 ranks, affinity, memlimit": (2, "affinity", True),
}


#: B5's optional row: one process cut into the 2-rank runs' partitions (``--b5-partitions``),
#: which separates what the smaller partitions do to one thread's speed from the scaling.
SAME_PARTS = "1 rank, the 2 ranks' partitions"


def b5(work: Path, args) -> dict:
    store = rmat_store(work, args.scale, args.edge_factor)
    limit_ok = memlimit_available()
    runs = {label: spec for label, spec in B5_RUNS.items() if limit_ok or not spec[2]}
    if args.b5_partitions:
        runs[SAME_PARTS] = (1, None, False)
    labels = list(runs)
    rounds: dict[str, list[dict]] = {label: [] for label in labels}
    for k in range(args.rounds):
        for label in labels[k % len(labels) :] + labels[: k % len(labels)]:
            ranks, policy, limited = runs[label]
            extra = ["--dist-policy", policy] if policy else []
            if label == SAME_PARTS:
                extra = ["--partitions", args.b5_partitions]
            run_dir = work / "run-b5"
            # A rank's plan sets torch and gloo aside first: it gets that much more, so that
            # every process has the same budget for the table, buffers and edges.
            more = parse_size(args.rank_runtime) if ranks > 1 else 0
            meta = run(
                store,
                run_dir,
                [*DOT, *B5_ARGS, "--memory", f"{(parse_size(args.memory) + more) >> 20}M", *extra],
                ranks,
                f"{(parse_size(args.limit) + more) >> 20}M" if limited else None,
            )
            fig = {**epoch_figures(meta), "wall_seconds": meta["wall_seconds"], "peaks": meta["peaks"]}
            fig["loadavg"] = meta["loadavg"]
            rounds[label].append(fig)
            shutil.rmtree(run_dir)
            print(
                f"B5 round {k + 1} {label}: {fig['seconds']:.1f} s, {fig['edges_per_second']:,.0f} edges/s, "
                f"{fig['partition_loads']} loads, load average {fig['loadavg'][0]:.1f}",
                flush=True,
            )
    return {
        **_graph(store, args),
        "table_bytes": (1 << args.scale) * 64 * 4 * 2,
        "memory": args.memory,
        "rank_runtime": args.rank_runtime,
        "limit": args.limit if limit_ok else None,
        "rounds": rounds,
    }


def _med(rows: list[dict], key) -> float:
    return median([key(r) for r in rows])


def _per_rank(rows: list[dict], key, fmt: str) -> str:
    """``key`` of each rank's figures, the median over the rounds, formatted, joined by ``/``."""
    return "/".join(fmt.format(_med(rows, lambda r, q=q: key(r["ranks"][q]))) for q in range(len(rows[0]["ranks"])))


def _load_span(rows: list[dict]) -> str:
    """The 1-minute load averages taken before and after a configuration's runs, lowest-highest."""
    loads = [x for r in rows for x in r["loadavg"]]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def _load_note(info: dict, loads: list[float]) -> str:
    """What the machine's load means for B5's timings: nothing else ran (load below the core
    count), or other work shared the cores for some rows (their load column says which)."""
    span = (
        f"1-minute load average {min(loads):.1f} to {max(loads):.1f} before and after the runs "
        "(per run in bench-results/dist-b5.json)"
    )
    if max(loads) < info["nproc"]:
        return f"**Quiet machine**: {info['nproc']} cores, nothing else running; {span}."
    return (
        f"**Not all rows on a quiet machine**: {span}. A row whose load column exceeds {info['nproc']} ran "
        "beside other engineers' builds: its loads and bytes hold, its edges/s and ratio do not (with more "
        "runnable threads than cores, two processes get about twice the CPU share of one)."
    )


def b5_markdown(res: dict, info: dict) -> str:
    rounds = res["rounds"]
    n = len(next(iter(rounds.values())))
    loads = [la for rows in rounds.values() for r in rows for la in r["loadavg"]]
    mib = 2**20
    lines = [
        "### B5: two ranks against one, and PBG's lock server (`benches/bench_dist.py --only b5`)",
        "",
        f"RMAT scale {res['scale']} x {res['edge_factor']}: {res['edges']:,} train edges; B3's run (Dot, 64 reals, "
        f"100 negatives, one epoch) with `--negative-pool resident`, `--memory {res['memory']}` for one process "
        f"and {res.get('rank_runtime', '0M')} more per rank (torch and gloo, which a rank's plan sets aside), table "
        "(embeddings + Adagrad state) "
        f"{res['table_bytes'] / 2**30:.2f} GiB; one thread per process; 2 ranks are "
        "`torchrun --nproc-per-node 2` on loopback, sharing the run directory, each prefetching its next "
        "grant (`dist_prefetch`, the default). memlimit rows: each process "
        f"under its own `memlimit {res['limit']}` (page cache included; ranks {res.get('rank_runtime', '0M')} "
        f"more). {n} rounds, alternating; medians.",
        "",
        _load_note(info, loads),
        "",
        "| run | partitions | epoch (s) | edges/s | vs 1 rank | partition loads (per rank) | waits | sent per rank "
        "| partition read+written per rank | peak per process | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {False: rounds.get("1 rank"), True: rounds.get("1 rank, memlimit")}
    for label, rows in rounds.items():
        eps = _med(rows, lambda r: r["edges_per_second"])
        ref = base["memlimit" in label]
        ratio = f"{eps / _med(ref, lambda r: r['edges_per_second']):.2f}x" if ref else "-"
        per_rank = _per_rank(rows, lambda q: q["partition_loads"], "{:.0f}")
        sent = _per_rank(rows, lambda q: q["bytes_sent"] / 2**10, "{:,.0f} KiB")
        disk = _per_rank(
            rows, lambda q: (q["partition_bytes_read"] + q["partition_bytes_written"]) / 2**30, "{:.2f} GiB"
        )
        peaks = [p for r in rows for p in r["peaks"]]
        peak = f"{max(peaks) / mib:.0f} MiB" if peaks else "-"
        waits = _med(rows, lambda r: sum(q["waits"] for q in r["ranks"]))
        load = _load_span(rows)
        lines.append(
            f"| {label} | {rows[0]['partitions']} | {_med(rows, lambda r: r['seconds']):.1f} | {eps:,.0f} | {ratio} | "
            f"{_med(rows, lambda r: r['partition_loads']):.0f} ({per_rank}) | {waits:.0f} | {sent} | {disk} | {peak} | "
            f"{load} |"
        )
    lines += [
        "",
        "Sent per rank: scheduler messages, relation all-reduces and the epoch's report (a shared run directory "
        "moves partitions through the disk: those bytes are the read+written column). Waits: the times the "
        "scheduler had no bucket a rank could take (it then wrote back and released everything).",
    ]
    if "1 rank" in rounds and "2 ranks, affinity" in rounds:
        ratios = [
            two["edges_per_second"] / one["edges_per_second"]
            for one, two in zip(rounds["1 rank"], rounds["2 ranks, affinity"], strict=True)
        ]
        lines += ["", "Per-round ratio 2 ranks / 1 rank (affinity): " + ", ".join(f"{x:.2f}" for x in ratios) + "."]
    if SAME_PARTS in rounds and "2 ranks, affinity" in rounds:
        eps = {k: _med(rounds[k], lambda r: r["edges_per_second"]) for k in (SAME_PARTS, "2 ranks, affinity")}
        lines += [
            "",
            f"2 ranks / 1 rank with the same {rounds[SAME_PARTS][0]['partitions']} partitions: "
            f"{eps['2 ranks, affinity'] / eps[SAME_PARTS]:.2f}x.",
        ]
    return "\n".join(lines)


#: B6's runs: label -> (ranks, options beside B6's).
B6_RUNS = {
    "1 process": (1, {}),
    **{f"2 ranks, relation_sync_every {k}": (2, {"--relation-sync-every": k}) for k in (1, 4, 16)},
}


#: The banks runs: label -> (ranks, options beside B6's).
BANK_RUNS = {
    "1 process, banks": (1, {"--negative-pool": "all"}),
    "2 ranks, banks": (2, {"--negative-pool": "all"}),
    "2 ranks, banks, bank_sync_every 1": (2, {"--negative-pool": "all", "--bank-sync-every": 1}),
    "2 ranks, resident negatives": (2, {}),
}


def b6(work: Path, args, runs: dict[str, tuple[int, dict[str, int | str]]]) -> dict:
    """Every run of ``runs`` (label -> ranks and the options that differ from B6's: resident
    negatives, ``relation_sync_every`` 4) on FB15k-237 with B1's settings, 8 partitions, a
    buffer of 3."""
    store = convert(SHARED / "datasets" / "fb15k-237", work / "fb15k-237.strata", "--relations")
    rows = {}
    for label, (ranks, extra) in runs.items():
        run_dir = work / "run-b6"
        options = {"--negative-pool": "resident", "--relation-sync-every": 4, **extra}
        meta = run(
            store,
            run_dir,
            [
                *B1, "--partitions", 8, "--buffer", 3, "--memory", "4G", "--seed", args.seed,
                *(str(x) for kv in options.items() for x in kv),
            ],
            ranks,
            None,
        )  # fmt: skip
        h = meta["history"]
        rows[label] = {
            "test": meta["test"],
            "best_epoch": meta["best"]["epoch"],
            "epoch_seconds": median([e["seconds"] for e in h]),
            "partition_loads": median([e["partition_loads"] for e in h]),
            "sent_per_rank": median(
                [median([r["bytes_sent"] for r in e.get("ranks", [{"bytes_sent": 0}])]) for e in h]
            ),
            "relation_rounds": median(
                [median([r["relation_rounds"] for r in e.get("ranks", [{"relation_rounds": 0}])]) for e in h]
            ),
            "loadavg": meta["loadavg"],
        }
        shutil.rmtree(run_dir)
        print(f"B6 {label}: test MRR {meta['test']['mrr']:.4f}", flush=True)
    return {"seed": args.seed, "runs": rows}


def banks_markdown(res: dict) -> str:
    lines = [
        "### B6 banks: negative banks shared by 2 ranks, FB15k-237 (`benches/bench_dist.py --only banks`)",
        "",
        "B6's settings (B1's ComplEx 100 run, 8 partitions, a buffer of 3, `relation_sync_every` 4, seed "
        f"{res['seed']}, one thread per process). Banks: `--negative-pool all`, negatives uniform over all nodes, "
        "those of partitions not resident from the bank blocks (FB15k-237's partitions of about 1,818 nodes are held "
        "whole). On 2 ranks the blocks are summed at each epoch's start from the committed table, refreshed when "
        "the rank evicts a partition, and the gradient left at the end is summed and applied by each partition's "
        "owner; with `bank_sync_every` 1 the pending gradient is also summed at every relation round and applied "
        "at once by the rank holding the partition (docs/distributed.md).",
        "",
        "| run | test MRR | vs 1 process, banks | Hits@10 | best epoch | loads per epoch | sent per rank per epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    ref = res["runs"]["1 process, banks"]["test"]["mrr"]
    for label, r in res["runs"].items():
        t = r["test"]
        lines.append(
            f"| {label} | {t['mrr']:.4f} | {t['mrr'] - ref:+.4f} | {t['hits@10']:.4f} | {r['best_epoch']} | "
            f"{r['partition_loads']:.0f} | {r['sent_per_rank'] / 2**20:.1f} MiB |"
        )
    return "\n".join(lines)


def b6_markdown(res: dict) -> str:
    lines = [
        "### B6: relation staleness, FB15k-237 with 2 ranks (`benches/bench_dist.py --only b6`)",
        "",
        "B1's settings (ComplEx 100, chunks of 1000 edges sharing 1000 negatives, softmax, Adagrad lr 0.1, 10 "
        "epochs) with 8 partitions, a buffer of 3 and `--negative-pool resident` (B6 banks below has the "
        f"negative banks), seed {res['seed']}, one thread per process; filtered test metrics at the best validation "
        "epoch. A rank joins a relation all-reduce every `relation_sync_every` buckets it trains; 1 is the "
        "synchronous variant.",
        "",
        "| run | test MRR | vs 1 process | Hits@10 | best epoch | loads per epoch | relation rounds per rank "
        "per epoch | sent per rank per epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ref = res["runs"]["1 process"]["test"]["mrr"]
    for label, r in res["runs"].items():
        t = r["test"]
        lines.append(
            f"| {label} | {t['mrr']:.4f} | {t['mrr'] - ref:+.4f} | {t['hits@10']:.4f} | {r['best_epoch']} | "
            f"{r['partition_loads']:.0f} | {r['relation_rounds']:.0f} | {r['sent_per_rank'] / 2**20:.1f} MiB |"
        )
    return "\n".join(lines)


#: B7's configurations: label -> whether ranks prefetch their next grant.
B7_RUNS = {"prefetch on": True, "prefetch off": False}


def b7(work: Path, args) -> dict:
    store = rmat_store(work, args.scale, args.edge_factor)
    labels = list(B7_RUNS)
    rounds: dict[str, list[dict]] = {label: [] for label in labels}
    for k in range(args.rounds):
        for label in labels[k % 2 :] + labels[: k % 2]:
            run_dir = work / "run-b7"
            flag = "--dist-prefetch" if B7_RUNS[label] else "--no-dist-prefetch"
            opts = ["--epochs", args.b7_epochs, "--eval-every", 0, "--negative-pool", "resident"]
            opts += ["--partitions", args.b7_partitions, "--memory", args.memory, flag]
            meta = run(store, run_dir, [*DOT, *opts], 2, None)
            epochs = [
                {
                    "seconds": e["seconds"],
                    "partition_loads": e["partition_loads"],
                    "ranks": [
                        {
                            key: r[key]
                            for key in (
                                "rank", "seconds", "buckets", "partition_loads", "prefetched_loads",
                                "partition_wait_seconds", "partition_wait_share", "partition_bytes_loaded",
                                "io_wait_seconds", "waits", "group_wait_seconds", "relation_rounds",
                            )
                        }
                        for r in e["ranks"]
                    ],
                }
                for e in meta["history"]
            ]  # fmt: skip
            plan = {p["name"]: p for p in meta["memory_plan"]["parts"]}
            fig = {"epochs": epochs, "loadavg": meta["loadavg"], "prefetch_plan": plan.get("prefetch slots")}
            rounds[label].append(fig)
            shutil.rmtree(run_dir)
            print(
                f"B7 round {k + 1} {label}: epochs {[round(e['seconds'], 1) for e in epochs]} s, partition wait "
                f"{[round(r['partition_wait_share'], 3) for e in epochs for r in e['ranks']]}, "
                f"load average {fig['loadavg'][0]:.1f}",
                flush=True,
            )
    return {
        **_graph(store, args),
        "partitions": args.b7_partitions,
        "epochs": args.b7_epochs,
        "memory": args.memory,
        "rounds": rounds,
    }


def b7_markdown(res: dict, info: dict) -> str:
    rounds = res["rounds"]
    loads = [la for rows in rounds.values() for r in rows for la in r["loadavg"]]
    lines = [
        "### B7: each rank prefetching its next grant, on and off (`benches/bench_dist.py --only b7`)",
        "",
        f"RMAT scale {res['scale']} x {res['edge_factor']}: {res['edges']:,} train edges; B5's 2-rank run "
        f"(Dot 64, 100 negatives, resident negatives, affinity policy, shared run directory) with "
        f"{res['partitions']} partitions, a buffer of 3 and `--memory {res['memory']}` per rank, {res['epochs']} "
        f"epochs per run, {len(next(iter(rounds.values())))} rounds alternating which goes first; medians over "
        "every epoch of every round. Partition wait: the seconds a rank's trainer was blocked on partition "
        "loads and write-backs, as a share of its epoch (`partition_wait_share` in run.json).",
        "",
        f"**Timings taken under load**: {info['nproc']} cores shared with other engineers' builds; 1-minute load "
        f"average {min(loads):.1f} to {max(loads):.1f} around the runs. Ratios are of runs taken side by side.",
        "",
        "| run | epoch (s) | partition wait share (per rank) | partition wait (s, per rank) | loads per epoch "
        "(per rank) | prefetched loads | waits | load average |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in rounds.items():
        eps = [e for r in rows for e in r["epochs"]]
        n = len(eps[0]["ranks"])

        def per_rank(key, fmt, eps=eps, n=n):
            return "/".join(fmt.format(median([e["ranks"][q][key] for e in eps])) for q in range(n))

        waits = median([sum(q["waits"] for q in e["ranks"]) for e in eps])
        prefetched = median([sum(q["prefetched_loads"] for q in e["ranks"]) for e in eps])
        load = _load_span(rows)
        lines.append(
            f"| {label} | {median([e['seconds'] for e in eps]):.1f} | {per_rank('partition_wait_share', '{:.1%}')} | "
            f"{per_rank('partition_wait_seconds', '{:.1f}')} | {median([e['partition_loads'] for e in eps]):.0f} "
            f"({per_rank('partition_loads', '{:.0f}')}) | {prefetched:.0f} | {waits:.0f} | {load} |"
        )
    on, off = rounds["prefetch on"], rounds["prefetch off"]
    ratios = [
        median([e["seconds"] for e in a["epochs"]]) / median([e["seconds"] for e in b["epochs"]])
        for a, b in zip(on, off, strict=True)
    ]
    lines += ["", "Per-round ratio of median epoch times, on / off: " + ", ".join(f"{x:.2f}" for x in ratios) + "."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="b5,b6,banks,b7", help="comma-separated subset of b5,b6,banks,b7")
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "embed")
    ap.add_argument("--scale", type=int, default=23, help="RMAT scale of B5's graph (B3's: 23)")
    ap.add_argument("--edge-factor", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--memory",
        default="900M",
        help="--memory of B5's single process (each rank gets --rank-runtime more); under --limit it leaves "
        "room for the page cache",
    )
    ap.add_argument("--limit", default="1000M", help="memlimit of every B5 process in the memlimit rows")
    ap.add_argument(
        "--rank-runtime",
        default="450M",
        help="added to --memory and --limit of each torchrun rank: torch and gloo, which a rank's plan sets "
        "aside (about 400 MiB measured), so every process has the same budget for its data",
    )
    ap.add_argument(
        "--b5-partitions",
        type=int,
        default=0,
        help="also run one process with this many partitions (the 2-rank runs' count, from their plan) "
        "to separate the partitioning's effect on one thread from the scaling; 0: no such row",
    )
    ap.add_argument("--seed", type=int, default=0, help="B6's seed")
    ap.add_argument("--b7-partitions", type=int, default=28, help="B7's partitions (out of core at any --memory)")
    ap.add_argument("--b7-epochs", type=int, default=2, help="B7's epochs per run")
    args = ap.parse_args()
    only = set(args.only.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    info = machine()
    if "b6" in only:
        res = b6(args.work, args, B6_RUNS)
        save("dist-b6", {"machine": info, **res})
        update_doc("dist-b6", b6_markdown(res))
    if "banks" in only:
        res = b6(args.work, args, BANK_RUNS)
        save("dist-b6-banks", {"machine": info, **res})
        update_doc("dist-b6-banks", banks_markdown(res))
    if "b5" in only:
        res = b5(args.work, args)
        save("dist-b5", {"machine": info, **res})
        update_doc("dist-b5", b5_markdown(res, info))
    if "b7" in only:
        res = b7(args.work, args)
        save("dist-b7", {"machine": info, **res})
        update_doc("dist-b7", b7_markdown(res, info))


if __name__ == "__main__":
    main()
