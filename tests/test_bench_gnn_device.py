"""benches/bench_gnn_device.py runs as the GPU session will run it, here on the CPU twin at a
tiny size: every run trains, the device runs say they used the device path and report a wait
share, and the features-4x-host run serves rows from every tier it has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import needs

needs("torch")

BENCHES = Path(__file__).resolve().parents[1] / "benches"


def test_bench_runs_on_the_cpu_twin(tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, BENCHES / "bench_gnn_device.py", "--device", "cpu", "--tiny", "--no-peer"]
    subprocess.run([*map(str, cmd), "--work", str(tmp_path), "--out", str(out)], check=True, timeout=600)
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"native", "device, all in memory", "device, features 4x host"}
    assert runs["native"]["data_path"] == "native"
    for name in ("device, all in memory", "device, features 4x host"):
        r = runs[name]
        assert r["data_path"] == "device" and r["sampled_nodes_per_second"] > 0
        assert 0.0 <= r["wait_share"] <= 1.0
        pipeline = r["epochs"][-1]["pipeline"]
        assert pipeline["sampler"] == "device" and 0.0 <= pipeline["wait_share"] <= 1.0
    everything = runs["device, all in memory"]["epochs"][-1]["pipeline"]["tiers"]
    assert everything["host_rows"] == everything["miss_rows"] == 0 < everything["device_rows"]
    quarter = runs["device, features 4x host"]["epochs"][-1]["pipeline"]["tiers"]
    assert quarter["device_rows"] == 0 < quarter["host_rows"] and quarter["miss_rows"] > 0
