"""strata.device.pins: host buffers page-locked in place, each registered whole and once, a
refusal remembered (its copies then go through staging) and said, every buffer unregistered at
release; with a recorder in place of CUDA's runtime, so the bookkeeping runs without a GPU."""

from __future__ import annotations

from conftest import needs
from strata.device.pins import HostPins


class Runtime:
    """Records registrations; refuses the addresses in ``refuse`` (CUDA error 712: already
    registered) and fails to unregister those in ``stuck``."""

    def __init__(self, refuse=(), stuck=()):
        self.refuse, self.stuck = set(refuse), set(stuck)
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def register(self, address: int, nbytes: int) -> int:
        if address in self.refuse:
            return 712
        self.registered.append((address, nbytes))
        return 0

    def unregister(self, address: int) -> int:
        self.unregistered.append(address)
        return 1 if address in self.stuck else 0


def test_a_buffer_is_registered_whole_once_and_released():
    rt = Runtime()
    pins = HostPins(rt.register, rt.unregister)
    assert pins.pin(0x10000, 8192) and pins.pin(0x10000, 8192) and pins.pin(0x10000, 4096)
    assert pins.pin(0x40000, 4096)
    assert rt.registered == [(0x10000, 8192), (0x40000, 4096)] and sum(pins.pinned.values()) == 12288
    # A buffer of unknown length (the relations' memory) is not pinned.
    assert not pins.pin(0x80000, 0) and len(rt.registered) == 2
    # More than the registered length of a buffer: not covered, and not registered again.
    assert not pins.pin(0x40000, 8192) and len(rt.registered) == 2
    assert pins.release() == [] and sorted(rt.unregistered) == [0x10000, 0x40000]
    assert pins.pinned == {} and pins.release() == [] and len(rt.unregistered) == 2


def test_a_refused_buffer_is_remembered_and_said():
    rt = Runtime(refuse={0x20000})
    pins = HostPins(rt.register, rt.unregister)
    assert not pins.pin(0x20000, 4096) and "CUDA error 712" in pins.refused and "4,096 bytes" in pins.refused
    rt.refuse.clear()
    assert not pins.pin(0x20000, 4096) and rt.registered == []  # not asked again
    assert pins.pin(0x30000, 4096)


def test_release_names_the_buffers_cuda_would_not_unregister():
    rt = Runtime(stuck={0x50000})
    pins = HostPins(rt.register, rt.unregister)
    pins.pin(0x50000, 4096), pins.pin(0x60000, 4096)
    (error,) = pins.release()
    assert "0x50000" in error and "4,096 bytes" in error and sorted(rt.unregistered) == [0x50000, 0x60000]
    assert pins.pinned == {}


def test_a_torch_without_the_runtime_leaves_the_slots_to_staging(monkeypatch, capsys):
    from types import SimpleNamespace

    needs("torch")
    from strata.embed.device import backend

    def unreachable(device):
        raise AssertionError("libcudart functions are unavailable")

    monkeypatch.setattr(backend, "cuda_register", unreachable)
    assert backend.TorchCompute._host_pins(SimpleNamespace(cuda=True, device="cuda:0")) is None
    assert "through staging" in capsys.readouterr().err
    assert backend.TorchCompute._host_pins(SimpleNamespace(cuda=False, device="cpu")) is None
