"""The torch backend of the compute seam: the Rust epoch loop hands it each piece of a bucket.

``strata_embed``'s epoch loop (ordering, partition buffer, I/O, run format) stays in Rust; a job
trained with ``device`` other than ``cpu`` calls :meth:`TorchCompute.train_piece` for every
piece, with the resident partition slots lent as writable host buffers.

Legend's placement: the partition slots (embeddings and Adagrad state) and the relations stay on
the device. The epoch loop's slot hooks say when: :meth:`TorchCompute.slot_in` once the I/O
engine has read a partition into its host slot (the device copies it in on the copy stream; the
compute stream waits for that copy only when a piece first uses the slot), and
:meth:`TorchCompute.slot_out` before a slot is written back or evicted (the device copies its
rows out into the host slot, which the I/O engine then writes to the table file). Edge pieces
are staged host -> device per piece. On ``cuda`` host -> device copies go through a pinned
staging buffer on a separate stream with events; on ``torch-cpu`` (the CPU twin, for machines
without a GPU and for the parity tests) the "device copy" is a separate tensor, so the hooks
move the same bytes at the same times and a missed write-back shows in the table.

A table the backend does not hold (a run path that calls no hooks) is copied in before the
piece and back before the call returns, as the seam's contract asks.
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from strata.device.gds import compat_mode_reason
from strata.device.pins import HostPins, cuda_register
from strata.embed.device import graphs, step, vs_all
from strata.embed.device.rows import Bank, Feat, Places, Table


def resolve(device: str) -> torch.device:
    """The torch device of a ``device`` option: ``cuda``, ``cuda:N`` or ``torch-cpu``.

    Raises a ``ValueError`` naming the option when CUDA is asked for and absent."""
    if device == "torch-cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device}: CUDA is not available to torch {torch.__version__}"
                " (no GPU, or a CPU-only torch build); use device = cpu, or torch-cpu for the"
                " device path on the CPU"
            )
        return torch.device(device)
    raise ValueError(f"device {device!r}: the torch backend takes torch-cpu, cuda or cuda:N (cpu is the Rust engine's)")


#: Device memory one tile of scores may take (scores, comparisons and masks; the pairwise
#: models' ``queries x candidates x dim`` differences): 256 MiB on a GPU, 64 MiB on the CPU twin.
TILE_BYTES = {"cuda": 256 << 20, "cpu": 64 << 20}


def memory_info(device: str) -> tuple[int | None, int]:
    """``(free bytes, evaluation tile bytes)`` of a ``device`` option, for the planner's
    ``device_memory``: the free memory as ``torch.cuda.mem_get_info`` reports it, ``None`` on
    the CPU twin (no memory of its own), and the bytes one tile of the device evaluator takes."""
    dev = resolve(device)
    tile = TILE_BYTES["cuda" if dev.type == "cuda" else "cpu"]
    if dev.type != "cuda":
        return None, tile
    free, _ = torch.cuda.mem_get_info(dev)
    return int(free), tile


def check_options(options: dict) -> None:
    """Raises a ``ValueError`` naming the option when the device backend cannot train a run of
    ``[embed.train]`` ``options`` (before anything is written): an unsupported model, CUDA
    asked for and absent."""
    resolve(options["device"])
    step.check_model(options["model"])


#: A piece's inputs, each staged host -> device through a buffer of its own.
PIECE_INPUTS = ("edges", "weights", "streams")

#: The storage types of lent tables (``DeviceTable``'s dtype).
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


class Lent(NamedTuple):
    """A table the Rust epoch loop lends (``DeviceTable``): its params and state as writable
    buffers, the rows in use, the address that keys it, its storage type (``f32``, or
    ``bf16`` for a ``table_dtype = "bf16"`` run's partitions) and the bytes from ``key`` on that
    are its own host buffer for the whole job (a partition slot's; 0: not a buffer of its own),
    which the backend may page-lock in place."""

    params: memoryview
    state: memoryview
    rows: int
    key: int
    dtype: str
    span: int = 0


@dataclass
class Slot:
    """A table held on the device: ``kind`` (``partition``, ``pinned``, ``staged`` or
    ``relations``), its slot in the buffer (partitions; the pinned region in its tail) or its own
    device rows (relations), and the event its copy in records (``None`` once the compute stream
    waited for it)."""

    kind: str
    index: int | None = None
    table: Table | None = None
    ready: object = None
    #: Floats of params and of state (a partition's part of its slot).
    floats: tuple[int, int] = (0, 0)


#: The slot index of the buffer's tail, which holds a typed run's pinned region.
TAIL = -1


class SlotBuffer:
    """The partition slots as one device buffer (Legend's placement): params and Adagrad state
    each one flat tensor, slot-major, every slot as large as the largest table it held, so that
    with rows of ``width`` floats the row ``r`` of the partition in slot ``i`` is buffer row
    ``i * slot_rows + r``: a chunk gathers and updates its rows of every resident partition
    with one indexed read and one indexed add, and a captured step's memory is the buffer's.
    A typed run's pinned region, resident all epoch and of its own size, is the buffer's tail
    (slot :data:`TAIL`, from row ``slots * slot_rows``), so that it sizes no partition slot.

    The buffer grows (a new one, the held slots copied over) when a table is larger than a slot
    or every slot is taken, or the tail changes size: in a run, only as its first slots fill.
    Its floats are the tables' storage type (:meth:`use_dtype`): float32, or bfloat16 for a
    ``table_dtype = "bf16"`` run."""

    def __init__(self, device: torch.device):
        self.device = device
        self._empty(torch.float32)

    def _empty(self, dtype: torch.dtype) -> None:
        """No slot and no tail, in values of ``dtype``."""
        self.params = torch.zeros(0, dtype=dtype, device=self.device)
        self.state = torch.zeros(0, dtype=dtype, device=self.device)
        self.size = (0, 0)  # floats of params and of state per slot
        self.tail = (0, 0)  # floats of params and of state of the tail
        self.taken: list[bool] = []

    def use_dtype(self, dtype: torch.dtype) -> None:
        """Makes the buffer hold values of ``dtype`` (a run's tables share one): emptied when
        it held another, which only a new run's first table can ask for."""
        held = self.params.dtype
        if dtype == held:
            return
        if any(self.taken) or self.tail != (0, 0):
            raise ValueError(f"a {dtype} table cannot share the device's slot buffer with {held} tables")
        self._empty(dtype)

    def place(self, n_params: int, n_state: int) -> int:
        """A free slot for a table of ``n_params`` and ``n_state`` floats, taken."""
        free = [i for i, taken in enumerate(self.taken) if not taken]
        size = (max(self.size[0], n_params), max(self.size[1], n_state))
        if not free or size != self.size:
            self._grow(size, len(self.taken) + (0 if free else 1), self.tail)
            free = free or [len(self.taken) - 1]
        self.taken[free[0]] = True
        return free[0]

    def place_tail(self, n_params: int, n_state: int) -> int:
        """The tail, sized for a table of ``n_params`` and ``n_state`` floats: :data:`TAIL`."""
        if self.tail != (n_params, n_state):
            self._grow(self.size, len(self.taken), (n_params, n_state))
        return TAIL

    def release(self, index: int) -> None:
        if index != TAIL:
            self.taken[index] = False

    def _position(self, index: int) -> int:
        """Slot ``index``'s place in the buffer: the tail's after every slot."""
        return len(self.taken) if index == TAIL else index

    def _start(self, index: int) -> tuple[int, int]:
        """Where slot ``index`` starts in the params and in the state (floats)."""
        at = self._position(index)
        return at * self.size[0], at * self.size[1]

    def region(self, index: int, n_params: int, n_state: int) -> Table:
        """The first ``n_params`` and ``n_state`` floats of slot ``index`` (flat views)."""
        p, s = self._start(index)
        return Table(self.params[p : p + n_params], self.state[s : s + n_state])

    def base(self, index: int, slot_rows: int) -> int:
        """The buffer row where slot ``index`` starts, with ``slot_rows`` rows a slot."""
        return self._position(index) * slot_rows

    def rows(self, width: int) -> tuple[Table, int]:
        """The buffer as rows of ``width`` floats (and their state, row by row), and the rows of
        a slot. Raises a ``ValueError`` when the slots do not hold whole rows."""
        p, s = self.size
        slot_rows = p // width if width else 0
        if not slot_rows or p % width or s % slot_rows or self.tail[0] % width:
            raise ValueError(f"partition slots of {p} floats and {s} of state do not hold whole rows of {width} reals")
        params = self.params.view(-1, width)
        places = Places(slot_rows, len(self.taken) * slot_rows)
        return Table(params, self.state.view(params.shape[0], -1), places), slot_rows

    def _grow(self, size: tuple[int, int], slots: int, tail: tuple[int, int]) -> None:
        """Makes the buffer ``slots`` slots of ``size`` and a tail of ``tail`` floats, the held
        slots' floats and the tail's (what fits) copied over."""
        if self.device.type == "cuda":
            # Slot copies may still read or write the old buffer on the copy stream.
            torch.cuda.synchronize(self.device)
        old, (p, s), old_tail = (self.params, self.state), self.size, self._start(TAIL)
        self.params = torch.zeros(slots * size[0] + tail[0], dtype=old[0].dtype, device=self.device)
        self.state = torch.zeros(slots * size[1] + tail[1], dtype=old[1].dtype, device=self.device)
        for i, taken in enumerate(self.taken):
            if taken:
                self.params[i * size[0] : i * size[0] + p].copy_(old[0][i * p : (i + 1) * p])
                self.state[i * size[1] : i * size[1] + s].copy_(old[1][i * s : (i + 1) * s])
        for k, (new, flat) in enumerate(zip((self.params, self.state), old, strict=True)):
            kept, start = min(tail[k], self.tail[k]), slots * size[k]
            new[start : start + kept].copy_(flat[old_tail[k] : old_tail[k] + kept])
        self.size, self.tail = size, tail
        self.taken += [False] * (slots - len(self.taken))
        if self.device.type == "cuda":
            # The copy stream fills slots of the new buffer next: the compute stream's zeros
            # and copies first.
            torch.cuda.synchronize(self.device)


class Staging:
    """A pinned host buffer that host -> device copies go through on ``cuda`` (an asynchronous
    copy needs page-locked memory); reused once the copy that last read it is done."""

    def __init__(self, device: torch.device, stream):
        self.device = device
        self.stream = stream
        self.buf = torch.empty(0, dtype=torch.uint8)
        self.done = None

    def to_device(self, host: torch.Tensor, out: torch.Tensor | None = None):
        """``host`` copied to ``out`` (by default a new device tensor) on the copy stream;
        returns it and the event the copy records."""
        if self.done is not None:
            self.done.synchronize()
        nbytes = host.numel() * host.element_size()
        if self.buf.numel() < nbytes:
            self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        pinned = self.buf[:nbytes].view(host.dtype).view(host.shape)
        pinned.copy_(host)
        if out is None:
            # Made on the copy stream, which writes it first, and recorded as the compute
            # stream's, so the allocator gives it to no later copy before the compute reading
            # it is done: the host runs a piece ahead of the device (PieceLosses), and memory
            # freed by the compute stream could still be read by its queued steps.
            with torch.cuda.stream(self.stream):
                out = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            out.record_stream(torch.cuda.current_stream(self.device))
        else:
            # The copy stream writes memory the compute stream allocated (a slot's region, the
            # banks' rows), after the compute that read it before: a victim's copy out ordered
            # the copy stream after it, a piece with banks waits for its gradient's landing.
            out.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            out.copy_(pinned, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(self.stream)
        return out, self.done


class PieceLosses:
    """The pieces' summed losses on their way to the host. Each piece's total is copied out as
    the piece ends (on ``cuda`` on the compute stream, into pinned memory) and read one piece
    later: the host waits for the piece before the one it has just queued, never for that one,
    so the device trains a piece while the host (the Rust epoch loop: shuffling, chunking and
    lending the next piece) prepares the next. The CPU twin keeps the same order, its copies
    done at once."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.flight: list[tuple[torch.Tensor, object]] = []

    def push(self, total: torch.Tensor) -> None:
        """Queues the copy out of a piece's ``total`` (a 0-d device tensor, rewritten by the
        next piece's steps after the copy)."""
        if not self.cuda:
            self.flight.append((total.clone(), None))
            return
        host = torch.empty((), dtype=total.dtype, pin_memory=True)
        host.copy_(total, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self.flight.append((host, copied))

    def take(self, leave: int = 0) -> float:
        """The summed loss of the pieces queued but not yet taken, all but the last ``leave``
        (waiting for their copies)."""
        loss = 0.0
        while len(self.flight) > leave:
            host, copied = self.flight.pop(0)
            if copied is not None:
                copied.synchronize()
            loss += float(host)
        return loss


@contextmanager
def matmul_precision(tf32: bool):
    """CUDA's matrix products in TF32 (``tf32``) or full float32 inside the block, as before
    it after: a piece's steps take the run's ``device_matmul``, the evaluation float32. A
    captured graph keeps the kernels chosen at its capture, all of a job's at its setting."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def storage_note(device: torch.device, load=importlib.import_module) -> str:
    """Why the table does not go straight from the SSD to ``device`` (GPUDirect Storage), with
    the machine's own answer where kvikio (``load("kvikio")``) can give it."""
    if device.type != "cuda":
        why = f"no GPU (the device is {device})"
    else:
        try:
            kvikio = load("kvikio")
        except ImportError as e:
            why = f"kvikio does not import ({e})"
        else:
            compat = compat_mode_reason(kvikio)
            why = (
                f"kvikio would read through host memory here: {compat}"
                if compat is not None
                else "cuFile reads on this machine, but the embedding tables' partitions do not go through it"
            )
    return (
        f"GPUDirect Storage is not used ({why}): the table's partitions are read by Strata's"
        " I/O engine (O_DIRECT, io_uring) into host slots and copied to the device"
    )


#: What of a context only says where its tables sit (in the layout a replay copies in).
PLACEMENT = ("parts", "rels", "src_part", "dst_part", "part_of", "answers", "typed_spans", "feat", "bank")


class TorchCompute:
    """Trains pieces on a torch device, holding the slots the hooks hand it; counts the work
    of the steps and the copies."""

    def __init__(self, device: str, matmul: str = "float32"):
        self.device = resolve(device)
        self.cuda = self.device.type == "cuda"
        if matmul not in ("float32", "tf32"):
            raise ValueError(f"device_matmul {matmul!r}: expected float32 or tf32")
        self.tf32 = matmul == "tf32"
        if self.cuda:
            # Full f32 products outside the training steps (evaluation), and inside them unless
            # device_matmul = tf32: TF32 would break the parity with the Rust engine (see
            # docs/embed.md, "Devices").
            torch.backends.cuda.matmul.allow_tf32 = False
        # Copies host <-> device run on their own stream, so that a slot can move while the
        # compute stream works.
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.stage_slots = Staging(self.device, self.copy_stream) if self.cuda else None
        # A piece's edges, weights and streams each through a staging buffer of its own: one
        # shared would make each copy wait for the one before it to leave the buffer.
        self.stage_piece = {k: Staging(self.device, self.copy_stream) for k in PIECE_INPUTS} if self.cuda else {}
        self.stage_out = torch.empty(0, dtype=torch.uint8)
        self.stage_victim = torch.empty(0, dtype=torch.uint8)
        # The partition slots' host buffers, page-locked in place as they are first lent: their
        # copies then skip the staging buffers above (see strata.device.pins).
        self.pins = self._host_pins()
        self.slots: dict[int, Slot] = {}
        self.buffer = SlotBuffer(self.device)
        # The step's small device constants, one tensor per value (a captured graph reads
        # them), and the loss a piece's chunks add into (one tensor for the graphs' lifetime).
        self.consts: dict[tuple, torch.Tensor] = {}
        self.total = torch.zeros((), dtype=torch.float64, device=self.device)
        self.losses = PieceLosses(self.device)
        self.graphs = graphs.StepGraphs(self.device)
        # The negative banks' rows and gradient (one set per job), and the host memory and
        # version the rows were copied from.
        self.bank_rows = self.bank_grad = None
        self.bank_from: tuple | None = None
        self.reset_counters()

    def _host_pins(self) -> HostPins | None:
        """Where the slots' host buffers are registered: CUDA's runtime on ``cuda``, none on
        the CPU twin (whose "device" copies are host copies) or where torch gives no access to
        the runtime (said once; the slots then go through staging)."""
        if not self.cuda:
            return None
        try:
            return HostPins(*cuda_register(self.device))
        except Exception as e:
            print(f"device: slots copied through staging: CUDA's runtime is not reachable ({e})", file=sys.stderr)
            return None

    def describe(self) -> str:
        """The run's line about the device (printed once at the start)."""
        name = torch.cuda.get_device_name(self.device) if self.cuda else "the CPU twin"
        step_note = "chunk steps replay as CUDA graphs" if self.cuda else "chunk steps run op by op"
        if not self.tf32:
            products = "training products in full float32"
        elif self.cuda:
            products = "training products in TF32 on tensor cores (device_matmul = tf32; evaluation in float32)"
        else:
            products = "device_matmul = tf32 asked for, but the CPU twin has no TF32: its products are float32"
        slots = "partition slots and relations stay on the device"
        if self.cuda:
            slots += " (the slots' host buffers page-locked in place, copied without staging)"
        return f"device {self.device} ({name}): {slots}; {step_note}; {products}; {storage_note(self.device)}"

    def reset_counters(self) -> None:
        self.losses.take()  # counted by the last counters() call, or by none (not training)
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.copy_wait = 0.0
        self.slot_in_seconds = 0.0
        self.busy = 0.0
        self.events: list = []

    def counters(self) -> tuple[float, int, int, float, float, float]:
        """``(busy seconds, host->device bytes, device->host bytes, seconds waited for
        copies, seconds of slot copies in, loss of the pieces train_piece has not yet
        returned)`` since the last reset."""
        busy = self.busy
        if self.cuda:
            torch.cuda.synchronize(self.device)
            busy += sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
            print(self.graphs.report(), file=sys.stderr)
        else:
            self.graphs.report()
        return busy, self.bytes_h2d, self.bytes_d2h, self.copy_wait, self.slot_in_seconds, self.losses.take()

    @staticmethod
    def _host(table: Lent) -> tuple[torch.Tensor, torch.Tensor]:
        """A lent table's host rows and state (flat tensors over the lent memory)."""
        dtype = DTYPES[table.dtype]
        return torch.frombuffer(table.params, dtype=dtype), torch.frombuffer(table.state, dtype=dtype)

    def _to_device(self, host: torch.Tensor, staging, out: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """``host`` copied to the device, into ``out`` or a new tensor (a separate tensor on
        the CPU twin), and the event its copy records (``None`` on the CPU); through
        ``staging`` on ``cuda``, or with ``staging`` ``None`` straight from ``host``, which must
        be page-locked (:meth:`_pinned`)."""
        self.bytes_h2d += host.numel() * host.element_size()
        if not self.cuda:
            return (host.clone() if out is None else out.copy_(host)), None
        if staging is not None:
            return staging.to_device(host, out)
        # As Staging does with a given ``out``: the copy stream writes memory the compute
        # stream read before, ordered after that compute by the slot's copy out.
        out.record_stream(self.copy_stream)
        with torch.cuda.stream(self.copy_stream):
            out.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        return out, done

    def _pinned(self, table: Lent) -> bool:
        """Whether ``table``'s host buffer is page-locked in place (registered now if it was
        not); a refusal is said once, and that buffer's copies go through staging."""
        if self.pins is None:
            return False
        said = self.pins.refused
        pinned = self.pins.pin(table.key, table.span)
        if self.pins.refused != said:
            print(f"device: {self.pins.refused}; that slot's copies go through a staging buffer", file=sys.stderr)
        return pinned

    def slot_in(self, kind: str, table) -> None:
        """The I/O engine filled ``table`` (a :class:`Lent`'s fields): hold a device copy of it
        (relations only when none is held: the device's are newer)."""
        table = Lent(*table)
        key = table.key
        if kind == "relations" and key in self.slots:
            return
        start = time.perf_counter()
        if key in self.slots:
            self._forget(key)
        self.slots[key] = self._hold(kind, table)
        elapsed = time.perf_counter() - start
        self.slot_in_seconds += elapsed
        if not self.cuda:
            self.copy_wait += elapsed

    def _hold(self, kind: str, table: Lent) -> Slot:
        """A device copy of a lent table: relations in tensors of their own, a partition in a
        slot of the buffer, the pinned region in its tail."""
        hp, hs = self._host(table)
        if kind == "relations":
            dp, _ = self._to_device(hp, self.stage_slots)
            ds, ready = self._to_device(hs, self.stage_slots)
            return Slot(kind, table=Table(dp, ds), ready=ready)
        floats = (hp.numel(), hs.numel())
        self.buffer.use_dtype(hp.dtype)
        index = self.buffer.place_tail(*floats) if kind == "pinned" else self.buffer.place(*floats)
        region = self.buffer.region(index, *floats)
        staging = None if self._pinned(table) else self.stage_slots
        self._to_device(hp, staging, region.params)
        _, ready = self._to_device(hs, staging, region.state)
        return Slot(kind, index=index, ready=ready, floats=floats)

    def _ready(self, slot: Slot) -> Table:
        """The slot's device floats (flat), once the compute stream is ordered after their copy
        in."""
        if slot.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(slot.ready)
            slot.ready = None
        return slot.table if slot.index is None else self.buffer.region(slot.index, *slot.floats)

    def _forget(self, key: int) -> None:
        """Drops the slot of ``key`` (rows not copied out), its place in the buffer free."""
        slot = self.slots.pop(key)
        self._ready(slot)
        if slot.index is not None:
            self.buffer.release(slot.index)

    def held(self, key: int) -> Table:
        """The device floats (flat) of the table held for host memory ``key``."""
        return self._ready(self.slots[key])

    def slot_out(self, table, evict: bool, later: bool = False):
        """Copies the device's rows of ``table`` into its host memory (before the I/O engine
        writes it); with ``evict`` forgets them.

        With ``later`` (an evicted victim, Legend's order) the copy out only starts: on ``cuda``
        it runs on the copy stream into a pinned buffer while the compute stream goes on with
        the retained partitions, and the call returns ``land(table)``, which the epoch loop
        calls (from its landing thread, with the same slot lent again) right before the I/O
        engine writes the slot: it waits for the copy and puts the rows into the host memory.
        The CPU twin makes the same calls in the same order and copies at the landing. An
        evicted slot's place in the buffer is free once its rows are out: at once, or at the
        landing."""
        table = Lent(*table)
        key = table.key
        if key not in self.slots:
            return (lambda _table: None) if later else None
        slot = self.slots.pop(key) if evict else self.slots[key]
        t = self._ready(slot)
        in_place = self._host(table) if slot.index is not None and self._pinned(table) else None
        land = self._start_copy_out([t.params, t.state], victim=later, hosts=in_place)

        def done(table) -> None:
            land(self._host(Lent(*table)))
            if evict and slot.index is not None:
                self.buffer.release(slot.index)

        if later:
            return done
        done(table)
        return None

    def _start_copy_out(self, devs: list[torch.Tensor], victim: bool, hosts: list[torch.Tensor] | None = None):
        """Starts copying the flat device tensors ``devs`` out (on ``cuda`` after the compute
        queued so far, on the copy stream, into a pinned buffer: the victims' own, so that one
        victim's copy may run while other slots are written back; or, given page-locked
        ``hosts``, straight into them); returns ``land(hosts)``, which waits for the copy and
        puts each into its host tensor (already there when copied straight)."""
        for dev in devs:
            self.bytes_d2h += dev.numel() * dev.element_size()

        def done_waiting(start: float) -> None:
            self.copy_wait += time.perf_counter() - start

        if not self.cuda:

            def land_twin(hosts) -> None:
                start = time.perf_counter()
                for host, dev in zip(hosts, devs, strict=True):
                    host.copy_(dev)
                done_waiting(start)

            return land_twin
        if hosts is not None:
            return self._copy_out_in_place(devs, hosts, done_waiting)
        name = "stage_victim" if victim else "stage_out"
        total = sum(d.numel() * d.element_size() for d in devs)
        if getattr(self, name).numel() < total:
            setattr(self, name, torch.empty(total, dtype=torch.uint8, pin_memory=True))
        pinned = getattr(self, name)
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        at, spans = 0, []
        with torch.cuda.stream(self.copy_stream):
            for dev in devs:
                span = pinned[at : at + dev.numel() * dev.element_size()].view(dev.dtype)
                span.copy_(dev, non_blocking=True)
                # An evicted slot's memory may go back to the allocator before the copy ends.
                dev.record_stream(self.copy_stream)
                spans.append(span)
                at += span.numel() * span.element_size()
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)

        def land(hosts) -> None:
            start = time.perf_counter()
            copied.synchronize()
            for host, span in zip(hosts, spans, strict=True):
                host.copy_(span)
            done_waiting(start)

        return land

    def _copy_out_in_place(self, devs: list[torch.Tensor], hosts: list[torch.Tensor], done_waiting):
        """Starts copying ``devs`` straight into the page-locked ``hosts`` (the slot's own
        buffer) on the copy stream, after the compute queued so far; returns the landing,
        which waits for the copy."""
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            for host, dev in zip(hosts, devs, strict=True):
                host.copy_(dev, non_blocking=True)
                # An evicted slot's memory may go back to the allocator before the copy ends.
                dev.record_stream(self.copy_stream)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)

        def land(_hosts) -> None:
            start = time.perf_counter()
            copied.synchronize()
            done_waiting(start)

        return land

    def release_host(self) -> None:
        """Unpins the slots' host buffers once the device's queued work (copies from and into
        them among it) is done: the job is about to free them."""
        if self.pins is None or not self.pins.pinned:
            return
        if self.cuda:
            torch.cuda.synchronize(self.device)
        errors = self.pins.release()
        if errors:
            raise RuntimeError("; ".join(errors))

    def forget_partitions(self) -> None:
        """Drops every partition slot and the pinned region (relations stay)."""
        for key in [k for k, s in self.slots.items() if s.kind in ("partition", "pinned")]:
            self._forget(key)

    def _stage(self, ctxs: list[dict]) -> dict:
        """Copies in the tables of ``ctxs`` the backend does not hold (a run path that calls no
        hooks; back out at the piece's end): ``{key: (slot, lent table)}``."""
        staged = {}
        for c in ctxs:
            tables = [("staged", p) for p in c["parts"]] + ([("relations", c["rels"])] if c["rels"] else [])
            for kind, table in tables:
                table = Lent(*table)
                if table.key not in self.slots and table.key not in staged:
                    staged[table.key] = (self._hold(kind, table), table)
        return staged

    def _bank(self, ctxs: list[dict]) -> tuple | None:
        """The device's copy of the piece's negative banks (the same for each of its contexts),
        copied in again when their host rows changed since, and their gradient zeroed:
        ``(rows, grad)``, or ``None`` without banks."""
        b = next((c["bank"] for c in ctxs if c["bank"] is not None), None)
        if b is None:
            return None
        (rows, address), dim = b["rows"], ctxs[0]["dim"]
        floats = len(rows) // 4
        if self.bank_rows is None or self.bank_rows.numel() != floats:
            self.bank_rows = torch.empty((floats // dim, dim), dtype=torch.float32, device=self.device)
            self.bank_grad = torch.zeros_like(self.bank_rows)
            self.bank_from = None
        if self.bank_from != (address, b["version"]):
            if self.cuda:
                # The copy stream overwrites rows the last piece's steps may still read.
                self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            self._lent_to_device(rows, torch.float32, self.bank_rows.view(-1))
            self.bank_from = (address, b["version"])
        self.bank_grad.zero_()
        return self.bank_rows, self.bank_grad

    def _ctx(self, c: dict, staged: dict, bank_tensors: tuple | None = None) -> step.Ctx:
        """The step's context of ``c``, once every table it names is held or staged, with the
        piece's negative banks' ``bank_tensors`` (:meth:`_bank`)."""

        def slot(key: int) -> Slot:
            s = self.slots.get(key) or staged[key][0]
            self._ready(s)
            return s

        step.check_model(c["model"])
        nodes, slot_rows = self.buffer.rows(c["dim"])
        bases = [self.buffer.base(slot(p[3]).index, slot_rows) for p in c["parts"]]
        bucket = (c["src_part"], c["dst_part"])
        sizes = [p[2] for p in c["parts"]]
        feat = self._feat(c, bases, len(nodes.params))
        banks, bank, lens = c["bank"], None, None
        if banks is not None:
            # Bank keys start past the buffer's rows and the featurized entities' keys.
            first = len(nodes.params) + (0 if feat is None else len(feat.offsets) - 1)
            lens, bank = banks["lens"], Bank(*bank_tensors, banks["capacity"], first)
        layout = step.layout(c["pool"], bases, sizes, bucket, c["part_of"], c["typed_spans"], feat, bank, lens)
        rels = None
        if c["rels"] is not None:
            flat = self._ready(slot(c["rels"][3]))
            params = flat.params.view(-1, step.rel_dim(step.query_model(c["model"], c["operator"]), c["dim"]))
            rels = Table(params, flat.state.view(params.shape[0], -1))
        head_prob = c["head_prob"]
        return step.Ctx(
            model=c["model"],
            operator=c["operator"],
            comparator=c["comparator"],
            dim=c["dim"],
            transe_norm=c["transe_norm"],
            loss=c["loss"],
            margin=c["margin"],
            gamma=c["gamma"],
            adversarial=c["adversarial"],
            lr=c["lr"],
            nodes=nodes,
            rels=rels,
            inverse_offset=c["inverse_offset"],
            corrupt=c["corrupt"],
            head_prob=self._const(head_prob, torch.float32) if head_prob else None,
            negatives=c["negatives"],
            shared_negatives=c["shared_negatives"],
            negatives_head=c["negatives_head"],
            degree_fraction=c["degree_fraction"],
            pool=c["pool"],
            layout=self._const(layout, torch.int64),
            part_size=c["part_size"],
            num_nodes=c["num_nodes"],
            alone=len(c["parts"]) == 1,
            reg=c["reg"],
            reg_weight=c["reg_weight"],
            reg_weighted=c["reg_weighted"],
            rel_reg_weight=c["rel_reg_weight"],
            entity_dropout=c["entity_dropout"],
            relation_dropout=c["relation_dropout"],
            independent_masks=c["independent_masks"],
            feat=feat,
            bank=bank,
            **self._vs_all(c, bases),
        )

    def _feat(self, c: dict, bases: list[int], buffer_rows: int) -> Feat | None:
        """A typed run's featurized entities (:class:`Feat`): their bags, lent as u64
        offsets and u32 rows at host addresses the job keeps, are copied to the device once."""
        f = c["feat"]
        if f is None:
            return None
        (offsets, at), (features, rows_at) = f["offsets"], f["rows"]
        key = ("feat", at, len(offsets), rows_at, len(features))
        if key not in self.consts:
            pad = torch.zeros(1, dtype=torch.int64, device=self.device)
            features = self._lent_to_device(features, torch.int32).to(torch.int64)
            self.consts[key] = (self._lent_to_device(offsets, torch.int64), torch.cat([features, pad]))
        offsets, features = self.consts[key]
        part = f["part"]
        ends = (c["src_part"] == part, c["dst_part"] == part)
        return Feat(part, f["plain"], bases[part], buffer_rows, ends, offsets, features)

    def _vs_all(self, c: dict, bases: list[int]) -> dict:
        """The 1vsAll and KvsAll fields of a context (:mod:`vs_all`): none for negative
        sampling. The candidates are every resident partition's buffer rows, in ``parts``
        order; KvsAll's answers are copied to the device once per job."""
        if c["training"] == "negative_sampling":
            return {}
        sizes = [p[2] for p in c["parts"]]
        key = ("candidates", tuple(bases), tuple(sizes))
        if key not in self.consts:
            spans = [torch.arange(b, b + n, device=self.device) for b, n in zip(bases, sizes, strict=True)]
            self.consts[key] = step.cat(spans)
        first = np.cumsum([0, *sizes]).tolist()
        answers = None
        if c["answers"] is not None:
            answers = tuple(self._answers(rows, address) for rows, address in c["answers"])
        return dict(
            training=c["training"],
            label_smoothing=c["label_smoothing"],
            reg_table=c["reg_table"],
            cand_rows=self.consts[key],
            cand_first=(first[c["src_part"]], first[c["dst_part"]]),
            answers=answers,
        )

    def _answers(self, rows, address: int) -> vs_all.Answers:
        """The device index of one side of KvsAll's answers, lent as rows of three u32 at host
        ``address`` (the job keeps them there), built on first use."""
        cache = ("answers", address, len(rows))
        if cache not in self.consts:
            dev = self._lent_to_device(rows, torch.int32).view(-1, 3)
            self.consts[cache] = vs_all.Answers.index(dev.to(torch.int64))
        return self.consts[cache]

    def _lent_to_device(
        self, lent, dtype: torch.dtype, out: torch.Tensor | None = None, via: str = "edges"
    ) -> torch.Tensor:
        """A read-only lent buffer of ``dtype`` values as a device tensor (empty: an empty one),
        a new one or ``out``, the compute stream ordered after its copy; staged through the
        buffer of ``via`` (one of :data:`PIECE_INPUTS`)."""
        if not len(lent):
            return torch.zeros(0, dtype=dtype, device=self.device)
        with warnings.catch_warnings():
            # Lent read-only; torch warns that it cannot mark its view so.
            warnings.simplefilter("ignore", UserWarning)
            host = torch.frombuffer(lent, dtype=dtype)
        dev, ready = self._to_device(host, self.stage_piece[via] if self.cuda else None, out)
        if ready is not None:
            torch.cuda.current_stream(self.device).wait_event(ready)
        return dev

    def _const(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """``values`` as a device tensor, the same tensor for the same values."""
        key = (dtype, tuple(values))
        if key not in self.consts:
            self.consts[key] = torch.tensor(values, dtype=dtype, device=self.device)
        return self.consts[key]

    @staticmethod
    def _graph_key(c: dict, ctx: step.Ctx) -> tuple:
        """What a captured step bakes in of a context: its settings, the device addresses and
        shapes of the slot buffer and the relations, the length of its layout (whose values
        a replay copies in: every bucket of a run shares the graphs of its settings) and whether
        its node table is the run's one slot (``Ctx.alone``)."""
        tables = [ctx.nodes, *([ctx.rels] if ctx.rels is not None else [])]
        if ctx.bank is not None:
            tables.append(Table(ctx.bank.rows, ctx.bank.grad))
        memory = tuple((t.params.data_ptr(), *t.params.shape, t.state.data_ptr(), *t.state.shape) for t in tables)
        settings = tuple((k, repr(v)) for k, v in sorted(c.items()) if k not in PLACEMENT)
        capacity = None if ctx.bank is None else ctx.bank.capacity
        return memory, len(ctx.layout), ctx.alone, capacity, settings

    def train_piece(
        self, ctxs: list[dict], groups: list[int], bounds: list[int], edges, weights, key: int, bank_grad=b""
    ):
        """Trains one piece: chunk ``c`` is edges ``bounds[c] .. bounds[c + 1]`` (rows of
        three int32) of ``edges``, with ``weights`` (f32, empty: unweighted), against
        ``ctxs[groups[c]]``, seeded ``derive(key, c)``; with negative banks, the gradient their
        rows received goes into ``bank_grad`` (f32, shaped as their rows). Returns ``(loss,
        directions, flops, busy seconds)``; the loss is the piece's before this one
        (:class:`PieceLosses`; the last piece's comes with :meth:`counters`)."""
        start = time.perf_counter()
        staged = self._stage(ctxs)
        bank = self._bank(ctxs)
        contexts = [self._ctx(c, staged, bank) for c in ctxs]
        e = self._lent_to_device(edges, torch.int32).view(-1, 3)
        w = self._lent_to_device(weights, torch.float32, via="weights") if len(weights) else None
        streams = step.piece_streams(key, len(groups)).reshape(-1)
        streams = self._lent_to_device(streams, torch.int64, via="streams")
        streams = streams.view(len(groups), -1)
        if self.cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        e = e.to(torch.int64)
        # The loss is added up on the device and read one piece later (PieceLosses): no
        # per-chunk host synchronisation, and none on the piece just queued.
        self.total.zero_()
        directions, flops = self._train_runs(ctxs, contexts, groups, bounds, (e, w, streams))
        if self.cuda:
            end.record()
            self.events.append((begin, end))
        else:
            self.busy += time.perf_counter() - start
        for slot, table in staged.values():
            t = self._ready(slot)
            self._start_copy_out([t.params, t.state], victim=False)(self._host(table))
            if slot.index is not None:
                self.buffer.release(slot.index)
        if bank is not None:
            self._start_copy_out([bank[1].view(-1)], victim=False)([torch.frombuffer(bank_grad, dtype=torch.float32)])
        self.losses.push(self.total)
        return self.losses.take(leave=1), directions, flops, time.perf_counter() - start

    def _train_runs(self, ctxs, contexts, groups, bounds, piece) -> tuple[int, float]:
        """Trains a piece's chunks (``piece``: its int64 edges, weights or None, and streams on
        the device), each run of chunks of one context and size as one graph replay; returns
        the directions and flops trained."""
        e, w, streams = piece
        keys = [self._graph_key(c, ctx) for c, ctx in zip(ctxs, contexts, strict=True)]
        directions, flops = 0, 0.0
        with matmul_precision(self.tf32):
            for first, end in graphs.chunk_runs(groups, bounds, graphs.RUN):
                g, lo, hi = groups[first], bounds[first], bounds[end]
                run = (e[lo:hi], None if w is None else w[lo:hi], streams[first:end])
                d, f = self.graphs.run(keys[g], contexts[g], *run, self.total)
                directions += d
                flops += f
        return directions, flops
