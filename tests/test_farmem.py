"""Far memory (`strata farmem serve` and `strata run --far`): edge blocks offloaded to a memory
server give the same results as a local run; a server killed in the middle of a run costs speed,
never results; the server stops cleanly on SIGTERM and Ctrl-C."""

from __future__ import annotations

import json
import re
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata
from netns import Namespace, needs_netns, veth_pair
from strata.config import ConvertConfig
from strata.convert import convert
from strata.errors import ConfigError
from strata.grid import build_grid, grid_info, run, serve_farmem

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_farmem")

N = 20_000
EDGES = 400_000  # 3.2 MB of edge records
SEGMENT = "64K"


def _default_sigint() -> None:
    """In the server's process before exec: SIGINT delivered and handled by default, whatever
    the test process inherited or set (an ignored or blocked SIGINT survives exec, and Python
    then never raises KeyboardInterrupt; the Ctrl-C test timed out in two full-suite runs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Server:
    """``strata farmem serve`` in a subprocess, on a port the OS picks."""

    def __init__(
        self,
        capacity: str = "256M",
        host: str = "127.0.0.1",
        netns: Namespace | None = None,
        transport: str = "tcp",
        token_file: Path | None = None,
    ):
        argv = [sys.executable, "-m", "strata", "farmem", "serve", "--listen", f"{host}:0", "--capacity", capacity,
                "--transport", transport]  # fmt: skip
        if token_file is not None:
            argv += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(
            netns.wrap(argv) if netns else argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        line = self._readline(60)
        m = re.match(rf"listening on ({re.escape(host)}:\d+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"no 'listening on' line from the server: {line!r} {self.proc.stderr.read()}")
        self.addr = m.group(1)

    def _readline(self, timeout: float) -> str:
        # A deadline only so that a server that never starts fails the test instead of hanging it.
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        return self.proc.stdout.readline() if ready else ""

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err


@pytest.fixture
def server():
    s = Server()
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("far")
    rng = np.random.default_rng(1)
    np.save(d / "edges.npy", rng.integers(0, N, size=(EDGES, 2)))
    out = d / "g.strata"
    convert(ConvertConfig(inputs=[d / "edges.npy"], out=out, num_nodes=N))
    build_grid(store=out, partitions=4)
    return out


@pytest.fixture(scope="module")
def local_ranks(store, tmp_path_factory) -> dict[int, np.ndarray]:
    """Ranks of local runs (every edge block resident) by iteration count."""
    ranks = {}
    for iterations in (10, 40):
        out = tmp_path_factory.mktemp("local")
        s = run(algorithm="pagerank", store=store, iterations=iterations, segment=SEGMENT, out=out)
        assert s["bytes_far"] == 0 and s["far"] is None
        ranks[iterations] = np.load(out / "rank.npy")
    return ranks


@pytest.mark.parametrize(("ratio", "keep"), [(0.7, True), (0.3, False)])
def test_far_run_matches_local(store, local_ranks, server, tmp_path, ratio, keep):
    messages = []
    s = run(
        algorithm="pagerank",
        store=store,
        iterations=10,
        segment=SEGMENT,
        far=server.addr,
        far_ratio=ratio,
        keep_resident=keep,
        out=tmp_path,
        progress=lambda *e: messages.append(e) or True,
    )
    p = s["placement"]
    assert p["far_bytes"] > 0 and s["bytes_far"] == 10 * p["far_bytes"]
    # Segments go far in streaming order until they reach the ratio: it overshoots by less than one
    # segment (whole blocks up to --segment, or one bigger block).
    segment = max(64 << 10, 8 * grid_info(s["grid"])["largest_block_edges"])
    assert p["far_bytes"] - segment < ratio * p["footprint"]
    if not keep:  # the rest of the edge blocks stream from disk
        assert p["disk_bytes"] > 0 and set(p["tiers"]) == {"far", "disk"}
    assert s["far"]["addr"] == server.addr and s["far_failure"] is None
    text = [e[1] for e in messages if e[0] == "message"]
    assert any(t.startswith(f"far memory {server.addr}: ") for t in text)
    assert any("the rest from far memory (" in t and f"far ratio {p['far_ratio']:.2f}" in t for t in text)
    np.testing.assert_allclose(np.load(tmp_path / "rank.npy"), local_ranks[10], rtol=1e-6)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(m["mb_far"] > 0 and m["far_fallbacks"] == 0 for m in metrics)


@needs_netns
def test_far_memory_across_a_veth_link(store, local_ranks, tmp_path):
    """The far-memory server in one network namespace, the run in another, joined by a veth
    pair: the edge blocks cross a real link (not loopback) and the ranks match a local run. A
    server other hosts can reach needs a token, and the run gives it from a file."""
    token, run_dir = token_file(tmp_path / "token", "veth-s3cret"), tmp_path / "run"
    with veth_pair() as (client, far):
        s = Server(host=far.addr, netns=far, token_file=token)
        try:
            proc = subprocess.run(
                client.wrap([sys.executable, "-m", "strata", "run", "pagerank", str(store), "--iterations", "10",
                             "--segment", SEGMENT, "--far", s.addr, "--far-ratio", "0.7", "--out", str(run_dir),
                             "--far-token-file", str(token)]),
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        finally:
            rc, out, err = s.stop(signal.SIGTERM)
    assert proc.returncode == 0, proc.stderr
    assert f"far memory {s.addr}: " in proc.stderr and s.addr.startswith("10.213.")
    np.testing.assert_allclose(np.load(run_dir / "rank.npy"), local_ranks[10], rtol=1e-6)
    summary = json.loads((run_dir / "run.json").read_text())["summary"]
    assert summary["bytes_far"] > 0 and summary["far_failure"] is None
    assert rc == 0 and re.search(r"farmem: served .* ([\d,]+) requests", out), err


def test_losing_far_memory_mid_run_keeps_the_results(store, local_ranks, server, tmp_path):
    messages = []

    def kill_at_third(record):
        if record["iteration"] + 1 == 3:
            server.proc.kill()  # SIGKILL: no goodbye to the client
            server.proc.wait()

    s = run(
        algorithm="pagerank",
        store=store,
        iterations=40,
        segment=SEGMENT,
        far=server.addr,
        far_ratio=0.7,
        out=tmp_path,
        progress=lambda *e: messages.append(e) or True,
        on_iteration=kill_at_third,
    )
    assert s["iterations"] == 40
    assert s["far_failure"] and "far memory unavailable" in s["far_failure"]
    warnings = [e[1] for e in messages if e[0] == "message" and e[1].startswith("warning: far memory stopped serving")]
    assert len(warnings) == 1 and "continuing from the disk copy, results are unaffected" in warnings[0]
    np.testing.assert_allclose(np.load(tmp_path / "rank.npy"), local_ranks[40], rtol=1e-6)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(m["mb_far"] > 0 and m["mb_disk"] == 0 for m in metrics[:3])
    assert all(m["mb_far"] == 0 and m["mb_disk"] > 0 for m in metrics[4:])
    assert s["bytes_disk"] > 0 and json.loads((tmp_path / "run.json").read_text())["summary"]["far_failure"]


def test_cli_far_run_and_sigterm(store, server, tmp_path):
    proc = run_strata("run", "pagerank", store, "--iterations", "3", "--segment", SEGMENT, "--far", server.addr,
                      "--far-ratio", "0.7", "--far-connections", "2", "--out", tmp_path)  # fmt: skip
    assert f"far memory {server.addr}: " in proc.stderr and "2 data connections" in proc.stderr
    assert f"  far memory {server.addr}: 2 connections" in proc.stdout
    assert re.search(r"iter 3 .* far [1-9]\d* MB/s", proc.stderr), proc.stderr
    rc, out, err = server.stop(signal.SIGTERM)
    assert rc == 0, err
    # The counters survive the signal: the run above read its edge blocks from this server.
    m = re.search(rf"farmem: served {server.addr} \(256 MiB\) for .*; stopped by SIGTERM; ([\d,]+) requests, .* "
                  r"received, (\S+) (\S+) served", out)  # fmt: skip
    assert m and int(m[1].replace(",", "")) > 0 and float(m[2]) > 0, out
    assert "Traceback" not in err


def test_cli_far_run_over_io_uring(store, local_ranks, tmp_path):
    """Both sides on the io_uring transport (client receiving into place, server zero-copy
    sends): the ranks equal the all-local run's."""
    s = Server(transport="uring")
    try:
        proc = run_strata("run", "pagerank", store, "--iterations", "10", "--segment", SEGMENT, "--far", s.addr,
                          "--far-ratio", "0.7", "--far-transport", "uring", "--far-chunk", "4M",
                          "--out", tmp_path)  # fmt: skip
    finally:
        rc, _, err = s.stop(signal.SIGTERM)
    assert "data connections over uring" in proc.stderr, proc.stderr
    assert re.search(r"far memory .* chunks of 4\.00 MiB over uring, ping", proc.stdout), proc.stdout
    np.testing.assert_allclose(np.load(tmp_path / "rank.npy"), local_ranks[10], rtol=1e-6)
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert summary["bytes_far"] > 0 and summary["far_failure"] is None and summary["far"]["transport"] == "uring"
    assert rc == 0 and "Traceback" not in err, err


