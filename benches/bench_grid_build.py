"""Question: how long from an input edge list to a grid `strata run` can stream,
straight from the input (`strata grid build INPUT --out DIR`) against a store first (`strata
convert`, CSR and CSC built, then `strata grid build STORE`), and how close does each pass come
to the disk's sequential speed?

    python benches/bench_grid_build.py [--scales 22,24] [--rounds 3] [--limit 2G] [--base REV]

Input: Graph500 R-MAT (`strata generate rmat`, bin32 pairs, 16 edges a vertex), under
--data (default /work/bench/gridbuild; scale 22 is 0.5 GB, 24 is 2.1 GB, 26 is 8.6 GB). Each
round runs the cases one after another, alternating their order from round to round:

- `direct`: `strata grid build INPUT --out DIR --num-nodes 2^scale`;
- `store`: `strata convert INPUT --num-nodes 2^scale` then `strata grid build STORE`;
- `base` (with --base REV): REV's `strata grid build STORE` on the same store (a worktree of
  REV built under bench-data/compare, as compare.py builds it), for the grid build before the
  pass rewrite.

Every command runs under `memlimit --limit` (page cache counted) with `--memory` the limit less
256 MiB for the interpreter. Reported per case: median seconds, input-to-grid MB/s (input bytes
over the time), per pass the seconds and MB/s read and written (from the build summary), peak
memory, and the 1-minute load average at the start of each round. The machine is shared:
compare the cases of one run, not runs of different days.

Results: bench-results/grid-build.json and the grid-build section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import MEMLIMIT, machine, median, save, strata, timed, update_doc

INTERPRETER = 256 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def generate(data: Path, scale: int) -> Path:
    raw = data / f"rmat{scale}.bin"
    if not raw.exists():
        subprocess.run(strata("generate", "rmat", "--scale", scale, "--out", raw, "-q"), check=True)
    return raw


def summary_of(run: dict) -> dict:
    """The build's JSON summary (the last JSON object on stdout)."""
    text = run["stdout"]
    return json.loads(text[text.index("{") :])


def direct(raw: Path, work: Path, scale: int, limit: str, memory: int) -> dict:
    out = work / "direct.grid"
    cmd = strata("grid", "build", raw, "--out", out, "--num-nodes", 2**scale, "--memory", memory, "--overwrite",
                 "-q", "--json-summary")  # fmt: skip
    run = timed(cmd, limit)
    s = summary_of(run)
    shutil.rmtree(out)
    return {"seconds": run["seconds"], "peak_bytes": run["peak_bytes"], "stages": s["stages"], "edges": s["num_edges"]}


def via_store(raw: Path, work: Path, scale: int, limit: str, memory: int, python_env: dict | None = None) -> dict:
    """`strata convert` then `strata grid build STORE` (this tree's, or another tree's through
    ``python_env``); the store is kept for the base case and removed by the caller."""
    store = work / "g.strata"
    if store.exists():
        shutil.rmtree(store)
    conv = timed(strata("convert", raw, "--format", "bin32", "--num-nodes", 2**scale, "--out", store,
                        "--memory", memory, "-q"), limit)  # fmt: skip
    build = build_store(store, limit, memory, python_env)
    return {"seconds": conv["seconds"] + build["seconds"], "convert_seconds": conv["seconds"], **build,
            "peak_bytes": max(conv["peak_bytes"] or 0, build["peak_bytes"] or 0)}  # fmt: skip


def build_store(store: Path, limit: str, memory: int, python_env: dict | None = None) -> dict:
    grids = store / "grids"
    if grids.exists():
        shutil.rmtree(grids)
    run = timed(strata("grid", "build", store, "--memory", memory, "-q", "--json-summary"), limit, env=python_env)
    s = summary_of(run)
    return {"build_seconds": run["seconds"], "stages": s.get("stages", []), "build_peak_bytes": run["peak_bytes"]}


