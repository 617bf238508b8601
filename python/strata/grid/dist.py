"""Distributed graph analytics over torch.distributed (docs/distributed.md, "Analytics").

Under torchrun, ``join`` joins the group (gloo, every wait bounded by ``dist_timeout``) and
returns an ``Exchange``: the collectives the grid engine calls between passes
(``all_gather`` of each rank's changed vertex values, ``all_reduce`` of a few figures,
``barrier``, ``traffic``). The engine decides what to send; this class moves bytes and counts
them as they go on the wire.
"""

from __future__ import annotations

from datetime import timedelta

from .. import torchrun


def join(timeout: int, options: dict | None = None) -> Exchange | None:
    """This process's rank of a distributed run (from torchrun's environment), or None when it
    runs alone; ``options`` are the run's settings every rank must share (compared with the
    grids' digests before the first pass, :meth:`Exchange.same_data`). Raises ``ConfigError``
    for a malformed environment, ``GroupError`` naming the rendezvous address when the group
    cannot be joined within ``timeout`` seconds, and ``MissingDependencyError`` without torch."""
    env = torchrun.environment()
    if env is None:
        return None
    torchrun.join(env, timeout)
    return Exchange(env, timeout, torchrun.process_bytes("RssAnon"), options or {})


class Exchange:
    """The collectives of a distributed grid run over a joined group (``rank``,
    ``world_size``). Bytes are counted as sent and received on the wire: an all-gather sends
    this rank's part, padded to the longest, to each other rank and receives theirs."""

    def __init__(
        self, env: torchrun.Environment, timeout: int, anon_bytes: int | None = None, options: dict | None = None
    ):
        self.torch, self.td = torchrun.torch_distributed()
        self.rank, self.world_size = env.rank, env.world_size
        #: torchrun's restarts of the group before this attempt, as the ranks agreed when they
        #: joined (a restarted run resumes from its last checkpoint).
        self.restart = torchrun.attempt()
        #: This process's anonymous memory once torch is imported and the group started
        #: (None where /proc does not tell): the rank's plan counts it as torch + gloo.
        self.anon_bytes = anon_bytes
        self.address, self.timeout = env.address, timeout
        self.options = options or {}
        self.sent = self.received = 0

    def __repr__(self) -> str:
        return f"Exchange(rank {self.rank} of {self.world_size}, store {self.address})"

    def _collective(self, what: str, call):
        return torchrun.collective(what, call, self.rank, self.timeout, self.address)

    def _count(self, nbytes: int) -> None:
        self.sent += nbytes * (self.world_size - 1)
        self.received += nbytes * (self.world_size - 1)

    def all_gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        torch, td = self.torch, self.td
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        mine = torch.tensor([len(data)], dtype=torch.int64)
        self._collective("the sizes of an exchange", lambda: td.all_gather(sizes, mine))
        self._count(8)
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        if longest == 0:
            return [b""] * self.world_size
        padded = torch.zeros(longest, dtype=torch.uint8)
        if data:
            padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        self._collective("an exchange of vertex values", lambda: td.all_gather(parts, padded))
        self._count(longest)
        return [p[:n].numpy().tobytes() for p, n in zip(parts, lengths, strict=True)]

    def all_reduce(self, data: bytes, op: str) -> bytes:
        """The float64 values ``data`` combined over the ranks with ``op`` (``sum`` or ``min``)."""
        torch, td = self.torch, self.td
        ops = {"sum": td.ReduceOp.SUM, "min": td.ReduceOp.MIN}
        t = torch.frombuffer(bytearray(data), dtype=torch.float64)
        self._collective(f"an all-reduce ({op})", lambda: td.all_reduce(t, op=ops[op]))
        self._count(len(data))
        return t.numpy().tobytes()

    def barrier(self, what: str) -> None:
        """Waits for every rank at the point named ``what``."""
        wait = timedelta(seconds=self.timeout)
        self._collective(f"the barrier '{what}'", lambda: self.td.monitored_barrier(timeout=wait, wait_all_ranks=True))

    def same_data(self, grid: str, digest: str) -> None:
        """Fails on every rank unless every rank runs on the same grid (``digest``, its content
        digest) with the same options (see :func:`strata.torchrun.same_data`)."""
        torchrun.same_data(self.rank, self.timeout, self.address, grid, digest, self.options)

    def traffic(self) -> tuple[int, int]:
        """Bytes sent to and received from the other ranks so far."""
        return self.sent, self.received

    def close(self) -> None:
        """Leaves the group."""
        torchrun.leave()
