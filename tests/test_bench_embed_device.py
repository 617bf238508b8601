"""benches/bench_embed_device.py runs as the GPU session will run it, here on the CPU twin at a
tiny size: every part trains, the traced one summarises its epochs, the device runs carry the
device's counters and say why GPUDirect Storage is not used, and the out-of-core run swaps
partitions while the resident one does not, with float32 and with bf16 tables, and with a
row-wise Adagrad, its partitions kept in host memory or every load from the SSD."""

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
    cmd = [sys.executable, BENCHES / "bench_embed_device.py", "--device", "torch-cpu", "--tiny"]
    lean = ["rmat-ooc", "--table-dtype", "bf16", "--optimizer", "adagrad_row", "--epochs", "2"]
    parts = [["fb15k"], ["fb15k-trace"], ["rmat-prepare"], ["rmat-ooc"], ["rmat-resident"]]
    parts += [["rmat-ooc", "--table-dtype", "bf16"], lean]
    for part in parts:
        args = [*cmd, "--part", *part, "--work", tmp_path, "--out", out]
        proc = subprocess.run([*map(str, args)], check=True, timeout=600, capture_output=True, text=True)
        assert "| run |" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) >= {"fb15k torch-cpu", "fb15k cpu", "rmat-s10 resident"}
    assert 0 < runs["fb15k torch-cpu"]["test_mrr"] <= 1 and 0 < runs["fb15k cpu"]["test_mrr"] <= 1
    assert "busy_share" not in runs["fb15k cpu"] and runs["fb15k cpu"]["device_line"] is None
    # The traced run: three epochs between the first and the last, each with the backend's
    # phases and the time in none (the Rust epoch loop's own), its trace beside the result.
    traced = runs["fb15k torch-cpu, traced"]
    assert len(traced["epochs"]) == 3 and (tmp_path / traced["trace"]).stat().st_size > 0
    for epoch in traced["epochs"]:
        assert epoch["host_ms_by_phase"]["TorchCompute.train_piece"] > 0 and epoch["host_unmarked_ms"] > 0
        assert "TorchRanker.count" not in epoch["host_ms_by_phase"]  # validation is off
    # The last epoch runs on into an evaluation on the device, whose ranker calls are marked.
    assert traced["last_and_eval"]["host_ms_by_phase"]["TorchRanker.count"] > 0
    ooc = runs["rmat-s10 out of core (1/4 on the device)"]
    resident = runs["rmat-s10 resident"]
    for r in (runs["fb15k torch-cpu"], ooc, resident):
        assert 0 < r["busy_share"] <= 1 and r["edges_per_second"] > 0 and r["h2d_bytes"] > 0
        assert "GPUDirect Storage is not used" in r["device_line"]
    assert ooc["partitions"] == 12 and ooc["partition_loads"] > 3 and ooc["ssd_to_device_bytes_per_second"] > 0
    # The out-of-core run's device budget: a quarter of the table and the fixed parts.
    assert ooc["device_memory"] == (1 << 10) * 800 // 4 + (512 << 20)
    assert resident["partitions"] == 1 and resident["partition_loads"] <= 1
    # bf16 tables: half the bytes a node, so half the quarter.
    bf16 = runs["rmat-s10 out of core (1/4 on the device), bf16 table"]
    assert bf16["device_memory"] == (1 << 10) * 400 // 4 + (512 << 20) and bf16["partition_loads"] > 3
    # bf16 and one Adagrad accumulator a node: 101 values of 2 bytes a node, over two epochs.
    lean = runs["rmat-s10 out of core (1/4 on the device), bf16 table, adagrad_row"]
    assert lean["device_memory"] == (1 << 10) * 202 // 4 + (512 << 20) and lean["epochs"] == 2
    # Its second epoch starts in the buffer state the first ended in: three loads fewer, and
    # with the partitions kept in host memory none of them reads the SSD; Legend's own setting
    # beside it (every load from the SSD) makes the same loads.
    first, second = (e["partition_loads"] for e in lean["per_epoch"])
    assert second == first - 3, lean["per_epoch"]
    ssd = runs["rmat-s10 out of core (1/4 on the device), every load from the SSD, bf16 table, adagrad_row"]
    assert [e["partition_loads"] for e in ssd["per_epoch"]] == [first, second]
    kept_read, ssd_read = ([e["partition_bytes_read"] for e in r["per_epoch"]] for r in (lean, ssd))
    assert kept_read[1] == 0 and ssd_read[1] > 0 and kept_read[0] > 0, (kept_read, ssd_read)