def test_ctrl_c_stops_the_server_cleanly():
    s = Server("16M")
    rc, out, err = s.stop(signal.SIGINT)
    assert rc == 0 and "stopped by Ctrl-C" in out and "Traceback" not in err, (out, err)


def test_serve_refuses_bad_options():
    proc = run_strata("farmem", "serve", "--listen", "7000", check=False)
    assert proc.returncode == 2 and "farmem.serve.listen: expected HOST:PORT" in proc.stderr
    proc = run_strata("farmem", "serve", "--capacity", "0", check=False)
    assert proc.returncode == 2 and "farmem.serve.capacity: must be positive" in proc.stderr
    # It lent 100 TiB it did not have: the kernel would kill it once clients filled it.
    proc = run_strata("farmem", "serve", "--listen", "127.0.0.1:0", "--capacity", "100T", check=False, timeout=60)
    assert proc.returncode == 2 and "capacity 100 TiB is more than this machine's" in proc.stderr, proc.stderr
    proc = run_strata("farmem", "serve", "--transport", "rdma", check=False)
    assert proc.returncode == 2 and "--transport: unknown choice 'rdma' (choices: tcp, uring)" in proc.stderr


def test_serve_refuses_a_port_in_use(server):
    def ready(addr):
        raise AssertionError(f"a second server listens on {addr}")  # stops it: the error propagates

    with pytest.raises(ConfigError, match=server.addr.split(":")[1]):
        serve_farmem(listen=server.addr, capacity="1M", on_ready=ready)


