"""G5 of `bench_gnn.py`: data-parallel GNN training under torchrun (DistributedDataParallel,
gloo on the CPU), 2 ranks against 1 process, side by side in one run.

Accuracy: G1's GraphSAGE on Cora and CiteSeer (every feature row in RAM), `strata gnn train`
as one process and under `torchrun --nproc-per-node 2`, over the same seeds. Each rank keeps
G1's batch of 64, so a 2-rank step averages the gradients of 128 seeds and an epoch has half
the steps.

Throughput: one epoch of GraphSAGE (mean, hidden 128) over the first ``--g4-seeds`` train
seeds of a permutation of the G2 graph's split (`gnn_train_driver.py`), 1 process with 1 torch
thread and 1 sampler thread against 2 ranks with 1 torch thread and 1 sampler thread each, each
within its own ``--g5-memory``. Rounds alternate the two; reported are medians of seeds/s (the
group's seeds over the slowest rank's seconds), their ratio, each rank's data-wait share, and
the machine's load average, since other jobs share it.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

from common import SHARED, machine, save, strata, update_doc

TRAIN_DRIVER = Path(__file__).resolve().parent / "gnn_train_driver.py"

G1_SAGE = ["--model", "sage", "--fanouts", "25,10", "--batch-size", "64", "--hidden", "256", "--lr", "0.01",
           "--weight-decay", "5e-4", "--dropout", "0.5", "--device", "cpu", "--feature-memory", "0"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args) -> list[str]:
    """``args`` (a module invocation ``-m ...`` or a script) under torchrun with ``nproc`` ranks on
    loopback."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "0", *map(str, args)]  # fmt: skip


def _run(cmd: list[str], timeout: int) -> dict:
    """Runs ``cmd`` with one thread per process and gloo on loopback; its JSON stdout, and the
    1-minute load average before and after."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout), "load_before": before, "load_after": os.getloadavg()[0]}


def accuracy(args) -> dict:
    """Test accuracy of G1's GraphSAGE on Cora and CiteSeer, 1 process and 2 ranks per seed."""
    rows = {}
    for name in ("cora", "citeseer"):
        store = args.work / f"{name}.strata"
        if not store.exists():
            subprocess.run(strata("convert", SHARED / "datasets" / "planetoid", "--name", name, "--out", store, "-q"),
                           check=True)  # fmt: skip
        for ranks in (1, 2):
            accs = []
            for seed in range(args.seeds):
                train = ["-m", "strata", "gnn", "train", store, "--run-dir", args.work / f"g5-{name}-{ranks}",
                         *G1_SAGE, "--epochs", args.epochs, "--seed", seed, "--torch-threads", "1", "-q",
                         "--json-summary"]  # fmt: skip
                cmd = [sys.executable, *map(str, train)] if ranks == 1 else torchrun(ranks, *train)
                accs.append(_run(cmd, 600)["test"]["accuracy"])
            rows[f"{name} {ranks}"] = {"accuracies": accs, "mean": statistics.mean(accs)}
            print(f"G5 {name}, {ranks} rank(s): mean test accuracy {statistics.mean(accs):.4f} {accs}", flush=True)
    return rows


def throughput(args, store: Path) -> dict:
    """Seeds/s of one training epoch, 1 process against 2 ranks, alternating for ``g5_rounds``."""
    drive = [TRAIN_DRIVER, store, "--memory", args.g5_memory, "--seeds", args.g4_seeds, "--hidden", args.g4_hidden,
             "--torch-threads", 1, "--sampler-threads", 1]  # fmt: skip
    runs = {1: [], 2: []}
    for r in range(args.g5_rounds):
        for ranks in (1, 2):
            cmd = [sys.executable, *map(str, drive)] if ranks == 1 else torchrun(ranks, *drive)
            rec = _run(cmd, 1800)
            runs[ranks].append(rec)
            print(f"G5 round {r + 1}, {ranks} rank(s): {rec['seeds_per_second']:,.0f} seeds/s, load "
                  f"{rec['load_before']:.1f} -> {rec['load_after']:.1f}", flush=True)  # fmt: skip
    med = {k: statistics.median(x["seeds_per_second"] for x in v) for k, v in runs.items()}
    return {"runs": runs, "median_seeds_per_second": med, "ratio": med[2] / med[1]}


def g5(args, store: Path) -> None:
    acc = accuracy(args)
    thr = throughput(args, store)
    save("gnn-g5", {"machine": machine(), "seeds": args.seeds, "epochs": args.epochs, "accuracy": acc,
                    "throughput": thr, "store": store.name})  # fmt: skip
    update_doc("gnn-g5", report(args, acc, thr, store))


def report(args, acc: dict, thr: dict, store: Path) -> str:
    m = machine()
    lines = [
        "### G5: data-parallel training, 2 ranks against 1 process (`benches/bench_gnn.py --only g5`)",
        "",
        f"{m['nproc']} cores ({m['cpu']}), shared with other jobs (load averages below). gloo on loopback, "
        "1 torch thread per process.",
        "",
        f"Accuracy: G1's GraphSAGE (fanouts 25,10, batch 64 per rank, hidden 256, {args.epochs} epochs, every row "
        f"in RAM), test accuracy at the best validation epoch, mean of {args.seeds} seeds.",
        "",
        "| dataset | 1 process | 2 ranks | per seed, 2 ranks | 2 ranks minus 1 process |",
        "|---|---|---|---|---|",
    ]
    for name in ("cora", "citeseer"):
        one, two = acc[f"{name} 1"], acc[f"{name} 2"]
        lines.append(
            f"| {name} | {one['mean']:.4f} | {two['mean']:.4f} | {', '.join(f'{a:.3f}' for a in two['accuracies'])} "
            f"| {100 * (two['mean'] - one['mean']):+.2f} points |"
        )
    runs, med = thr["runs"], thr["median_seeds_per_second"]
    lines += [
        "",
        f"Throughput: {store.name}, one epoch of GraphSAGE (mean, hidden {args.g4_hidden}, fanouts 15,10, batch "
        f"1024) over {args.g4_seeds:,} train seeds, each process within --memory {args.g5_memory}, 1 torch thread "
        f"and 1 sampler thread per process; {args.g5_rounds} alternating rounds.",
        "",
        "| run | seeds/s per round | median seeds/s | data wait per rank (median round) | load average (1 min) |",
        "|---|---|---|---|---|",
    ]
    for ranks in (1, 2):
        rs = runs[ranks]
        mid = sorted(rs, key=lambda x: x["seeds_per_second"])[len(rs) // 2]
        waits = [r["data_wait_fraction"] for r in mid.get("ranks", [mid])]
        loads = ", ".join(f"{x['load_before']:.1f}-{x['load_after']:.1f}" for x in rs)
        rates = ", ".join(f"{x['seeds_per_second']:,.0f}" for x in rs)
        lines.append(
            f"| {ranks} rank{'s' if ranks > 1 else ''} x 1 thread | {rates} | {med[ranks]:,.0f} | "
            f"{', '.join(f'{100 * w:.0f}%' for w in waits)} | {loads} |"
        )
    lines += ["", f"Ratio 2 ranks / 1 process: **{thr['ratio']:.2f}x** (target >= 1.6x)."]
    return "\n".join(lines)
