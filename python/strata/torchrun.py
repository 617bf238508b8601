"""Running under torchrun: the pieces every engine that trains over torch.distributed shares.

``environment`` reads the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``LOCAL_RANK``); ``join`` meets the other ranks at the rendezvous store and
initialises the default process group, every wait bounded by a timeout and every failure a
``GroupError`` that names the store's address; ``same_data`` proves, before the first step,
that every rank holds the same data and runs the same options. Torch is an optional extra: it is imported here,
lazily, with a message that says how to install it. The engines (``strata.embed.dist``,
``strata.gnn.train``) build their own protocols on top.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from .errors import ConfigError, DataMismatchError, GroupError, MissingDependencyError

#: torchrun's variables a rank needs.
ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Environment:
    """This process's place in a distributed run, as torchrun describes it."""

    rank: int
    world_size: int
    addr: str
    port: int
    #: The rank's index among the ranks of its machine (which GPU it takes).
    local_rank: int = 0

    @property
    def address(self) -> str:
        """``MASTER_ADDR:MASTER_PORT``, the rendezvous store's address."""
        return f"{self.addr}:{self.port}"


def torch_distributed():
    """``(torch, torch.distributed)``, or ``MissingDependencyError`` saying how to install them."""
    try:
        import torch
        import torch.distributed as td
    except ImportError as e:
        raise MissingDependencyError(
            "distributed training (WORLD_SIZE > 1 in the environment, as torchrun sets it) needs torch: "
            "pip install torch"
        ) from e
    if not td.is_available():
        raise MissingDependencyError("this torch build has no torch.distributed; install a build that has it")
    return torch, td


def environment(environ=os.environ) -> Environment | None:
    """This process's rank in a distributed run, or None for a single-process run (no
    ``WORLD_SIZE``, or ``WORLD_SIZE=1``). Raises ``ConfigError`` naming a missing or malformed
    variable."""
    try:
        if int(environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        for name in ENVIRONMENT:
            if name not in environ:
                raise ConfigError(
                    f"WORLD_SIZE is set but {name} is not: run under torchrun, which sets {', '.join(ENVIRONMENT)}"
                )
        rank, world_size, port = int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["MASTER_PORT"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ConfigError(
            f"torchrun's environment: {e} (RANK, WORLD_SIZE, MASTER_PORT and LOCAL_RANK are integers)"
        ) from None
    if not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size})")
    return Environment(rank, world_size, environ["MASTER_ADDR"], port, local_rank)


def follower(environ=os.environ) -> bool:
    """Whether this process is a rank other than 0 of a distributed run (it leaves the run's
    summary to rank 0)."""
    try:
        return int(environ.get("WORLD_SIZE", "1")) > 1 and int(environ.get("RANK", "0")) != 0
    except ValueError:
        return False


def attempt() -> int:
    """This attempt of the group in the current torchrun run: 0 for the first, ``k`` after
    ``k`` restarts, the same on every rank (agreed through the rendezvous store by
    :func:`join`, or :func:`agree_attempt`); 0 in a process that has not joined a group."""
    return _AGREED.get("attempt", 0)


#: The attempt this process agreed on with the other ranks (one per process: every rank
#: agrees once, so a second caller reuses it instead of starting a round the others never join).
_AGREED: dict = {}
#: How many times this process joined a group (:func:`join`).
_JOINS = [0]

#: Where the attempt agreement keeps its keys in torchrun's store (every attempt's own keys
#: are under ``pg/{number}/{join}/``, ``strata/{number}/`` and ``rpc/{number}/`` beside them).
AGREEMENT = "strata/attempt/"


def agree_attempt(store, rank: int, world_size: int, deadline: float, address: str) -> int:
    """The number of this attempt of the group (0 first), the same on every rank, from the
    rendezvous ``store`` that torchrun keeps across restarts; every wait ends by ``deadline``
    (``time.monotonic()``), else a ``GroupError`` (its text the reason, for the caller to
    prefix with the rank and the figure) naming the ranks that did not arrive.

    torchrun's restart count cannot name an attempt: each agent counts only its own node's
    failures (with two nodes, the agent of the node whose rank died says 1 and the other 0),
    and nothing else torchrun hands the workers changes between attempts. So rank 0 draws a
    fresh generation from the store (an atomic counter: never one an earlier attempt used)
    and hands it to every rank that asks; the others ask under a key only they know and
    confirm. Messages go to numbered slots, each claimed atomically (``compare_set``), so a
    rank killed mid-message leaves no hole; rank 0 reads the slots in order, answering every
    request (a dead rank's of an earlier attempt too, harmlessly) until each rank confirmed
    this generation."""
    _, td = torch_distributed()
    keys = td.PrefixStore(AGREEMENT, store)
    try:
        if rank == 0:
            generation = _hand_out(keys, world_size, deadline, address)
        else:
            generation = _ask(keys, rank, deadline, address)
    except RuntimeError as e:  # the store went away (rank 0's agent died)
        raise GroupError(f"the store failed while the ranks agreed on the attempt: {first_line(e)}") from None
    return generation - 1


