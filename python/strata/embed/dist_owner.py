"""Owner mode's partition transport (docs/distributed.md, ``dist_storage = "owners"``).

Partition ``p`` is owned by rank ``p mod W``, which keeps it in its own run directory. A rank
that trains ``p`` without owning it asks the owner for it and sends it back when it evicts it:

- a request is a key in the group's c10d store, ``part/req/OWNER/RANK/K`` (JSON: read or write,
  the epoch, the partition, its size), ``K`` counting RANK's requests to OWNER;
- the region's bytes (embeddings + optimizer state, as in the table file) travel by
  ``isend``/``irecv`` in chunks of at most 64 MiB on a gloo group of their own, so they never
  interleave with the relation all-reduce on the default group; a write is acknowledged by a
  one-element message once the owner has written it;
- each rank runs owner server threads (``PeerRequests``, one blocking on each other rank's
  next request key) that answer from the tables the trainer handed it for the epoch
  (``serve``), through the native I/O engine, one answer at a time.

Every wait is bounded by the run's ``dist_timeout``; a rank that gets no answer names the
owner's rank and address and what it was doing.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import timedelta

from ..errors import GroupError
from ..torchrun import PeerRequests, first_line

#: Largest piece of a region in one point-to-point message.
CHUNK = 64 << 20
#: Pieces one transfer may have (regions up to 64 GiB): tags leave room for them.
MAX_CHUNKS = 1024
#: Tags wrap here (torch passes them as a C int); transfers that far apart are long finished.
TAG_SPACE = 1 << 30
READ, WRITE, ACK = 0, 1, 2


def owner_of(p: int, world_size: int) -> int:
    """The rank owning partition ``p`` (the same rule as ``owner_of`` in strata-embed's ``train/dist.rs``)."""
    return p % world_size


def tag(k: int, kind: int, chunk: int) -> int:
    """The point-to-point tag of piece ``chunk`` of the ``kind`` message of request ``k``; a
    pair of ranks never has two messages in flight with one tag."""
    return ((k * 3 + kind) * MAX_CHUNKS + chunk) % TAG_SPACE


def _local_address(master: str, port: int) -> str:
    """The address this host uses to reach ``master`` (for error messages on other ranks)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


class Owners:
    """This rank's side of owner mode in ``group`` (a ``strata.embed.dist.Group``): the
    point-to-point group, the owner server thread, and the calls the native trainer makes
    (``serve``, ``read``, ``write``, ``traffic``). Created on every rank at the same point
    (it makes a process group); ``close`` stops the server."""

    def __init__(self, group):
        self.group = group
        self.torch, self.td = group.torch, group.td
        self.rank, self.world_size, self.timeout = group.rank, group.world_size, group.timeout
        self.wait = timedelta(seconds=self.timeout)
        master, port = group.address.rsplit(":", 1)
        try:
            self.p2p = self.td.new_group(backend="gloo", timeout=self.wait)
            self.addresses = [None] * self.world_size
            self.td.all_gather_object(self.addresses, _local_address(master, int(port)), group=self.p2p)
        except RuntimeError as e:
            raise GroupError(
                f"rank {self.rank}: could not set up the partition transport within {self.timeout} s "
                f"(dist_timeout) (group rendezvous at {group.address}): {first_line(e)}"
            ) from None
        self.counters = threading.Lock()
        self.sent = self.received = 0
        self.seq = [0] * self.world_size
        self.served = threading.Condition()
        self.epoch, self.tables = -1, None
        self.stop = threading.Event()
        # One answer at a time: the tables and the point-to-point group serve one transfer.
        self.answering = threading.Lock()
        self.server = PeerRequests(
            "strata-owner-server",
            group.connect,
            f"part/req/{self.rank}",
            [r for r in range(self.world_size) if r != self.rank],
            self._handle,
            self.timeout,
        )

    def _count(self, sent: int, received: int) -> None:
        with self.counters:
            self.sent += sent
            self.received += received

    def _owner(self, p: int) -> str:
        o = owner_of(p, self.world_size)
        return f"its owner, rank {o} at {self.addresses[o]}"

    def _check(self) -> None:
        if self.server.failure is not None:
            raise GroupError(f"rank {self.rank}: the owner server stopped: {first_line(self.server.failure)}")

    def _transfer(self, op, t, peer: int, k: int, kind: int) -> None:
        """``op`` (``isend`` or ``irecv``) of the uint8 tensor ``t`` with ``peer`` in pieces of
        at most ``CHUNK`` bytes, each waited for at most ``dist_timeout``."""
        works = [
            op(t[a : a + CHUNK], peer, self.p2p, tag(k, kind, i))
            for i, a in enumerate(range(0, max(t.numel(), 1), CHUNK))
        ]
        for w in works:
            w.wait(self.wait)

    def _request(self, p: int, request: dict) -> tuple[int, int]:
        if request["bytes"] > CHUNK * MAX_CHUNKS:
            raise GroupError(
                f"rank {self.rank}: partition {p} has {request['bytes']} bytes, more than the "
                f"{CHUNK * MAX_CHUNKS} one transfer can carry; use more partitions"
            )
        o = owner_of(p, self.world_size)
        k = self.seq[o]
        self.seq[o] += 1
        text = json.dumps(request)
        self.group.store.set(f"part/req/{o}/{self.rank}/{k}", text)
        self._count(len(text), 0)
        return o, k

    def _failed(self, p: int, what: str, e: BaseException) -> GroupError:
        return GroupError(
            f"rank {self.rank}: no answer from {self._owner(p)}, within {self.timeout} s (dist_timeout) "
            f"{what}: {first_line(e)}"
        )

    # The calls the native trainer makes (strata-py's PyPartitions).

    def serve(self, epoch: int, tables) -> None:
        """From now on, answer requests of ``epoch`` from ``tables`` (a native ServedTables:
        this rank's committed and output tables of the epoch)."""
        self._check()
        with self.served:
            self.epoch, self.tables = epoch, tables
            self.served.notify_all()

    def read(self, epoch: int, p: int, written: bool, size: int) -> bytes:
        """Partition ``p``'s region (``size`` bytes) from its owner: its output table of
        ``epoch`` when ``written``, else its committed one."""
        self._check()
        what = f"while reading partition {p} for epoch {epoch + 1}"
        try:
            o, k = self._request(p, {"op": "read", "epoch": epoch, "p": p, "written": written, "bytes": size})
            buf = self.torch.empty(size, dtype=self.torch.uint8)
            self._transfer(self.td.irecv, buf, o, k, READ)
        except (RuntimeError, TimeoutError) as e:
            raise self._failed(p, what, e) from None
        self._count(0, size)
        return buf.numpy().tobytes()

    def write(self, epoch: int, p: int, region: bytearray) -> None:
        """Sends partition ``p``'s ``region`` to its owner's output table of ``epoch``; returns
        once the owner has written it."""
        self._check()
        what = f"while writing partition {p} back in epoch {epoch + 1}"
        torch = self.torch
        try:
            o, k = self._request(p, {"op": "write", "epoch": epoch, "p": p, "bytes": len(region)})
            self._transfer(self.td.isend, torch.frombuffer(region, dtype=torch.uint8), o, k, WRITE)
            ack = torch.zeros(1, dtype=torch.int64)
            self._transfer(self.td.irecv, ack, o, k, ACK)
        except (RuntimeError, TimeoutError) as e:
            raise self._failed(p, what, e) from None
        self._count(len(region), 8)
        if int(ack.item()) != 1:
            raise GroupError(f"rank {self.rank}: {self._owner(p)} could not write partition {p} (see its log)")

    def traffic(self) -> tuple[int, int]:
        """Bytes of regions, requests and acknowledgements sent and received so far (this
        rank's requests and its server's answers)."""
        with self.counters:
            return self.sent, self.received

    # The owner server.

    def _tables_of(self, epoch: int, rank: int):
        deadline = time.monotonic() + self.timeout
        with self.served:
            while self.epoch < epoch:
                left = deadline - time.monotonic()
                if left <= 0 or self.stop.is_set():
                    raise TimeoutError(
                        f"rank {rank} asked for epoch {epoch + 1}, which this rank did not start "
                        f"within {self.timeout} s"
                    )
                self.served.wait(min(left, 1.0))
            if self.epoch != epoch:
                raise ValueError(f"rank {rank} asked about epoch {epoch + 1} while this rank serves {self.epoch + 1}")
            return self.tables

    def _answer(self, r: int, k: int, request: dict) -> None:
        torch = self.torch
        tables = self._tables_of(request["epoch"], r)
        p = request["p"]
        if request["op"] == "read":
            data = tables.read(p, request["written"])
            self._transfer(self.td.isend, torch.frombuffer(data, dtype=torch.uint8), r, k, READ)
            self._count(len(data), 0)
            return
        buf = torch.empty(request["bytes"], dtype=torch.uint8)
        self._transfer(self.td.irecv, buf, r, k, WRITE)
        self._count(0, request["bytes"])
        failure = None
        try:
            tables.write(p, buf.numpy().tobytes())
        except Exception as e:  # told to the writer (its ack), then this rank stops serving
            failure = e
        self._transfer(self.td.isend, torch.full((1,), int(failure is None), dtype=torch.int64), r, k, ACK)
        self._count(8, 0)
        if failure is not None:
            raise failure

    def _handle(self, store, r: int, k: int, text: str) -> None:
        with self.answering:
            self._count(0, len(text))
            self._answer(r, k, json.loads(text))

    def close(self) -> None:
        """Stops the owner server (after the last epoch's commit: no request is pending)."""
        self.stop.set()
        with self.served:
            self.served.notify_all()
        self.server.close(self.group.store)
