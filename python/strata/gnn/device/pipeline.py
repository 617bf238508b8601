"""The deep pipeline of the device data path (Helios §3.3, GIDS §3.4).

Batches are sampled ``window`` batches ahead of their feature lookups, each started (its draw
queued on the sampling stream) before the one before it is finished, so that the host never
waits for a draw. As a batch is sampled,
hop by hop on a sampling stream, the cache places its nodes (device tier, host tier, miss) and
pins its misses in the I/O engine's dynamic cache, so a row read for one batch stays cached for
the batches of the window that need it too (GIDS window buffering: the sampled-ahead batches
say which rows are reused soon). A batch's lookups then run on a lookup stream (device and
host-tier rows by kernel, misses through the I/O engine) while later batches are sampled, and
batch ``i + 1`` is prepared while the model trains batch ``i``: the training stream waits for a
batch's "ready" event only when it takes the batch. On the CPU twin the same code runs in
order. Per-epoch statistics give each stage's busy seconds and the share of the epoch the
model waited for data.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..batch import Batch
from ..models import Block
from .cache import DeviceCache, PlannedLookup
from .keys import batch_key, epoch_order
from .sampler import DeviceSample, DeviceSampler, Started, one_ahead

#: Batches a CUDA producer thread prepares ahead of training.
PREFETCH = 2
#: Batches sampled ahead of their lookups (GIDS's default window depth).
WINDOW = 8
#: Who issues a CUDA pipeline's work (:class:`DevicePipeline`'s ``producer``).
PRODUCERS = ("thread", "inline")


class StageClock:
    """Busy seconds per stage: CUDA events on the stage's stream on a GPU (read at the epoch's
    end, so timing never blocks the pipeline), the host clock on the CPU twin, where a span
    inside another (a hop's lookups inside sampling) counts for its own stage only."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = {}
        self._inner: list[float] = []

    @contextmanager
    def span(self, stage: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans.setdefault(stage, []).append((start, end))
            return
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            inner = self._inner.pop()
            took = time.perf_counter() - t0
            if self._inner:
                self._inner[-1] += took
            self.spans.setdefault(stage, []).append(took - inner)

    def totals(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {k: sum(s.elapsed_time(e) for s, e in v) / 1e3 for k, v in self.spans.items()}
        return {k: float(sum(v)) for k, v in self.spans.items()}


class DevicePipeline:
    """Batches of one device: the :class:`DeviceSampler` samples them ``window`` batches ahead
    of their lookups, the :class:`DeviceCache` serves their rows; ``labels`` (int64 per node
    on the device, or None) gives ``y``. When a batch's missed rows are due, they are read in
    one read with those of the batches after it in the window, up to ``read_rows`` missed
    rows in all (None: the whole window; 0: each batch's alone), so pages shared by batches
    are read once.

    On CUDA, ``producer`` says which host thread issues the data path's work. ``thread``: a
    producer thread prepares ``PREFETCH`` batches ahead, so a host wait (a miss's read from the
    SSD, a draw's sizes) never holds the training loop; but the two threads share one
    interpreter, and every torch op releases the GIL and takes it back, so each thread's ops
    queue behind the other's Python. ``inline``: the training loop issues each batch's
    sampling and lookups itself when it asks for the batch, between its steps. The device
    still overlaps them with training (separate streams, the window's draws queued batches
    ahead), and one thread hands the GIL to nobody; a host wait holds the loop, so it suits a
    cache whose rows cannot miss. The CPU twin always runs in order."""

    def __init__(
        self,
        sampler: DeviceSampler,
        cache: DeviceCache,
        labels: torch.Tensor | None,
        batch_size: int,
        *,
        window: int = WINDOW,
        read_rows: int | None = None,
        producer: str = "thread",
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size: expected at least 1, got {batch_size}")
        if window < 0:
            raise ValueError(f"window: expected at least 0 batches, got {window}")
        if producer not in PRODUCERS:
            raise ValueError(f"producer: expected one of {', '.join(PRODUCERS)}, got {producer!r}")
        self.sampler, self.cache, self.labels, self.batch_size = sampler, cache, labels, batch_size
        self.window, self.read_rows, self.producer = window, read_rows, producer
        self.device = sampler.device
        cuda = self.device.type == "cuda"
        self._sample_stream = torch.cuda.Stream(self.device) if cuda else None
        self._lookup_stream = torch.cuda.Stream(self.device) if cuda else None
        self.stats: dict | None = None

    def describe_window(self) -> str:
        """The window, its reads and who issues the work, for the plan's lines."""
        ahead = f"a window of {self.window} batches sampled ahead, their misses pinned"
        if self.window == 0:
            window = "no window: each batch's misses read when it is served"
        elif self.read_rows == 0:
            window = f"{ahead}; each batch's misses read alone (no accumulator)"
        else:
            most = "the whole window's" if self.read_rows is None else f"up to {self.read_rows:,} rows"
            window = f"{ahead} and read together ({most})"
        if self._sample_stream is None:
            return window
        if self.producer == "thread":
            return f"{window}; a producer thread {PREFETCH} batches ahead of training"
        return f"{window}; issued inline by the training loop"

    def epoch(
        self, seeds, *, epoch: int = 0, seed: int = 0, shuffle: bool = True, drop_last: bool = False
    ) -> Iterator[Batch]:
        """One epoch's batches over ``seeds`` (global ids), in the native loader's order and
        with its batch keys, so each batch's sample equals the native loader's. On CUDA a
        producer thread prepares up to ``PREFETCH`` batches ahead on the sampling and lookup
        streams (its host waits, e.g. for a hop's sizes, release the GIL), so batch ``i + 1``
        is sampled and read while the model trains batch ``i``; on the CPU twin each batch is
        prepared when it is asked for."""
        order = epoch_order(np.asarray(seeds), seed, epoch) if shuffle else np.asarray(seeds, dtype=np.int64)
        # Checked once here, so no batch passes over its seeds on the host.
        self.sampler.check(order)

        def start(part: np.ndarray, key: int) -> Started:
            started = self.sampler.start(torch.from_numpy(part), key, checked=True)
            return Started(lambda on_hop: (started.finish(on_hop), None), started.abandon)

        return self._run(
            len(order), lambda i: order[i * self.batch_size : (i + 1) * self.batch_size], start, epoch, drop_last
        )

    def link_epoch(
        self, edges, negatives: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True, drop_last: bool = False
    ) -> Iterator[Batch]:
        """One link-prediction epoch over ``edges`` (a ``(2, E)`` array of positive (source,
        destination) ids): the native loader's shuffle of the edges as pairs, its cut into
        ``batch_size`` edges and its batch keys; each batch is
        :meth:`~strata.gnn.device.sampler.DeviceSampler.sample_links` of its edges with
        ``negatives`` destinations per edge, so blocks and negatives equal the native
        batch's. Batches carry ``links`` (the local ids behind ``edge_label_index``)."""
        edges = np.asarray(edges, dtype=np.int64)
        n = edges.shape[1]
        order = epoch_order(np.arange(n), seed, epoch) if shuffle else np.arange(n)
        edges = edges[:, order]
        self.sampler.check(edges, distinct=False)

        def start(part: np.ndarray, key: int) -> Started:
            # Link batches are drawn when finished (their endpoints' relabelling reads back).
            def finish(on_hop):
                src, dst = torch.from_numpy(part[0]), torch.from_numpy(part[1])
                links = self.sampler.sample_links(src, dst, negatives, key, on_hop=on_hop, checked=True)
                return links.sample, (links.src_local, links.dst_local, links.neg_dst_local)

            return Started(finish)

        return self._run(
            n, lambda i: edges[:, i * self.batch_size : (i + 1) * self.batch_size], start, epoch, drop_last
        )

    def _run(self, n: int, part, start, epoch: int, drop_last: bool) -> Iterator[Batch]:
        """The epoch's batches: ``n`` items cut into ``batch_size`` parts (``part(i)``), each
        sampled by ``start(part, batch_key)``, a :class:`Started` whose ``finish(on_hop)`` gives
        ``(DeviceSample, links or None)``."""
        count = n // self.batch_size if drop_last else -(-n // self.batch_size)
        clock = StageClock(self.device)
        self.cache.reset_stats()
        produced = self._windowed(count, part, start, epoch, clock)
        if self._sample_stream is not None and self.producer == "thread":
            # The thread starts on device 0; it must work on this one. ``set_device`` takes an
            # index (torch 2.11 refuses a bare ``cuda``, which means the current device).
            index = torch.cuda.current_device() if self.device.index is None else self.device.index
            produced = _ahead(produced, PREFETCH, lambda: torch.cuda.set_device(index))
        waited, sampled, batches, started = 0.0, 0, 0, time.perf_counter()
        try:
            while True:
                t0 = time.perf_counter()
                item = next(produced, None)
                waited += time.perf_counter() - t0
                if item is None:
                    break
                batch, ready = item
                if ready is not None:
                    with clock.span("wait"):
                        # The training stream stalls until the batch is ready; the span's events
                        # measure that stall on the device.
                        stream = torch.cuda.current_stream(self.device)
                        stream.wait_event(ready)
                    held = (batch.x, batch.nodes, *(b.src for b in batch.blocks), *(b.dst for b in batch.blocks))
                    for t in (*held, *(batch.links or ())):
                        t.record_stream(stream)
                sampled, batches = sampled + len(batch.nodes), batches + 1
                # The epoch so far, for a progress line (the stage timings come at its end).
                self.stats = {"batches": batches, "sampled_nodes": sampled, "tiers": self.cache.stats_dict()}
                # The consumer's step, on its stream (the model's busy time: the rest of the
                # epoch it had no batch to train).
                with clock.span("train"):
                    yield batch
        finally:
            # Also when the consumer stops early: the prefetch thread ends here, not at exit
            # (where a thread inside a CUDA call aborts the interpreter), and the stats cover
            # the batches served.
            produced.close()
            totals = clock.totals()
            wall = time.perf_counter() - started
            # Two clocks, kept apart: their sum is no share of the wall (an inline producer's
            # host work and the device's stall on the batch it issued overlap in time).
            stalled = totals.pop("wait", 0.0)
            trained = totals.pop("train", 0.0)
            self.stats = {
                "batches": batches,
                "wall_seconds": wall,
                "busy_seconds": totals,
                # The training loop's host seconds blocked on the next batch (an inline
                # producer's: issuing it).
                "waited_seconds": waited,
                "wait_share": waited / wall if wall > 0 else 0.0,
                # The model's stream stalled on a batch's ready event (CUDA events; 0 on the
                # CPU twin, whose batches are ready when handed out).
                "stalled_seconds": stalled,
                # The share of the epoch the model's stream had no step to run: waiting for a
                # batch, or for the host to issue the step (on the CPU twin, the host's time
                # outside the steps).
                "train_seconds": trained,
                "model_idle_share": max(wall - trained, 0.0) / wall if wall > 0 else 0.0,
                "sampled_nodes": sampled,
                "sampler": "device",
                "producer": self.producer if self._sample_stream is not None else "in order",
                # How the sampler's batches ran so far: CUDA graphs replayed (and captured), or
                # op by op (the CPU twin; a sampler that is not uniform or whose capture failed).
                "sampler_batches": dict(self.sampler.counts),
                "window": self.window,
                "tiers": self.cache.stats_dict(),
            }

    def _windowed(self, count: int, part, start, epoch: int, clock: StageClock) -> Iterator[tuple]:
        """``(batch, ready event or None)`` for batches ``0 .. count``, each sampled (and its
        lookups planned) ``window`` batches before it is served. Batch ``i + 1`` is started
        before batch ``i`` is finished, so the host never waits for a draw (only, once a batch,
        for sizes long computed). Batches started or in the window when the epoch ends early
        are given up, their pins released."""
        window: deque[SampledBatch] = deque()
        ahead = one_ahead(self._started(part(i), start, epoch, i, clock) for i in range(count))
        try:
            for i, started in enumerate(ahead):
                window.append(self._finished(i, started, clock))
                if len(window) > self.window:
                    yield self._served(window.popleft(), window, clock)
            while window:
                yield self._served(window.popleft(), window, clock)
        finally:
            ahead.close()
            for waiting in window:
                for planned in waiting.parts:
                    self.cache.release(planned)

    def _started(self, part, start, epoch: int, index: int, clock: StageClock) -> Started:
        """Starts sampling batch ``index`` on the sampling stream."""
        sample_ctx = torch.cuda.stream(self._sample_stream) if self._sample_stream is not None else nullcontext()
        with sample_ctx, clock.span("sample"):
            return start(part, batch_key(epoch, index))

    def _finished(self, index: int, started: Started, clock: StageClock) -> SampledBatch:
        """Finishes sampling a started batch, placing its nodes as soon as they are known (on
        the lookup stream, after the sampling stream's event)."""
        parts: list[PlannedLookup] = []
        sample_ctx = torch.cuda.stream(self._sample_stream) if self._sample_stream is not None else nullcontext()
        lookup_ctx = torch.cuda.stream(self._lookup_stream) if self._lookup_stream is not None else nullcontext()

        def on_hop(new_nodes: torch.Tensor) -> None:
            if self._lookup_stream is not None:
                self._lookup_stream.wait_stream(self._sample_stream)
                new_nodes.record_stream(self._lookup_stream)
            with lookup_ctx, clock.span("lookup"):
                parts.append(self.cache.plan(new_nodes))

        try:
            with sample_ctx, clock.span("sample"):
                drawn, links = started.finish(on_hop)
        except BaseException:
            started.abandon()
            for planned in parts:
                self.cache.release(planned)
            raise
        done = None
        if self._sample_stream is not None:
            done = torch.cuda.Event()
            done.record(self._sample_stream)
        return SampledBatch(index, drawn, links, parts, done)

    def _served(self, sampled: SampledBatch, waiting: deque[SampledBatch], clock: StageClock):
        """``(batch, ready event or None)``: the sampled batch's rows looked up (on the lookup
        stream), its misses read with those of the ``waiting`` batches behind it when they
        are not read yet."""
        lookup_ctx = torch.cuda.stream(self._lookup_stream) if self._lookup_stream is not None else nullcontext()
        if sampled.done is not None:
            self._lookup_stream.wait_event(sampled.done)
        rows = []
        try:
            with lookup_ctx, clock.span("lookup"):
                if any(p.unread for p in sampled.parts):
                    self.cache.read_ahead(self._read_group(sampled, waiting))
                for planned in sampled.parts:
                    rows.append(self.cache.serve(planned))
        finally:
            # A lookup that failed released its own pins; the parts after it release theirs.
            for planned in sampled.parts[len(rows) + 1 :]:
                self.cache.release(planned)
        with lookup_ctx:
            x = torch.cat(rows) if len(rows) > 1 else rows[0]
            batch = self._batch(sampled.index, sampled.drawn, x, sampled.links)
        if self._lookup_stream is None:
            return batch, None
        ready = torch.cuda.Event()
        ready.record(self._lookup_stream)
        return batch, ready

    def _batch(self, index: int, sample: DeviceSample, x: torch.Tensor, links) -> Batch:
        blocks = []
        for b in sample.blocks:
            dst = b.dst
            if dst is None:
                # Edge e's destination is the row whose span of indptr holds it: one search a
                # block (a bounded batch's draw made them already, inside its graph).
                edges = torch.arange(b.indices.numel(), device=b.indices.device)
                dst = torch.searchsorted(b.indptr[1:], edges, right=True)
            blocks.append(Block(b.num_src, b.num_dst, b.indices, dst))
        seeds = sample.nodes[: sample.hop_counts[0]]
        y = None if self.labels is None else self.labels[seeds]
        stats = {"sampler": "device"}
        return Batch(index, seeds, sample.nodes, list(sample.hop_counts), blocks, x, y, stats, links, sample.sizes)

    def _read_group(self, head: SampledBatch, waiting: deque[SampledBatch]) -> list[PlannedLookup]:
        """The lookups whose misses are read with ``head``'s: its own, then those of the
        waiting batches in order while the missed rows stay within ``read_rows``."""
        group = list(head.parts)
        total = sum(p.unread for p in group)
        for batch in waiting:
            more = sum(p.unread for p in batch.parts)
            if self.read_rows is not None and total + more > self.read_rows:
                break
            group += batch.parts
            total += more
        return group


@dataclass
class SampledBatch:
    """A batch sampled and placed, waiting in the window for its lookups: its ``drawn``
    sample, link ids (or None), its hops' ``parts`` and the sampling stream's ``done`` event
    (None on the CPU twin)."""

    index: int
    drawn: DeviceSample
    links: tuple | None
    parts: list[PlannedLookup]
    done: torch.cuda.Event | None


def _ahead(items: Iterator, depth: int, enter: Callable[[], None]) -> Iterator:
    """``items`` produced by a background thread up to ``depth`` ahead, the thread first
    calling ``enter()``; an exception of either is raised here, and closing this iterator early
    stops the thread."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            enter()
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(done)
        except BaseException as e:  # handed to the consumer, which raises it
            slots.put(e)
        finally:
            # Stopped early, the items' own clean-up (e.g. releasing pins) runs here, now.
            if hasattr(items, "close"):
                items.close()

    thread = threading.Thread(target=produce, name="strata-device-pipeline", daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                slots.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
