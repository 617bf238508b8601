"""SIGTERM (``timeout``, a batch scheduler, ``kill``) stops a command as Ctrl-C does: through its
clean-up, with exit status 143. It left a half-written ``OUT.partial-PID`` store behind before.
A command blocked where it never checks for signals still ends, without its clean-up."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np


def strata_process(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "strata", *map(str, args)], stderr=subprocess.PIPE, text=True, **kwargs
    )


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> str:
    """The first stderr line holding ``needle``; the deadline only turns a hang into a failure."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
        line = proc.stderr.readline()
        if needle in line or not line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout} s")


def test_sigterm_stops_training_through_its_clean_up_and_the_run_resumes(kg, tmp_path):
    run = tmp_path / "run"
    proc = strata_process("embed", "train", kg, "--run-dir", run, "--epochs", "1000", "--dim", "16")
    assert "epoch 1/1000" in wait_for_line(proc, "epoch 1/1000")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "strata embed train: terminated (SIGTERM)" in err and "Traceback" not in err
    resumed = strata_process("embed", "train", kg, "--run-dir", run, "--epochs", "1000", "--dim", "16")
    assert "resuming" in wait_for_line(resumed, "resuming")
    resumed.kill()
    resumed.communicate(timeout=60)


def test_sigterm_during_a_conversion_removes_its_partial_store(tmp_path):
    """The signal arrives while the converter streams (sent by its own progress hook, so it
    lands mid-conversion every time): the native job notices it at its next progress check."""
    edges = tmp_path / "e.npy"
    np.save(edges, np.random.default_rng(0).integers(0, 50_000, size=(400_000, 2)))
    script = textwrap.dedent(f"""
        import os, signal, sys
        from strata.config import ConvertConfig
        from strata.convert import convert
        from strata.stopping import Terminated, sigterm_interrupts

        sigterm_interrupts()
        sent = []

        def progress(event, *args):
            if event == "update" and not sent:
                sent.append(os.kill(os.getpid(), signal.SIGTERM))
            return True

        try:
            convert(ConvertConfig(inputs=[{str(edges)!r}], out={str(tmp_path / "g.strata")!r},
                                  io_chunk="64K"), progress)
        except Terminated:
            sys.exit(143)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy"]


def test_sigterm_unnoticed_by_a_blocked_call_still_ends_the_process(tmp_path):
    """The converter blocks reading a FIFO nobody writes to: the main thread never returns to
    Python, and the process ends ten seconds after the signal, as it would have at once before."""
    fifo = tmp_path / "edges.txt"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the FIFO open: reads block instead of ending
    try:
        proc = strata_process("convert", fifo, "--out", tmp_path / "g.strata")
        time.sleep(1.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
        waited = time.monotonic() - sent
    finally:
        os.close(writer)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert waited < 60, waited


def test_ranks_of_a_distributed_run_keep_the_default_sigterm():
    script = "import signal; from strata.stopping import sigterm_interrupts; sigterm_interrupts(); " \
             "print(repr(signal.getsignal(signal.SIGTERM)))"  # fmt: skip
    for world, expected in (("2", "Handlers.SIG_DFL"), ("1", "_terminate")):
        env = {**os.environ, "WORLD_SIZE": world}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
        assert expected in out.stdout, (world, out.stdout, out.stderr)
