"""Where the device cache's misses are read from: GPUDirect Storage (kvikio) is chosen only on a
GPU, with kvikio importing and out of its compatibility mode; otherwise the I/O engine, with the
reason said in the plan and recorded by `strata gnn train`. A fake kvikio that records its calls
checks the call shape of the GPUDirect reader (one pread per run of consecutive rows, at the
rows' byte offsets in the feature file, into one buffer) and that the rows land in the asked
order. It measures nothing."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from conftest import gpu_devices, needs, run_strata

torch = needs("torch")

from strata.device.gds import compat_mode_reason  # noqa: E402
from strata.gnn.device.reads import GDS, EngineReads, GdsReads, choose_reads  # noqa: E402
from strata.gnn.loader import GnnData  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_device_reads")


class FakeFuture:
    def __init__(self, size: int):
        self.size = size

    def get(self) -> int:
        return self.size


class FakeCuFile:
    """kvikio.CuFile's call shape: ``pread(buf, size, file_offset)`` fills ``buf`` (here a CPU
    tensor) from the file and returns a future."""

    def __init__(self, module, path: str, flags: str):
        assert flags == "r"
        self.module, self.path = module, path
        module.calls.append(("open", path))

    def pread(self, buf, size: int, file_offset: int):
        self.module.calls.append(("pread", size, file_offset))
        with open(self.path, "rb") as f:
            f.seek(file_offset)
            raw = f.read(size)
        assert buf.is_contiguous() and buf.numel() * buf.element_size() == size
        buf.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        return FakeFuture(size)

    def close(self):
        self.module.calls.append(("close", self.path))


class FakeDefaults:
    """kvikio.defaults: ``is_compat_mode_preferred()`` (kvikio 25.04 on)."""

    def __init__(self, compat: bool):
        self._compat = compat

    def is_compat_mode_preferred(self) -> bool:
        return self._compat


class LegacyDefaults:
    """kvikio.defaults before 25.04: ``compat_mode()``, a bool."""

    def __init__(self, compat: bool):
        self._compat = compat

    def compat_mode(self) -> bool:
        return self._compat


class FakeKvikio:
    def __init__(self, compat: bool = False, defaults=FakeDefaults):
        self.calls: list = []
        self.defaults = defaults(compat)

    def CuFile(self, path, flags):
        return FakeCuFile(self, path, flags)


def engine_of(data: GnnData, device="cpu") -> EngineReads:
    return EngineReads(data._native, data.dim, data.torch_dtype, device)


def test_the_choice_falls_back_to_the_engine_and_says_why(cora):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    features = data.store.features
    cuda = torch.device("cuda")

    def absent(name):
        raise ImportError(f"No module named {name!r}")

    choice = choose_reads(engine_of(data), features, "cpu", load=lambda n: FakeKvikio())
    assert choice.reads.kind == "engine" and choice.note == "no GPU (the device is cpu)"
    choice = choose_reads(engine_of(data), features, cuda, load=absent)
    assert choice.reads.kind == "engine" and "kvikio does not import" in choice.note
    compat = FakeKvikio(compat=True)
    choice = choose_reads(engine_of(data), features, cuda, load=lambda n: compat)
    assert choice.reads.kind == "engine" and "compatibility mode" in choice.note
    assert [c[0] for c in compat.calls] == ["open", "close"]
    for legacy_compat in (True, False):
        legacy = FakeKvikio(compat=legacy_compat, defaults=LegacyDefaults)
        choice = choose_reads(engine_of(data), features, cuda, load=lambda n, k=legacy: k)
        assert choice.reads.kind == ("engine" if legacy_compat else GDS)
    choice = choose_reads(engine_of(data), features, cuda, gds="off", load=lambda n: FakeKvikio())
    assert choice.reads.kind == "engine" and "turned off" in choice.note
    fake = FakeKvikio()
    choice = choose_reads(engine_of(data), features, cuda, load=lambda n: fake)
    assert choice.reads.kind == GDS and choice.note is None
    assert fake.calls == [("open", str(features.filename))]
    with pytest.raises(ValueError, match="gds: expected"):
        choose_reads(engine_of(data), features, cuda, gds="on")


def test_gds_reads_one_pread_per_run_of_rows_in_the_asked_order(cora):
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    features = data.store.features
    fake = FakeKvikio()
    # The reader on the CPU twin: the fake fills CPU tensors (no device memory is involved).
    reads = GdsReads(fake, features.filename, features.offset, data.dim, data.torch_dtype, "cpu")
    nodes = torch.tensor([9, 7, 8, 100, 7, 2707, 0, 101])
    rows = reads.deliver(reads.stage(nodes))
    expected = torch.from_numpy(np.array(features[nodes.numpy()], dtype=np.float32))
    assert torch.equal(rows, expected)
    row = data.row_bytes
    offset = features.offset
    # Distinct ids sorted: runs [0], [7, 8, 9], [100, 101], [2707].
    assert fake.calls[1:] == [
        ("pread", row, offset),
        ("pread", 3 * row, offset + 7 * row),
        ("pread", 2 * row, offset + 100 * row),
        ("pread", row, offset + 2707 * row),
    ]


def test_kvikio_s_answer_is_read_where_its_defaults_are_only_importable(monkeypatch):
    """Since kvikio 26.10, ``import kvikio`` leaves its ``defaults`` submodule unimported: the
    library's answer is read from it all the same."""
    package, defaults = types.ModuleType("fake_kvikio"), types.ModuleType("fake_kvikio.defaults")
    monkeypatch.setitem(sys.modules, "fake_kvikio", package)
    monkeypatch.setitem(sys.modules, "fake_kvikio.defaults", defaults)
    defaults.is_compat_mode_preferred = lambda: False
    assert compat_mode_reason(package) is None
    defaults.is_compat_mode_preferred = lambda: True
    assert compat_mode_reason(package) == "KVIKIO_COMPAT_MODE is on, or libcufile did not load"
    lacking = types.ModuleType("kvikio_without_defaults")
    assert compat_mode_reason(lacking) == "this kvikio does not say whether it reads through cuFile"


