"""The demo behind ``make demo``: Strata's main jobs on generated data, each step printed with
the equivalent command line so a newcomer can repeat it by hand."""

from __future__ import annotations

import time
from pathlib import Path

from .config import ConvertConfig, KgConfig, RmatConfig, Size
from .convert import convert, format_summary
from .generate import format_summary as format_generated
from .generate import generate
from .info import describe, render
from .io import bench_disk, format_profile
from .progress import ProgressBar
from .store import Store


def _step(n: int, title: str, command: str) -> None:
    print(f"\n== {n}. {title}\n   $ {command}", flush=True)


def run_demo(workdir: Path, quiet: bool = False) -> int:
    """Generates, converts and describes two graphs under small budgets; returns 0."""
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    bar = ProgressBar(enabled=not quiet)

    kg_raw, kg_store = workdir / "kg-raw", workdir / "kg.strata"
    _step(
        1,
        "Generate a knowledge graph with planted structure (5,000 entities, 120,000 triples)",
        f"strata generate kg --out {kg_raw} --entities 5000 --relations 40 --triples 120000",
    )
    g = generate(KgConfig(out=kg_raw, entities=5000, relations=40, triples=120000, overwrite=True), bar)
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

    _step(3, "Describe the store, and what fits in 256 MiB", f"strata info {kg_store} --memory 256M")
    print(render(describe(Store(kg_store), memory=256 << 20, dim=128), 256 << 20))

    rmat_raw, rmat_store = workdir / "rmat-s18.bin", workdir / "rmat-s18.strata"
    _step(
        4,
        "Generate a Graph500 RMAT graph (2^18 vertices, 4.2M edges) as int32 pairs",
        f"strata generate rmat --scale 18 --edge-factor 16 --out {rmat_raw}",
    )
    g = generate(RmatConfig(out=rmat_raw, scale=18, edge_factor=16, overwrite=True), bar)
    bar.close()
    print(format_generated(g))

    _step(
        5,
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

    _step(6, "Describe it", f"strata info {rmat_store} --memory 64M")
    print(render(describe(Store(rmat_store), memory=64 << 20, dim=128), 64 << 20))

    _step(
        7,
        "Measure the disk the stores live on (a small, quick run of the device benchmark)",
        f"strata bench-disk --dir {workdir} --size 64M --queue-depths 1,16,128 --seconds 0.5 --no-save",
    )
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

    print(f"\nDemo finished in {time.monotonic() - t0:.1f} s; outputs are in {workdir}/.")
    return 0
