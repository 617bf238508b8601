"""Question: how fast does `strata embed train --device cuda` train, at what quality, and does
the out-of-core buffer on the device keep the GPU busy (Legend's placement and overlap)?

    python benches/bench_embed_device.py --part PART [--device cuda] [--out FILE] [--work DIR]
        [--scale 24] [--edge-factor 16] [--epochs N] [--table-dtype bf16] [--tiny]

Parts (each fits one call of the GPU machine; results accumulate in `--out`):

- `fb15k`: FB15k-237 at B1's settings (docs/benchmarks.md: ComplEx, 100 reals, chunks of 1000
  edges sharing 1000 uniform negatives, both sides corrupted, softmax, Adagrad lr 0.1, 10
  epochs, one partition) on `--device` (on `cuda` also with TF32 products, and with each epoch
  writing its table back before it ends instead of behind validation) against the Rust
  engine on the machine's cores and on one thread, side by side: median epoch seconds and
  filtered test MRR.
- `fb15k-trace`: B1's run on `--device` in this process under torch's profiler
  (`device_trace`): per epoch the device's busy share, and for its idle time what the host was
  doing (the backend's phases, or the Rust engine's own work); the Chrome trace beside `--out`.
- `rmat-prepare`: generates and converts the RMAT graph (scale `--scale`, `--edge-factor` edges
  per node) into `--work` (kept for the two runs below).
- `rmat-ooc`: one epoch of Dot, 100 reals, on `--device` with 12 partitions and a buffer of 3
  (the device holds a quarter of the table: Legend's buffer of three), legend ordering, with
  `--device-memory` a quarter of the table plus the device's fixed parts (`DEVICE_FIXED`): with
  the partitions outside the slots kept in host memory (the default, `--memory` holds them) and
  with every load from the SSD (`--no-keep-partitions`, Legend's own setting), side by side.
- `rmat-resident`: the same epoch with the whole table resident (one partition).

`--table-dtype bf16` trains every run of the parts with bf16 tables (half the device memory and
bytes moved per partition; the names say so), beside float32 runs of an earlier call.
`--optimizer adagrad_row` keeps one Adagrad accumulator a node instead of one a real (PyTorch-
BigGraph's choice for embeddings): with bf16 tables a partition moves about a quarter of the
float32 bytes, which a disk of about 1 GB/s can hide behind the device's training.

Reported per run: epoch seconds, edges/s, the device's busy share of the epoch, its copies and
the SSD-to-device bandwidth (run.json's `device` counters), and test MRR for `fb15k`. `--tiny`
runs a generated knowledge graph and an RMAT graph of scale 10 for tests. The figures the GPU
session measures go into docs/benchmarks.md by hand, with the device named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_embed import B1
from common import REPO, SHARED, machine, strata, timed

PARTS = ("fb15k", "fb15k-trace", "rmat-prepare", "rmat-ooc", "rmat-resident")
#: B1's settings (``B1``) as options of ``strata.embed.train``, for the traced run.
B1_OPTIONS = dict(
    model="complex", dim=100, chunk_size=1000, negatives=1000, corrupt="both", loss="softmax", optimizer="adagrad",
    lr=0.1,
)  # fmt: skip

#: The out-of-core runs: Dot as B3 trains it (100 reals), larger chunks for the device,
#: negatives from the resident partitions (Legend's pool).
RMAT = ["--model", "dot", "--dim", "100", "--negatives", "100", "--lr", "0.01", "--eval-every", "0",
        "--negative-pool", "resident"]  # fmt: skip


def kg_store(args) -> Path:
    """FB15k-237 (or, with `--tiny`, a small generated knowledge graph) as a store."""
    if args.tiny:
        store = args.work / "kg-tiny.strata"
        if not store.exists():
            raw = args.work / "kg-tiny-raw"
            gen = ["--entities", 200, "--relations", 8, "--triples", 4000]
            timed(strata("generate", "kg", "--out", raw, *gen, "--overwrite", "-q"))
            timed(strata("convert", raw, "--relations", "--out", store, "-q"))
        return store
    store = args.work / "fb15k-237.strata"
    if not store.exists():
        timed(strata("convert", SHARED / "datasets" / "fb15k-237", "--relations", "--out", store, "-q"))
    return store


def rmat_store(args) -> Path:
    return args.work / f"rmat-s{args.scale}-e{args.edge_factor}.strata"


def summary(meta: dict) -> dict:
    """Medians over a run's epochs, and the device's counters."""
    h = meta["history"]
    med = lambda key: statistics.median([e[key] for e in h])  # noqa: E731
    out = {
        "epochs": len(h),
        "epoch_seconds": med("seconds"),
        "edges_per_second": med("edges_per_second"),
        "io_wait_fraction": med("io_wait_fraction"),
        "io_wait_seconds": med("io_wait_seconds"),
        "partition_loads": med("partition_loads"),
        "partitions": meta["partitioning"]["partitions"],
        "device_line": meta["device_line"],
        "device_memory": (meta.get("device_memory_plan") or {}).get("memory"),
    }
    if all("device" in e for e in h):
        d = lambda key: statistics.median([e["device"][key] for e in h])  # noqa: E731
        out.update(
            busy_share=d("busy_share"),
            h2d_bytes=d("h2d_bytes"),
            d2h_bytes=d("d2h_bytes"),
            copy_wait_seconds=d("copy_wait_seconds"),
            ssd_to_device_bytes_per_second=d("ssd_to_device_bytes_per_second"),
        )
    # Each epoch on its own: a run's first epoch fills its buffer and compiles, the later ones
    # show the steady state (an out-of-core epoch after the first starts where the last ended).
    out["per_epoch"] = [
        {
            "seconds": e["seconds"],
            "partition_loads": e["partition_loads"],
            "partition_bytes_read": e["partition_bytes_read"],
            "io_wait_fraction": e["io_wait_fraction"],
            **({"busy_share": e["device"]["busy_share"]} if "device" in e else {}),
        }
        for e in h
    ]
    if meta.get("test"):
        out["test_mrr"] = meta["test"]["mrr"]
    return out


def run(store: Path, run_dir: Path, options: list) -> dict:
    """Trains a fresh run; its summary, with the run's line about the device."""
    cmd = strata("embed", "train", store, "--run-dir", run_dir, "--fresh", "--json-summary", *options)
    res = timed(cmd, log=run_dir.with_name(run_dir.name + ".log"))
    meta = json.loads(res["stdout"])
    lines = [line.strip() for line in res["stderr"].splitlines() if "GPUDirect Storage" in line]
    meta["device_line"] = lines[0] if lines else None
    out = summary(meta)
    # The backend's per-epoch lines (how the chunk steps ran: CUDA graphs or op by op).
    out["device_notes"] = [line.strip() for line in res["stderr"].splitlines() if line.startswith("device: ")]
    return out


