"""The lock of CUDA graph captures (strata.device.capture): while one thread captures, another
thread's op-by-op draws from torch's generator and its graph replays wait (torch fails them
otherwise), off CUDA nothing waits, and the capturing thread itself may draw. torch.cuda.graph
is replaced by a recorder, so the CPU runs the same locking as a GPU."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from conftest import needs

torch = needs("torch")

from strata.device import capture  # noqa: E402

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


class Replays:
    """A captured graph's stand-in: counts its replays."""

    def __init__(self, events: list):
        self.events = events

    def replay(self):
        self.events.append("replayed")


def recorded_capture(monkeypatch, events: list, during):
    """Makes torch.cuda.graph record its begin and end in ``events`` and call ``during()``
    between them."""

    @contextmanager
    def graph(_graph, capture_error_mode):
        assert capture_error_mode == "thread_local"
        events.append("begin")
        during()
        yield
        events.append("end")

    monkeypatch.setattr(torch.cuda, "graph", graph)


def draw(device, events: list):
    with capture.drawing(device):
        events.append(f"drew on {device.type}")


def test_another_thread_s_cuda_draws_and_replays_wait_for_the_capture(monkeypatch):
    events, others = [], []

    def start_others():
        others.append(threading.Thread(target=draw, args=(CUDA, events)))
        others.append(threading.Thread(target=capture.replay, args=(Replays(events),)))
        for t in others:
            t.start()
        for t in others:
            t.join(0.2)
        assert all(t.is_alive() for t in others), "a draw or replay ran during another thread's capture"

    recorded_capture(monkeypatch, events, start_others)
    with capture.capturing(object()):
        events.append("captured")
    for t in others:
        t.join(5)
    assert not any(t.is_alive() for t in others)
    assert events[:3] == ["begin", "captured", "end"]
    assert sorted(events[3:]) == ["drew on cuda", "replayed"]


def test_cpu_draws_go_on_and_the_capturing_thread_may_draw(monkeypatch):
    events = []

    def draw_on_cpu_elsewhere():
        t = threading.Thread(target=draw, args=(CPU, events))
        t.start()
        t.join(5)
        assert not t.is_alive()

    recorded_capture(monkeypatch, events, draw_on_cpu_elsewhere)
    with capture.capturing(object()):
        draw(CUDA, events)  # re-entrant: the GNN step warms up, then captures, holding it
    assert events == ["begin", "drew on cpu", "drew on cuda", "end"]
