"""Question: does Strata's I/O engine reach the device's speed? fio and `strata bench-disk`
side by side on the same file, alternating, in one run: 4 KiB random reads at queue depth 128
and 1 MiB sequential reads and writes at queue depth 32, all with O_DIRECT and io_uring.

    python benches/bench_disk.py [--size 4G] [--rounds 3] [--seconds 10]

Target: Strata >= 90% of fio on each figure (medians over the rounds). Results go to
bench-results/disk.json and the `disk` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from common import REPO, machine, median, save, strata, update_doc

QD_RAND, QD_SEQ = 128, 32


def fio(path: Path, rw: str, size: str, seconds: int) -> float:
    """Runs one fio job; returns IOPS for randread, MB/s otherwise."""
    bs = "4k" if rw == "randread" else "1M"
    qd = QD_RAND if rw == "randread" else QD_SEQ
    cmd = [
        "fio",
        "--name=strata-compare",
        f"--filename={path}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={qd}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--size={size}",
        "--numjobs=1",
        "--output-format=json",
    ]
    if rw == "randread":
        cmd += ["--time_based", f"--runtime={seconds}"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    job = out["jobs"][0]
    side = job["write"] if rw == "write" else job["read"]
    return side["iops"] if rw == "randread" else side["bw_bytes"] / 1e6


def strata_run(path: Path, size: str, seconds: int) -> dict:
    """`strata bench-disk` on `path` (created with the write test when absent)."""
    out = subprocess.run(
        strata(
            "bench-disk",
            "--dir",
            path.parent,
            "--file",
            path,
            "--size",
            size,
            "--queue-depths",
            str(QD_RAND),
            "--seq-depth",
            QD_SEQ,
            "--seconds",
            seconds,
            "--backend",
            "io_uring",
            "--no-save",
            "--json-summary",
            "-q",
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="4G")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (Debian: apt-get install fio)")
    args.dir.mkdir(exist_ok=True)
    path = args.dir / "disk-compare.bin"
    rows = {"randread_iops": ([], []), "read_mb_s": ([], []), "write_mb_s": ([], [])}
    try:
        for _ in range(args.rounds):
            # Strata writes a fresh file, then reads it; fio then measures the same file, and
            # writes a fresh one of its own for its write figure.
            path.unlink(missing_ok=True)
            s = strata_run(path, args.size, args.seconds)
            rows["write_mb_s"][1].append(s["seq_write_mb_s"])
            rows["read_mb_s"][1].append(s["seq_read_mb_s"])
            rows["randread_iops"][1].append(s["rand_read_4k"][0]["iops"])
            rows["read_mb_s"][0].append(fio(path, "read", args.size, args.seconds))
            rows["randread_iops"][0].append(fio(path, "randread", args.size, args.seconds))
            path.unlink()
            rows["write_mb_s"][0].append(fio(path, "write", args.size, args.seconds))
    finally:
        path.unlink(missing_ok=True)
    result = {
        "machine": machine(),
        "size": args.size,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "fio_version": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
        "figures": {
            k: {
                "fio": v[0],
                "strata": v[1],
                "fio_median": median(v[0]),
                "strata_median": median(v[1]),
                "ratio": median(v[1]) / median(v[0]),
            }
            for k, v in rows.items()
        },
    }
    save("disk", result)
    m = result["machine"]
    names = {
        "randread_iops": f"4 KiB random read, QD {QD_RAND} (IOPS)",
        "read_mb_s": f"1 MiB sequential read, QD {QD_SEQ} (MB/s)",
        "write_mb_s": f"1 MiB sequential write, QD {QD_SEQ} (MB/s)",
    }
    lines = [
        "## Disk: Strata's I/O engine against fio (`benches/bench_disk.py`)",
        "",
        f"Machine: {m['nproc']} cores, {m['ram_gib']} GiB RAM, Linux {m['kernel']}; {result['fio_version']}. "
        f"Command: `python benches/bench_disk.py --size {args.size} --rounds {args.rounds} --seconds {args.seconds}`. "
        "Both use io_uring with O_DIRECT on the same file, alternating in one run; medians over the rounds.",
        "",
        "| figure | fio | strata bench-disk | strata / fio | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, f in result["figures"].items():
        fmt = "{:,.0f}"
        lines.append(
            f"| {names[k]} | {fmt.format(f['fio_median'])} | {fmt.format(f['strata_median'])} | "
            f"{f['ratio']:.2f} | >= 0.90 |"
        )
    lines.append("")
    per_round = []
    for k, f in result["figures"].items():
        pairs = ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(f["fio"], f["strata"], strict=True))
        per_round.append(f"{names[k].split(' (')[0]}: {pairs}")
    lines.append("Per round (fio / strata): " + "; ".join(per_round) + ".")
    update_doc("disk", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
