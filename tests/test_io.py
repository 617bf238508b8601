"""The I/O engine from Python and the CLI: row reads, counters, backends, bench-disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from strata import io

BACKENDS = ["io_uring", "threads"]

ROWS_SCRIPT = """
import json, sys
import numpy as np
from strata import io
path, rows = sys.argv[1], json.loads(sys.argv[2])
got = io.read_rows(path, rows)
np.save(sys.argv[3], got)
print(json.dumps({"info": io.info(), "stats": io.stats()}))
"""


def run_rows(backend: str, path, rows, out) -> dict:
    env = dict(os.environ, STRATA_IO_BACKEND=backend)
    proc = subprocess.run(
        [sys.executable, "-c", ROWS_SCRIPT, str(path), json.dumps(rows), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("dtype", "shape"), [("float32", (5000, 33)), ("int64", (7777,)), ("float16", (999, 128))])
def test_read_rows_equals_numpy_on_each_backend(tmp_path, backend, dtype, shape):
    rng = np.random.default_rng(3)
    arr = (rng.standard_normal(shape) * 100).astype(dtype)
    path = tmp_path / "a.npy"
    np.save(path, arr)
    rows = [int(r) for r in rng.integers(0, shape[0], 600)] + [0, shape[0] - 1, 5, 5]
    report = run_rows(backend, path, rows, tmp_path / "out.npy")
    assert report["info"]["backend"] == backend
    assert np.array_equal(np.load(tmp_path / "out.npy"), arr[rows])
    stats = report["stats"]
    assert stats["read_ops"] >= len(rows)
    assert stats["errors"] == 0 and stats["in_flight"] == 0
    assert stats["latency_p99_us"] >= stats["latency_p50_us"] > 0


def test_read_rows_rejects_bad_rows(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10))
    with pytest.raises(Exception, match="row 10 is out of range: the array has 10 rows"):
        io.read_rows(tmp_path / "a.npy", [1, 10])
    with pytest.raises(IndexError, match="negative"):
        io.read_rows(tmp_path / "a.npy", [-1])
    assert io.read_rows(tmp_path / "a.npy", []).shape == (0,)


def test_info_reports_the_running_backend():
    info = io.info()
    assert info["backend"] in BACKENDS
    assert info["depth"] > 0
    if info["backend"] == "threads":
        assert info["fallback_reason"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_conversions_agree_across_backends(tmp_path, backend, strata_cli):
    raw = tmp_path / "r.bin"
    strata_cli("generate", "rmat", "--scale", "12", "--out", raw, "-q")
    ref = tmp_path / "ref.strata"
    strata_cli("--io-backend", "io_uring", "convert", raw, "--out", ref, "--memory", "1M", "-q")
    out = tmp_path / f"{backend}.strata"
    strata_cli("--io-backend", backend, "convert", raw, "--out", out, "--memory", "1M", "-q")
    for f in sorted(p.name for p in ref.iterdir() if p.suffix == ".npy"):
        assert (ref / f).read_bytes() == (out / f).read_bytes(), f


def test_bench_disk_writes_a_profile(tmp_path, strata_cli):
    env = dict(os.environ, STRATA_PROFILE_DIR=str(tmp_path / "profiles"))
    proc = strata_cli(
        "bench-disk",
        "--dir",
        tmp_path,
        "--size",
        "16M",
        "--seconds",
        "0.2",
        "--queue-depths",
        "1,8",
        "--seq-depth",
        "4",
        "--json-summary",
        "-q",
        env=env,
    )
    p = json.loads(proc.stdout)
    assert p["backend"] in BACKENDS and p["file_bytes"] == 16 << 20
    assert p["seq_read_mb_s"] > 0 and p["seq_write_mb_s"] > 0
    assert [q["queue_depth"] for q in p["rand_read_4k"]] == [1, 8]
    assert p["peak_iops"] == max(q["iops"] for q in p["rand_read_4k"])
    expect_n = 0.95 / 0.05 * p["peak_iops"] * p["unloaded_latency_us"] * 1e-6
    assert p["target_in_flight_p95"] == max(1, int(np.ceil(expect_n)))
    assert p["knee_queue_depth"] in (1, 8)
    saved = json.loads(open(p["saved_to"]).read())
    assert saved["rand_read_4k"] == p["rand_read_4k"]
    # The engines find the profile of the device holding a path.
    code = "import json, sys; from strata import io; print(json.dumps(io.load_profile(sys.argv[1])))"
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, check=True
        ).stdout
    )
    assert found["device"] == p["device"]
    assert not list(tmp_path.glob(".strata-bench-disk-*")), "the temporary benchmark file is removed"
    text = strata_cli(
        "bench-disk",
        "--dir",
        tmp_path,
        "--size",
        "8M",
        "--seconds",
        "0.1",
        "--queue-depths",
        "2",
        "--no-save",
        "-q",
        env=env,
    ).stdout
    assert "GIDS in-flight target for 95% of peak" in text and "knee" in text
    # A file this small may be served by a cache below the file system: the report says so.
    assert p["caveat"] and "measured on a 16 MiB file" in p["caveat"]
    assert "note: the disk profile was measured on a 8 MiB file" in text and "default --size" in text


def test_bench_disk_bad_options(tmp_path, strata_cli):
    proc = strata_cli("bench-disk", "--dir", tmp_path / "absent", "--size", "8M", "-q", check=False)
    assert proc.returncode == 2 and "absent: no such directory" in proc.stderr
    proc = strata_cli("bench-disk", "--dir", tmp_path, "--queue-depths", "0", check=False)
    assert proc.returncode == 2 and "--queue-depths: must be >= 1, got 0" in proc.stderr
    # 100 TiB on this disk: refused before the first byte (it wrote until the disk was full).
    proc = strata_cli("bench-disk", "--dir", tmp_path, "--size", "100T", "-q", check=False)
    assert proc.returncode == 2 and "the benchmark file of 100 TiB does not fit" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())
    # A profile path that cannot be written is refused before the measuring, not after it.
    proc = strata_cli("bench-disk", "--dir", tmp_path, "--size", "8M", "--profile", tmp_path, check=False)
    assert proc.returncode == 2 and "is a directory; give the path of a file" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())
