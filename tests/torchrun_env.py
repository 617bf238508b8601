"""What the tests that launch ranks under torchrun share: a free port for the rendezvous, and
the environment each rank runs with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


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


def run_session(cmd: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    """Runs ``cmd`` (a torchrun launch) with ``env`` in a session of its own, capturing its
    output; torchrun and its workers are killed whole if they outlive ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
