"""The demo behind ``make demo``: Strata's main jobs on generated data, each step printed with
the equivalent command line so a newcomer can repeat it by hand."""

from __future__ import annotations

import time
from pathlib import Path

from .config import ConvertConfig, EmbedTrainConfig, KgConfig, RmatConfig, Size
from .convert import convert, format_summary
from .embed import format_metrics, train
from .embed import format_summary as format_embed_summary
from .generate import format_summary as format_generated
from .generate import generate
from .info import describe, render
from .io import bench_disk, format_profile, load_profile, save_profile
from .progress import ProgressBar
from .store import Store


def _step(n: int, title: str, command: str) -> None:
    print(f"\n== {n}. {title}\n   $ {command}", flush=True)


def _embed_demo(workdir: Path, bar: ProgressBar) -> None:
    """Steps 1-6: a knowledge graph trained out of core, evaluated, queried."""
    kg_raw, kg_store = workdir / "kg-raw", workdir / "kg.strata"
    _step(
        1,
        "Generate a knowledge graph with planted structure (100,000 entities, 40 relations, 2M triples)",
        f"strata generate kg --out {kg_raw} --entities 100000 --relations 40 --triples 2000000",
    )
    g = generate(KgConfig(out=kg_raw, entities=100_000, relations=40, triples=2_000_000, overwrite=True), bar)
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

    _step(3, "Describe the store, and what fits in 128 MiB", f"strata info {kg_store} --memory 128M")
    print(render(describe(Store(kg_store), memory=128 << 20, dim=128), 128 << 20))

    _step(
        4,
        "Measure the disk the run will live on, for the prefetch check (Legend's Theorem 3)",
        f"strata bench-disk --dir {workdir} --size 64M --queue-depths 1,16,128 --seconds 0.5",
    )
    profile = load_profile(workdir)
    if profile is not None:
        measured = time.strftime("%Y-%m-%d %H:%M", time.localtime(profile["measured_at"]))
        print(f"   A profile of this disk is already saved (measured {measured}); using it.")
    else:
        profile = bench_disk(
            {
                "dir": str(workdir),
                "size": 64 << 20,
                "file": None,
                "queue_depths": [1, 16, 128],
                "seconds": 0.5,
                "seq_depth": 16,
                "keep": False,
            },
            "auto",
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
        memory=Size(128 << 20),
        eval_max_queries=2000,
    )
    _step(
        5,
        "Train ComplEx embeddings out of core: the 98 MiB table (embeddings + Adagrad state) gets a "
        "128 MiB budget in all, so it is split into partitions on disk and 3 are resident at a time",
        f"strata embed train {kg_store} --dim 128 --negatives 256 --epochs 2 --memory 128M --eval-max-queries 2000",
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


def run_demo(workdir: Path, quiet: bool = False) -> int:
    """Trains knowledge-graph embeddings out of core, then converts and describes an RMAT graph; returns 0."""
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    bar = ProgressBar(enabled=not quiet)

    _embed_demo(workdir, bar)

    rmat_raw, rmat_store = workdir / "rmat-s18.bin", workdir / "rmat-s18.strata"
    _step(
        8,
        "Generate a Graph500 RMAT graph (2^18 vertices, 4.2M edges) as int32 pairs",
        f"strata generate rmat --scale 18 --edge-factor 16 --out {rmat_raw}",
    )
    g = generate(RmatConfig(out=rmat_raw, scale=18, edge_factor=16, overwrite=True), bar)
    bar.close()
    print(format_generated(g))

    _step(
        9,
        "Convert it under a 24 MiB budget: CSR/CSC are built from bucket files on disk",
        f"strata convert {rmat_raw} --out {rmat_store} --num-nodes {1 << 18} --memory 24M --split 0.98,0.01,0.01",
    )
    s = convert(
        ConvertConfig(
            inputs=[rmat_raw],
            out=rmat_store,
            num_nodes=1 << 18,
            memory=Size(24 << 20),
            split=(0.98, 0.01, 0.01),
            overwrite=True,
        ),
        bar,
    )
    bar.close()
    print(format_summary(s))
    for line in s["plan"]:
        print(f"   plan: {line}")

    _step(10, "Describe it", f"strata info {rmat_store} --memory 64M")
    print(render(describe(Store(rmat_store), memory=64 << 20, dim=128), 64 << 20))

    print(f"\nDemo finished in {time.monotonic() - t0:.1f} s; outputs are in {workdir}/.")
    return 0
