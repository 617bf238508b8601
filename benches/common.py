"""Shared benchmark plumbing: machine description, timed runs under memlimit, and writing
results to bench-results/*.json and docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ``shared/`` beside the checkout, or beside the folder of worktrees (as tests/conftest.py
# looks for it).
SHARED = next(
    (p / "shared" for p in (REPO.parent, REPO.parent.parent) if (p / "shared").is_dir()), REPO.parent / "shared"
)
MEMLIMIT = SHARED / "tools" / "memlimit"
RESULTS = REPO / "bench-results"
DOC = REPO / "docs" / "benchmarks.md"


def machine() -> dict:
    """What the numbers were measured on."""
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def strata(*args) -> list[str]:
    return [sys.executable, "-m", "strata", *map(str, args)]


def timed(
    cmd: list[str], limit: str | None = None, env: dict | None = None, log: Path | None = None, cwd: Path | None = None
) -> dict:
    """Runs ``cmd`` (under ``memlimit LIMIT`` when given, in ``env`` or this process's
    environment, in ``cwd`` or this process's folder); returns seconds, the CPU seconds (user +
    system) of the command and its children, peak bytes, stdout. With ``log`` the command's
    stderr goes to that file as it is written (a run cut off by a time limit leaves its progress
    there) and is read back after."""
    full = ([str(MEMLIMIT), limit] if limit else []) + cmd
    t, used = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if log is None:
        proc = subprocess.run(full, capture_output=True, text=True, env=env, cwd=cwd)
    else:
        with open(log, "w") as err:
            proc = subprocess.run(full, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=cwd)
        proc.stderr = Path(log).read_text()
    seconds = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(full)}\n{proc.stderr[-3000:]}")
    peak = None
    m = re.search(r"memlimit: peak (\S+) of limit", proc.stderr)
    if m:
        peak = int(subprocess.run(["numfmt", "--from=iec", m.group(1)], capture_output=True, text=True).stdout)
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_bytes": peak, "stdout": proc.stdout, "stderr": proc.stderr}


def memlimit_available() -> bool:
    if not MEMLIMIT.exists():
        return False
    return subprocess.run([str(MEMLIMIT), "64M", "true"], capture_output=True).returncode == 0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def update_doc(section: str, markdown: str, doc: Path | None = None) -> None:
    """Replaces the text between ``<!-- section:begin -->`` and ``<!-- section:end -->`` in
    ``doc`` (docs/benchmarks.md unless given), appending the section when it has none."""
    doc = doc or DOC
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def profiled(run, cuda: bool, per: int, top: int = 25) -> list[dict]:
    """Where ``run()`` spends its time, by torch's profiler: the ``top`` ops and kernels by
    their own time on the device (``cuda``) or on the host, each as ``{name, calls,
    device_us, host_us}`` per unit of ``per`` (the chunks or batches ``run`` does); on ``cuda``
    the kernels a replayed CUDA graph runs are listed by their kernel names."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
    rows = [
        {"name": e.key, "calls": e.count / per, "device_us": e.self_device_time_total / per,
         "host_us": e.self_cpu_time_total / per}
        for e in prof.key_averages()
    ]  # fmt: skip
    rows.sort(key=lambda r: r["device_us" if cuda else "host_us"], reverse=True)
    return rows[:top]
