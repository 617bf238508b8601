"""Node features split across the ranks of a distributed run (docs/distributed.md, "Features
that do not fit on one machine").

Ownership is a pure function of the node id, the graph's node count and the world size:
rank ``r`` owns the contiguous id range ``[r N / W, (r + 1) N / W)`` (:func:`owned_range`), as
DistDGL's range partition book does after its METIS relabelling. Each rank's native data path
plans and holds only its own rows (hot set, cache and disk reads); a batch's other rows are
left to this module, which asks their owners for them over torch.distributed RPC
(TensorPipe): one request per owner and batch, ids deduplicated, answered by the owner from its
own tiers. :class:`SplitFeatures` is that client and server; the loaders use it when opened
with ``features="split"``.
"""

from __future__ import annotations

import atexit
import threading
import time
import warnings
import weakref
from datetime import timedelta

import numpy as np

from .. import torchrun
from ..errors import ConfigError, GroupError
from ._torch import require_torch

#: torch.distributed rendezvous scheme under which :func:`start_rpc` hands RPC the group's
#: store (a public hook of ``torch.distributed.rendezvous``): RPC's keys then carry the
#: attempt's number, like the process group's, and never meet an earlier attempt's.
RENDEZVOUS_SCHEME = "strata-rpc"

#: Worker name of rank ``r`` in the RPC group.
WORKER = "strata-features-{}"

#: The tables this process serves, by creation index (every rank creates its tables in the
#: same order, so index ``k`` names the same table on every rank), and the condition their
#: registration signals (a request may come before its table is open here). Weak: a table
#: goes when its loader does.
_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_TABLES_CHANGED = threading.Condition()
_STATE = {"created": 0, "rpc": False, "timeout": 600.0, "store": None, "registered": False}


def owned_range(num_nodes: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, end)``: the node ids whose feature rows rank ``rank`` of ``world_size`` owns.
    The ranges are contiguous, disjoint, cover ``0..num_nodes`` and differ by at most one row."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    return rank * num_nodes // world_size, (rank + 1) * num_nodes // world_size


def owners(nodes: np.ndarray, num_nodes: int, world_size: int) -> np.ndarray:
    """The owning rank of each of ``nodes`` (an ``(n,)`` integer array), as :func:`owned_range`
    assigns them."""
    starts = np.array([owned_range(num_nodes, r, world_size)[0] for r in range(world_size)], dtype=np.int64)
    return np.searchsorted(starts, np.asarray(nodes, dtype=np.int64), side="right") - 1


def start_rpc(rank: int, world_size: int, store, timeout: float) -> None:
    """Joins this process to the RPC group of ``world_size`` ranks through ``store`` (the
    rendezvous store, e.g. what :func:`strata.torchrun.join` returns), once per process; every
    call and the group's start fail after ``timeout`` seconds. Left at exit (or by
    :func:`shutdown`), waiting for every rank's outstanding requests."""
    if _STATE["rpc"]:
        return
    torch, td = torchrun.torch_distributed()
    rpc = torch.distributed.rpc
    # The attempt is agreed once per process (torchrun.join did, unless a user's script
    # initialised its own group).
    env = torchrun.environment()
    address = env.address if env is not None else "the rendezvous store"
    try:
        number = torchrun.agreed_attempt(store, rank, world_size, time.monotonic() + timeout, address)
    except GroupError as e:
        raise GroupError(
            f"rank {rank}: could not start the RPC group for split features within {timeout} s: {e}"
        ) from None
    _STATE["store"] = (td.PrefixStore(f"rpc/{number}/", store), rank, world_size)
    if not _STATE["registered"]:
        td.register_rendezvous_handler(RENDEZVOUS_SCHEME, _rendezvous)
        _STATE["registered"] = True
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"{RENDEZVOUS_SCHEME}://", rpc_timeout=timeout)
    with warnings.catch_warnings():
        # TensorPipe's start exchanges device maps through a gloo backend used as a group,
        # which torch itself warns about; nothing for the user to act on.
        warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
        try:
            rpc.init_rpc(WORKER.format(rank), rank=rank, world_size=world_size, rpc_backend_options=options)
        except RuntimeError as e:
            raise GroupError(
                f"rank {rank}: could not start the RPC group for split features within {timeout} s "
                f"(dist_timeout): {torchrun.first_line(e)}"
            ) from None
    _STATE["rpc"], _STATE["timeout"] = True, float(timeout)
    atexit.register(shutdown)


def join_rpc(rank: int, world_size: int, timeout: float = 600) -> None:
    """:func:`start_rpc` through torchrun's rendezvous store (the loaders' way in a user's
    script launched by torchrun); nothing when this process already joined."""
    if _STATE["rpc"]:
        return
    env = torchrun.environment()
    if env is None:
        raise ConfigError(
            "features='split' needs torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), "
            "or strata.gnn.features.start_rpc(rank, world_size, store, timeout) called first"
        )
    _, td = torchrun.torch_distributed()
    store, _, _ = next(td.rendezvous("env://", rank, world_size, timeout=timedelta(seconds=timeout)))
    start_rpc(rank, world_size, store, timeout)


def _rendezvous(url, **kwargs):
    """The rendezvous handler of :data:`RENDEZVOUS_SCHEME`: the store :func:`start_rpc` was given."""
    yield _STATE["store"]


