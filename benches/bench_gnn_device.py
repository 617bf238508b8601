"""Question: does the device data path (device sampler, device-managed cache, deep pipeline)
keep a GPU fed, what does holding a quarter of the features in host memory cost, and how does it
compare with PyG's NeighborLoader?

    python benches/bench_gnn_device.py --only FIGURES [--prepare] [--device cuda] [--work DIR]
        [--out FILE] [--max-batches N] [--tiny]

FIGURES, comma-separated (each a JSON entry under ``figures``):

- ``g6``: G6's graph and settings (docs/benchmarks.md, G6: `strata generate sbm`, 200,000
  nodes, 16 classes, 128 float32 features, mean degree 10, symmetrized; `strata gnn train
  --model sage --fanouts 10,5 --batch-size 1024 --epochs 3 --memory 2G`), run through the CLI
  with `--data-path native` and `--data-path device`, and the device path again with
  `--step eager` (the others take `--step auto`: on a GPU each padded batch shape's training
  step is a CUDA graph), once more with `--window 0` (G6's rows all sit in device memory, so
  no read can miss and the GIDS window only holds back each epoch's first batch until nine
  are sampled), and once with `--producer inline` (no producer thread: the training
  loop issues the data path's work between its steps): sampled nodes/s, the share of the epoch
  the training loop waited for a batch, and the share the model's stream had no step to run
  (`model_idle_share`: the device's own measure, events around each step), medians of the
  epochs after the first from each run.json, and their ratios.
- ``trace``: G6's device run (`--step auto`) in this process under torch's profiler
  (`device_trace`): per epoch the device's busy share and, for its idle time, what the host
  threads were doing (sampling, lookups, the training step's copies, or nothing torch saw);
  the Chrome trace beside `--out`.
- ``path``: G6's device data path alone, no model (`GnnData` with G6's settings and
  `data_path="device"`): sampled nodes/s and milliseconds per batch per epoch, the busy
  seconds per stage, and for the first batches of an epoch, sampled and looked up on the
  calling thread, the torch ops, kernel launches, host waits and values read back per batch
  (`strata.device.waits`): what the data path costs a GPU's host, beside what it delivers.
- ``reads``: G6's device data path without a model, a quarter of the feature rows in host
  memory and the rest read per batch: each batch's misses read alone (window 0) against the
  default window of 8 batches sampled ahead, whose misses are read together (each distinct row
  once, pages shared by batches read once): disk bytes and requests an epoch, the lookups'
  busy seconds. The reads are the SSD's on the CPU twin too, so it measures there.
- ``pyg``: on G6's graph, PyG's `NeighborLoader` with every feature in memory against Strata's
  device path with a quarter of the features in host memory (no device tier; the rest read per
  batch), the same fanouts, batch size and model (GraphSAGE, hidden 256, Adam); epoch seconds.
- ``big``: the issue's scale, 20M nodes with 256 float32 features (20 GB; `--big-nodes`,
  `--big-dim`): the device path with every row in device memory against the same run with
  `--memory` a quarter of the feature bytes and no device tier (features 4x the host budget);
  throughput (sampled nodes/s) and its ratio.
- ``big-pyg``: PyG's `NeighborLoader` with every feature in memory on the big graph.

`--prepare` only generates, converts and checks the stores the figures need (kept in `--work`,
reused by later calls; the check is recorded in the store, so later opens skip it), so that the
GPU session can run, each call under 10 minutes:

    python benches/bench_gnn_device.py --only g6,path,reads,pyg --work /tmp/gnn-bench --out $OUT/g6.json
    python benches/bench_gnn_device.py --only big --prepare --work /tmp/gnn-bench
    python benches/bench_gnn_device.py --only big --work /tmp/gnn-bench --out $OUT/big.json
    python benches/bench_gnn_device.py --only big-pyg --work /tmp/gnn-bench --out $OUT/big-pyg.json

The big graph trains on 1% of its nodes (Helios's setting; 196 batches an epoch).
`--max-batches` caps every epoch of the Python-side runs at the same number of batches;
throughput is over the batches trained, and runs say their cap (`max_batches`). Epoch 1
includes CUDA's warm-up and is left out of the medians. PyG's runs need PyG and its sampler
(pyg-lib or torch-sparse); without them the figure records why it was skipped. kvikio reads
below its `KVIKIO_GDS_THRESHOLD` through POSIX; the bench sets it to 4096 unless set.
`--tiny` runs every figure at a few thousand nodes (the tests). The figures the GPU session
measures go into docs/benchmarks.md by hand, with the device named.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from common import RESULTS, machine, profiled, save, strata, timed

FANOUTS = [10, 5]
BATCH = 1024
HIDDEN = 256
#: Host memory for the data path's fixed needs (topology, batch buffers) beside the feature rows.
HOST_FIXED = 6 << 30
#: G6's graph and the issue's large one: (nodes, feature dim).
GRAPHS = {"g6": (200_000, 128), "big": (20_000_000, 256)}
TINY = {"g6": (1500, 16), "big": (3000, 16)}
FIGURES = ("g6", "trace", "path", "reads", "pyg", "big", "big-pyg")
#: Batches the ``path`` figure counts ops and waits over.
COUNTED = 8
#: The big graph trains on 1% of its nodes (Helios's share), valid and test 1% each.
BIG_SPLITS = ["--train-fraction", 0.01, "--valid-fraction", 0.01, "--test-fraction", 0.01]


def make_store(work: Path, nodes: int, dim: int, splits=()) -> Path:
    """An SBM store (16 classes, mean degree 10, symmetrized; ``splits`` the generator's split
    fractions), generated, converted and checked once; reused from ``work`` when present."""
    name = f"sbm-n{nodes}-f{dim}" + ("-splits" if splits else "")
    store = work / f"{name}.strata"
    if (store / "manifest.json").exists():
        return store
    raw = work / f"{name}-raw"
    gen = ["--nodes", nodes, "--classes", 16, "--avg-degree", 10, "--feature-dim", dim, *splits]
    steps = {"generate": timed(strata("generate", "sbm", "--out", raw, *gen, "--overwrite", "-q"))}
    partial = store.with_name(store.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # A budget that holds the big graph's edges sorts them in memory instead of spilling runs.
    budget = "16G" if nodes > 1_000_000 else "1G"
    steps["convert"] = timed(strata("convert", raw, "--symmetrize", "--memory", budget, "--out", partial, "-q"))
    shutil.rmtree(raw)
    steps["check"] = timed(strata("check", partial))
    partial.rename(store)
    print(f"{store}: " + ", ".join(f"{k} {v['seconds']:.0f} s" for k, v in steps.items()), file=sys.stderr)
    return store


def medians(epochs: list[dict], keys) -> dict:
    """The median of each of ``keys`` over the epochs after the first (all of one)."""
    later = epochs[1:] or epochs
    return {k: statistics.median(e[k] for e in later) for k in keys}


def cli_run(
    store: Path,
    args,
    data_path: str,
    run_dir: Path,
    step: str = "auto",
    producer: str = "thread",
    window: int | None = None,
) -> dict:
    """`strata gnn train` with G6's settings on ``data_path``, its training step ``step``, the
    device path's ``producer`` and GIDS ``window`` (None: the default); its run.json
    summarised."""
    cmd = strata(
        "gnn", "train", store, "--model", "sage", "--fanouts", ",".join(map(str, FANOUTS)),
        "--batch-size", args.batch_size, "--epochs", args.epochs, "--memory", "2G", "--device", args.device,
        "--hidden", args.hidden,
        "--data-path", data_path, "--step", step, "--producer", producer, "--run-dir", run_dir,
        *([] if window is None else ["--window", window]),
    )  # fmt: skip
    command = " ".join(map(str, cmd[2:]))
    took = timed(cmd, log=run_dir.with_name(run_dir.name + ".log"))
    rec = json.loads((run_dir / "run.json").read_text())
    history = rec["history"]
    for e in history:
        e["pipeline_wait_share"] = e["pipeline"].get("wait_share")
        e["model_idle_share"] = e["pipeline"].get("model_idle_share")
    keys = ["sampled_nodes_per_second", "seeds_per_second", "data_wait_fraction", "seconds"]
    out = medians(history, keys)
    if data_path == "device":
        out.update(medians(history, ["pipeline_wait_share", "model_idle_share"]))
    for i, e in enumerate(history, 1):
        # The device path's busy seconds per stage (sample, lookup), as each run goes.
        busy = ", ".join(f"{k} {v:.2f} s" for k, v in (e["pipeline"].get("busy_seconds") or {}).items())
        idle = e["model_idle_share"]
        print(
            f"g6 {data_path} epoch {i}: {e['seconds']:.2f} s, {e['sampled_nodes_per_second'] / 1e6:.2f}M nodes/s, "
            f"data wait {e['data_wait_fraction']:.3f}"
            + (f", model idle {idle:.3f}" if idle is not None else "")
            + (f"; busy {busy}" if busy else ""),
            file=sys.stderr,
        )
    lines = (line.strip() for line in (took["stdout"] + took["stderr"]).splitlines())
    plan = [line for line in lines if line.startswith("data path:")]
    return {
        **out,
        "data_path": rec["data_path"],
        "data_path_note": rec["data_path_note"],
        "feature_reads": rec["feature_reads"],
        "train_step": rec["train_step"],
        "test_accuracy": (rec.get("test") or {}).get("accuracy"),
        "plan": plan,
        "epochs": [
            {k: e.get(k) for k in (*keys, "pipeline_wait_share", "model_idle_share")}
            | {k: e["pipeline"].get(k) for k in ("tiers", "busy_seconds", "sampler_batches")}
            | {"steps": e.get("step")}
            for e in history
        ],
        "command": command,
    }


def train_loop(batches, step, device, torch, epochs: int, stats=None) -> dict:
    """Trains ``epochs`` epochs over ``batches(epoch)`` (an iterable of ``(batch, sampled
    nodes)``, each batch with ``blocks``, ``x`` and ``y``) by ``step`` (a
    ``strata.gnn.step.TrainStep``); per epoch: seconds, sampled nodes, host wait seconds, loss,
    and how the steps ran; medians after the first epoch."""
    out = []
    for epoch in range(epochs):
        t0, wait, sampled, loss_sum, n = time.perf_counter(), 0.0, 0, 0.0, 0
        it = iter(batches(epoch))
        while True:
            t = time.perf_counter()
            b = next(it, None)
            wait += time.perf_counter() - t
            if b is None:
                break
            batch, count = b
            loss, _ = step(batch)
            # Summed on the device, read once an epoch: a read per batch would stall the host.
            loss_sum, n, sampled = loss_sum + loss.double(), n + 1, sampled + count
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rec = {
            "seconds": seconds,
            "batches": n,
            "sampled_nodes": sampled,
            "sampled_nodes_per_second": sampled / max(seconds, 1e-9),
            "wait_share": wait / max(seconds, 1e-9),
            "loss": float(loss_sum) / max(n, 1),
            "steps": step.take_counts(),
        }
        if stats is not None:
            rec["pipeline"] = stats()
        out.append(rec)
    return {**medians(out, ["seconds", "sampled_nodes_per_second", "wait_share"]), "epochs": out}


def capped(iterable, limit: int | None):
    """The first ``limit`` items of ``iterable`` (all with None), closing it when cut."""
    if limit is None:
        yield from iterable
        return
    it = iter(iterable)
    try:
        for _ in range(limit):
            item = next(it, None)
            if item is None:
                return
            yield item
    finally:
        if hasattr(iterable, "close"):
            iterable.close()


def strata_run(store: Path, device, torch, args, *, device_memory, feature_memory, gds="auto") -> dict:
    """GraphSAGE on the device path of ``store`` (``GnnData`` from Python, as a user's script
    opens it) with ``device_memory`` and ``feature_memory`` bytes of host memory for feature
    rows, all of it for the host tier (``hot_share = 1``: the native dynamic cache does not
    serve the device path), within a host budget ``memory`` of that plus ``HOST_FIXED``."""
    from strata.gnn.loader import GnnData
    from strata.gnn.models import GNN
    from strata.gnn.step import TrainStep, adam

    options = {
        "fanouts": FANOUTS, "batch_size": args.batch_size, "device_memory": device_memory,
        "feature_memory": feature_memory, "memory": feature_memory + HOST_FIXED, "hot_share": 1.0,
    }  # fmt: skip
    t = time.perf_counter()
    data = GnnData(store, device=str(device), data_path="device", gds=gds, **options)
    opened = time.perf_counter() - t
    torch.manual_seed(0)
    model = GNN("sage", data.dim, args.hidden, data.num_classes, layers=len(FANOUTS)).to(device)
    # As `strata gnn train --step auto` trains: CUDA graphs of padded batches on a GPU.
    mode = "graphs" if device.type == "cuda" else "eager"
    step = TrainStep(model, adam(model.parameters(), device, mode, lr=0.003), device, mode)
    train_nodes = data.nodes("train")
    loaders = {}

    def batches(epoch):
        loaders["last"] = data.loader(train_nodes, epoch=epoch)
        return capped(((b, len(b.nodes)) for b in loaders["last"]), args.max_batches)

    res = train_loop(batches, step, device, torch, args.epochs, lambda: loaders["last"].stats())
    budget = data.device_path.budget()
    res.update(
        data_path=data.data_path,
        feature_reads=data.feature_reads,
        plan=data.plan_lines(),
        open_seconds=opened,
        max_batches=args.max_batches,
        device_rows=budget["device_rows"],
        host_rows=budget["host_rows"],
        held_share=(budget["device_rows"] + budget["host_rows"]) / data.num_nodes,
    )
    return res


def pyg_run(store: Path, device, torch, args) -> dict:
    """PyG's NeighborLoader, every feature in host memory, the same fanouts and model."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from strata.gnn.models import GNN, Block
    from strata.gnn.step import TrainStep
    from strata.store import Store

    s = Store(store)
    t = time.perf_counter()
    indptr, indices = (np.asarray(a, dtype=np.int64) for a in s.csc())
    dst = np.repeat(np.arange(s.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([indices, dst]))
    x = torch.from_numpy(np.array(s.features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(s.labels, dtype=np.int64))
    g = Data(x=x, y=y, edge_index=edge_index, num_nodes=s.num_nodes)
    train_nodes = torch.from_numpy(np.asarray(s.array("node_train"), dtype=np.int64))
    loaded = time.perf_counter() - t
    torch.manual_seed(0)
    model = GNN("sage", x.shape[1], args.hidden, int(y.max()) + 1, layers=len(FANOUTS)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    pin = device.type == "cuda"

    def batches(epoch):
        loader = NeighborLoader(
            g, num_neighbors=FANOUTS, batch_size=args.batch_size, input_nodes=train_nodes, shuffle=True,
            pin_memory=pin,
        )  # fmt: skip
        for b in capped(loader, args.max_batches):
            # PyG's hop-by-hop subgraph as the two blocks GNN reads: the whole sampled graph
            # each layer, the seeds' rows at the end (PyG's own SAGE does the same work).
            ei = b.edge_index.to(device, non_blocking=True)
            n, seeds = b.num_nodes, b.batch_size
            blocks = [Block(n, n, ei[0], ei[1]) for _ in FANOUTS[:-1]] + [Block(n, seeds, *_into(ei, seeds))]
            x, y = b.x.to(device, non_blocking=True), b.y[:seeds].to(device, non_blocking=True)
            yield SimpleNamespace(blocks=blocks, x=x, y=y), n

    # PyG's users train eagerly; its blocks are not in hops, which padding needs.
    res = train_loop(batches, TrainStep(model, opt, device, "eager"), device, torch, args.epochs)
    res.update(data_path="pyg", load_seconds=loaded, max_batches=args.max_batches)
    return res


def _into(ei, seeds):
    keep = ei[1] < seeds
    return ei[0][keep], ei[1][keep]


def pyg_or_why(store: Path, device, torch, args) -> dict:
    """:func:`pyg_run`, or why PyG could not run (not installed, no sampler backend)."""
    try:
        return pyg_run(store, device, torch, args)
    except ImportError as e:
        print(f"pyg: skipped ({e})", file=sys.stderr)
        return {"skipped": f"{type(e).__name__}: {e}"}


def csc_and_index_bytes(store: Path) -> int:
    """Device memory for the CSC and the cache's index only (no device-tier row)."""
    from strata.store import Store

    s = Store(store)
    return sum(a.nbytes for a in s.csc()) + s.num_nodes * 8


def figure_g6(store: Path, device, torch, args) -> dict:
    runs = {p: cli_run(store, args, p, args.work / f"run-g6-{p}") for p in ("native", "device")}
    runs["device_eager_step"] = cli_run(store, args, "device", args.work / "run-g6-device-eager", step="eager")
    # G6's rows all sit in device memory, so no read can miss: the GIDS window (8) only holds
    # each epoch's first batch back until nine are sampled, about 8 ms of a 0.15 s epoch on an
    # H200 whose model idled 10 to 21% of it. Without a window a batch is served once sampled.
    runs["device_window_0"] = cli_run(store, args, "device", args.work / "run-g6-device-window0", window=0)
    # No second thread at all: the training loop issues the data path's work between its steps.
    runs["device_inline"] = cli_run(store, args, "device", args.work / "run-g6-device-inline", producer="inline")
    rate = {k: r["sampled_nodes_per_second"] for k, r in runs.items()}
    return {
        "runs": runs,
        "device_over_native_nodes_per_second": rate["device"] / max(rate["native"], 1e-9),
        "step_auto_over_eager_nodes_per_second": rate["device"] / max(rate["device_eager_step"], 1e-9),
        "window_0_over_default_nodes_per_second": rate["device_window_0"] / max(rate["device"], 1e-9),
        "inline_over_thread_nodes_per_second": rate["device_inline"] / max(rate["device"], 1e-9),
    }


def figure_trace(store: Path, device, torch, args) -> dict:
    """G6's device run traced in this process (``device_trace``), each training epoch a marked
    call; the epochs after the first summarised."""
    import device_trace
    from strata.gnn import step
    from strata.gnn import train as gnn_train
    from strata.gnn.device import bounded, cache, pipeline, sampler

    targets = {
        pipeline.DevicePipeline: ["_started", "_finished", "_served", "_batch"],
        bounded.BoundedBatch: ["start", "sizes"],
        sampler.DeviceSampler: ["_finish_bounded"],
        cache.DeviceCache: ["plan", "serve"],
        step.TrainStep: ["__call__"],
        step.Padded: ["load"],
    }
    out = args.out or RESULTS / "gnn-device.json"
    path = out.with_name(out.stem + "-g6-trace.json.gz")
    run_dir = args.work / "run-g6-trace"
    shutil.rmtree(run_dir, ignore_errors=True)
    options = dict(model="sage", fanouts=FANOUTS, batch_size=args.batch_size, epochs=args.epochs, memory="2G")
    options |= dict(device=str(device), hidden=args.hidden, data_path="device", run_dir=run_dir)
    record = {}
    summ = device_trace.traced(
        lambda: record.update(gnn_train.train(store=store, **options)),
        targets,
        (gnn_train, "train_epoch", True),
        path,
        cuda=device.type == "cuda",
    )
    print(device_trace.show("g6 trace", summ), file=sys.stderr)
    history = record["history"]
    run = medians(history, ["seconds", "sampled_nodes_per_second", "data_wait_fraction"])
    return {"runs": {"device path, traced": {**run, "trace": path.name, "epochs": summ["epochs"][1:]}}}


def figure_path(store: Path, device, torch, args) -> dict:
    """G6's device data path without a model: throughput per epoch (the first left out of the
    medians), what a batch costs the host (the first ``COUNTED`` batches of epoch 0) and where its
    time goes (``common.profiled``, the same batches again under torch's profiler)."""
    from strata.device.waits import HostWaits
    from strata.gnn.device.keys import batch_key
    from strata.gnn.loader import GnnData

    t = time.perf_counter()
    data = GnnData(store, device=str(device), data_path="device", fanouts=FANOUTS, batch_size=args.batch_size)
    opened = time.perf_counter() - t
    train = data.nodes("train")
    epochs = []
    for epoch in range(args.epochs):
        loader = data.loader(train, epoch=epoch)
        t, batches, sampled = time.perf_counter(), 0, 0
        for b in capped(loader, args.max_batches):
            batches, sampled = batches + 1, sampled + len(b.nodes)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        epochs.append({
            "seconds": seconds, "batches": batches, "sampled_nodes_per_second": sampled / max(seconds, 1e-9),
            "ms_per_batch": 1e3 * seconds / max(batches, 1), "busy_seconds": loader.stats()["busy_seconds"],
            "wait_share": 0.0,
        })  # fmt: skip
        print(f"path epoch {epoch + 1}: {epochs[-1]['ms_per_batch']:.2f} ms/batch, "
              f"{epochs[-1]['sampled_nodes_per_second'] / 1e6:.2f}M nodes/s", file=sys.stderr)  # fmt: skip
    path = data.device_path
    seeds = np.asarray(train)[: COUNTED * args.batch_size]
    with HostWaits() as waits:
        for i in range(-(-len(seeds) // args.batch_size)):
            part = seeds[i * args.batch_size : (i + 1) * args.batch_size]
            path.sampler.sample(part, batch_key(0, i), on_hop=path.cache.lookup)
    counted = max(-(-len(seeds) // args.batch_size), 1)

    def sample_counted():
        for i in range(counted):
            path.sampler.sample(seeds[i * args.batch_size : (i + 1) * args.batch_size], batch_key(1, i),
                                on_hop=path.cache.lookup)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize()

    profile = profiled(sample_counted, device.type == "cuda", counted)
    per_batch = {
        "ops": waits.ops / counted, "kernels": waits.kernels / counted,
        "host_waits": len(waits.waits) / counted, "reads": len(waits.reads) / counted,
    }  # fmt: skip
    print(f"path per batch: {per_batch}", file=sys.stderr)
    out = medians(epochs, ["seconds", "sampled_nodes_per_second", "ms_per_batch", "wait_share"])
    run = {**out, "epochs": epochs, "open_seconds": opened, "per_batch": per_batch, "profile": profile,
           "sampler_batches": dict(path.sampler.counts)}  # fmt: skip
    return {"runs": {"device path alone": run}}


def figure_reads(store: Path, device, torch, args, nodes: int, dim: int) -> dict:
    """G6's data paths without a model, a quarter of the feature rows in host memory (the hot
    set, ``hot_share = 1``) and the rest read per batch. The device path: each batch's misses
    read alone (``window = 0``) against the default window, whose batches' misses are read
    together. The native path (the CPU's): a read per batch (the accumulator off, as reads
    flushed at GIDS's in-flight target are: one batch's misses pass it), its default (here,
    where the batches share the file's pages and the feature budget is capped, reads merged
    until two batches' rows), and the window's batches merged (``in_flight_target`` past any
    window's misses).
    Epoch seconds, the device path's lookup busy seconds and the disk's rows, requests and
    bytes an epoch (medians of the epochs after the first). On the CPU twin the reads are the
    SSD's as on a GPU machine, so the bytes and requests are the figure; its seconds include
    the twin's sampling."""
    from strata.gnn.loader import GnnData

    quarter = max(nodes * dim * 4 // 4, 1)
    settings = {
        "a read per batch (window 0)": dict(data_path="device", window=0),
        "window 8, misses read together": dict(data_path="device", window=8),
        "native, a read per batch": dict(data_path="native", accumulator=False),
        "native, the default": dict(data_path="native"),
        "native, the window's reads merged": dict(data_path="native", in_flight_target=1 << 40),
    }
    runs = {}
    for name, path in settings.items():
        device_memory = dict(device_memory=0) if path["data_path"] == "device" else {}
        data = GnnData(
            store, device=str(device), fanouts=FANOUTS, batch_size=args.batch_size, feature_memory=quarter,
            memory=quarter + HOST_FIXED, hot_share=1.0, **device_memory, **path,
        )  # fmt: skip
        epochs = []
        for epoch in range(args.epochs):
            loader = data.loader(data.nodes("train"), epoch=epoch)
            t = time.perf_counter()
            sampled = sum(len(b.nodes) for b in capped(loader, args.max_batches))
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            st = loader.stats()
            tiers = st["tiers"]
            epochs.append({
                "seconds": seconds, "sampled_nodes_per_second": sampled / max(seconds, 1e-9),
                "lookup_busy_seconds": st.get("busy_seconds", {}).get("lookup", 0.0),
                **{k: tiers[k] for k in ("rows", "hot_rows", "disk_rows", "disk_requests", "disk_bytes_read")},
            })  # fmt: skip
        keys = ["seconds", "sampled_nodes_per_second", "lookup_busy_seconds", "disk_requests", "disk_bytes_read"]
        run = runs[name] = {**medians(epochs, keys), "wait_share": 0.0, "epochs": epochs, "plan": data.plan_lines()}
        print(f"reads {name}: {run['disk_bytes_read'] / 1e9:.2f} GB, {run['disk_requests']:,.0f} requests, "
              f"{run['seconds']:.2f} s an epoch", file=sys.stderr)  # fmt: skip
    alone, together, per_batch, native, merged = runs.values()
    return {
        "runs": runs,
        "bytes_alone_over_together": alone["disk_bytes_read"] / max(together["disk_bytes_read"], 1),
        "requests_alone_over_together": alone["disk_requests"] / max(together["disk_requests"], 1),
        "native_bytes_per_batch_over_default": per_batch["disk_bytes_read"] / max(native["disk_bytes_read"], 1),
        "native_bytes_default_over_window": native["disk_bytes_read"] / max(merged["disk_bytes_read"], 1),
    }


def figure_quarter_vs_pyg(store: Path, device, torch, args, nodes: int, dim: int) -> dict:
    quarter = max(nodes * dim * 4 // 4, 1)
    runs = {
        "strata device, features 4x host": strata_run(
            store, device, torch, args, device_memory=csc_and_index_bytes(store), feature_memory=quarter
        ),
        "pyg, features in memory": pyg_or_why(store, device, torch, args),
    }
    out = {"runs": runs}
    if "skipped" not in runs["pyg, features in memory"]:
        pyg, ours = runs["pyg, features in memory"], runs["strata device, features 4x host"]
        out["pyg_over_strata_epoch_seconds"] = pyg["seconds"] / max(ours["seconds"], 1e-9)
    return out


def figure_big(store: Path, device, torch, args, nodes: int, dim: int) -> dict:
    features = nodes * dim * 4
    csc_index = csc_and_index_bytes(store)
    quarter = features // 4
    runs = {
        "device, all in memory": strata_run(
            store, device, torch, args, device_memory=features + csc_index + (256 << 20), feature_memory=16 << 20
        ),
        "device, features 4x host": strata_run(
            store, device, torch, args, device_memory=csc_index, feature_memory=quarter
        ),
    }  # fmt: skip
    if runs["device, features 4x host"]["feature_reads"]["path"] == "gds":
        runs["device, features 4x host, engine reads"] = strata_run(
            store, device, torch, args, device_memory=csc_index, feature_memory=quarter, gds="off"
        )
    full = runs["device, all in memory"]["sampled_nodes_per_second"]
    ratios = {
        k: r["sampled_nodes_per_second"] / max(full, 1e-9) for k, r in runs.items() if k != "device, all in memory"
    }
    return {"runs": runs, "throughput_over_all_in_memory": ratios}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="g6,pyg", help=f"figures, comma-separated: {', '.join(FIGURES)}")
    p.add_argument("--prepare", action="store_true", help="only generate, convert and check the stores")
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--max-batches", type=int, default=None, help="batches per epoch of the Python-side runs")
    p.add_argument("--big-nodes", type=int, default=GRAPHS["big"][0])
    p.add_argument("--big-dim", type=int, default=GRAPHS["big"][1])
    p.add_argument("--work", type=Path, default=None, help="where stores and runs are kept (default: a new temp dir)")
    p.add_argument(
        "--tiny", action="store_true", help="every figure at a few thousand nodes, two epochs, hidden 16 (tests)"
    )
    p.add_argument("--out", type=Path, default=None, help="write the result JSON here instead of bench-results/")
    args = p.parse_args()
    only = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = sorted(set(only) - set(FIGURES))
    if unknown:
        p.error(f"--only: unknown figure(s) {unknown}; known: {', '.join(FIGURES)}")
    graphs = dict(GRAPHS, big=(args.big_nodes, args.big_dim))
    if args.tiny:
        graphs, args.epochs, args.batch_size, args.hidden = TINY, 2, 256, 16
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-gnn-device-"))
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KVIKIO_GDS_THRESHOLD", "4096")
    needed = sorted({"big" if f.startswith("big") else "g6" for f in only})
    stores = {g: make_store(args.work, *graphs[g], BIG_SPLITS if g == "big" else ()) for g in needed}
    if args.prepare:
        print(json.dumps({g: str(s) for g, s in stores.items()}))
        return
    import torch

    device = torch.device(args.device)
    result = {"machine": machine(), "device": str(device), "graphs": {g: graphs[g] for g in needed}, "figures": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    for fig in only:
        graph = "big" if fig.startswith("big") else "g6"
        store, (nodes, dim) = stores[graph], graphs[graph]
        if fig == "g6":
            result["figures"][fig] = figure_g6(store, device, torch, args)
        elif fig == "path":
            result["figures"][fig] = figure_path(store, device, torch, args)
        elif fig == "trace":
            result["figures"][fig] = figure_trace(store, device, torch, args)
        elif fig == "pyg":
            result["figures"][fig] = figure_quarter_vs_pyg(store, device, torch, args, nodes, dim)
        elif fig == "reads":
            result["figures"][fig] = figure_reads(store, device, torch, args, nodes, dim)
        elif fig == "big":
            result["figures"][fig] = figure_big(store, device, torch, args, nodes, dim)
        else:
            result["figures"][fig] = {"runs": {"pyg, features in memory": pyg_or_why(store, device, torch, args)}}
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    else:
        save("gnn-device", result)
    print(f"{'figure':8s} {'run':34s} {'epoch s':>9s} {'nodes/s':>12s} {'waited':>7s}")
    for fig, res in result["figures"].items():
        for name, r in res["runs"].items():
            if "skipped" in r:
                print(f"{fig:8s} {name:34s} skipped: {r['skipped']}")
                continue
            wait = r.get("wait_share", r.get("data_wait_fraction"))
            print(f"{fig:8s} {name:34s} {r['seconds']:9.3f} {r['sampled_nodes_per_second']:12,.0f} {100 * wait:6.1f}%")


if __name__ == "__main__":
    main()
