"""Question: how fast does `strata convert` stream a large edge list within a small memory
budget (under a 2 GiB memlimit that also caps the page cache), and how fast does it convert
FB15k-237? And how does a Parquet edge table compare with the same edges as TSV?

    python benches/bench_convert.py [--scale 25] [--formats bin32,tsv] [--limit 2G] [--memory 1536M]
    python benches/bench_convert.py --parquet-scale 20 [--runs 3]   # Parquet vs TSV only

RMAT scale 25, edge factor 16 is 536,870,912 edges (4.3 GB as int32 pairs, 9.4 GB as TSV).
Results go to bench-results/convert.json and the `convert` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from common import REPO, SHARED, disk_free, machine, median, memlimit_available, save, strata, timed, update_doc


def rmat_rows(args, work: Path, limit: str | None) -> list[dict]:
    rows = []
    for fmt in args.formats.split(","):
        raw = work / f"rmat-s{args.scale}.{fmt}"
        gen = timed(
            strata(
                "generate",
                "rmat",
                "--scale",
                args.scale,
                "--edge-factor",
                args.edge_factor,
                "--format",
                fmt,
                "--out",
                raw,
                "--overwrite",
                "-q",
                "--json-summary",
            )
        )
        edges = json.loads(gen["stdout"])["num_edges"]
        out = work / f"rmat-s{args.scale}-{fmt}.strata"
        extra = ["--ids", "int"] if fmt == "tsv" else []
        run = timed(
            strata(
                "convert",
                raw,
                "--out",
                out,
                "--num-nodes",
                1 << args.scale,
                "--memory",
                args.memory,
                "--overwrite",
                "-q",
                "--json-summary",
                *extra,
            ),
            limit,
        )
        summary = json.loads(run["stdout"])
        rows.append(
            {
                "input": f"RMAT scale {args.scale} x {args.edge_factor} ({fmt})",
                "edges": edges,
                "input_bytes": raw.stat().st_size,
                "seconds": run["seconds"],
                "peak_bytes": run["peak_bytes"],
                "input_mb_s": raw.stat().st_size / run["seconds"] / 1e6,
                "edges_per_s": edges / run["seconds"],
                "store_bytes": summary["store_bytes"],
                "stages": summary["stages"],
                "plan": summary["plan"],
                "generate_seconds": gen["seconds"],
            }
        )
        raw.unlink()
        shutil.rmtree(out)
    return rows


def fb15k_row(work: Path, runs: int) -> dict | None:
    src = SHARED / "datasets" / "fb15k-237"
    if not src.is_dir():
        return None
    times = []
    for _ in range(runs):
        out = work / "fb.strata"
        r = timed(strata("convert", src, "--relations", "--out", out, "--overwrite", "-q", "--json-summary"))
        times.append(r["seconds"])
        summary = json.loads(r["stdout"])
    return {
        "input": "FB15k-237 (TSV, string ids, 3 split files)",
        "edges": sum(summary["num_edges"].values()),
        "input_bytes": summary["input_bytes"],
        "seconds": median(times),
        "runs": times,
        "native_seconds": summary["seconds"],
        "store_bytes": summary["store_bytes"],
    }


def parquet_rows(args, work: Path, limit: str | None) -> list[dict]:
    """The same RMAT edges as TSV and as Parquet (int64 columns src, dst), converted in
    alternation ``args.runs`` times each; medians."""
    import pyarrow.csv
    import pyarrow.parquet

    tsv = work / "rmat.tsv"
    timed(strata("generate", "rmat", "--scale", args.parquet_scale, "--edge-factor", args.edge_factor,
                 "--format", "tsv", "--out", tsv, "--overwrite", "-q"))  # fmt: skip
    table = pyarrow.csv.open_csv(
        tsv,
        read_options=pyarrow.csv.ReadOptions(column_names=["src", "dst"]),
        parse_options=pyarrow.csv.ParseOptions(delimiter="\t"),
    )
    pq = work / "rmat.parquet"
    with pyarrow.parquet.ParquetWriter(pq, table.schema) as writer:
        for batch in table:
            writer.write_batch(batch)
    inputs = {"TSV": (tsv, ["--ids", "int"]), "Parquet": (pq, [])}
    times: dict[str, list[float]] = {name: [] for name in inputs}
    peaks: dict[str, list[int]] = {name: [] for name in inputs}
    for _ in range(args.runs):
        for name, (path, extra) in inputs.items():
            run = timed(
                strata("convert", path, "--out", work / "g.strata", "--num-nodes", 1 << args.parquet_scale,
                       "--memory", args.memory, "--overwrite", "-q", "--json-summary", *extra),
                limit,
            )  # fmt: skip
            times[name].append(run["seconds"])
            peaks[name].append(run["peak_bytes"] or 0)
            edges = sum(json.loads(run["stdout"])["num_edges"].values())
    return [
        {
            "input": f"RMAT scale {args.parquet_scale} x {args.edge_factor} ({name})",
            "edges": edges,
            "input_bytes": path.stat().st_size,
            "seconds": median(times[name]),
            "runs": times[name],
            "peak_bytes": max(peaks[name]),
        }
        for name, (path, _) in inputs.items()
    ]


def parquet_doc(args, rows: list[dict], limit: str | None) -> str:
    m = machine()
    load = os.getloadavg()[0]
    tsv, parquet = rows
    lines = [
        "## Conversion: Parquet vs TSV (`benches/bench_convert.py --parquet-scale`)",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), load average {load:.1f} at the end (other "
        f"jobs were running: read the ratio, not the absolute times). Command: `python benches/bench_convert.py "
        f"--parquet-scale {args.parquet_scale} --runs {args.runs} --memory {args.memory} --limit {args.limit}`; "
        "each conversion runs as `memlimit "
        f"{limit or '(unavailable)'} strata convert ... --memory {args.memory}`, TSV and Parquet in alternation, "
        "median of the runs. Parquet is staged as CSV one record batch at a time, then read by the text converter "
        '(docs/convert.md, "Parquet inputs").',
        "",
        "| input | edges | input size | wall time (median) | runs | peak memory (cgroup) | edges/s |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        runs = ", ".join(f"{t:.1f}" for t in r["runs"])
        peak = f"{r['peak_bytes'] / 2**20:.0f} MiB" if r["peak_bytes"] else "n/a"
        lines.append(
            f"| {r['input']} | {r['edges']:,} | {r['input_bytes'] / 1e6:.0f} MB | {r['seconds']:.1f} s | {runs} | "
            f"{peak} | {r['edges'] / r['seconds'] / 1e6:.2f}M |"
        )
    lines += ["", f"Parquet / TSV wall time: {parquet['seconds'] / tsv['seconds']:.2f}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=25)
    ap.add_argument("--edge-factor", type=int, default=16)
    ap.add_argument("--formats", default="bin32,tsv")
    ap.add_argument("--limit", default="2G", help="memlimit for the RMAT conversions")
    ap.add_argument("--memory", default="1536M", help="strata's --memory inside the limit")
    ap.add_argument("--fb-runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data")
    ap.add_argument("--parquet-scale", type=int, help="only compare Parquet with TSV, on RMAT of this scale")
    ap.add_argument("--runs", type=int, default=3, help="conversions of each input for --parquet-scale")
    args = ap.parse_args()
    args.dir.mkdir(exist_ok=True)
    if args.parquet_scale:
        limit = args.limit if memlimit_available() else None
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            rows = parquet_rows(args, Path(tmp), limit)
        save("convert-parquet", {"machine": machine(), "memlimit": limit, "memory": args.memory, "rows": rows})
        doc = parquet_doc(args, rows, limit)
        update_doc("convert-parquet", doc)
        print(doc)
        return
    need = (1 << args.scale) * args.edge_factor * 8 * 5
    if disk_free(args.dir) < need:
        raise SystemExit(f"need about {need / 1e9:.0f} GB free in {args.dir}")
    limit = args.limit if memlimit_available() else None
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        rows = rmat_rows(args, work, limit)
        fb = fb15k_row(work, args.fb_runs)
    result = {"machine": machine(), "memlimit": limit, "memory": args.memory, "rmat": rows, "fb15k237": fb}
    save("convert", result)
    m = result["machine"]
    lines = [
        "## Conversion (`benches/bench_convert.py`)",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, Linux {m['kernel']}. "
        f"Command: `python benches/bench_convert.py --scale {args.scale} --formats {args.formats}`; each RMAT "
        f"conversion runs as `memlimit {limit or '(unavailable)'} strata convert ... --memory {args.memory}` "
        "(memlimit caps anonymous memory and page cache together).",
        "",
        "| input | edges | input size | wall time | peak memory (cgroup) | input MB/s | edges/s | store size |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peak = f"{r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] else "n/a"
        lines.append(
            f"| {r['input']} | {r['edges']:,} | {r['input_bytes'] / 1e9:.2f} GB | {r['seconds']:.1f} s | "
            f"{peak} | {r['input_mb_s']:.0f} | {r['edges_per_s'] / 1e6:.1f}M | "
            f"{r['store_bytes'] / 1e9:.2f} GB |"
        )
    if fb:
        lines.append(
            f"| {fb['input']} | {fb['edges']:,} | {fb['input_bytes'] / 1e6:.1f} MB | "
            f"{fb['seconds']:.2f} s (median of {len(fb['runs'])}; {fb['native_seconds']:.2f} s in the "
            f"converter) | - | {fb['input_bytes'] / fb['seconds'] / 1e6:.0f} | "
            f"{fb['edges'] / fb['seconds'] / 1e6:.2f}M | {fb['store_bytes'] / 1e6:.1f} MB |"
        )
    lines.append("")
    for r in rows:
        stages = ", ".join(f"{s['name']} {s['seconds']:.1f} s" for s in r["stages"])
        lines.append(f"- {r['input']}: stages {stages}. Plan: " + "; ".join(r["plan"]) + ".")
    update_doc("convert", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
