"""The helpers that let the suite run on parallel pytest-xdist workers: rendezvous ports that no
two test processes share, and the rules that put heavy tests into xdist groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torchrun_env
from conftest import heavy_group
from netns import veth_pair
from torchrun_env import rank_env, run_session, wait_all

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


# Stand-ins for test functions and fixtures: the grouping reads the names their code uses and
# never calls them.
def _pure():
    return sum(range(3))


def _starts_a_process():
    return subprocess.run(["true"])


def _starts_two_processes():
    procs = [subprocess.Popen(["true"]) for _ in range(2)]
    return wait_all(procs, 1)


def _starts_side_by_side():
    return [subprocess.Popen(["true"]) for _ in range(2)]


def _torchrun():
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "x.py"])


def _starts_ranks_by_hand():
    return [subprocess.Popen([sys.executable, "x.py"], env=rank_env()) for _ in range(2)]


def _a_lone_rank():
    return subprocess.run([sys.executable, "x.py"], env=rank_env() | {"RANK": "1", "WORLD_SIZE": "2"})


def _launch():
    return run_session(["torchrun"], {}, timeout=1)


def _calls_the_launcher():
    return _launch()


class _Ranks:
    def start(self):
        return _torchrun()


def _uses_the_class():
    return _Ranks().start()


def _makes_a_link():
    with veth_pair() as pair:
        return pair


def _asks_for_a_port():
    return torchrun_env.free_port()


def item(file: str, function=_pure, **fixtures) -> SimpleNamespace:
    """A collected test as heavy_group reads it: its file, function and fixtures' functions."""
    defs = {name: [SimpleNamespace(func=f)] for name, f in fixtures.items()}
    return SimpleNamespace(path=Path(file), function=function, fixturenames=["tmp_path", *fixtures],
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=defs))  # fmt: skip


def test_heavy_tests_are_grouped_by_what_they_reach():
    ranks, memory = "heavy-ranks", "heavy-memory"
    # A torchrun command line, or the helpers that start or wait on several processes, make a
    # test heavy wherever it is: through module functions, a class's methods, or a fixture.
    assert heavy_group(item("tests/test_grid_program.py", _torchrun)) == ranks
    assert heavy_group(item("tests/test_grid_program.py", _calls_the_launcher)) == ranks
    assert heavy_group(item("tests/test_grid_dist_faults.py", _launch)) == ranks
    assert heavy_group(item("tests/test_farmem.py", _uses_the_class)) == ranks
    assert heavy_group(item("tests/test_farmem.py", _pure, link=_makes_a_link)) == ranks
    assert heavy_group(item("tests/test_torchrun_attempt.py", _starts_two_processes)) == ranks
    # In a file named for ranks, namespaces or faults, processes started side by side are heavy...
    assert heavy_group(item("tests/test_embed_dist.py", _starts_side_by_side)) == ranks
    assert heavy_group(item("tests/test_serve_netns.py", store=_starts_side_by_side)) == ranks
    # ... and one process at a time is light: a CLI run, a lone rank waiting for its peer, or a
    # test that runs in the test's process.
    assert heavy_group(item("tests/test_embed_dist.py", _starts_a_process)) is None
    assert heavy_group(item("tests/test_gnn_dist.py", _a_lone_rank)) is None
    assert heavy_group(item("tests/test_embed_dist.py", _pure)) is None
    assert heavy_group(item("tests/test_grid_program.py", _starts_side_by_side)) is None
    # Elsewhere, processes started by hand with a rank's environment are ranks side by side.
    assert heavy_group(item("tests/test_gnn_features.py", _starts_ranks_by_hand)) == ranks
    assert heavy_group(item("tests/test_serve_adversarial.py")) == memory
    assert heavy_group(item("tests/test_wheel.py")) == memory
    assert heavy_group(item("tests/test_memory_bound.py")) == memory
    assert heavy_group(item("tests/test_config.py", limiter=_pure)) == memory
    # Ranks come first: a torchrun test that also bounds memory never overlaps another group of ranks.
    assert heavy_group(item("tests/test_gnn_dist.py", _torchrun, limiter=_pure)) == ranks
    # A test that only asks for a port (nothing listens on it) is light.
    assert heavy_group(item("tests/test_peer_requests.py", _asks_for_a_port)) is None
    assert heavy_group(item("tests/test_grid.py", _starts_a_process)) is None