def agreed_attempt(store, rank: int, world_size: int, deadline: float, address: str) -> int:
    """:func:`agree_attempt`, once per process: a later call (the RPC group's, after
    :func:`join`) returns the number agreed first, as every rank's does."""
    if "attempt" not in _AGREED:
        _AGREED["attempt"] = agree_attempt(store, rank, world_size, deadline, address)
    return _AGREED["attempt"]


def _post(keys, message: str) -> None:
    """Puts ``message`` (unique: it names its sender) in the first free slot at or after the
    last one rank 0 finished reading."""
    k = keys.add("read", 0) + 1
    while keys.compare_set(f"slot/{k}", "", message).decode() != message:
        k += 1


def _remaining(deadline: float) -> timedelta:
    return timedelta(seconds=max(deadline - time.monotonic(), 0.001))


def _hand_out(keys, world_size: int, deadline: float, address: str) -> int:
    """Rank 0's side of :func:`agree_attempt`: a fresh generation, handed to every rank that
    asks until ranks ``1..world_size-1`` all confirmed it."""
    generation = keys.add("generation", 1)
    first = keys.add("read", 0)
    k, waiting = first + 1, set(range(1, world_size))
    while waiting:
        try:
            keys.wait([f"slot/{k}"], _remaining(deadline))
        except RuntimeError as e:
            if not _timed_out(str(e)):
                raise
            missing = ", ".join(map(str, sorted(waiting)))
            raise GroupError(
                f"rank {missing} did not arrive ({'its' if len(waiting) == 1 else 'their'} process never "
                f"started, or cannot reach {address})"
            ) from None
        kind, sender, value = keys.get(f"slot/{k}").decode().split()
        if kind == "ask":
            keys.set(f"answer/{value}", str(generation))
        elif kind == "joined" and int(value) == generation:
            waiting.discard(int(sender))
        k += 1
    # The next attempt's rank 0 starts after these slots.
    keys.add("read", k - 1 - first)
    return generation


def _ask(keys, rank: int, deadline: float, address: str) -> int:
    """A rank other than 0's side of :func:`agree_attempt`: asks rank 0 for the generation
    under a key of this process alone, and confirms it."""
    token = uuid.uuid4().hex
    _post(keys, f"ask {rank} {token}")
    try:
        keys.wait([f"answer/{token}"], _remaining(deadline))
    except RuntimeError as e:
        if not _timed_out(str(e)):
            raise
        raise GroupError(
            f"rank 0 did not arrive at the rendezvous store at {address} (its process never started, or "
            "is stuck before joining)"
        ) from None
    generation = int(keys.get(f"answer/{token}"))
    _post(keys, f"joined {rank} {generation}")
    return generation


def _await_store(env: Environment, deadline: float) -> None:
    """Returns once something listens at the rendezvous store's address, or raises
    ``GroupError`` at ``deadline``. torch's store client retries a failed connection once
    after a random delay, so its own timeout ``t`` waits 2 to 3 ``t``; probing here first
    keeps the whole wait within the user's figure."""
    while True:
        try:
            with socket.create_connection(
                (env.addr, env.port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))
            ):
                return
        except socket.gaierror as e:
            raise GroupError(f"the rendezvous host {env.addr!r} does not resolve: {e}") from None
        except OSError as e:
            if time.monotonic() + 0.2 >= deadline:
                raise GroupError(
                    f"nothing answered at {env.address} ({e.strerror or e}): rank 0's torchrun agent has not "
                    "started, or the address is not reachable from this machine"
                ) from None
            time.sleep(0.2)