def part_fb15k(args) -> dict:
    store = kg_store(args)
    settings = list(B1)
    if args.tiny:
        settings = [*B1, "--dim", 16, "--negatives", 32, "--chunk-size", 200]
    settings += ["--epochs", args.epochs or (1 if args.tiny else 10), "--partitions", 1, "--memory", "4G"]
    # The Rust engine on every core trains chunks in parallel without locks (Hogwild), which
    # costs quality at this size; on one thread it trains them in order, as the device does.
    settings += ["--table-dtype", args.table_dtype, "--optimizer", args.optimizer]
    runs = {f"fb15k {args.device}": run(store, args.work / "run-fb15k-device", [*settings, "--device", args.device])}
    if args.device == "cuda":
        # The step's three score products on tensor cores: what TF32 buys the epoch, and costs MRR.
        tf32 = [*settings, "--device", "cuda", "--device-matmul", "tf32"]
        runs["fb15k cuda, tf32"] = run(store, args.work / "run-fb15k-tf32", tf32)
        # Each epoch writing its table back before it ends: what the write-behind copy saves.
        back = [*settings, "--device", "cuda", "--no-write-behind"]
        runs["fb15k cuda, written back"] = run(store, args.work / "run-fb15k-back", back)
    runs |= {
        "fb15k cpu": run(store, args.work / "run-fb15k-cpu", [*settings, "--device", "cpu"]),
        "fb15k cpu, 1 thread": run(store, args.work / "run-fb15k-cpu1", [*settings, "--device", "cpu", "--threads", 1]),
    }
    return named(runs, args)


