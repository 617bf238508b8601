"""Mini-batches for GNN training as PyTorch tensors, served by Strata's native pipeline.

``open_data(store, ...)`` opens a store once (topology in RAM, feature tiers sized by the
budget); ``data.loader(nodes)`` iterates an epoch's batches. ``NodeLoader`` does both for the
common case::

    loader = NodeLoader("products.strata", fanouts=[15, 10], batch_size=1024, memory="2G")
    for batch in loader:          # one epoch per iteration over the loader
        out = model(batch.blocks, batch.x)
        loss = F.cross_entropy(out, batch.y)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .. import _native
from ..config.gnn import GnnTrainConfig
from ..config.schema import fields
from ..errors import ConfigError
from ..store import Store
from ..torchrun import process_bytes
from ..units import fmt_bytes, parse_size
from ._torch import require_torch, torch_device
from .batch import Batch
from .features import SplitFeatures, join_rpc, owned_range

#: The data paths GnnData can use (``data_path``).
DATA_PATHS = ("auto", "native", "device")

#: Feature dtype names -> the torch dtype (a function of the torch module, imported lazily).
FLOAT_DTYPES = {"float32": lambda t: t.float32, "float16": lambda t: t.float16}


def node_id_bytes(nodes) -> bytes:
    """Node ids (any integer array-like) as the little-endian uint32 bytes the native side takes."""
    return node_ids(nodes).astype("<u4").tobytes()


def node_ids(nodes) -> np.ndarray:
    """Node ids (any integer array-like) as a 1-D int64 array.

    Raises ``ValueError`` for ids that are not integers (a float array would be truncated),
    negative, or beyond 32 bits (they would wrap onto other nodes)."""
    raw = np.asarray(nodes)
    if raw.size and raw.dtype.kind not in "iu":
        raise ValueError(f"nodes: expected integer node ids, got an array of {raw.dtype}")
    arr = np.ascontiguousarray(raw, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"nodes: expected a 1-D array of node ids, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"nodes: node ids must not be negative, got {arr.min()}")
    if arr.size and arr.max() > np.iinfo(np.uint32).max:
        raise ValueError(f"nodes: node ids are 32-bit, got {arr.max()}")
    return arr


def fanout_list(value, what: str) -> list[int]:
    """``value`` checked as a list of whole fanouts, one per hop (a tuple or a NumPy array
    too); ValueError naming ``what`` otherwise (a float would be truncated, a string or a
    number is not a list)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{what}: expected a list of fanouts (one per hop), got {value!r}")
    out = []
    for f in value:
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)):
            raise ValueError(f"{what}: fanouts must be whole numbers, got {f!r}")
        out.append(int(f))
    return out