def join(env: Environment, timeout: int, backend: str = "gloo"):
    """Meets the other ranks at the rendezvous store of ``env``, agrees with them on the
    attempt (:func:`attempt`) and initialises the default process group with ``backend``
    (``gloo``, or ``nccl`` for CUDA tensors), all within ``timeout`` seconds; collectives then
    fail after ``timeout`` seconds instead of waiting forever. Returns the rendezvous store."""
    _, td = torch_distributed()
    # A rank that torch's C++ side aborts (a gloo thread calling std::terminate) would die with
    # only "terminate called ..."; this prints where every Python thread was.
    faulthandler.enable()
    wait = timedelta(seconds=timeout)
    deadline = time.monotonic() + timeout

    def failed(reason: str) -> GroupError:
        return GroupError(
            f"rank {env.rank}: could not join the group through the rendezvous store at {env.address} "
            f"within {timeout} s (dist_timeout): {reason}"
        )

    try:
        if env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            # Outside torchrun rank 0 hosts the store. It does not wait there for the others to
            # connect (torch's way, whose timeout says only how many came): the agreement
            # below waits for them, and names those that never come.
            store = td.TCPStore(
                env.addr,
                env.port,
                env.world_size,
                True,
                _remaining(deadline),
                wait_for_workers=False,
                multi_tenant=True,
            )
        else:
            _await_store(env, deadline)
            store, _, _ = next(td.rendezvous("env://", env.rank, env.world_size, timeout=_remaining(deadline)))
        number = agreed_attempt(store, env.rank, env.world_size, deadline, env.address)
        # torchrun keeps its store across restarts of the group: keys of an earlier attempt
        # (the ranks' gloo addresses among them) must not meet this one's. Nor may those of an
        # earlier group of this attempt: a script may run one analysis after another, each
        # joining and leaving; every rank joins as often, in the same order, so the count agrees.
        _JOINS[0] += 1
        pg_store = td.PrefixStore(f"pg/{number}/{_JOINS[0]}/", store)
        # The group's timeout is every collective's: the whole figure. Every rank is known to be
        # up by now, so the group forms at once (or fails, should one die meanwhile).
        td.init_process_group(backend, store=pg_store, rank=env.rank, world_size=env.world_size, timeout=wait)
    except GroupError as e:
        raise failed(str(e)) from None
    except (RuntimeError, TimeoutError, ValueError) as e:
        raise failed(first_line(e)) from None
    # The store's own waits (RPC's start, the engines' requests) get the whole figure again.
    store.set_timeout(wait)
    return store


def data_digest(path) -> str:
    """The content digest (``blake3:HEX``) of the store or grid directory at ``path``: the one
    kept in it, or computed from its files and kept (a store written before digests existed,
    or copied; docs/distributed.md). A rank calls it before joining its group, so that hashing
    a large store counts against no collective's timeout."""
    from . import _native

    return _native.content_digest(str(path))


def same_data(rank: int, timeout: int, address: str, path, digest: str, options: dict) -> None:
    """Proves that every rank of the joined group holds the same data and runs the same
    ``options`` (the settings that must agree, as a JSON-able dict): the ranks all-gather
    (digest, host, path, options), and every rank raises the same ``DataMismatchError``,
    naming both ranks' ``host:path`` and digests (or the differing options), when one differs
    from rank 0's."""
    _, td = torch_distributed()
    mine = {"host": socket.gethostname(), "path": os.path.abspath(path), "digest": digest, "options": options}
    every: list = [None] * td.get_world_size()
    collective("comparing the ranks' data", lambda: td.all_gather_object(every, mine), rank, timeout, address)
    first = every[0]
    for r, other in enumerate(every[1:], start=1):
        if other["digest"] != first["digest"]:
            raise DataMismatchError(
                f"rank {r} holds different data from rank 0: rank 0 has {first['host']}:{first['path']} "
                f"({first['digest']}), rank {r} has {other['host']}:{other['path']} ({other['digest']}); "
                "every rank needs the same data: copy rank 0's store to the others, or convert the same "
                "input with the same options on each machine"
            )
        keys = sorted(first["options"].keys() | other["options"].keys())
        differ = [k for k in keys if first["options"].get(k) != other["options"].get(k)]
        if differ:
            shown = "; ".join(
                f"{k} is {first['options'].get(k)!r} on rank 0, {other['options'].get(k)!r} on rank {r}" for k in differ
            )
            raise DataMismatchError(
                f"rank {r} runs with different options from rank 0 ({first['host']}:{first['path']} and "
                f"{other['host']}:{other['path']}): {shown}; every rank must be given the same options"
            )


def leave() -> None:
    """Leaves the default process group, if this process joined one.

    What still holds the group is collected first: DistributedDataParallel's reducer sits in
    reference cycles, and left to interpreter shutdown it would destroy the gloo group after
    the interpreter is gone, whose worker threads then abort the process ("terminate called
    without an active exception", exit -6) after a run that succeeded."""
    _, td = torch_distributed()
    if td.is_initialized():
        gc.collect()
        td.destroy_process_group()


