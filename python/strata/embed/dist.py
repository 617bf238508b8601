"""Distributed embedding training over torch.distributed (docs/distributed.md).

``from_environment`` reads torchrun's variables and, when the world has more than one rank,
joins the group: the rendezvous store at ``MASTER_ADDR:MASTER_PORT``, a gloo process group, and
on rank 0 the bucket scheduler serving the other ranks over the store. The native trainer calls
the ``Group``'s methods (``acquire``, ``release``, ``sync``, ``barrier``, ``gather``,
``traffic``); every wait on another rank is bounded by the run's ``dist_timeout``.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta

from ..errors import GroupError
from ..torchrun import (
    Environment,
    PeerRequests,
    attempt,
    collective,
    connect_store,
    environment,
    first_line,
    follower,
    join,
    leave,
    process_bytes,
    torch_distributed,
)
from . import dist_policy

__all__ = ["Group", "follower", "from_environment"]


def from_environment(
    timeout: int, environ=os.environ, *, policy: str = "affinity", device: str = "cpu"
) -> Group | None:
    """The group this process belongs to, or None for a single-process run (no ``WORLD_SIZE``,
    or ``WORLD_SIZE=1``); rank 0 schedules buckets with ``dist_policy.POLICIES[policy]``, and
    a rank training on ``device`` ``cuda:N`` joins over NCCL (gloo otherwise). Raises
    ``ConfigError`` naming a missing or malformed variable."""
    env = environment(environ)
    return None if env is None else Group(env.rank, env.world_size, env.addr, env.port, timeout, policy, device)


class _Scheduler:
    """Rank 0's bucket scheduler: the policy's state, served to the other ranks through the
    store (``PeerRequests``), and called directly by rank 0."""

    def __init__(self, group: Group, policy: str):
        self.group = group
        self.grant = dist_policy.POLICIES[policy]
        self.lock = threading.Lock()
        self.epoch = -1
        self.state: dist_policy.EpochState | None = None
        self.server = PeerRequests(
            "strata-bucket-scheduler",
            group.connect,
            "sched/req",
            range(1, group.world_size),
            self._answer,
            group.timeout,
        )

    @property
    def failure(self) -> BaseException | None:
        return self.server.failure

    def handle(self, rank: int, request: dict) -> dict:
        """One request of ``rank`` (``acquire`` or ``release``), answered as a dict."""
        with self.lock:
            epoch = request["epoch"]
            if request["op"] == "acquire" and epoch > self.epoch:
                self.epoch, self.state = epoch, dist_policy.EpochState(request["partitions"], seed=epoch)
            elif epoch != self.epoch:
                raise ValueError(
                    f"rank {rank} asks about epoch {epoch + 1} while the group trains epoch {self.epoch + 1}"
                )
            if request["op"] == "acquire" and request["partitions"] != self.state.partitions:
                raise ValueError(
                    f"rank {rank} has {request['partitions']} partitions, the epoch's first request "
                    f"{self.state.partitions}: every rank must train the same partitioning"
                )
            if request["op"] == "release":
                dist_policy.release(self.state, rank, request["parts"])
                return {}
            g = self.grant(self.state, rank, set(request["held"]), request["capacity"])
            return {"kind": g.kind, "bucket": list(g.bucket), "evict": list(g.evict), "written": list(g.written)}

    def _answer(self, store, r: int, k: int, text: str) -> None:
        try:
            reply = self.handle(r, json.loads(text))
        except (ValueError, KeyError) as e:
            reply = {"error": str(e)}
        data = json.dumps(reply)
        store.set(f"sched/rep/{r}/{k}", data)
        with self.lock:
            self.group.received += len(text)
            self.group.sent += len(data)

    def close(self) -> None:
        self.server.close(self.group.store)


class Group:
    """This process's rank in a distributed run (``rank``, ``world_size``), joined on creation:
    the rendezvous store, a process group (gloo; NCCL for a rank on ``cuda:N``), and rank 0's
    scheduler (with the named policy of ``dist_policy.POLICIES``). ``close`` leaves it."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        addr: str,
        port: int,
        timeout: int,
        policy: str = "affinity",
        device: str = "cpu",
    ):
        self.torch, td = torch_distributed()
        self.td = td
        self.rank, self.world_size = rank, world_size
        self.address = f"{addr}:{port}"
        self.timeout = timeout
        self.sent = self.received = 0
        self.seq = 0
        wait = timedelta(seconds=timeout)
        # A rank on a GPU joins over NCCL, as PyTorch users' GPU ranks do; what it exchanges
        # (relation rows, reports) is staged through its device. gloo otherwise (the CPU
        # engine, the CPU twin).
        self.device = self.torch.device(device) if device.startswith("cuda") else None
        self.backend = "gloo" if self.device is None else "nccl"
        if self.device is not None:
            # NCCL's object collectives stage through the current device.
            self.torch.cuda.set_device(self.device)
        store = join(Environment(rank, world_size, addr, port), timeout, self.backend)
        #: How many times torchrun restarted the group before this attempt (0: the first), as
        #: the ranks agreed when they joined.
        self.restart = attempt()
        # torchrun's agent keeps one store across restarts: our keys are under the attempt's
        # number, or a restarted rank would meet the keys of the attempt before it.
        self.store = td.PrefixStore(f"strata/{self.restart}/", store)
        self.store.set_timeout(wait)
        self.scheduler = _Scheduler(self, policy) if rank == 0 else None
        #: This process's anonymous memory now that torch is imported and the group started
        #: (None where /proc does not tell): the rank's plan counts it beside the engine's.
        self.anon_bytes = process_bytes("RssAnon")

    def __repr__(self) -> str:
        return f"Group(rank {self.rank} of {self.world_size}, {self.backend}, store {self.address})"

    def connect(self):
        """A connection of its own to the rendezvous store, under this attempt's keys (a
        server thread blocks in its waits without holding ``store``)."""
        return connect_store(self.address, f"strata/{self.restart}/", self.timeout)

    def _ask(self, request: dict, what: str) -> dict:
        if self.scheduler is not None:
            if self.scheduler.failure is not None:
                raise GroupError(f"rank 0: the bucket scheduler stopped: {self.scheduler.failure}")
            try:
                return self.scheduler.handle(0, request)
            except (ValueError, KeyError) as e:
                raise GroupError(f"rank 0: the bucket scheduler refused a request: {e}") from None
        k = self.seq
        self.seq += 1
        data = json.dumps(request)
        key = f"sched/rep/{self.rank}/{k}"
        try:
            self.store.set(f"sched/req/{self.rank}/{k}", data)
            self.sent += len(data)
            self.store.wait([key], timedelta(seconds=self.timeout))
            text = self.store.get(key)
            self.store.delete_key(key)
        except (RuntimeError, TimeoutError) as e:
            raise GroupError(
                f"rank {self.rank}: no answer from the bucket scheduler on rank 0 (store at {self.address}) "
                f"within {self.timeout} s (dist_timeout) {what}: {first_line(e)}"
            ) from None
        self.received += len(text)
        reply = json.loads(text)
        if "error" in reply:
            raise GroupError(f"rank {self.rank}: the bucket scheduler refused a request: {reply['error']}")
        return reply

    def acquire(self, epoch: int, held: list[int], partitions: int, capacity: int):
        """The next grant: ``(kind, (a, b), evict, written)``."""
        r = self._ask(
            {"op": "acquire", "epoch": epoch, "held": held, "partitions": partitions, "capacity": capacity},
            f"while asking for a bucket of epoch {epoch + 1}",
        )
        return r["kind"], tuple(r["bucket"]), r["evict"], r["written"]

    def release(self, epoch: int, parts: list[int]) -> None:
        """``parts`` are written back and no longer held."""
        self._ask(
            {"op": "release", "epoch": epoch, "parts": parts},
            f"while releasing partitions {parts} in epoch {epoch + 1}",
        )

    def _collective(self, what: str, call):
        return collective(what, call, self.rank, self.timeout, self.address)

    def sync(self, values: bytes, done: bool):
        """One relation round: the float32 ``values`` summed over the ranks, and whether every
        rank said ``done``."""
        torch = self.torch
        t = torch.empty(len(values) // 4 + 1, dtype=torch.float32)
        if values:  # a model without relation parameters (dot) still syncs its done flag
            t[:-1] = torch.frombuffer(bytearray(values), dtype=torch.float32)
        t[-1] = 1.0 if done else 0.0
        if self.device is not None:
            t = t.to(self.device)
        self._collective("a relation all-reduce", lambda: self.td.all_reduce(t))
        t = t.cpu()
        self.sent += t.numel() * 4
        self.received += t.numel() * 4
        return t[:-1].numpy().tobytes(), int(t[-1].item()) == self.world_size

    def barrier(self, what: str) -> None:
        """Waits for every rank at the point named ``what``."""
        wait = timedelta(seconds=self.timeout)
        if self.device is not None:
            # NCCL has no monitored barrier; the group's timeout bounds this one.
            self._collective(f"the barrier '{what}'", lambda: self.td.barrier(device_ids=[self.device.index]))
            return
        self._collective(f"the barrier '{what}'", lambda: self.td.monitored_barrier(timeout=wait, wait_all_ranks=True))

    def gather(self, mine: str) -> list[str]:
        """Every rank's ``mine`` on rank 0, in rank order; empty on the others."""
        out = [None] * self.world_size if self.rank == 0 else None
        self._collective("gathering the epoch's reports", lambda: self.td.gather_object(mine, out, dst=0))
        self.sent += len(mine) if self.rank else 0
        if self.rank:
            return []
        self.received += sum(len(s) for s in out[1:])
        return list(out)

    def broadcast(self, text: str) -> str:
        """Rank 0's ``text`` on every rank (owner mode's commit of an epoch)."""
        box = [text]
        self._collective("broadcasting rank 0's commit", lambda: self.td.broadcast_object_list(box, src=0))
        if self.rank:
            self.received += len(box[0])
        else:
            self.sent += len(text) * (self.world_size - 1)
        return box[0]

    def traffic(self) -> tuple[int, int]:
        """Bytes sent to and received from the other ranks so far."""
        return self.sent, self.received

    def close(self) -> None:
        """Stops the scheduler (rank 0) and leaves the process group."""
        if self.scheduler is not None:
            self.scheduler.close()
        leave()
