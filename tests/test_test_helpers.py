"""The helpers that let the suite run on parallel pytest-xdist workers: rendezvous ports that no
two test processes share, and the rules that put heavy tests into xdist groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torchrun_env
from conftest import heavy_group

HERE = Path(__file__).resolve().parent

HOLD_A_PORT = """
import random, sys
sys.path.insert(0, sys.argv[1])
random.randrange = lambda n: 0
import torchrun_env
print(torchrun_env.free_port(), flush=True)
sys.stdin.read()
"""


def test_a_port_held_by_a_live_process_is_not_handed_to_another(monkeypatch):
    # Both processes start their search at the same port: the second must pass over the first's.
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_PORT, str(HERE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        held = int(holder.stdout.readline())
        monkeypatch.setattr(torchrun_env.random, "randrange", lambda n: 0)
        mine = torchrun_env.free_port()
    finally:
        holder.communicate(timeout=30)
    assert mine != held
    # Below the kernel's ephemeral range: no socket bound to port 0 can take it meanwhile.
    assert torchrun_env.FIRST_PORT <= min(mine, held) and max(mine, held) < torchrun_env._ephemeral_low()
    assert torchrun_env.free_port() != mine


def item(file: str, fixtures=(), **module_names) -> SimpleNamespace:
    return SimpleNamespace(path=Path(file), module=SimpleNamespace(**module_names), fixturenames=list(fixtures))


def test_heavy_tests_are_grouped_by_name_helper_and_fixture():
    ranks, memory = "heavy-ranks", "heavy-memory"
    assert heavy_group(item("tests/test_embed_dist.py")) == ranks
    assert heavy_group(item("tests/test_grid_dist_faults.py")) == ranks
    assert heavy_group(item("tests/test_serve_netns.py")) == ranks
    assert heavy_group(item("tests/test_grid_program.py", run_session=object())) == ranks
    assert heavy_group(item("tests/test_farmem.py", veth_pair=object())) == ranks
    assert heavy_group(item("tests/test_serve_adversarial.py")) == memory
    assert heavy_group(item("tests/test_wheel.py")) == memory
    assert heavy_group(item("tests/test_memory_bound.py")) == memory
    assert heavy_group(item("tests/test_config.py", fixtures=("tmp_path", "limiter"))) == memory
    # Ranks come first: a torchrun test that also bounds memory never overlaps another group of ranks.
    assert heavy_group(item("tests/test_gnn_dist.py", fixtures=("limiter",))) == ranks
    # A module that only asks for a port (nothing listens on it) is light.
    assert heavy_group(item("tests/test_peer_requests.py", free_port=object())) is None
    assert heavy_group(item("tests/test_grid.py", fixtures=("tmp_path",))) is None