def token_file(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def test_a_server_other_hosts_reach_needs_a_token(tmp_path):
    proc = run_strata("farmem", "serve", "--listen", "0.0.0.0:0", check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert (
        "strata farmem serve: error: listen: 0.0.0.0:0 is not a loopback address; set a token (--token-file or "
        "STRATA_FARMEM_TOKEN) before serving other hosts"
    ) in proc.stderr
    proc = run_strata("farmem", "serve", "--token-file", tmp_path / "missing", check=False, timeout=60)
    assert proc.returncode == 2 and "token file" in proc.stderr and "cannot be read" in proc.stderr


def test_a_run_without_the_servers_token_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.delenv("STRATA_FARMEM_TOKEN", raising=False)
    token = token_file(tmp_path / "token", "far-s3cret")
    s = Server("16M", token_file=token)
    try:
        assert s.proc.poll() is None
        base = ["run", "pagerank", store, "--iterations", "2", "--segment", SEGMENT, "--far", s.addr,
                "--far-connections", "1"]  # fmt: skip
        proc = run_strata(*base, "--out", tmp_path / "none", check=False)
        assert proc.returncode == 2, proc.stderr
        assert (
            f"cannot use the memory server at {s.addr}: far memory refused this client: this server needs a token"
            in proc.stderr
        )
        proc = run_strata(*base, "--out", tmp_path / "wrong", "--far-token", "guess", check=False)
        assert proc.returncode == 2 and "far memory refused this client: wrong token" in proc.stderr
        assert "far-s3cret" not in proc.stderr + proc.stdout and "guess" not in proc.stderr
        assert not (tmp_path / "none").exists() and not (tmp_path / "wrong").exists()
        # The token by environment, then by file; run.json keeps the file's path, never the secret.
        monkeypatch.setenv("STRATA_FARMEM_TOKEN", "far-s3cret")
        summary = run(algorithm="pagerank", store=store, iterations=2, segment=SEGMENT, far=s.addr, far_ratio=0.7,
                      far_connections=1, out=tmp_path / "env")  # fmt: skip
        assert summary["bytes_far"] > 0
        monkeypatch.delenv("STRATA_FARMEM_TOKEN")
        run_strata(*base, "--far-ratio", "0.7", "--out", tmp_path / "file", "--far-token-file", token)
        record = (tmp_path / "file" / "run.json").read_text()
        assert json.loads(record)["config"]["far_token_file"] == str(token) and "far-s3cret" not in record
        run_strata(*base, "--out", tmp_path / "flag", "--far-token", "far-s3cret")
        assert "far-s3cret" not in (tmp_path / "flag" / "run.json").read_text()
    finally:
        rc, out, err = s.stop(signal.SIGTERM)
    assert rc == 0 and "stopped by SIGTERM" in out and "Traceback" not in err, err
