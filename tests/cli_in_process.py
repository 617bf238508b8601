"""``strata ARGS`` run inside the test's own process: for tests about what a command refuses and
says, not about the process (its signals, its start-up), where the interpreter, the extension and
PyTorch are already loaded. A child process would pay their start-up again (~0.4 CPU s a command,
~2.5 more where it imports PyTorch). The command line is the same: the parser, the checks, the
error messages and the exit code that ``strata.cli.main.main`` gives the interpreter."""

from __future__ import annotations

import subprocess

import pytest

from strata.cli.main import main


def _run(args, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # a Rust panic arrives as PanicException, a BaseException
        pytest.fail(f"strata {' '.join(map(str, args))}: {type(e).__name__}: {e}")
    out = capsys.readouterr()
    return code, out.out, out.err


def in_process(args, capsys) -> tuple[int, str]:
    """Runs ``strata ARGS`` in this process: the exit code and the output (stdout then stderr). A
    panic (PanicException) or any other exception the command line would print as a traceback
    fails the test."""
    code, out, err = _run(args, capsys)
    return code, out + err


def strata_in_process(capsys):
    """A runner called like ``conftest.run_strata`` (``check``, a completed process with the exit
    code, stdout and stderr) that runs each command in this process."""

    def run(*args, check: bool = True) -> subprocess.CompletedProcess:
        code, out, err = _run(args, capsys)
        if check and code != 0:
            raise AssertionError(f"strata {' '.join(map(str, args))} failed ({code}):\n{err}")
        return subprocess.CompletedProcess(["strata", *map(str, args)], code, out, err)

    return run


def first_in_child(child, capsys):
    """A runner that runs its first command with ``child`` (``run_strata``: a child process, whose
    exit status and stderr the test checks as a user sees them) and every later one in this
    process: a test of many refusals pays for one start-up, not one each."""
    in_process_run = strata_in_process(capsys)
    started = []

    def run(*args, check: bool = True) -> subprocess.CompletedProcess:
        runner = in_process_run if started else child
        started.append(args)
        return runner(*args, check=check)

    return run
