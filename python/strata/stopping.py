"""Running a blocking server call until SIGTERM or Ctrl-C, shared by ``strata farmem serve`` and
``strata serve``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class _Terminated(Exception):
    pass


def run_until_stopped(run: Callable[[], object]) -> str:
    """Calls ``run()`` with SIGTERM turned into an exception (on the main thread, the only one
    Python delivers signals to), so the native call returns through its own clean-up; returns
    how it ended: ``server`` (it returned), ``SIGTERM`` or ``interrupt`` (Ctrl-C)."""

    def terminate(signum, frame):
        raise _Terminated()

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    try:
        run()
        return "server"
    except _Terminated:
        return "SIGTERM"
    except KeyboardInterrupt:
        return "interrupt"
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