def edge_index_array(edges, num_nodes: int) -> np.ndarray:
    """Edges given as a ``(2, E)`` array-like of (source, destination) ids, or as a
    ``(src, dst)`` pair of ``(E,)`` arrays, as a ``(2, E)`` int64 array; checked against
    ``num_nodes`` here so that a bad edge fails before an epoch starts."""
    if isinstance(edges, (tuple, list)) and len(edges) == 2:
        src, dst = np.asarray(edges[0]), np.asarray(edges[1])
        if src.ndim != 1 or dst.ndim != 1 or len(src) != len(dst):
            raise ValueError(
                f"edges: sources of shape {src.shape} and destinations of shape {dst.shape}; "
                "they must be 1-D and pair up"
            )
        edges = np.stack([src, dst]) if len(src) else np.empty((2, 0), dtype=np.int64)
    arr = np.asarray(edges)
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise ValueError(f"edges: expected a (2, E) array of (source, destination) ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"edges: expected integer node ids, got {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= num_nodes):
        bad = arr.min() if arr.min() < 0 else arr.max()
        raise ValueError(f"edges: node id {bad} is out of range (the graph has {num_nodes} nodes)")
    return arr


def negatives_per_edge(negatives) -> int:
    """``negatives`` checked as a whole number of negative destinations per edge."""
    if isinstance(negatives, bool) or not isinstance(negatives, (int, np.integer)) or negatives < 0:
        raise ValueError(f"negatives: expected a whole number of negatives per edge >= 0, got {negatives!r}")
    return int(negatives)


def shard(items, rank: int, world_size: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True, pad: bool = True):
    """Rank ``rank``'s share of ``items`` (an ``(n,)`` array of node ids, or a ``(2, n)`` array
    of edges: its columns) in a run of ``world_size`` ranks.

    Every rank draws the same permutation from ``(seed, epoch)`` (or keeps the given order when
    not ``shuffle``) and takes every ``world_size``-th item of it from position ``rank``. With
    ``pad`` the permutation is first extended by wrapping around to a multiple of
    ``world_size``, as torch's ``DistributedSampler`` does: every rank gets the same number of
    items, so the same number of batches, and a few items appear twice in the epoch. Without
    it the shares partition ``items`` exactly and differ in length by at most one (for
    evaluation)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    arr = np.asarray(items)
    n = arr.shape[-1]
    order = np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)
    if pad and n:
        order = np.resize(order, -(-n // world_size) * world_size)
    return arr[..., order[rank::world_size]]


def distributed_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` as given, or when neither is given torch.distributed's when its
    default group is initialised, else ``(0, 1)``."""
    if rank is None and world_size is None:
        td = require_torch().distributed
        if td.is_available() and td.is_initialized():
            return td.get_rank(), td.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"rank={rank}, world_size={world_size}: give both, or neither to ask torch.distributed")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    return int(rank), int(world_size)


#: Share of a CUDA device's free memory the device tier takes when ``device_memory="auto"``:
#: the rest is left to the model, its activations and the batches.
AUTO_DEVICE_SHARE = 0.25

#: Device-tier rows copied per transfer while loading it (bounds the host staging buffer).
DEVICE_LOAD_ROWS = 1 << 16


def node_labels(store: Store):
    """The store's node labels, checked against its class count (-1: unlabelled); None when
    it has none."""
    if not store.has("labels"):
        return None
    return store.checked("labels", "label", -1, store.manifest["labels"]["num_classes"])


def device_tier_bytes(device_memory, device: str) -> int:
    """Bytes for the device tier: ``device_memory`` as a size, or for ``"auto"`` (or None) a
    quarter of the free memory of a CUDA ``device`` and nothing on other devices. Opening a
    store for the CPU does not import torch."""
    if device_memory not in (None, "auto"):
        return parse_size(device_memory)
    if device == "cpu":
        return 0
    torch = require_torch()
    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free * AUTO_DEVICE_SHARE)


def _without_hot_set(share: float | None) -> float:
    """The native path's hot share with no hot-set ranking: 0, so that the dynamic cache takes
    the whole feature budget (the plan held ``share`` of it for a hot set of no rows). A share
    given away from its default is refused: nothing would use it."""
    default = next(f.default for f in fields(GnnTrainConfig) if f.name == "hot_share")
    if share is not None and share != default:
        raise ConfigError(
            f"gnn.train.hot_share: applies with a hot-set ranking; hot_ranking is none, so the dynamic cache "
            f"takes the whole feature budget (got {share})"
        )
    return 0.0