def collective(what: str, call, rank: int, timeout: int, address: str):
    """``call()`` (a collective of the group), its failure (torch raises ``RuntimeError`` when a
    peer is gone or ``timeout`` passed) a ``GroupError`` naming ``what``, the rank and the
    rendezvous ``address``."""
    try:
        return call()
    except RuntimeError as e:
        reason = first_line(e)
        # A peer that died closes its connections at once; only a silent one costs the timeout.
        outcome = f"did not complete within {timeout} s (dist_timeout)" if _timed_out(reason) else "failed"
        raise GroupError(f"rank {rank}: {what} {outcome} (group rendezvous at {address}): {reason}") from None


class PeerRequests:
    """Answers the numbered requests other ranks post in the group's store: peer ``r``'s
    ``k``-th request is the text under ``{prefix}/{r}/{k}``, taken (and deleted) in order.

    One thread per peer blocks in the store's ``wait`` for that peer's next key, on a store
    connection of its own (``connect()``: a connection is held for the length of a wait), so an
    idle server costs no CPU and a request is taken as soon as it lands. Polling the keys
    instead cost rank 0 about 5% of a core at 2 ms (docs/distributed.md); with one thread of
    training per core that is training time. ``handle(store, r, k, text)`` answers on the
    thread's connection; handles of different peers may run at once (the caller locks what
    must not). ``failure`` is the first error a thread met; ``close`` stops them."""

    STOP = "stop"

    def __init__(self, name: str, connect: Callable, prefix: str, peers, handle: Callable, timeout: int):
        self.prefix, self.handle, self.timeout = prefix, handle, timeout
        self.lock = threading.Lock()
        self.stopping = False
        self.failure: BaseException | None = None
        self.seq = {r: 0 for r in peers}
        self.threads = [
            threading.Thread(target=self._serve, args=(r, connect()), name=f"{name}-{r}", daemon=True) for r in self.seq
        ]
        for t in self.threads:
            t.start()

    def _key(self, r: int) -> str:
        return f"{self.prefix}/{r}/{self.seq[r]}"

    def _serve(self, r: int, store) -> None:
        try:
            while True:
                with self.lock:
                    if self.stopping or self.failure is not None:
                        return
                    key = self._key(r)
                try:
                    store.wait([key], timedelta(seconds=self.timeout))
                except RuntimeError as e:
                    if _timed_out(str(e)):  # an idle peer (a long evaluation): wait again
                        continue
                    raise
                text = store.get(key).decode()
                store.delete_key(key)
                if text == self.STOP:
                    return
                self.handle(store, r, self.seq[r], text)
                with self.lock:
                    self.seq[r] += 1
        except BaseException as e:  # the store went away, or a handle failed
            with self.lock:
                if not self.stopping:
                    self.failure = self.failure or e

    def close(self, store) -> None:
        """Stops every thread: each one waiting is woken through ``store`` by a stop request
        under its next key."""
        with self.lock:
            self.stopping = True
            keys = [self._key(r) for r in self.seq]
        for key in keys:
            try:
                store.set(key, self.STOP)
            except RuntimeError:  # the store is gone: the daemon threads end with the process
                break
        for t in self.threads:
            t.join(timeout=10)


def connect_store(address: str, prefix: str, timeout: int):
    """A connection of its own to the rendezvous store at ``address`` (``HOST:PORT``), its keys
    under ``prefix``."""
    _, td = torch_distributed()
    host, port = address.rsplit(":", 1)
    try:
        store = td.TCPStore(host, int(port), None, False, timedelta(seconds=timeout))
    except (RuntimeError, TimeoutError) as e:
        raise GroupError(
            f"could not connect to the rendezvous store at {address} within {timeout} s: {first_line(e)}"
        ) from None
    return td.PrefixStore(prefix, store)


def _timed_out(reason: str) -> bool:
    """Whether torch's error text ``reason`` is a timeout (gloo's and the store's say so; torch
    has no separate exception type for them)."""
    return "timed out" in reason.lower() or "timeout" in reason.lower()


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (torch's carry C++ traces below it)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def ranked(progress: Callable[..., bool] | None, rank: int) -> Callable[..., bool] | None:
    """``progress`` with each message line prefixed by the rank, so interleaved output of the
    ranks of one machine stays readable."""
    if progress is None:
        return None

    def report(event: str, *args) -> bool:
        if event == "message" and not args[0].startswith("rank "):
            args = (f"rank {rank}: {args[0]}",)
        return progress(event, *args)

    return report


def process_bytes(field: str) -> int | None:
    """A size of this process from ``/proc/self/status`` in bytes, or None where it does not
    tell: ``RssAnon``, its anonymous memory (the heap, torch's included, and thread stacks:
    what the kernel cannot reclaim without swap), or ``VmHWM``, the largest resident set so
    far (library pages mapped included)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
