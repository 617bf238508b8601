"""``strata.torchrun.PeerRequests``: the store-keyed request server behind the embed scheduler
and owner mode, exercised in one process against a real c10d TCPStore."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from conftest import needs
from strata.errors import GroupError
from strata.torchrun import PeerRequests, connect_store
from torchrun_env import free_port


@pytest.fixture
def store():
    td = needs("torch").distributed
    master = td.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    address = f"127.0.0.1:{master.port}"
    yield address, connect_store(address, "t/", 10)


def test_each_peer_is_answered_in_order_and_close_wakes_idle_threads(store):
    address, main = store
    got: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def handle(conn, r, k, text):
        with lock:
            got.append((r, k, text))
        conn.set(f"rep/{r}/{k}", text.upper())

    server = PeerRequests("test", lambda: connect_store(address, "t/", 10), "req", [1, 2], handle, 10)
    for k in range(3):
        for r in (1, 2):
            main.set(f"req/{r}/{k}", f"r{r}k{k}")
    for k in range(3):
        for r in (1, 2):
            main.wait([f"rep/{r}/{k}"], timedelta(seconds=10))
            assert main.get(f"rep/{r}/{k}") == f"R{r}K{k}".encode()
    # Each peer's requests in order, each key taken away once answered.
    for r in (1, 2):
        assert [k for rr, k, _ in got if rr == r] == [0, 1, 2]
        assert not main.check([f"req/{r}/0"])
    started = time.monotonic()
    server.close(main)
    assert time.monotonic() - started < 5, "close must wake threads blocked in the store's wait"
    assert all(not t.is_alive() for t in server.threads)
    assert server.failure is None


def test_a_failing_handle_is_kept_as_the_servers_failure(store):
    address, main = store

    def handle(conn, r, k, text):
        raise ValueError(f"bad request {text}")

    server = PeerRequests("test", lambda: connect_store(address, "t/", 10), "req", [1], handle, 10)
    main.set("req/1/0", "x")
    server.threads[0].join(timeout=10)
    assert isinstance(server.failure, ValueError) and "bad request x" in str(server.failure)
    server.close(main)


def test_an_unreachable_store_is_named():
    needs("torch")
    with pytest.raises(GroupError, match=r"rendezvous store at 127\.0\.0\.1:\d+"):
        connect_store(f"127.0.0.1:{free_port()}", "t/", 1)