class GnnData:
    """A store opened for GNN training; make each epoch's batches with :meth:`loader`.

    ``device`` is where batches go by default and where the device tier lives: the hottest
    feature rows (by the hot-set ranking) in a ``(rows, dim)`` tensor of ``device_memory``
    bytes (``"auto"``: a quarter of a CUDA device's free memory, none on ``cpu``), outside the
    host ``memory`` budget. Batches then carry only the other rows from the host; the device
    rows are gathered on the device. On ``cpu`` an explicit ``device_memory`` builds the same
    tier in RAM (for tests and for checking the path without a GPU).

    ``memory`` (default: the [gnn.train] section's) is the data path's budget (topology,
    feature tiers, batches) plus a fixed runtime reserve: in a caller's own script the rest of
    the process is the caller's. With
    ``own_process=True`` (``strata gnn train``, which owns its process) the budget holds the
    whole process instead: its anonymous memory when the store is opened (the interpreter,
    torch's heap and whatever model is built by then) is measured and planned as the runtime
    with a fixed allowance for the libraries' code pages (``strata_gnn::budget::CODE_PAGES_BYTES``,
    96 MiB; the rest of torch's mapped libraries is page cache a memory cgroup reclaims), so
    build the model and optimizer before opening the store. ``training`` (a model's
    :meth:`~strata.gnn.models.GNN.training_costs`) plans what training a batch adds.

    ``split=(rank, world_size)`` opens the features split across the ranks of a distributed
    run (:mod:`strata.gnn.features`; the RPC group must be started): this process plans and
    reads only the rows it owns, and batches get the others from their owners. There is no
    device tier then. ``self.split`` is the :class:`~strata.gnn.features.SplitFeatures`
    (None otherwise).

    ``data_path`` picks who samples and serves node and link batches: ``"native"`` (the Rust sampler and
    feature tiers), ``"device"`` (:mod:`strata.gnn.device`: the device sampler, a cache managed
    from the device over device and page-locked host memory, the deep pipeline; on ``cpu`` its
    CPU twin), or ``"auto"``: the device path on a CUDA device unless the features are split
    across ranks, else the native one. ``self.data_path`` says which is used, and
    ``self.data_path_note`` why not the device's. ``gds`` (``"auto"`` or ``"off"``) lets the
    device path read its cache misses by GPUDirect Storage where kvikio can;
    ``self.feature_reads`` says how they are read and why not by it. ``producer`` (``"thread"``
    or ``"inline"``) says which host thread issues the device path's work on a GPU
    (:class:`~strata.gnn.device.pipeline.DevicePipeline`)."""

    def __init__(
        self,
        store: str | Path,
        progress: Callable[..., bool] | None = None,
        *,
        device: str = "cpu",
        device_memory: int | str | None = "auto",
        training: dict | None = None,
        own_process: bool = False,
        split: tuple[int, int] | None = None,
        data_path: str = "auto",
        gds: str = "auto",
        producer: str = "thread",
        **options,
    ):
        # The native data path's options are the engine's part of the [gnn.train] section
        # (strata_gnn::data::DataConfig), whose defaults fill in those not given, ``memory`` too
        # (a loader's budget then covers the data path and a runtime reserve, not the caller's
        # process, while ``strata gnn train``'s holds its whole process).
        unknown = sorted(set(options) - set(GnnTrainConfig.__engine__))
        if unknown:
            raise TypeError(_native.unknown_name("option", unknown[0], sorted(GnnTrainConfig.__engine__)))
        # A device other than the CPU is checked as `strata gnn train` checks it (torch's own
        # refusal of a name it does not know came from deep in a lookup).
        self.device = str(device) if str(device) == "cpu" else str(torch_device(str(device)))
        # Checked as the [gnn.train] section (errors name gnn.train.KEY), its defaults filled in.
        if split is not None and device_memory == "auto":
            device_memory = 0
        self.data_path, self.data_path_note = self._choose_data_path(data_path, split)
        device_bytes = device_tier_bytes(device_memory, self.device)
        self.device_bytes = device_bytes
        # On the device path the device budget is its cache's, and the native tiers are its I/O
        # engine for the misses: they build no hot set, since the plan's hot set is the device
        # path's page-locked host tier, ranked by its own pre-sampling epoch.
        given = {**options, "device_memory": device_bytes}
        if self.data_path == "device":
            given.update(device_memory=0, hot_ranking="none")
        elif given.get("hot_ranking") == "none":
            given["hot_share"] = _without_hot_set(given.get("hot_share"))
        if "fanouts" in given:
            given["fanouts"] = fanout_list(given["fanouts"], "fanouts")
        cfg = _native.config_check("gnn.train", given)
        self.store = Store(store)
        self.config = cfg
        train = self.nodes("train") if self.store.has("node_train") else np.empty(0, dtype=np.int64)
        self.labels = node_labels(self.store)
        self.num_classes = None if self.labels is None else int(self.labels.max()) + 1
        consumer = {"anon_bytes": process_bytes("RssAnon") if own_process else None, **(training or {})}
        if split is not None:
            consumer["owned_rows"] = list(owned_range(self.store.num_nodes, *split))
        self._native = _native.GnnData(str(store), cfg, node_id_bytes(train), consumer, progress)
        self.num_nodes, self.dim, self.dtype, self.row_bytes = self._native.features_info()
        # Split, the native device tier's index holds the other ranks' rows: nothing to load.
        self.split = None if split is None else SplitFeatures(self, *split)
        self.device_path = None
        if self.data_path == "device":
            from .device.path import DeviceDataPath

            # A store without node splits trains links: its batches' seeds are edge endpoints.
            hot_seeds = train
            if not len(train) and self.store.has("edges_train"):
                hot_seeds = np.unique(self.edges("train"))
            self.device_path = DeviceDataPath(
                self,
                self.device,
                train_nodes=hot_seeds,
                device_bytes=device_bytes,
                host_bytes=int(self.plan.get("hot_bytes", 0)),
                gds=gds,
                producer=producer,
            )
        self.device_table = None if split is not None or self.device_path else self._load_device_tier()
        if progress:
            for line in self.data_path_lines():
                progress("message", line)

    def _choose_data_path(self, data_path: str, split) -> tuple[str, str | None]:
        """``("device" | "native", why not the device path or None)``."""
        if data_path not in DATA_PATHS:
            raise ConfigError(f"data_path: expected one of {DATA_PATHS}, got {data_path!r}")
        if data_path == "native":
            return "native", "the native data path was asked for"
        why = None
        if split is not None:
            why = "split features are served by the native data path"
        elif data_path == "auto" and self.device.split(":")[0] != "cuda":
            why = "the device is not a GPU"
        if why is not None and data_path == "device":
            raise ConfigError(f"data_path: the device data path cannot serve this store: {why}")
        return ("native", why) if why is not None else ("device", None)

    @property
    def torch_dtype(self):
        """The features' torch dtype."""
        return FLOAT_DTYPES[self.dtype](require_torch())

    def _load_device_tier(self):
        """The device tier's rows in slot order as a ``(rows, dim)`` tensor on ``self.device``
        (None without a tier), copied over in chunks so the host holds one chunk at a time."""
        nodes = np.frombuffer(self._native.device_nodes(), dtype="<u4")
        if nodes.size == 0:
            return None
        torch = require_torch()
        table = torch.empty((nodes.size, self.dim), dtype=FLOAT_DTYPES[self.dtype](torch), device=self.device)
        for start in range(0, nodes.size, DEVICE_LOAD_ROWS):
            chunk = nodes[start : start + DEVICE_LOAD_ROWS]
            rows = torch.frombuffer(self._native.gather(chunk.tobytes()), dtype=table.dtype).view(-1, self.dim)
            table[start : start + chunk.size].copy_(rows)
        return table

    @property
    def plan(self) -> dict:
        """The budget plan: bytes for topology, hot set, cache, batches, runtime."""
        return self._native.plan()

    @property
    def memory_plan(self) -> dict:
        """The plan in the shape every engine's takes: engine, memory, minimum, parts, data."""
        return self._native.memory_plan()

    def plan_lines(self) -> list[str]:
        """The plan as text, the data path's lines (:meth:`data_path_lines`) last."""
        return [*self._native.plan_lines(), *self.data_path_lines()]

    def data_path_lines(self) -> list[str]:
        """Which data path serves the batches, why, and its two budgets: the host's
        (``memory``, of which ``feature_memory`` for feature rows) and the device's
        (``device_memory``); with the device path, where its cache misses are read from."""
        cfg = self.config
        features = "what memory leaves" if cfg.get("feature_memory") is None else fmt_bytes(cfg["feature_memory"])
        why = f" ({self.data_path_note})" if self.data_path_note else ""
        host = f"memory {fmt_bytes(cfg['memory'])} (feature rows: {features})"
        if self.device_path is None:
            rows = self.plan.get("device_rows", 0)
            device = f"device_memory {fmt_bytes(self.device_bytes)} ({rows:,} device-tier rows)"
            return [f"data path: native{why}; {host}; {device}"]
        b = self.device_path.budget()
        reads = self.feature_reads
        how = (
            "GPUDirect Storage" if reads["path"] == "gds" else f"the I/O engine, not GPUDirect Storage: {reads['note']}"
        )
        return [
            f"data path: device{why}; {host}, page-locked {fmt_bytes(b['memory'])} of it "
            f"({b['host_rows']:,} host rows{', the CSC' if b['topology'] == 'host' else ''}); "
            f"device_memory {fmt_bytes(self.device_bytes)}, {fmt_bytes(b['device_memory'])} of it held (the cache "
            f"index, {b['device_rows']:,} device rows{', the CSC' if b['topology'] == 'device' else ''}); "
            f"misses read by {how}; {self.device_path.pipeline.describe_window()}",
        ]

    @property
    def feature_reads(self) -> dict:
        """``{"path": "gds" | "engine", "note": why not GPUDirect Storage or None}``: how
        feature rows that no memory tier holds are read."""
        if self.device_path is None:
            return {"path": "engine", "note": "the native data path reads through the I/O engine"}
        return {"path": self.device_path.reads, "note": self.device_path.reads_note}

    @property
    def hot_seconds(self):
        """Seconds the hot set took to load."""
        return self._native.hot_seconds

    def has_split(self, split: str) -> bool:
        """Whether the store has node split ``split``."""
        return self.store.has(f"node_{split}")

    def nodes(self, split: str):
        """The node ids of a split (``train``, ``valid``, ``test``) of the store."""
        if not self.store.has(f"node_{split}"):
            raise ValueError(f"{self.store.path}: the store has no node split {split!r}")
        return self.store.checked(f"node_{split}", "node", 0, self.store.num_nodes)

    def node_set(self, nodes) -> np.ndarray:
        """The node ids ``nodes`` names, checked: a split name (``train``, ...), a boolean mask
        with one entry per node (as PyG's ``input_nodes`` takes), or ids below ``num_nodes``.
        Raises ``ValueError`` naming what is wrong."""
        if isinstance(nodes, str):
            return self.nodes(nodes)
        mask = np.asarray(nodes)
        if mask.dtype == bool:
            if mask.shape != (self.num_nodes,):
                raise ValueError(
                    f"nodes: a boolean mask must have one entry per node ({self.num_nodes}), got shape {mask.shape}"
                )
            return np.flatnonzero(mask)
        ids = node_ids(nodes)
        if ids.size and ids.max() >= self.num_nodes:
            raise ValueError(f"nodes: node {ids.max()} is out of range (the graph has {self.num_nodes} nodes)")
        return ids

    def loader(
        self,
        nodes,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        device: str | None = None,
        epoch: int = 0,
    ) -> EpochLoader:
        """The batches of one epoch over ``nodes`` (see :meth:`node_set`), on ``device``
        (default: the store's)."""
        nodes = self.node_set(nodes)
        if self.device_path is not None and (device is None or device == self.device):
            return self.device_path.loader(nodes, epoch=epoch, shuffle=shuffle, drop_last=drop_last)
        native = self._native.epoch(node_id_bytes(nodes), epoch, shuffle, drop_last)
        return EpochLoader(self, native, device or self.device)

    def edges(self, split: str):
        """The edges of a split (``train``, ``valid``, ``test``) of the store as a ``(2, E)``
        int64 array of (source, destination) rows; relation types, if any, are dropped."""
        if not self.store.has(f"edges_{split}"):
            raise ValueError(f"{self.store.path}: the store has no edge split {split!r}")
        name, n = f"edges_{split}", self.store.num_nodes
        src, dst = (self.store.checked(name, field, 0, n, col) for field, col in (("src", 0), ("dst", -1)))
        return np.stack([np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)])

    def link_loader(
        self,
        edges="train",
        *,
        negatives: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        device: str | None = None,
        epoch: int = 0,
    ) -> EpochLoader:
        """The link-prediction batches of one epoch over the positive ``edges`` (a ``(2, E)``
        array of (source, destination) ids, or an edge split name), ``batch_size`` edges each
        with ``negatives`` uniform negative destinations per edge, on ``device`` (default: the
        store's). Batches carry ``edge_label_index`` and ``edge_label``."""
        edges = self.edges(edges) if isinstance(edges, str) else edge_index_array(edges, self.num_nodes)
        negatives = negatives_per_edge(negatives)
        if self.device_path is not None and (device is None or device == self.device):
            return self.device_path.link_loader(edges, negatives, epoch=epoch, shuffle=shuffle, drop_last=drop_last)
        native = self._native.link_epoch(
            node_id_bytes(edges[0]), node_id_bytes(edges[1]), negatives, epoch, shuffle, drop_last
        )
        return EpochLoader(self, native, device or self.device)