def base_env(rev: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare import checkout

    tree = checkout(rev)
    return {**os.environ, "PYTHONPATH": str(tree / "python")}


def rates(stages: list[dict]) -> str:
    return "; ".join(
        f"{st['name']} {st['seconds']:.1f} s, CPU {st.get('cpu_seconds', float('nan')):.1f} s "
        f"({st['read_bytes'] / st['seconds'] / 1e6:.0f} MB/s in, "
        f"{st['written_bytes'] / st['seconds'] / 1e6:.0f} MB/s out)"
        for st in stages
        if st["seconds"] > 0
    )


def table(results: dict) -> str:
    lines = [
        "| scale | case | seconds (median) | rounds | input MB/s | passes (median round) | peak MiB | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scale, r in results.items():
        for case, runs in r["cases"].items():
            secs = [x["seconds"] for x in runs]
            mid = sorted(runs, key=lambda x: x["seconds"])[len(runs) // 2]
            detail = rates(mid.get("stages", []))
            if "convert_seconds" in mid:
                detail = f"convert {mid['convert_seconds']:.1f} s, build {mid['build_seconds']:.1f} s: " + detail
            peak = max((x["peak_bytes"] or 0) for x in runs) / 2**20
            lines.append(
                f"| {scale} | {case} | {median(secs):.1f} | {', '.join(f'{s:.1f}' for s in secs)} | "
                f"{r['input_bytes'] / median(secs) / 1e6:.0f} | {detail} | {peak:.0f} | "
                f"{', '.join(f'{x:.1f}' for x in r['loads'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", default="22,24")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limit", default="2G", help="memlimit of every command (page cache counted)")
    p.add_argument("--data", type=Path, default=Path("/work/bench/gridbuild"))
    p.add_argument("--base", help="a commit whose `strata grid build STORE` runs beside (main before the rewrite)")
    p.add_argument("--cases", default="direct,store", help="comma-separated: direct, store (base with --base)")
    p.add_argument("--keep", action="store_true", help="keep the generated inputs")
    a = p.parse_args()
    if not MEMLIMIT.exists():
        raise SystemExit(f"{MEMLIMIT} is missing: every figure here is taken under memlimit")
    memory = parse_size(a.limit) - INTERPRETER
    cases = a.cases.split(",") + (["base"] if a.base else [])
    env = base_env(a.base) if a.base else None
    a.data.mkdir(parents=True, exist_ok=True)
    results = {}
    for scale in (int(s) for s in a.scales.split(",")):
        raw = generate(a.data, scale)
        work = a.data / f"work{scale}"
        work.mkdir(exist_ok=True)
        res = {"input_bytes": raw.stat().st_size, "cases": {c: [] for c in cases}, "loads": []}
        for k in range(a.rounds):
            res["loads"].append(os.getloadavg()[0])
            order = cases if k % 2 == 0 else cases[::-1]
            for case in order:
                if case == "direct":
                    got = direct(raw, work, scale, a.limit, memory)
                elif case == "store":
                    got = via_store(raw, work, scale, a.limit, memory)
                else:
                    if not (work / "g.strata" / "manifest.json").exists():
                        via_store(raw, work, scale, a.limit, memory)
                    got = build_store(work / "g.strata", a.limit, memory, env)
                    got = {**got, "seconds": got["build_seconds"], "peak_bytes": got["build_peak_bytes"]}
                got["load"] = os.getloadavg()[0]
                res["cases"][case].append(got)
                print(f"scale {scale} round {k + 1} {case}: {got['seconds']:.1f} s, load {got['load']:.1f}", flush=True)
        shutil.rmtree(work)
        if not a.keep:
            raw.unlink()
        results[scale] = res
    command = " ".join(["python", "benches/bench_grid_build.py", *sys.argv[1:]])
    save("grid-build", {"machine": machine(), "command": command, "limit": a.limit, "results": results})
    update_doc(
        "grid-build",
        f"### Input to grid (`{command}`; memlimit {a.limit}, the 1-minute load in the last column)\n\n"
        f"{table(results)}",
    )
    print(table(results))


if __name__ == "__main__":
    main()