def part_fb15k_trace(args) -> dict:
    """B1's run traced in this process (``device_trace``): five epochs, the second to the
    fourth summarised (the first captures the step's graphs), and the last with one evaluation
    of the validation split on the device after it (the device ranker's calls marked);
    validation off so that an epoch is its training alone; an epoch starts where the epoch
    loop lends the backend its slots. The Chrome trace goes beside ``--out``."""
    import device_trace
    from strata.embed import Run, train
    from strata.embed.device import backend, evaluate, graphs

    store = kg_store(args)
    options = dict(B1_OPTIONS, epochs=args.epochs or 5, partitions=1, memory="4G", eval_every=0)
    if args.tiny:
        options.update(dim=16, negatives=32, chunk_size=200)
    options.update(table_dtype=args.table_dtype, optimizer=args.optimizer, device=args.device)
    run_dir = args.work / "run-fb15k-trace"
    targets = {
        # A piece's host work in its parts: the contexts, the staged inputs, the losses read
        # one piece later.
        backend.TorchCompute: ["train_piece", "slot_in", "slot_out", "counters", "_ctx", "_lent_to_device"],
        backend.PieceLosses: ["push", "take"],
        backend.Staging: ["to_device"],
        graphs.StepGraphs: ["run"],
        # The evaluation after training falls in the last epoch's window: the device's
        # counting against the host's preparing of the rounds.
        evaluate.TorchRanker: ["count"],
    }
    path = args.out.with_name(args.out.stem + "-fb15k-trace.json.gz")

    def run() -> None:
        train(store=store, run_dir=run_dir, fresh=True, **options)
        Run(run_dir).evaluate("valid", device=args.device, checkpoint="last")

    summ = device_trace.traced(
        run,
        targets,
        (backend.TorchCompute, "forget_partitions", False),
        path,
        cuda=args.device.startswith("cuda"),
    )
    print(device_trace.show("fb15k trace", summ), file=sys.stderr)
    epochs = summ["epochs"]
    return {f"fb15k {args.device}, traced": {"trace": path.name, "epochs": epochs[1:-1], "last_and_eval": epochs[-1]}}


def named(runs: dict, args) -> dict:
    """``runs`` with their names saying a bf16 table (``--table-dtype bf16``) and a row-wise
    Adagrad (``--optimizer adagrad_row``)."""
    suffix = (", bf16 table" if args.table_dtype == "bf16" else "") + (
        ", adagrad_row" if args.optimizer == "adagrad_row" else ""
    )
    return {f"{name}{suffix}": r for name, r in runs.items()}


def part_rmat_prepare(args) -> dict:
    store = rmat_store(args)
    if store.exists():
        return {}
    raw = args.work / f"rmat-s{args.scale}-e{args.edge_factor}.bin"
    gen = ["--scale", args.scale, "--edge-factor", args.edge_factor]
    r1 = timed(strata("generate", "rmat", *gen, "--out", raw, "-q"))
    r2 = timed(strata("convert", raw, "--num-nodes", 1 << args.scale, "--memory", "8G", "--out", store, "-q"))
    raw.unlink()
    return {"rmat prepare": {"seconds": r1["seconds"] + r2["seconds"]}}


def rmat_settings(args) -> list:
    chunk = 200 if args.tiny else args.chunk_size
    memory = "1G" if args.tiny else "64G"
    return [*RMAT, "--chunk-size", chunk, "--epochs", args.epochs or 1, "--memory", memory, "--device", args.device,
            "--table-dtype", args.table_dtype, "--optimizer", args.optimizer]  # fmt: skip