class EpochLoader:
    """Iterates one epoch's batches in order; ``stats()`` reports the pipeline's counters."""

    def __init__(self, data: GnnData, native_epoch, device: str):
        """``native_epoch``: the native iterator of ``data`` (``epoch`` or ``link_epoch``)."""
        self.torch = require_torch()
        from .models import Block

        self._block = Block
        self.data = data
        self.device = self.torch.device(device)
        self._epoch = native_epoch
        self._float = FLOAT_DTYPES[data.dtype](self.torch)
        self._pin = self.device.type == "cuda"

    def _tensor(self, buf: bytearray, dtype):
        """A tensor sharing ``buf``'s memory (``torch.frombuffer`` refuses empty buffers)."""
        return self.torch.frombuffer(buf, dtype=dtype) if buf else self.torch.empty(0, dtype=dtype)

    def __iter__(self) -> Iterator[Batch]:
        if self.data.split is None:
            for raw in self._epoch:
                yield self._batch(*raw)
            return
        # Split features: the next batch's remote rows are requested before this batch is
        # handed out, so that the owners answer while it trains.
        ahead = None
        for index, seeds, nodes, hops, blocks, features, stats, device, links in self._epoch:
            positions = self._tensor(device[0], self.torch.int32).to(self.torch.int64)
            remote = np.frombuffer(nodes, dtype="<u4")[positions.numpy()]
            fetch = self.data.split.fetch(remote)
            if ahead is not None:
                yield self._batch(*ahead[0], remote=ahead[1:])
            ahead = ((index, seeds, nodes, hops, blocks, features, stats, (b"", b""), links), positions, fetch)
        if ahead is not None:
            yield self._batch(*ahead[0], remote=ahead[1:])

    def _batch(self, index, seeds, nodes, hops, blocks, features, stats, device, links, remote=None) -> Batch:
        """The :class:`Batch` of one native batch; ``remote``: ``(positions, fetch)`` of its
        rows owned by other ranks (split features)."""
        torch = self.torch
        seeds_t = self._tensor(seeds, torch.int32).to(torch.int64)
        nodes_t = self._tensor(nodes, torch.int32).to(torch.int64)
        x = self._tensor(features, self._float).view(len(nodes_t), self.data.dim)
        blks = [
            self._block.from_csc(n_src, n_dst, self._tensor(indptr, torch.int64), self._tensor(indices, torch.int32))
            for n_src, n_dst, indptr, indices in blocks
        ]
        y = None
        if self.data.labels is not None:
            y = torch.from_numpy(self.data.labels[seeds_t.numpy()].astype(np.int64))
        if remote is not None:
            positions, fetch = remote
            x[positions] = fetch.wait()
        x = self._features(x, *device)
        if links is not None:
            links = tuple(self._tensor(b, torch.int32).to(torch.int64).to(self.device) for b in links)
        if self.device.type != "cpu":
            blks = [b.to(self.device) for b in blks]
            y = None if y is None else y.to(self.device, non_blocking=True)
        return Batch(index, seeds_t, nodes_t, list(hops), blks, x, y, stats, links)

    def _features(self, x, positions: bytearray, slots: bytearray):
        """The batch's ``(rows, dim)`` features on the loader's device: the host rows of ``x``
        moved over (through page-locked memory, asynchronously, when the device is CUDA) and
        the device tier's rows gathered from its table at ``positions``."""
        torch = self.torch
        table = self.data.device_table
        if not positions:
            if self.device.type == "cpu":
                return x
            # Page-locked staging lets the copy to the GPU run asynchronously.
            return (x.pin_memory() if self._pin else x).to(self.device, non_blocking=True)
        pos = self._tensor(positions, torch.int32).to(torch.int64)
        rows = table[self._tensor(slots, torch.int32).to(torch.int64).to(table.device)]
        if self.device.type == "cpu":
            x[pos] = rows.to("cpu")
            return x
        # Only the host rows cross to the device.
        host = torch.ones(len(x), dtype=torch.bool)
        host[pos] = False
        host_rows = x[host]
        out = torch.empty(x.shape, dtype=x.dtype, device=self.device)
        out[host.to(self.device)] = (host_rows.pin_memory() if self._pin else host_rows).to(
            self.device, non_blocking=True
        )
        out[pos.to(self.device)] = rows.to(self.device)
        return out

    def stats(self) -> dict | None:
        """Per-stage busy seconds, wall time, merged reads, and the tiers' hit rates so far
        (with split features the rows other ranks own are ``tiers.remote_rows``: the native
        path counts them where it counts device rows, as it leaves both to this loader)."""
        stats = self._epoch.stats()
        if stats and self.data.split is not None and "tiers" in stats:
            stats["tiers"]["remote_rows"] = stats["tiers"].pop("device_rows")
        return stats

    def close(self) -> None:
        """Stops the epoch early: threads end and the cache's window pins are released."""
        self._epoch.close()


