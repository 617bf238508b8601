"""Two network namespaces joined by a veth pair, for tests whose traffic must cross a real
network link between two hosts rather than the loopback device.

Each test run gets its own namespaces and its own /24 (10.213.K.0/24, K from the process id), so
parallel runs do not meet. Namespaces left behind by a run that was killed are removed the next
time a pair is made. Only the two veth addresses are reachable from inside the namespaces.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

PREFIX = "strata-t"


@dataclass(frozen=True)
class Namespace:
    """One end of the link: the namespace's name, its address on the veth pair and the name
    of its veth device (for GLOO_SOCKET_IFNAME and the like)."""

    name: str
    addr: str
    device: str

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@functools.cache
def unavailable() -> str | None:
    """Why namespaces cannot be made here, as a skip reason that says what to change, or None
    when they can: the `ip` command, root, and the right to make one (a container needs
    CAP_SYS_ADMIN), tried once per test run with a namespace made and deleted at once."""
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command (apt install iproute2)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (run the tests as root)"
    probe = f"{PREFIX}{os.getpid()}p"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return (
            f"cannot create a network namespace here ({made.stderr.strip()}): in a container, "
            "give it CAP_SYS_ADMIN and CAP_NET_ADMIN (docker run --cap-add SYS_ADMIN --cap-add NET_ADMIN)"
        )
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


#: Marks a test that runs ranks in two network namespaces (:func:`veth_pair`): skipped, with
#: what to change, where they cannot be made.
needs_netns = pytest.mark.skipif(unavailable() is not None, reason=f"network namespaces: {unavailable()}")


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _remove_stale() -> None:
    """Deletes namespaces of earlier runs whose process is gone (a killed test run)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].rstrip("abp")
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@contextmanager
def veth_pair() -> Iterator[tuple[Namespace, Namespace]]:
    """Two namespaces, ``a`` at 10.213.K.1 and ``b`` at 10.213.K.2, joined by a veth pair with
    both ends up; deleted (with the link) on exit, whatever happened inside."""
    _remove_stale()
    pid = os.getpid()
    subnet = f"10.213.{pid % 250}"
    # Interface names are limited to 15 bytes: "sv" + pid (at most 7 digits) + end.
    ends = (f"sv{pid}a", f"sv{pid}b")
    a = Namespace(f"{PREFIX}{pid}a", f"{subnet}.1", ends[0])
    b = Namespace(f"{PREFIX}{pid}b", f"{subnet}.2", ends[1])
    made = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns.name)
            made.append(ns)
        _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        for ns, end in zip((a, b), ends, strict=True):
            _ip("link", "set", end, "netns", ns.name)
            _ip("-n", ns.name, "addr", "add", f"{ns.addr}/24", "dev", end)
            _ip("-n", ns.name, "link", "set", end, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        yield a, b
    finally:
        # Deleting a namespace deletes the veth end inside it, and with it the peer; an end not
        # yet moved into its namespace is deleted by name.
        subprocess.run(["ip", "link", "del", ends[0]], capture_output=True, timeout=30)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=30)
