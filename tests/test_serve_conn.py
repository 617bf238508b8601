"""``strata serve``'s connections: silent or stalled clients are closed after
``--idle-timeout``, and the token can come from a file or the environment, never the
server's command line."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from conftest import run_strata
from serve_process import server_env, serving
from strata.errors import ConfigError
from strata.serve import Client
from strata.serve.client import TOKEN_ENV, ServiceError, resolve_token

#: Stalled connections a test opens (bounded: each is a socket of the test and a task of the server).
STALLED = 50
#: The HTTP/2 connection preface every gRPC client starts with.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes ``sock`` (reads until EOF or a reset; False when the
    monotonic ``deadline`` passes first)."""
    sock.settimeout(max(deadline - time.monotonic(), 0.1))
    try:
        while sock.recv(4096):
            pass  # the server's SETTINGS and pings, if it got that far
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_silent_and_stalled_connections_are_closed(tmp_path):
    with serving(tmp_path / "state", "--idle-timeout", "1") as server:
        host, port = server.addr.rsplit(":", 1)
        # Nothing at all, half a preface, and a preface with half a SETTINGS frame header:
        # each stops there and never answers a ping.
        stalls = [b"", PREFACE[:10], PREFACE + b"\x00\x00"]
        socks = []
        try:
            for i in range(STALLED):
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(stalls[i % len(stalls)])
                socks.append(s)
            # Generous: the server closes them after about a second.
            deadline = time.monotonic() + 60
            still_open = [i for i, s in enumerate(socks) if not closed_by_peer(s, deadline)]
        finally:
            for s in socks:
                s.close()
        assert still_open == [], f"connections {still_open} were not closed"
        with server.client() as c:  # the server still answers
            assert c.status()["graphs"] == []
        assert server.stop() == 0, server.stderr


def test_a_client_that_answers_pings_keeps_its_connection(tmp_path):
    with serving(tmp_path / "state", "--idle-timeout", "0.5") as server, server.client() as c:
        c.status()
        states = []

        def record(state):
            states.append(state.name)

        c._channel.subscribe(record)
        # Idle for several timeouts: the server's pings are answered, so the channel stays
        # connected (a closed connection would take it to IDLE).
        time.sleep(2.0)
        assert c.status()["graphs"] == []
        c._channel.unsubscribe(record)
        assert set(states) == {"READY"}, states
        assert server.stop() == 0, server.stderr


def test_idle_timeout_must_be_positive(tmp_path):
    proc = run_strata("serve", "--idle-timeout", "0", "--state-dir", tmp_path / "s", check=False, env=server_env())
    assert proc.returncode == 2
    assert "serve.idle_timeout: must be >= 0.01, got 0" in proc.stderr, proc.stderr


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def token_file(path: Path, token: str, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def assert_only_token_works(addr: str, secret: str, tmp_path: Path) -> None:
    """The server at ``addr`` answers ``secret`` from a file and from the environment, and
    refuses a wrong one from either."""
    with Client(addr, token_file=token_file(tmp_path / "right", secret)) as c:
        assert c.status()["graphs"] == []
    with Client(addr, token_file=token_file(tmp_path / "wrong", secret + "x")) as c:
        with pytest.raises(ServiceError) as e:
            c.status()
        assert e.value.code == "UNAUTHENTICATED"
    for token, code in ((secret, 0), ("wrong", 1)):
        proc = run_strata("serve", "status", "--address", addr, check=False, env=server_env(**{TOKEN_ENV: token}))
        assert proc.returncode == code, proc.stderr
    proc = run_strata("serve", "status", "--address", addr, "--token-file", tmp_path / "right", env=server_env())
    assert "strata serve on" in proc.stdout


def test_the_token_from_a_file_stays_off_the_command_line(tmp_path):
    secret = "file-s3cret-token"
    path = token_file(tmp_path / "token", secret)
    with serving(tmp_path / "state", "--token-file", path) as server:
        assert "(token required)" in server.output
        assert secret not in cmdline(server.proc.pid)
        assert_only_token_works(server.addr, secret, tmp_path)
        assert server.stop() == 0, server.stderr
    # stderr is read by a thread: only after stop() has joined it is all of it there.
    assert secret not in server.output + server.stderr
    assert "warning" not in server.stderr


def test_the_token_from_the_environment_stays_off_the_command_line(tmp_path):
    secret = "env-s3cret-token"
    with serving(tmp_path / "state", env={TOKEN_ENV: secret}) as server:
        assert "(token required)" in server.output
        assert secret not in cmdline(server.proc.pid)
        assert_only_token_works(server.addr, secret, tmp_path)
        assert server.stop() == 0, server.stderr


def test_a_token_file_others_can_read_is_warned_about(tmp_path):
    path = token_file(tmp_path / "token", "shared-s3cret", mode=0o644)
    with serving(tmp_path / "state", "--token-file", path) as server:
        assert server.stop() == 0, server.stderr
    # Read after stop(), which joins the thread that collects stderr.
    assert f"token file {path} can be read by other users (mode 644)" in server.stderr
    assert "shared-s3cret" not in server.stderr


def test_bad_token_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert resolve_token(token_file=token_file(tmp_path / "t", "abc")) == "abc"
    (tmp_path / "crlf").write_bytes(b"abc\r\n")
    assert resolve_token(token_file=tmp_path / "crlf") == "abc"
    cases = {
        tmp_path / "missing": "cannot be read",
        token_file(tmp_path / "empty", ""): "expected one line",
        token_file(tmp_path / "two", "a\nb"): "expected one line",
        Path("/dev/zero"): "longer than 4096 bytes",
    }
    for path, why in cases.items():
        with pytest.raises(ConfigError, match=why):
            resolve_token(token_file=path)
    with pytest.raises(ConfigError, match="not both"):
        resolve_token("abc", tmp_path / "t")
    proc = run_strata("serve", "--token-file", tmp_path / "two", "--state-dir", tmp_path / "s", check=False)
    assert proc.returncode == 2 and "expected one line" in proc.stderr, proc.stderr
    assert os.environ.get(TOKEN_ENV) is None


def test_a_deadline_that_cannot_be_met_is_refused_before_calling():
    """A timeout of 0 or less, infinity, or past about 9.2e9 s (gRPC's deadline in int64
    nanoseconds wraps) reached gRPC as a deadline already missed: every call was
    "DEADLINE_EXCEEDED", as if the server were slow. A message limit past a C int
    raised OverflowError; True passed as 1."""
    # 1e10 s: gRPC's deadline in int64 nanoseconds wrapped into the past.
    for timeout in (0, -1, float("nan"), float("inf"), 1e10, True, "5"):
        with pytest.raises(ConfigError, match="timeout must be a finite positive number of seconds"):
            Client("127.0.0.1:1", timeout=timeout)
    for wait in (-1, float("inf"), float("nan"), True):
        with pytest.raises(ConfigError, match="wait must be a finite number of seconds, 0 or more"):
            Client("127.0.0.1:1").result(1, wait=wait)
    for size in (0, True, 1 << 31, 1.5):
        with pytest.raises(ConfigError, match="max_message_bytes must be an integer from 1 to 2147483647"):
            Client("127.0.0.1:1", max_message_bytes=size)
    for timeout, said in (("0", "serve.status.timeout: must be a finite positive"), ("inf", "a finite number")):
        proc = run_strata("serve", "status", "--address", "127.0.0.1:1", "--timeout", timeout, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and said in proc.stderr, proc.stderr