def open_split(store, progress, device, fanouts, batch_size, memory, loader, features: str, options) -> GnnData:
    """A loader's :class:`GnnData`, its features ``replicated`` (every row from this process's
    store) or ``split`` across the loader's ranks (:mod:`strata.gnn.features`; joins the RPC
    group through torchrun's rendezvous unless this process already did)."""
    if features not in ("replicated", "split"):
        raise ValueError(f"features: expected 'replicated' or 'split', got {features!r}")
    split = None
    if features == "split" and loader.world_size > 1:
        join_rpc(loader.rank, loader.world_size)
        split = (loader.rank, loader.world_size)
    if memory is not None:
        options = {**options, "memory": memory}
    return GnnData(store, progress, device=device, fanouts=fanouts, batch_size=batch_size, split=split, **options)


def _rank_share(loader, items):
    """``(items, shuffle)`` of the loader's next epoch: all of them, or in a distributed run
    the rank's :func:`shard` of them, already shuffled (so the native loader keeps its order)."""
    if loader.world_size == 1:
        return items, loader.shuffle
    seed = loader.data.config["seed"]
    share = shard(
        items, loader.rank, loader.world_size, epoch=loader.epoch, seed=seed, shuffle=loader.shuffle, pad=loader.pad
    )
    return share, False


