"""benches/bench_gnn_device.py runs every figure as the GPU session will run them, here on the CPU
twin at a tiny size: a --prepare call makes the stores a later call reuses; G6's runs go through
`strata gnn train --data-path`, the device runs say they used the device path and report a wait
share; the traced run gives each epoch's host phases; the data path alone delivers batches with
no host wait but one read of sizes per hop; the all-in-memory run serves every row from the
device tier and the features-4x-host runs hold a quarter of the rows on the host and read the
rest, a batch's misses read alone or with the window's; PyG's runs train, or say why not (no
sampler backend installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import needs

needs("torch")

BENCHES = Path(__file__).resolve().parents[1] / "benches"
FIGURES = "g6,trace,path,reads,pyg,big,big-pyg"


def bench(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, BENCHES / "bench_gnn_device.py", "--device", "cpu", "--tiny", *args]
    return subprocess.run(list(map(str, cmd)), check=True, timeout=900, capture_output=True, text=True)


def assert_pyg_ran_or_said_why(run: dict) -> None:
    if "skipped" in run:
        assert "pyg-lib" in run["skipped"] or "torch-sparse" in run["skipped"] or "torch_geometric" in run["skipped"]
    else:
        assert run["data_path"] == "pyg" and run["sampled_nodes_per_second"] > 0


def test_bench_runs_every_figure_on_the_cpu_twin(tmp_path):
    prepared = json.loads(bench("--only", FIGURES, "--prepare", "--work", tmp_path).stdout)
    assert set(prepared) == {"g6", "big"} and all(Path(p, "manifest.json").exists() for p in prepared.values())
    out = tmp_path / "result.json"
    bench("--only", FIGURES, "--work", tmp_path, "--out", out)
    figures = json.loads(out.read_text())["figures"]
    assert list(figures) == FIGURES.split(",")

    g6 = figures["g6"]["runs"]
    for path in ("native", "device"):
        r = g6[path]
        assert r["data_path"] == path and r["sampled_nodes_per_second"] > 0
        assert 0.0 <= r["data_wait_fraction"] <= 1.0 and r["plan"][0].startswith(f"data path: {path}")
    assert 0.0 <= g6["device"]["pipeline_wait_share"] <= 1.0
    assert figures["g6"]["device_over_native_nodes_per_second"] > 0
    # `--step auto` is eager on the CPU: both device runs train every batch as sampled.
    for run in ("device", "device_eager_step"):
        assert g6[run]["train_step"]["mode"] == "eager"
        assert all(e["steps"]["eager"] > 0 == e["steps"]["replayed"] for e in g6[run]["epochs"])
    assert figures["g6"]["step_auto_over_eager_nodes_per_second"] > 0
    # The device run again without the GIDS window, through the same CLI.
    window0 = g6["device_window_0"]
    same = g6["device"]["command"].replace("run-g6-device", "run-g6-device-window0") + " --window 0"
    assert window0["data_path"] == "device" and window0["command"] == same
    assert figures["g6"]["window_0_over_default_nodes_per_second"] > 0
    # And with the training loop issuing the data path's work (in order on the CPU twin).
    inline = g6["device_inline"]
    assert inline["command"] == g6["device"]["command"].replace(
        "--producer thread --run-dir " + str(tmp_path / "run-g6-device"),
        "--producer inline --run-dir " + str(tmp_path / "run-g6-device-inline"),
    )
    assert 0.0 <= inline["model_idle_share"] <= 1.0 and figures["g6"]["inline_over_thread_nodes_per_second"] > 0

    # The traced run: its epochs after the first, each with the host phases of sampling and
    # training (no device lane on the CPU), its trace written beside the result.
    traced = figures["trace"]["runs"]["device path, traced"]
    assert traced["sampled_nodes_per_second"] > 0 and (tmp_path / traced["trace"]).stat().st_size > 0
    for epoch in traced["epochs"]:
        assert epoch["busy_ms"] is None and epoch["ms"] > 0
        phases = epoch["host_ms_by_phase"]
        assert phases["BoundedBatch.start"] > 0 and phases["TrainStep.__call__"] > 0

    alone = figures["path"]["runs"]["device path alone"]
    assert alone["sampled_nodes_per_second"] > 0 and alone["ms_per_batch"] > 0
    # Per batch: no host wait but one read of the batch's sizes (and one per lookup when the
    # rows are spread over tiers), and under 400 kernels.
    per_batch = alone["per_batch"]
    assert per_batch["host_waits"] == 0 and 1 <= per_batch["reads"] <= 4 and 0 < per_batch["kernels"] < 400
    # And where a batch's time goes, by torch's profiler: the ops a batch runs, each with its calls.
    assert alone["profile"] and all(row["name"] and row["calls"] > 0 for row in alone["profile"])
    # The CPU twin draws each batch op by op (a GPU replays a CUDA graph per batch capacity).
    assert alone["sampler_batches"]["op_by_op"] > 0 and alone["sampler_batches"]["replayed"] == 0

    # A read per batch against the window's misses read together: the same rows missed, each
    # run's requests and bytes counted.
    reads = figures["reads"]
    alone, together, per_batch, native, merged = (reads["runs"][k]["epochs"][-1] for k in reads["runs"])
    assert alone["disk_rows"] == together["disk_rows"] > 0 and alone["rows"] == together["rows"]
    assert min(alone["disk_requests"], together["disk_requests"], together["disk_bytes_read"]) > 0
    assert reads["bytes_alone_over_together"] > 0 and reads["requests_alone_over_together"] > 0
    # The native path reads the same rows whatever it merges; merged, it asks for each once a read.
    assert per_batch["rows"] == native["rows"] == merged["rows"] == alone["rows"]
    assert per_batch["disk_rows"] == native["disk_rows"] == merged["disk_rows"] > 0
    assert reads["native_bytes_per_batch_over_default"] > 0 and reads["native_bytes_default_over_window"] > 0

    quarter = figures["pyg"]["runs"]["strata device, features 4x host"]
    assert quarter["data_path"] == "device" and 0 < quarter["held_share"] <= 0.25
    assert_pyg_ran_or_said_why(figures["pyg"]["runs"]["pyg, features in memory"])

    big = figures["big"]["runs"]
    for r in big.values():
        assert r["data_path"] == "device" and r["sampled_nodes_per_second"] > 0 and 0.0 <= r["wait_share"] <= 1.0
        assert all(e["steps"]["eager"] == e["batches"] for e in r["epochs"])
        assert r["epochs"][-1]["pipeline"]["sampler"] == "device"
        assert r["feature_reads"] == {"path": "engine", "note": "no GPU (the device is cpu)"}
    everything = big["device, all in memory"]["epochs"][-1]["pipeline"]["tiers"]
    assert everything["host_rows"] == everything["miss_rows"] == 0 < everything["device_rows"]
    four_x = big["device, features 4x host"]
    tiers = four_x["epochs"][-1]["pipeline"]["tiers"]
    assert tiers["device_rows"] == 0 < tiers["host_rows"] and tiers["miss_rows"] > 0
    assert 0 < four_x["held_share"] <= 0.25
    assert figures["big"]["throughput_over_all_in_memory"]["device, features 4x host"] > 0
    assert_pyg_ran_or_said_why(figures["big-pyg"]["runs"]["pyg, features in memory"])
