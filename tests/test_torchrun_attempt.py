"""How the ranks of a torchrun group agree on their attempt (docs/distributed.md, "Restarts"),
and how long joining a group may wait: ranks played by threads against an in-process TCPStore
(as torchrun's agent hosts it), and a rank whose store or peer never comes, under the
timeout it was given."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from conftest import needs
from strata import torchrun
from strata.errors import GroupError
from torchrun_env import free_port, rank_env


@pytest.fixture
def store():
    """A TCPStore server on a free port, as torchrun's agent keeps one across restarts."""
    needs("torch")
    import torch.distributed as td

    server = td.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30))
    yield server


def _agree(server, ranks: list[int], world_size: int, seconds: float = 30) -> dict:
    """Each of ``ranks`` agreeing at once on its own connection to ``server``: the number or
    the error of each."""
    import torch.distributed as td

    out: dict = {}

    def one(rank: int) -> None:
        client = td.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30))
        try:
            out[rank] = torchrun.agree_attempt(client, rank, world_size, time.monotonic() + seconds, "here")
        except GroupError as e:
            out[rank] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 30)
    return out


def test_every_rank_of_each_attempt_gets_the_same_fresh_number(store):
    assert _agree(store, [0, 1, 2], 3) == {0: 0, 1: 0, 2: 0}
    # An attempt that died midway: rank 2 asked, its rank 0 never answered, and rank 1 had
    # only claimed its slot. Neither may confuse the next attempt.
    import torch.distributed as td

    keys = td.PrefixStore(torchrun.AGREEMENT, store)
    torchrun._post(keys, "ask 2 deadbeef")
    assert _agree(store, [2, 0, 1], 3) == {0: 1, 1: 1, 2: 1}
    # The agents restart their ranks at different moments: rank 1 first, rank 0 well after.
    late = threading.Timer(1.0, lambda: results.update(_agree(store, [0], 2)))
    results = {}
    late.start()
    results.update(_agree(store, [1], 2))
    late.join()
    assert results == {0: 2, 1: 2}


def test_a_rank_that_never_arrives_is_named_by_rank_0(store):
    start = time.monotonic()
    out = _agree(store, [0, 1], 3, seconds=2)
    assert out[1] == 0 or isinstance(out[1], GroupError)
    assert isinstance(out[0], GroupError) and "rank 2 did not arrive" in str(out[0])
    assert time.monotonic() - start < 20


def test_rank_0_that_never_arrives_is_named_by_the_others(store):
    out = _agree(store, [1], 2, seconds=2)
    assert isinstance(out[1], GroupError) and "rank 0 did not arrive" in str(out[1])


#: ``torchrun.join`` timed from after torch's import (which alone takes seconds on a loaded
#: machine): prints the seconds it took to fail, then fails as the CLI would.
JOIN = """
import time
from strata import torchrun
torchrun.torch_distributed()
start = time.monotonic()
try:
    torchrun.join(torchrun.environment(), {timeout})
finally:
    print(time.monotonic() - start)
"""


def _join_alone(rank: int, port: int, timeout: int, **env) -> tuple[subprocess.CompletedProcess, float]:
    """``torchrun.join`` in a process of its own as ``rank`` of two, the store at ``port``;
    its result and how long the join took."""
    environ = rank_env() | {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    environ |= {"MASTER_PORT": str(port), **env}
    cmd = [sys.executable, "-c", JOIN.format(timeout=timeout)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * 4 + 120, env=environ)
    return proc, float(proc.stdout.split()[-1])


def test_a_store_that_never_answers_fails_the_rank_within_its_timeout():
    needs("torch")
    # torch's store client alone waits two to three times its timeout (it retries once).
    port = free_port()
    proc, took = _join_alone(1, port, 12, TORCHELASTIC_USE_AGENT_STORE="False")
    assert proc.returncode != 0
    # Loose: not a timing test, but torch's own client would take 24 s or more.
    assert took < 12 + 6, took
    assert f"rank 1: could not join the group through the rendezvous store at 127.0.0.1:{port} within 12 s" in (
        proc.stderr
    ), proc.stderr[-2000:]
    assert "nothing answered" in proc.stderr, proc.stderr[-2000:]


def test_rank_0_names_the_rank_that_never_arrives_within_its_timeout(store):
    # Rank 0 as torchrun starts it: a client of the agent's store, whose rank 1 never starts.
    proc, took = _join_alone(0, store.port, 4, TORCHELASTIC_USE_AGENT_STORE="True")
    assert proc.returncode != 0
    assert "rank 0: could not join the group" in proc.stderr and "within 4 s" in proc.stderr, proc.stderr[-2000:]
    assert "rank 1 did not arrive" in proc.stderr, proc.stderr[-2000:]
    assert took < 4 + 6, took


def test_rank_0_hosting_the_store_names_the_rank_that_never_arrives():
    needs("torch")
    # Launched by hand (no torchrun): rank 0 hosts the store itself.
    proc, took = _join_alone(0, free_port(), 4, TORCHELASTIC_USE_AGENT_STORE="False")
    assert proc.returncode != 0
    assert took < 4 + 6, took
    assert "within 4 s" in proc.stderr and "rank 1 did not arrive" in proc.stderr, proc.stderr[-2000:]