class NodeLoader:
    """Node-classification batches over ``nodes`` (ids or a split name, default ``train``):
    each ``iter(loader)`` is one epoch (reshuffled); ``loader.stats`` is the last epoch's.

    For data-parallel training (DistributedDataParallel) give ``rank`` and ``world_size``, or
    neither to take them from torch.distributed when its default group is initialised: each
    epoch then yields rank ``rank``'s :func:`shard` of the nodes, drawn from the same
    ``(seed, epoch)`` permutation on every rank and padded so that every rank yields the same
    number of batches (``pad=False``: the shares partition the nodes exactly, for evaluation,
    and differ by at most one node). Each rank's loader plans within its own ``memory``.

    ``features="split"`` (with more than one rank) holds only the feature rows this rank owns
    and fetches a batch's other rows from their owners over torch.distributed RPC
    (:mod:`strata.gnn.features`), requested one batch ahead; under torchrun the RPC group is
    joined through its rendezvous. Every rank must open its loaders in the same order."""

    def __init__(
        self,
        store: str | Path,
        fanouts=(15, 10),
        batch_size: int = 1024,
        *,
        nodes="train",
        memory: int | str | None = None,
        device: str = "cpu",
        shuffle: bool = True,
        drop_last: bool = False,
        progress: Callable[..., bool] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pad: bool = True,
        features: str = "replicated",
        **options,
    ):
        self.rank, self.world_size = distributed_rank(rank, world_size)
        self.pad = pad
        self.data = open_split(store, progress, device, fanouts, batch_size, memory, self, features, options)
        self.nodes = self.data.node_set(nodes)
        self.device, self.shuffle, self.drop_last = device, shuffle, drop_last
        self.epoch = 0
        self.stats: dict | None = None

    def __iter__(self) -> Iterator[Batch]:
        nodes, shuffle = _rank_share(self, self.nodes)
        loader = self.data.loader(
            nodes, shuffle=shuffle, drop_last=self.drop_last, device=self.device, epoch=self.epoch
        )
        self.epoch += 1
        try:
            yield from loader
        finally:
            self.stats = loader.stats()
            loader.close()


