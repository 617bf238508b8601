"""benches/device_trace.py's summary of a profiler trace, on hand-made Chrome traces: epochs from
marks and from marked calls, the device's busy union, and its idle gaps attributed to the
innermost host phase running (or to none, outside torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))

import device_trace
from device_trace import EPOCH, EPOCH_START, summary


def x(name: str, ts: float, dur: float, cat: str = "user_annotation", tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_marked_epochs_busy_union_and_idle_by_phase():
    trace = {
        "traceEvents": [
            x(EPOCH_START, 0, 0.5),
            x("strata::TorchCompute.train_piece", 100, 500),
            x("strata::StepGraphs.run", 200, 100),
            x("gemm", 250, 300, cat="kernel", tid=7),
            x("softmax", 400, 300, cat="kernel", tid=7),  # overlaps the gemm: counted once
            x("Memcpy DtoH", 900, 50, cat="gpu_memcpy", tid=8),
            x("aten::add", 920, 10, cat="cpu_op"),
            x(EPOCH_START, 1000, 0.5),
            x("strata::TorchCompute.counters", 1100, 20),
            x("aten::empty", 1990, 10, cat="cpu_op"),
        ]
    }
    first, last = summary(trace)["epochs"]
    assert first["ms"] == pytest.approx(1.0)
    assert first["busy_ms"] == pytest.approx(0.5) and first["busy_share"] == pytest.approx(0.5)
    # Idle 0-250 µs: 100 outside, 100 in train_piece, 50 in its run; 700-900 and 950-1000
    # after the piece: outside torch.
    assert first["idle_ms_by_host_phase"] == pytest.approx(
        {"outside torch": 0.35, "TorchCompute.train_piece": 0.1, "StepGraphs.run": 0.05}
    )
    assert first["host_ms_by_phase"] == pytest.approx({"TorchCompute.train_piece": 0.5, "StepGraphs.run": 0.1})
    assert first["host_unmarked_ms"] == pytest.approx(0.5)
    # Each kernel's own time, overlaps counted in both, longest first.
    assert first["device_ms_by_kernel"] == pytest.approx({"gemm": 0.3, "softmax": 0.3, "Memcpy DtoH": 0.05})
    # The last epoch runs to the trace's end; its device never works.
    assert last["ms"] == pytest.approx(1.0) and last["busy_ms"] == 0
    assert last["idle_ms_by_host_phase"] == pytest.approx({"outside torch": 0.98, "TorchCompute.counters": 0.02})
    assert last["device_ms_by_kernel"] == {}
    shown = device_trace.show("t", summary(trace))
    assert "device idle" in shown and "device time by kernel: gemm 0.3 ms" in shown


def test_an_epoch_names_its_longest_kernels_and_adds_up_the_rest(monkeypatch):
    monkeypatch.setattr(device_trace, "TOP_KERNELS", 2)
    kernels = [x(f"k{i}", 100 * i, 10 * (i + 1), cat="kernel", tid=7) for i in range(4)]
    # A kernel running past the epoch's end counts its part inside it.
    trace = {"traceEvents": [x(EPOCH, 0, 320), *kernels]}
    (epoch,) = summary(trace)["epochs"]
    assert epoch["device_ms_by_kernel"] == pytest.approx({"k2": 0.03, "k1": 0.02, "(the rest)": 0.03})


def test_marked_calls_are_epochs_and_no_device_lane_gives_host_phases_alone():
    trace = {
        "traceEvents": [
            x(EPOCH, 1000, 400),
            x("strata::TrainStep.__call__", 1100, 100),
            x("strata::DeviceSampler.sample", 1150, 30, tid=2),
            x("aten::mm", 1300, 500, cat="cpu_op"),  # after the epoch: not in it
        ]
    }
    (epoch,) = summary(trace)["epochs"]
    assert epoch["ms"] == pytest.approx(0.4) and epoch["busy_ms"] is None
    assert epoch["host_ms_by_phase"] == pytest.approx({"TrainStep.__call__": 0.1, "DeviceSampler.sample": 0.03})
    assert epoch["host_unmarked_ms"] == pytest.approx(0.3)
    assert "idle_ms_by_host_phase" not in epoch
    assert summary({"traceEvents": []}) == {"epochs": []}
