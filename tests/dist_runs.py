"""Several `strata` commands one after another in each rank of one torchrun launch, for the tests
that check what distributed runs compute: a launch costs each process an import of torch (about
2.5 CPU s: 8 for an agent and two ranks), a run on a test's graph a fraction of that.

``torchrun ... tests/dist_runs.py PLAN`` runs, in every rank, each run of ``PLAN`` (a JSON
file) through the CLI's ``main`` in this process: each run joins the group and leaves it, as a
script calling ``strata.grid.run`` twice does. A run's stdout and stderr (Python's and the native
code's: file descriptors 1 and 2) go to ``LOGS/NAME.RANK.out`` and ``.err``, its exit status to
``LOGS/NAME.RANK.rc``; a run that fails does not stop the next. :func:`plan` writes a plan and
:func:`result` reads a run's outcome.

A plan's run is ``{"name": NAME, "argv": [...]}`` (every rank's arguments), or ``"argv"`` a list
of one argument list per rank (``RANK``); ``"memory_from": OTHER`` appends ``--memory`` of the
figure run OTHER's refusal named on this rank (``raise --memory to at least X MiB``) plus 32 MiB.

Faults: ``"kill": {"rank": R, "attempt": A, "function": "MODULE:NAME", "call": N}`` kills rank R
with SIGKILL as its N-th call of ``MODULE.NAME`` begins, in attempt A of a group torchrun restarts
(``TORCHELASTIC_RESTART_COUNT``; one agent counts every attempt). The restarted ranks start the
plan again and skip the runs that succeeded on them, so the killed run resumes first, and one
launch can kill a rank in each of several runs.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

#: The refusal of a budget that cannot hold what torch and gloo took in the rank.
RAISE_MEMORY = r"raise --memory to at least ([\d.]+) MiB"
#: What a run given ``memory_from`` plans beyond the refused figure: the same process measures a
#: little differently each time it joins.
MEMORY_ROOM_MIB = 32


def plan(path: Path, logs: Path, runs: list[dict]) -> Path:
    """Writes the plan of ``runs`` (their logs under ``logs``) to ``path``; returns ``path``."""
    logs.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"logs": str(logs), "runs": runs}, default=str))
    return path


def _file(logs: Path, name: str, rank: int, kind: str) -> Path:
    return logs / f"{name}.{rank}.{kind}"


def result(logs: Path, name: str, rank: int) -> tuple[int | None, str, str]:
    """Run ``name``'s (exit status, stdout, stderr) on ``rank``; the status is None when the
    rank never finished the run (the launch failed before it)."""
    rc, out, err = (_file(logs, name, rank, kind) for kind in ("rc", "out", "err"))
    return (
        int(rc.read_text()) if rc.exists() else None,
        out.read_text() if out.exists() else "",
        err.read_text() if err.exists() else "",
    )


def _argv(run: dict, rank: int, logs: Path) -> list[str]:
    argv = run["argv"]
    if argv and isinstance(argv[0], list):
        argv = argv[rank]
    argv = [str(a) for a in argv]
    if run.get("memory_from"):
        err = _file(logs, run["memory_from"], rank, "err").read_text()
        figures = re.findall(RAISE_MEMORY, err)
        if figures:
            argv += ["--memory", f"{int(max(map(float, figures))) + MEMORY_ROOM_MIB}M"]
    return argv


@contextmanager
def _killed_at(kill: dict | None, rank: int):
    """Within the block, the function ``kill`` names kills this process at its ``call``-th call,
    when ``kill`` is for this rank and this attempt of the group."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if kill is None or kill["rank"] != rank or kill["attempt"] != attempt:
        yield
        return
    module_name, name = kill["function"].split(":")
    module = importlib.import_module(module_name)
    real, calls = getattr(module, name), [0]

    def fatal(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill["call"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(module, name, fatal)
    try:
        yield
    finally:
        setattr(module, name, real)


def _run(argv: list[str], out_path: Path, err_path: Path) -> int:
    """``strata ARGV`` with file descriptors 1 and 2 on ``out_path`` and ``err_path``."""
    from strata.cli.main import main

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's usage errors
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return rc


def main(plan_path: str) -> int:
    spec = json.loads(Path(plan_path).read_text())
    logs, rank = Path(spec["logs"]), int(os.environ["RANK"])
    for run in spec["runs"]:
        name = run["name"]
        done = _file(logs, name, rank, "rc")
        if done.exists() and done.read_text() == "0":  # by this rank, before torchrun restarted the group
            continue
        with _killed_at(run.get("kill"), rank):
            rc = _run(_argv(run, rank, logs), _file(logs, name, rank, "out"), _file(logs, name, rank, "err"))
        done.write_text(str(rc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
