"""The load test of ``strata serve``: benchmark S3 at a small size (16 client threads mixing
classifications, link predictions and every kind of mutation for 5 seconds and at least 1,000
calls, with a fold every second), which must end with no errors and every acknowledged mutation present both on the
running server and after a restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import needs

BENCH = Path(__file__).resolve().parents[1] / "benches" / "bench_serve.py"


def test_sixteen_clients_mixing_analyses_and_mutations(tmp_path):
    needs("torch")  # the bench exports its model from the PyTorch reference
    s3 = ["--only", "s3", "--nodes", "3000", "--s3-seconds", "5", "--s3-fold-after", "1", "--s3-min-calls", "1000"]
    proc = subprocess.run(
        [sys.executable, BENCH, *s3, "--work", tmp_path, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout)["s3"]
    assert res["errors"] == []
    assert res["calls"] >= 1000
    # Each kind of call happened, and mutations were still on the restarted server.
    assert all(op["count"] > 0 for op in res["ops"].values()), res["ops"]
    assert all(res["restarted"][k] == res["live"][k] for k in ("vertices", "edges", "last_lsn"))
    assert res["restarted"]["vertices"] > 0 and res["restarted"]["edges"] > 0
    assert res["live"]["version"] >= 2  # a fold happened during the run