class LinkLoader:
    """Link-prediction batches over ``edges`` (a split name, default ``train``, or a ``(2, E)``
    array of (source, destination) ids): ``batch_size`` positive edges per batch, each with
    ``negatives`` uniform negative destinations; each ``iter(loader)`` is one epoch
    (reshuffled); ``loader.stats`` is the last epoch's. Batches carry ``edge_label_index``
    ``(2, B * (1 + negatives))`` and ``edge_label`` besides ``blocks`` and ``x``.

    ``rank`` and ``world_size`` split each epoch's edges across the ranks of a data-parallel
    run as :class:`NodeLoader` splits its nodes; ``features`` is :class:`NodeLoader`'s."""

    def __init__(
        self,
        store: str | Path,
        fanouts=(15, 10),
        batch_size: int = 1024,
        *,
        edges="train",
        negatives: int = 1,
        memory: int | str | None = None,
        device: str = "cpu",
        shuffle: bool = True,
        drop_last: bool = False,
        progress: Callable[..., bool] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pad: bool = True,
        features: str = "replicated",
        **options,
    ):
        self.rank, self.world_size = distributed_rank(rank, world_size)
        self.pad = pad
        self.data = open_split(store, progress, device, fanouts, batch_size, memory, self, features, options)
        self.edges = self.data.edges(edges) if isinstance(edges, str) else edge_index_array(edges, self.data.num_nodes)
        self.negatives = negatives_per_edge(negatives)
        self.device, self.shuffle, self.drop_last = device, shuffle, drop_last
        self.epoch = 0
        self.stats: dict | None = None

    def __iter__(self) -> Iterator[Batch]:
        edges, shuffle = _rank_share(self, self.edges)
        loader = self.data.link_loader(
            edges,
            negatives=self.negatives,
            shuffle=shuffle,
            drop_last=self.drop_last,
            device=self.device,
            epoch=self.epoch,
        )
        self.epoch += 1
        try:
            yield from loader
        finally:
            self.stats = loader.stats()
            loader.close()