@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_gds_reads_the_rows_the_store_holds(cora, device):
    """The GPUDirect reader's rows equal the store's. On a GPU the real kvikio reads them
    (through cuFile, or through its compatibility mode where the machine lacks GPUDirect
    Storage: the same rows either way), into device memory; on the CPU twin the fake does."""
    if device == "cuda":
        kvikio = pytest.importorskip(
            "kvikio", reason="kvikio is not installed: pip install kvikio-cu12 or kvikio-cu13 (your torch's CUDA)"
        )
    else:
        kvikio = FakeKvikio()
    data = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="native")
    features = data.store.features
    reads = GdsReads(kvikio, features.filename, features.offset, data.dim, data.torch_dtype, device)
    nodes = torch.tensor([2707, 0, 1, 2, 1500, 3, 1501])
    rows = reads.deliver(reads.stage(nodes))
    assert rows.device.type == torch.device(device).type
    expected = torch.from_numpy(np.array(features[nodes.numpy()], dtype=np.float32))
    assert torch.equal(rows.cpu(), expected)


def test_the_device_path_reports_its_reads_on_the_cpu_twin(cora, monkeypatch):
    # kvikio absent: on the CPU the reason is the device, whatever kvikio's state.
    monkeypatch.setitem(sys.modules, "kvikio", None)
    lines = []
    data = GnnData(
        cora,
        lambda kind, *a: lines.append(a[0]) if kind == "message" else True,
        fanouts=[5, 5],
        batch_size=64,
        data_path="device",
        device_memory="200K",
    )
    assert data.feature_reads == {"path": "engine", "note": "no GPU (the device is cpu)"}
    # The native tiers are the misses' I/O engine only: the plan's hot set is the device
    # path's host tier, so they load none (no row held twice, none served twice).
    assert any(line.startswith("hot set: 0 rows ranked by none") for line in lines)
    assert data.device_path.budget()["host_rows"] > 0
    plan = [line for line in lines if line.startswith("data path:")]
    assert len(plan) == 1 and plan[0] == data.plan_lines()[-1]
    assert "data path: device (" not in plan[0] and "device_memory 200 KiB" in plan[0]
    assert "misses read by the I/O engine, not GPUDirect Storage: no GPU (the device is cpu); a window of 8" in plan[0]
    native = GnnData(cora, fanouts=[5, 5], batch_size=64, data_path="auto")
    assert native.data_path_lines()[0].startswith("data path: native (the device is not a GPU); memory ")
    assert native.feature_reads["path"] == "engine"


def test_gnn_train_data_path_flag_is_printed_and_recorded(cora, tmp_path):
    run = tmp_path / "run"
    # On the CPU device even where a GPU is present: the note below is the CPU's.
    common = ["gnn", "train", cora, "--epochs", "1", "--fanouts", "5,5", "--batch-size", "128", "--hidden", "16"]
    device = ["--device", "cpu", "--data-path", "device", "--device-memory", "200K", "--producer", "inline"]
    out = run_strata(*common, *device, "--run-dir", run)
    assert "data path: device; memory " in out.stdout + out.stderr
    record = json.loads((run / "run.json").read_text())
    assert record["data_path"] == "device" and record["data_path_note"] is None
    assert record["feature_reads"] == {"path": "engine", "note": "no GPU (the device is cpu)"}
    pipeline = record["history"][0]["pipeline"]
    assert pipeline["sampler"] == "device" and pipeline["producer"] == "in order"
    assert 0.0 <= pipeline["model_idle_share"] <= 1.0
    # The epoch line gives the device's measure of the model's wait beside the host's.
    idle = f"(the model idle {100 * pipeline['model_idle_share']:.1f}%)"
    assert (
        f"waited for data {100 * record['history'][0]['data_wait_fraction']:.1f}% {idle}; " in out.stdout + out.stderr
    )
    # Without --data-path (auto) on the CPU: tests/test_gnn_train.py's CLI run checks the native
    # path is printed and recorded with its reason.
    bad = run_strata(*common, "--data-path", "gpu", check=False)
    assert bad.returncode == 2 and "--data-path: unknown choice 'gpu'" in bad.stderr
    help_text = run_strata("gnn", "train", "--help").stdout
    assert "--data-path {auto,native,device}" in help_text and "--producer {thread,inline}" in help_text
    bad = run_strata(*common, "--producer", "process", check=False)
    assert bad.returncode == 2 and "--producer: unknown choice 'process'" in bad.stderr
