"""Question: what does a store's content digest cost (docs/formats.md, "Content digest")? A
distributed run computes it once for a store that has none (written before digests existed,
or copied); converters pay it at conversion.

    python benches/bench_digest.py [--scale 20] [--runs 3]

Generates an RMAT graph (edge factor 16), converts it, and times hashing the store from its
files (the kept digest removed before each run) in MB/s of array and manifest bytes, median of
``--runs``. Results go to bench-results/digest.json and the `digest` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from common import machine, median, save, strata, timed, update_doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from strata import _native

    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        work = Path(tmp)
        timed(
            strata("generate", "rmat", "--scale", args.scale, "--format", "bin32", "--out", work / "rmat.bin32", "-q")
        )
        store = work / "rmat.strata"
        timed(strata("convert", work / "rmat.bin32", "--out", store, "-q"))
        hashed = sum(f.stat().st_size - 4096 for f in store.glob("*.npy")) + (store / "manifest.json").stat().st_size
        seconds, cpu = [], []
        for _ in range(args.runs):
            (store / "digest.json").unlink(missing_ok=True)
            t, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
            _native.content_digest(str(store))
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            seconds.append(time.monotonic() - t)
            cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    rate = hashed / median(seconds) / 1e6
    cpu_rate = hashed / max(median(cpu), 1e-9) / 1e6
    load = open("/proc/loadavg").read().split()[0]
    result = {"machine": machine(), "scale": args.scale, "bytes": hashed, "seconds": seconds, "cpu_seconds": cpu,
              "mb_per_s": rate, "cpu_mb_per_s": cpu_rate, "load_average": load}  # fmt: skip
    save("digest", result)
    update_doc(
        "digest",
        f"## Store content digest\n\n`python benches/bench_digest.py --scale {args.scale} --runs {args.runs}` "
        f"({result['machine']['nproc']} cores, {result['machine']['cpu']}): an RMAT store of "
        f"{hashed / 1e6:,.0f} MB hashed from its files (O_DIRECT reads, one thread) in "
        f"{median(seconds):.2f} s median: **{rate:,.0f} MB/s** of wall time, the disk's rate (load average "
        f"{load} on the shared machine); the hashing itself took {median(cpu):.2f} s of CPU, "
        f"**{cpu_rate:,.0f} MB/s** of one core.",
    )
    print(f"{hashed / 1e6:,.0f} MB in {median(seconds):.2f} s: {rate:,.0f} MB/s ({cpu_rate:,.0f} MB/s of CPU)")


if __name__ == "__main__":
    main()
