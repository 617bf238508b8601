"""Stopping on SIGTERM as on Ctrl-C: a command (``strata convert`` under ``timeout`` or a batch
scheduler) and the servers (``strata farmem serve``, ``strata serve``) return through their own
clean-up instead of dying where they stand."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises ``KeyboardInterrupt``, so every clean-up that Ctrl-C
    runs (a partial store removed, a checkpoint kept) runs for it too."""


#: Seconds a command has, after SIGTERM, to notice it: a native call blocked where it never
#: checks for signals (a read from a pipe nobody writes to) is ended without its clean-up then.
NOTICE_SECONDS = 10.0

#: Set once the main thread has taken SIGTERM (its Python handler ran).
_noticed = threading.Event()


def _terminate(signum, frame):
    _noticed.set()
    # A second SIGTERM, while the first one's clean-up runs, ends the process the default way.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


def sigterm_interrupts(notice_seconds: float = NOTICE_SECONDS) -> None:
    """Makes SIGTERM raise :class:`Terminated` in the main thread; native jobs notice it at their
    next progress check, as they notice Ctrl-C. Python runs the handler only once the main thread
    is back in the interpreter, so a thread woken by the signal itself (through the wakeup fd)
    ends the process when it goes unnoticed for ``notice_seconds``: SIGTERM never stops working.
    Left as it is in a rank of a distributed run: torchrun's agent sends SIGTERM to ranks that
    may be blocked in a collective, and restarts the group only once they are gone."""
    if threading.current_thread() is not threading.main_thread() or os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, _terminate)
    threading.Thread(target=_unnoticed_exit, args=(read_fd, notice_seconds), name="strata-sigterm", daemon=True).start()


def _unnoticed_exit(read_fd: int, seconds: float) -> None:
    """Waits for SIGTERM on the wakeup fd (one byte per signal, its number), then exits the
    process if the main thread has not taken it within ``seconds``."""
    while signal.SIGTERM not in (woken := os.read(read_fd, 64)):
        if not woken:
            return
    if not _noticed.wait(seconds):
        os._exit(128 + signal.SIGTERM)


def run_until_stopped(run: Callable[[], object]) -> str:
    """Calls ``run()`` with SIGTERM turned into :class:`Terminated` (on the main thread, the only
    one Python delivers signals to), so the native call returns through its own clean-up;
    returns how it ended: ``server`` (it returned), ``SIGTERM`` or ``interrupt`` (Ctrl-C)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        run()
        return "server"
    except Terminated:
        return "SIGTERM"
    except KeyboardInterrupt:
        return "interrupt"
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
