"""A restart across two machines (docs/distributed.md, "Restarts"): two torchrun agents, each
in a network namespace of its own joined by a veth pair, launched as the two-node example of the
docs says (c10d rendezvous, ``--local-addr``), one rank each and ``--max-restarts 1``. Rank 1
dies of SIGKILL mid-run; only its node's agent counts a restart, yet the restarted group meets,
resumes and ends with the right result. The restart's agreement is strata.torchrun's, the
same for the three engines; it is run with the embeddings (each engine's resume after a
restart has a loopback test of its own: test_embed_dist_faults.py, test_gnn_dist.py,
test_grid_dist_faults.py; its traffic across two namespaces too: test_embed_owner.py,
test_gnn_dist.py, test_grid_dist.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from conftest import REPO, needs, run_strata
from netns import Namespace, needs_netns, veth_pair
from test_embed_dist import SMALL as EMBED_SMALL
from test_embed_dist_faults import EPOCHS, PARTITIONS, assert_one_table_per_epoch
from torchrun_env import free_port, rank_env

pytestmark = needs_netns

#: Every wait on a peer; a group that never meets fails within it, well inside the test's limit.
DIST_TIMEOUT = "30"
#: The whole run's limit in seconds (both attempts), after which both agents are killed.
LIMIT = 300


def _agent(ns: Namespace, node: int, rdzv: str, args: list, env: dict) -> subprocess.Popen:
    """torchrun in ``ns`` as node ``node`` of two, as docs/distributed.md says to launch on a
    machine whose host name resolves to 127.0.0.1 (as it does here): the c10d rendezvous at
    ``rdzv``, hosted by node 0 because it is told so (``is_host``: torchrun recognises the
    endpoint as its own only by the host name), and this node's own address as
    ``--local-addr`` (else the ranks would be sent to meet at 127.0.0.1); one rank, one
    restart. In a session of its own, so that it and its ranks can be killed whole."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv, "--rdzv-conf", f"join_timeout=60,is_host={int(node == 0)}",
        "--local-addr", ns.addr, "--max-restarts", "1", "-m", "strata", *map(str, args),
    ]  # fmt: skip
    return subprocess.Popen(ns.wrap(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=rank_env(ns.device) | env, cwd=REPO, start_new_session=True)  # fmt: skip


def _two_nodes(args: Callable[[int], list], env: dict) -> list[str]:
    """Runs ``strata ARGS(node)`` on two nodes (namespaces ``a``, the rendezvous host, and
    ``b``) with ``env`` added to their environment. Returns each agent's output (stdout
    and stderr) after asserting that both exited 0; every process is killed and both
    namespaces removed whatever happens."""
    with veth_pair() as (a, b):
        rdzv = f"{a.addr}:{free_port()}"
        agents = [_agent(ns, node, rdzv, args(node), env) for node, ns in enumerate((a, b))]
        try:
            deadline = time.monotonic() + LIMIT
            outs = [p.communicate(timeout=max(1, deadline - time.monotonic())) for p in agents]
        finally:
            for p in agents:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
    logs = [out + err for out, err in outs]
    for node, p in enumerate(agents):
        assert p.returncode == 0, f"node {node}: " + logs[node][-6000:]
    return logs


def test_embeddings_resume_after_a_rank_on_the_other_node_is_killed(kg, tmp_path):
    needs("torch")
    run = tmp_path / "run"

    def args(node: int) -> list:
        # One run directory, as a shared file system would give both machines.
        return ["embed", "train", kg, "--run-dir", run, "--partitions", PARTITIONS, "--negative-pool", "resident",
                "--epochs", EPOCHS, "--dist-timeout", DIST_TIMEOUT, *[a for a in EMBED_SMALL if a != "-q"]]  # fmt: skip

    logs = _two_nodes(args, {"STRATA_FAULT": "rank1:embed.dist.e2.started"})
    # Rank 1 died of the fault; the restarted group resumed after epoch 1, the last commit.
    assert "exitcode: -9" in logs[1] and "after epoch 1" in logs[0], logs[0][-3000:] + logs[1][-3000:]
    assert_one_table_per_epoch(run)
    # 400 candidates: a random ranking has an MRR near 0.015; two clean epochs give about 0.4.
    out = run_strata("embed", "eval", run, "--json", "--split", "test").stdout
    assert json.loads(out)["metrics"]["mrr"] > 0.2
