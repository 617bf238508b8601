"""What the tests that launch ranks under torchrun share: a free port for the rendezvous, and
the environment each rank runs with."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(interface: str = "lo") -> dict:
    """This process's environment for a rank: one thread per rank on a shared test machine,
    and gloo on ``interface`` (loopback, or a namespace's veth device)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=interface)
    return env