#: Room the device budget of the out-of-core run leaves beside the table's quarter: one staged
#: edge piece (at most 2^20 edges, 40 MiB) and a chunk's scratch (about 200 MiB at 10,000 edges
#: and 100 negatives of 100 reals), rounded up.
DEVICE_FIXED = 512 << 20


def part_rmat_ooc(args) -> dict:
    store = rmat_store(args)
    # Dot, 100 reals: 100 values of embedding a node, and 100 of Adagrad state (1 for adagrad_row).
    values = 100 + (1 if args.optimizer == "adagrad_row" else 100)
    quarter = (1 << args.scale) * values * (2 if args.table_dtype == "bf16" else 4) // 4
    options = [*rmat_settings(args), "--partitions", 12, "--buffer", 3, "--ordering", "legend"]
    options += ["--device-memory", quarter + DEVICE_FIXED]
    name = f"rmat-s{args.scale} out of core (1/4 on the device)"
    runs = {name: run(store, args.work / "run-rmat-ooc", options)}
    # Legend's own setting beside it: every load from the SSD, none kept in host memory.
    ssd = [*options, "--no-keep-partitions"]
    runs[f"{name}, every load from the SSD"] = run(store, args.work / "run-rmat-ooc-ssd", ssd)
    return named(runs, args)


def part_rmat_resident(args) -> dict:
    store = rmat_store(args)
    options = [*rmat_settings(args), "--partitions", 1]
    return named({f"rmat-s{args.scale} resident": run(store, args.work / "run-rmat-resident", options)}, args)


def table(runs: dict) -> str:
    head = "| run | epoch (s) | edges/s | device busy | SSD->device MB/s | test MRR |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        if "epoch_seconds" not in r:
            continue
        busy = f"{r['busy_share']:.1%}" if "busy_share" in r else "-"
        bw = f"{r['ssd_to_device_bytes_per_second'] / 1e6:.0f}" if "ssd_to_device_bytes_per_second" in r else "-"
        mrr = f"{r['test_mrr']:.4f}" if "test_mrr" in r else "-"
        lines.append(f"| {name} | {r['epoch_seconds']:.3f} | {r['edges_per_second']:,.0f} | {busy} | {bw} | {mrr} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", action="append", choices=[*PARTS, "all"], required=True)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or torch-cpu (the CPU twin, for tests)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "embed-device.json")
    ap.add_argument("--work", type=Path, default=REPO / "bench-work" / "embed-device")
    ap.add_argument("--scale", type=int, default=24)
    ap.add_argument("--edge-factor", type=int, default=16)
    ap.add_argument("--chunk-size", type=int, default=10000, help="edges per chunk of the RMAT runs")
    ap.add_argument("--epochs", type=int, default=0, help="0: B1's 10 for fb15k, 1 for the RMAT runs")
    ap.add_argument("--table-dtype", choices=["f32", "bf16"], default="f32", help="the runs' table_dtype")
    ap.add_argument("--optimizer", choices=["adagrad", "adagrad_row"], default="adagrad", help="the runs' optimizer")
    ap.add_argument("--tiny", action="store_true", help="a generated graph and RMAT scale 10, for tests")
    args = ap.parse_args()
    if args.tiny:
        args.scale, args.edge_factor = 10, 4
    args.work.mkdir(parents=True, exist_ok=True)
    parts = PARTS if "all" in args.part else args.part
    result = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    result["machine"] = machine()
    runs = {"fb15k": part_fb15k, "fb15k-trace": part_fb15k_trace, "rmat-prepare": part_rmat_prepare}
    runs["rmat-ooc"] = part_rmat_ooc
    runs["rmat-resident"] = part_rmat_resident
    for part in parts:
        if part != "rmat-prepare" and part.startswith("rmat") and not rmat_store(args).exists():
            sys.exit(f"{rmat_store(args)} is missing: run --part rmat-prepare first")
        result["runs"].update(runs[part](args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(table(result["runs"]))


if __name__ == "__main__":
    main()
