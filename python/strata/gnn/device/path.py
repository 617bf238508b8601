"""The device data path of a :class:`~strata.gnn.loader.GnnData`: the device sampler, the
device-managed cache and the deep pipeline behind the same loader interface (``iter``,
``stats()``, ``close()``) as the native data path."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ..batch import Batch
from .cache import DeviceCache, presample_hotness
from .pipeline import DevicePipeline
from .reads import EngineReads, choose_reads
from .sampler import DeviceSampler
from .topology import DeviceTopology


class DeviceDataPath:
    """Opens the device path for ``data`` on ``device``: the CSC in device memory when it fits
    ``device_bytes`` (else page-locked host memory), hotness from one pre-sampling epoch over
    ``train_nodes`` (none when the rest of ``device_bytes`` holds every row), then the hottest
    rows in the rest of ``device_bytes`` and the next in ``host_bytes`` of page-locked host
    memory; misses read by GPUDirect Storage where it can (``gds="auto"``,
    :func:`~strata.gnn.device.reads.choose_reads`), else through ``data``'s native tiers (its
    dynamic cache, pinned by the pipeline's window of ``window`` batches sampled ahead, then
    the I/O engine); ``reads`` and ``reads_note`` say which and why. ``producer`` is the
    pipeline's (:class:`~strata.gnn.device.pipeline.DevicePipeline`)."""

    def __init__(
        self,
        data,
        device,
        *,
        train_nodes,
        device_bytes: int,
        host_bytes: int,
        gds: str = "auto",
        producer: str = "thread",
    ):
        # The native data path samples uniformly; so does its device twin.
        cfg = data.config
        self.device = torch.device(device)
        self.topology = DeviceTopology.open(data.store, self.device, weighted=False, budget=device_bytes)
        self.sampler = DeviceSampler(self.topology, cfg["fanouts"], seed=cfg["seed"])
        on_device = self.topology.nbytes if self.topology.placement == "device" else 0
        index_bytes = data.num_nodes * 8
        free = max(device_bytes - on_device - index_bytes, 0)
        if free // data.row_bytes >= data.num_nodes:
            # Every row fits in device memory: no ranking to make, so no pre-sampling epoch.
            hotness = torch.zeros(data.num_nodes, dtype=torch.int64)
        else:
            hotness = presample_hotness(self.sampler, np.asarray(train_nodes), cfg["batch_size"])
        engine = EngineReads(data._native, data.dim, data.torch_dtype, self.device)
        choice = choose_reads(engine, data.store.features, self.device, gds=gds)
        self.reads, self.reads_note = choice.reads.kind, choice.note
        self.cache = DeviceCache(
            data.store.features,
            choice.reads,
            hotness,
            device_rows=free // data.row_bytes,
            host_rows=host_bytes // data.row_bytes,
            device=self.device,
        )
        labels = None if data.labels is None else torch.from_numpy(np.asarray(data.labels, dtype=np.int64))
        self.pipeline = DevicePipeline(
            self.sampler,
            self.cache,
            None if labels is None else labels.to(self.device),
            cfg["batch_size"],
            window=cfg["window"],
            # The plan's batch buffers hold the misses read ahead: the batches' rows on the
            # host (their features are on the device). Without the accumulator a batch's misses
            # are read alone.
            read_rows=max(int(data.plan["batch_buffers_bytes"]) // data.row_bytes, 1) if cfg["accumulator"] else 0,
            producer=producer,
        )
        self.seed = cfg["seed"]

    def budget(self) -> dict:
        """Bytes the path holds: ``device_memory`` (the CSC when on the device, the cache's
        index and device tier) and ``memory`` (page-locked: the CSC when there, the host tier);
        ``topology`` says which holds the CSC (``host`` on the CPU twin, whose tensors are in
        RAM)."""
        cache = self.cache.nbytes
        topo = self.topology.nbytes
        on_device = self.topology.placement == "device" and self.device.type != "cpu"
        return {
            "device_memory": cache["device_memory"] + (topo if on_device else 0),
            "memory": cache["memory"] + (0 if on_device else topo),
            "topology": "device" if on_device else "host",
            "device_rows": self.cache.device_table.shape[0],
            "host_rows": self.cache.host_table.shape[0],
        }

    def loader(self, nodes, *, epoch: int, shuffle: bool, drop_last: bool) -> DeviceEpochLoader:
        """One epoch's node batches over ``nodes`` (global ids)."""
        batches = self.pipeline.epoch(nodes, epoch=epoch, seed=self.seed, shuffle=shuffle, drop_last=drop_last)
        return DeviceEpochLoader(self, batches)

    def link_loader(self, edges, negatives: int, *, epoch: int, shuffle: bool, drop_last: bool) -> DeviceEpochLoader:
        """One epoch's link batches over ``edges`` (``(2, E)`` positive pairs), ``negatives``
        uniform destinations per edge."""
        batches = self.pipeline.link_epoch(
            edges, negatives, epoch=epoch, seed=self.seed, shuffle=shuffle, drop_last=drop_last
        )
        return DeviceEpochLoader(self, batches)


class DeviceEpochLoader:
    """One epoch's batches on the device path; ``stats()`` is the pipeline's: during the epoch
    the batches, sampled nodes and rows per tier so far, after it also the busy seconds per
    stage, the share of the epoch the model waited and ``sampler: "device"``."""

    def __init__(self, path: DeviceDataPath, batches: Iterator[Batch]):
        self.path = path
        self._batches = batches

    def __iter__(self) -> Iterator[Batch]:
        return self._batches

    def stats(self) -> dict | None:
        return self.path.pipeline.stats

    def close(self) -> None:
        self._batches.close()
