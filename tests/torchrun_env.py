"""What the tests that launch ranks under torchrun share: a port reserved for a rendezvous, and
the environment each rank runs with."""

from __future__ import annotations

import atexit
import fcntl
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

#: Lock files, one a reserved port, shared by every test process on the machine (parallel
#: pytest-xdist workers, and other checkouts' test runs).
PORT_LOCKS = Path(tempfile.gettempdir()) / "strata-test-ports"
#: Where reserved ports come from: below the kernel's ephemeral range (32768-60999 by default),
#: so that no socket bound to port 0 or connecting out (gloo's, torch's, a server's) takes one.
FIRST_PORT = 20000
_held: dict[int, int] = {}  # port -> the open lock file that reserves it, for this process's life


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that nothing listens on, reserved for this process until it exits: another
    test process asking at the same time (a parallel worker) never gets it, and the kernel never
    hands it out on its own, so a rendezvous endpoint chosen now is still free when torchrun
    binds it. Each call returns a port this process has not had before."""
    last = _ephemeral_low()
    if last <= FIRST_PORT + 1000:
        raise RuntimeError(f"the ephemeral port range starts at {last}: no room below it for test ports")
    PORT_LOCKS.mkdir(exist_ok=True)
    span = last - FIRST_PORT
    start = random.randrange(span)
    for i in range(span):
        port = FIRST_PORT + (start + i) % span
        if port in _held:
            continue
        fd = os.open(PORT_LOCKS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _bindable(port):
            os.close(fd)
            continue
        _held[port] = fd
        return port
    raise RuntimeError(f"no free port left in {FIRST_PORT}-{last - 1}")


@functools.cache
def _rank_tmpdir() -> str:
    """A temp folder for the ranks this test process starts, removed when it exits: torchrun
    leaves a ``torchelastic_*`` folder behind per launch, which would pile up in /tmp."""
    path = tempfile.mkdtemp(prefix="strata-test-ranks-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def rank_env(interface: str = "lo") -> dict:
    """This process's environment for a rank: one thread per rank on a shared test machine,
    gloo on ``interface`` (loopback, or a namespace's veth device), and temp files in a folder
    this process removes at exit."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=interface, TMPDIR=_rank_tmpdir())
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


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Every process's (returncode, stdout, stderr), in order; each wait is bounded by
    ``timeout`` seconds, and every process still running when one fails is killed."""
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results
