"""A ``strata serve`` child process for the serve tests (tests/test_serve*.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from strata.serve import Client
from strata.serve.client import TOKEN_ENV


def server_env(**extra: str) -> dict:
    """The environment of a server: no token unless a test passes one (in ``extra``)."""
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    return {**env, **extra}


class Server:
    """A ``strata serve`` child process, started on ``state_dir`` with ``args``; ``addr`` once
    it prints ``listening on HOST:PORT``. Its stdout is collected in ``lines``. With ``wrap``
    (e.g. ``[memlimit, LIMIT]``) the server runs as that command's child; ``env`` adds to its
    environment (:func:`server_env`)."""

    def __init__(
        self,
        state_dir: Path,
        *args,
        listen: str = "127.0.0.1:0",
        ready_timeout: float = 60.0,
        wrap: Sequence[str | os.PathLike] = (),
        env: dict[str, str] | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.wrapped = bool(wrap)
        cmd = [*map(str, wrap), sys.executable, "-m", "strata", "serve", *map(str, args), "--listen", listen]
        cmd += ["--state-dir", str(state_dir)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server_env(**(env or {}))
        )
        self.addr: str | None = None
        self.lines: list[str] = []
        self.err: list[str] = []
        self._ready = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True),
        ]
        for t in self._threads:
            t.start()
        if not self._ready.wait(ready_timeout) or self.addr is None:
            self.kill()
            raise AssertionError(f"strata serve did not start:\n{self.output}\n{self.stderr}")

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.addr is None and line.startswith("listening on "):
                self.addr = line.split()[2]
                self._ready.set()
        self._ready.set()  # EOF: the server exited (maybe before it listened)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        """What the server wrote to stderr so far; complete only after :meth:`stop` or
        :meth:`kill`, which join the thread that reads it."""
        return "".join(self.err)

    def after_listening(self) -> str:
        """The stdout printed after the ``listening on`` line (the stop summary)."""
        i = next(i for i, line in enumerate(self.lines) if line.startswith("listening on "))
        return "".join(self.lines[i + 1 :])

    def client(self, **kw) -> Client:
        return Client(self.addr, **kw)

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=10)

    def _server_pid(self) -> int | None:
        """The server's process id: the child's, or its own child's when wrapped."""
        if not self.wrapped:
            return self.proc.pid
        pid = self.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children")
        try:
            return int(children.read_text().split()[0])
        except (OSError, IndexError):
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Sends ``sig`` (to the server itself when wrapped) and waits for the exit; returns the
        exit status (the wrapper's, which passes the server's on)."""
        pid = self._server_pid() if self.proc.poll() is None else None
        if pid is not None:
            os.kill(pid, sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"strata serve did not stop within {timeout} s after signal {sig}") from None
        self._join()
        return rc

    def kill(self) -> None:
        """SIGKILL (no-op when it already exited)."""
        if self.proc.poll() is None:
            pid = self._server_pid()
            if pid is not None and pid != self.proc.pid:
                os.kill(pid, signal.SIGKILL)
            self.proc.kill()
        self.proc.wait()
        self._join()


@contextmanager
def serving(state_dir: Path, *args, **kw):
    """A server for the ``with`` block, killed when the block fails or forgets to stop it."""
    server = Server(state_dir, *args, **kw)
    try:
        yield server
    finally:
        server.kill()