def shutdown() -> None:
    """Leaves the RPC group (a barrier: it waits for every rank to leave) if this process
    joined one."""
    if _STATE["rpc"]:
        _STATE["rpc"] = False
        require_torch().distributed.rpc.shutdown(graceful=True)


def _rows(table: int, ids):
    """RPC handler: the rows of ``ids`` (an int64 tensor of owned node ids) of this process's
    table ``table``, as a ``(len(ids), dim)`` tensor."""
    deadline = time.monotonic() + _STATE["timeout"]
    with _TABLES_CHANGED:
        while (features := _TABLES.get(table)) is None:
            if table < _STATE["created"]:
                raise RuntimeError(f"split features: table {table} was closed on this rank")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"split features: table {table} was not opened on this rank in time")
            _TABLES_CHANGED.wait(left)
    return features.local_rows(ids.numpy())


class SplitFeatures:
    """The feature rows of one opened store (a :class:`~strata.gnn.loader.GnnData` opened with
    ``split=(rank, world_size)``) split across the ranks: ``gather(ids)`` returns any rows,
    its own read locally and the others fetched from their owners; ``fetch(ids)`` starts the
    remote part and returns a :class:`Fetch` to wait on (the loaders start it for a batch
    before the previous batch is trained).

    ``stats()`` counts the remote traffic: requests, rows, bytes and the seconds spent waiting
    for them."""

    def __init__(self, data, rank: int, world_size: int):
        self.torch = require_torch()
        if not _STATE["rpc"]:
            raise RuntimeError("split features: the RPC group is not started (call strata.gnn.features.start_rpc)")
        self.data, self.rank, self.world_size = data, rank, world_size
        self.num_nodes, self.dim, self.row_bytes = data.num_nodes, data.dim, data.row_bytes
        self.start, self.end = owned_range(self.num_nodes, rank, world_size)
        self._dtype = getattr(self.torch, data.dtype)
        self._counts = {"requests": 0, "rows": 0, "bytes": 0, "wait_seconds": 0.0}
        with _TABLES_CHANGED:
            self.table = _STATE["created"]
            _STATE["created"] += 1
            _TABLES[self.table] = self
            _TABLES_CHANGED.notify_all()

    def local_rows(self, ids: np.ndarray):
        """Rows of ``ids`` (node ids this rank owns) from this rank's tiers as a
        ``(len(ids), dim)`` tensor; ids it does not own are refused."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < self.start or ids.max() >= self.end):
            bad = ids[(ids < self.start) | (ids >= self.end)][0]
            raise ValueError(f"rank {self.rank} owns rows {self.start}..{self.end - 1}, not {bad}")
        buf = self.data._native.gather(ids.astype("<u4").tobytes())
        if not buf:
            return self.torch.empty((0, self.dim), dtype=self._dtype)
        return self.torch.frombuffer(buf, dtype=self._dtype).view(len(ids), self.dim)

    def fetch(self, ids) -> Fetch:
        """Starts fetching the rows of ``ids`` (any node ids, repeats allowed) that other ranks
        own: one asynchronous request per owner with its distinct ids."""
        rpc = self.torch.distributed.rpc
        ids = np.asarray(ids, dtype=np.int64)
        distinct, inverse = np.unique(ids, return_inverse=True)
        owner = owners(distinct, self.num_nodes, self.world_size)
        requests = []
        for r in np.unique(owner):
            part = distinct[owner == r]
            if r == self.rank:
                requests.append((owner == r, None, self.local_rows(part)))
                continue
            future = rpc.rpc_async(WORKER.format(int(r)), _rows, args=(self.table, self.torch.from_numpy(part)))
            requests.append((owner == r, future, None))
            self._counts["requests"] += 1
            self._counts["rows"] += len(part)
            self._counts["bytes"] += len(part) * self.row_bytes
        return Fetch(self, len(distinct), inverse, requests)

    def gather(self, ids):
        """The ``(len(ids), dim)`` rows of ``ids`` (any node ids, repeats allowed), local and
        remote, in the order of ``ids``."""
        return self.fetch(ids).wait()

    def stats(self) -> dict:
        """Remote requests, rows, bytes and seconds waited for them so far."""
        return dict(self._counts)


class Fetch:
    """Rows on their way from their owners; :meth:`wait` assembles them."""

    def __init__(self, features: SplitFeatures, distinct: int, inverse: np.ndarray, requests: list):
        self.features, self.distinct, self.inverse, self.requests = features, distinct, inverse, requests

    def wait(self):
        """The rows, ``(len(ids), dim)`` in the order of the ids given to ``fetch``."""
        f = self.features
        torch = f.torch
        out = torch.empty((self.distinct, f.dim), dtype=f._dtype)
        t = time.perf_counter()
        for where, future, rows in self.requests:
            if future is not None:
                try:
                    rows = future.wait()
                except RuntimeError as e:
                    raise GroupError(
                        f"rank {f.rank}: fetching feature rows from their owner failed: {torchrun.first_line(e)}"
                    ) from None
            out[torch.from_numpy(np.flatnonzero(where))] = rows
        f._counts["wait_seconds"] += time.perf_counter() - t
        return out[torch.from_numpy(self.inverse.reshape(-1))]
