"""The demo behind ``make demo``: Strata's main jobs on generated data, each step printed with
the equivalent command line so a newcomer can repeat it by hand."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import (
    ConvertConfig,
    EmbedTrainConfig,
    GnnTrainConfig,
    GridBuildConfig,
    KgConfig,
    RmatConfig,
    RunConfig,
    SbmConfig,
    Size,
)
from .convert import convert, format_summary
from .embed import format_metrics, train
from .embed import format_summary as format_embed_summary
from .errors import MissingDependencyError
from .generate import format_summary as format_generated
from .generate import generate
from .grid import build_grid, format_build
from .grid import format_summary as format_run_summary
from .grid import run as run_grid
from .info import describe, render
from .io import bench_disk, format_profile, load_profile, save_profile
from .paths import make_dir
from .progress import ProgressBar
from .store import Store
from .units import fmt_bytes


@dataclass(frozen=True)
class DemoSize:
    """The graphs the demo generates and the budgets it gives them. Each budget is smaller than
    its data, so every step runs out of core at either size."""

    entities: int
    triples: int
    #: The embedding run's whole budget, MiB (its table is ``entities`` x 128 x 2 float32).
    embed_mib: int
    sbm_nodes: int
    #: The GNN's feature tiers, MiB (its features are ``sbm_nodes`` x 128 float32).
    feature_mib: int
    #: The RMAT graph converted under ``convert_mib`` MiB, and the smaller one PageRank runs on.
    rmat_scale: int
    convert_mib: int
    grid_scale: int
    #: The disk benchmark's file, MiB: the profile the demo saves is the one later runs plan with,
    #: and a file under 1 GiB may be served by a cache below the file system (its profile says so).
    disk_mib: int


#: What ``make demo`` runs (about a minute on two cores).
FULL = DemoSize(100_000, 2_000_000, 128, 600_000, 64, 18, 24, 16, 1024)
#: ``strata demo --small``: every step on graphs an eighth to a quarter the size, each budget still
#: below its data (the test suite's run).
SMALL = DemoSize(25_000, 250_000, 104, 100_000, 16, 16, 16, 14, 64)


def _step(n: int, title: str, command: str) -> None:
    print(f"\n== {n}. {title}\n   $ {command}", flush=True)


def _embed_demo(workdir: Path, size: DemoSize, bar: ProgressBar) -> None:
    """Steps 1-6: a knowledge graph trained out of core, evaluated, queried."""
    kg_raw, kg_store = workdir / "kg-raw", workdir / "kg.strata"
    _step(
        1,
        f"Generate a knowledge graph with planted structure ({size.entities:,} entities, 40 relations, "
        f"{size.triples:,} triples)",
        f"strata generate kg --out {kg_raw} --entities {size.entities} --relations 40 --triples {size.triples}",
    )
    g = generate(KgConfig(out=kg_raw, entities=size.entities, relations=40, triples=size.triples, overwrite=True), bar)
    bar.close()
    print(format_generated(g))

    _step(
        2,
        "Convert it into a store, streaming within a 64 MiB budget",
        f"strata convert {kg_raw} --relations --out {kg_store} --memory 64M",
    )
    s = convert(
        ConvertConfig(inputs=[kg_raw], out=kg_store, relations=True, memory=Size(64 << 20), overwrite=True), bar
    )
    bar.close()
    print(format_summary(s))

    mib = size.embed_mib
    _step(3, f"Describe the store, and each engine's plan for {mib} MiB", f"strata info {kg_store} --memory {mib}M")
    print(render(describe(Store(kg_store), memory=mib << 20)))

    _step(
        4,
        "Measure the disk the run will live on, for the prefetch check (Legend's Theorem 3)",
        f"strata bench-disk --dir {workdir} --size {size.disk_mib}M --queue-depths 1,16,128 --seconds 0.5",
    )
    profile = load_profile(workdir)
    if profile is not None:
        measured = time.strftime("%Y-%m-%d %H:%M", time.localtime(profile["measured_at"]))
        print(f"   A profile of this disk is already saved (measured {measured}); using it.")
    else:
        profile = bench_disk(
            {
                "dir": str(workdir),
                "size": size.disk_mib << 20,
                "queue_depths": [1, 16, 128],
                "seconds": 0.5,
                "seq_depth": 16,
            },
            bar,
        )
        bar.close()
        print(format_profile(profile))
        print(f"   saved to {save_profile(profile)}")

    cfg = EmbedTrainConfig(
        store=kg_store,
        fresh=True,
        model="complex",
        dim=128,
        negatives=256,
        epochs=2,
        memory=Size(mib << 20),
        eval_max_queries=2000,
    )
    table = fmt_bytes(size.entities * 128 * 2 * 4)
    _step(
        5,
        f"Train ComplEx embeddings out of core: the {table} table (embeddings + Adagrad state) gets a "
        f"{mib} MiB budget in all, so it is split into partitions on disk, a few resident at a time",
        f"strata embed train {kg_store} --dim 128 --negatives 256 --epochs 2 --memory {mib}M --eval-max-queries 2000",
    )
    run = train(cfg, bar)
    bar.close()
    print(format_embed_summary(run))

    _step(6, "Evaluate the best checkpoint on test triples", f"strata embed eval {kg_store} --max-queries 5000")
    result = run.evaluate("test", max_queries=5000, progress=bar)
    bar.close()
    print(f"   {format_metrics(result['metrics'])}")

    head, relation, tail = (kg_raw / "test.txt").read_text().split("\n", 1)[0].split("\t")
    _step(
        7,
        f"Predict tails of the first test triple ({head}, {relation}, ?), leaving out known triples; "
        f"the held-out answer is {tail}",
        f"strata embed predict {kg_store} --head {head} --relation {relation} --top 5 --exclude-known",
    )
    answers = run.predict(head=head, relation=relation, top=5, exclude_known=True, progress=bar)["predictions"]
    bar.close()
    for rank, a in enumerate(answers, 1):
        note = "  <- the held-out answer" if a["name"] == tail else ("  (a training triple)" if a["known"] else "")
        print(f"   {rank}. {a['name']:<8} score {a['score']:8.3f}{note}")


def _gnn_demo(workdir: Path, size: DemoSize, bar: ProgressBar) -> None:
    """Steps 8-9: a labelled graph whose features exceed the budget, a few epochs of GraphSAGE."""
    raw, store = workdir / "sbm-raw", workdir / "sbm.strata"
    _step(
        8,
        f"Generate a labelled graph with planted communities and 128-dim features ({size.sbm_nodes:,} nodes, "
        f"{fmt_bytes(size.sbm_nodes * 128 * 4)} of features)",
        f"strata generate sbm --out {raw} --nodes {size.sbm_nodes} --avg-degree 10 --train-fraction 0.02 "
        "--valid-fraction 0.01 --test-fraction 0.02",
    )
    g = generate(
        SbmConfig(
            out=raw,
            nodes=size.sbm_nodes,
            avg_degree=10.0,
            train_fraction=0.02,
            valid_fraction=0.01,
            test_fraction=0.02,
            overwrite=True,
        ),
        bar,
    )
    bar.close()
    print(format_generated(g))
    s = convert(ConvertConfig(inputs=[raw], out=store, symmetrize=True, memory=Size(256 << 20), overwrite=True), bar)
    bar.close()
    print(format_summary(s))

    _step(
        9,
        f"Train GraphSAGE within 1 GiB in all (torch's runtime, measured at start, included) and "
        f"{size.feature_mib} MiB for the feature tiers: the features stay on disk, served through a hot set, a "
        "window-pinned cache and merged direct reads",
        f"strata gnn train {store} --fanouts 10,5 --batch-size 256 --epochs 2 --hidden 64 --memory 1G "
        f"--feature-memory {size.feature_mib}M",
    )
    try:
        from .gnn.train import format_summary as format_gnn_summary
        from .gnn.train import train as train_gnn

        record = train_gnn(
            GnnTrainConfig(
                store=store,
                fanouts=[10, 5],
                batch_size=256,
                epochs=2,
                hidden=64,
                feature_memory=Size(size.feature_mib << 20),
                device="cpu",
            ),
            bar,
        )
    except MissingDependencyError as e:
        print(f"   skipped: {e}")
        return
    bar.close()
    print(format_gnn_summary(record))
    last = record["history"][-1]
    tiers = last["pipeline"]["tiers"]
    print(
        f"   loader: {last['seeds_per_second']:,.0f} seeds/s, {last['sampled_nodes_per_second']:,.0f} sampled "
        f"nodes/s; rows from the hot set {100 * tiers['hot_rows'] / tiers['rows']:.0f}%, cache "
        f"{100 * tiers['cache_rows'] / tiers['rows']:.0f}%, disk {100 * tiers['disk_rows'] / tiers['rows']:.0f}% "
        f"({fmt_bytes(tiers['disk_bytes_read'])} read); the model waited for data "
        f"{100 * last['data_wait_fraction']:.0f}% of the epoch"
    )


def _grid_demo(workdir: Path, scale: int, bar: ProgressBar) -> None:
    """Steps 13-15: PageRank over an RMAT graph whose edge blocks stream from disk every iteration."""
    raw, store = workdir / f"rmat-s{scale}.bin", workdir / f"rmat-s{scale}.strata"
    _step(
        13,
        f"Generate a smaller RMAT graph (2^{scale} vertices, {16 << scale:,} edges) and convert it, all edges for "
        "training",
        f"strata generate rmat --scale {scale} --edge-factor 16 --out {raw} && "
        f"strata convert {raw} --out {store} --num-nodes {1 << scale} --memory 64M",
    )
    g = generate(RmatConfig(out=raw, scale=scale, edge_factor=16, overwrite=True), bar)
    bar.close()
    print(format_generated(g))
    s = convert(
        ConvertConfig(inputs=[raw], out=store, num_nodes=1 << scale, memory=Size(64 << 20), overwrite=True), bar
    )
    bar.close()
    print(format_summary(s))

    _step(
        14,
        "Lay its edges out as an 8 x 8 grid of blocks (vertex chunk of the source x chunk of the destination)",
        f"strata grid build {store} --partitions 8 --memory 96M",
    )
    b = build_grid(GridBuildConfig(store=store, partitions=8, memory=Size(96 << 20), overwrite=True), bar)
    bar.close()
    print(format_build(b))

    _step(
        15,
        "PageRank in a 96 MiB budget (64 MiB of it the runtime's reserve), streaming the edge blocks from disk "
        "every iteration instead of keeping them resident; the plan and one line per iteration go to stderr",
        f"strata run pagerank {store} --iterations 10 --memory 96M --no-keep-resident",
    )
    summary = run_grid(
        RunConfig(algorithm="pagerank", store=store, iterations=10, memory=Size(96 << 20), keep_resident=False), bar
    )
    bar.close()
    print(format_run_summary(summary))
    rank = np.load(Path(summary["out"]) / "rank.npy")
    in_degree = np.load(Path(summary["grid"]) / "in_degree.npy")
    top = np.argsort(-rank, kind="stable")[:5]
    print("   top 5 vertices by PageRank (RMAT gives a few hubs most of the in-edges):")
    for i, v in enumerate(top, 1):
        print(f"   {i}. vertex {v:<6} rank {rank[v]:.5f}  in-degree {in_degree[v]:,}")


def run_demo(workdir: Path, quiet: bool = False, size: DemoSize = FULL) -> int:
    """Trains KG embeddings out of core and a GNN with features on disk, converts and describes an RMAT
    graph, then runs PageRank over a grid streamed from disk, at ``size``; returns 0."""
    make_dir(workdir, "--dir")
    t0 = time.monotonic()
    bar = ProgressBar(enabled=not quiet)

    _embed_demo(workdir, size, bar)
    _gnn_demo(workdir, size, bar)

    scale, cmib = size.rmat_scale, size.convert_mib
    rmat_raw, rmat_store = workdir / f"rmat-s{scale}.bin", workdir / f"rmat-s{scale}.strata"
    _step(
        10,
        f"Generate a Graph500 RMAT graph (2^{scale} vertices, {16 << scale:,} edges) as int32 pairs",
        f"strata generate rmat --scale {scale} --edge-factor 16 --out {rmat_raw}",
    )
    g = generate(RmatConfig(out=rmat_raw, scale=scale, edge_factor=16, overwrite=True), bar)
    bar.close()
    print(format_generated(g))

    _step(
        11,
        f"Convert it under a {cmib} MiB budget: CSR/CSC are built from bucket files on disk",
        f"strata convert {rmat_raw} --out {rmat_store} --num-nodes {1 << scale} --memory {cmib}M "
        "--split 0.98,0.01,0.01",
    )
    s = convert(
        ConvertConfig(
            inputs=[rmat_raw],
            out=rmat_store,
            num_nodes=1 << scale,
            memory=Size(cmib << 20),
            split=(0.98, 0.01, 0.01),
            overwrite=True,
        ),
        bar,
    )
    bar.close()
    print(format_summary(s))
    for line in s["plan"]:
        print(f"   plan: {line}")

    _step(12, "Describe it", f"strata info {rmat_store} --memory 64M")
    print(render(describe(Store(rmat_store), memory=64 << 20)))

    _grid_demo(workdir, size.grid_scale, bar)

    print(f"\nDemo finished in {time.monotonic() - t0:.1f} s; outputs are in {workdir}/.")
    return 0
