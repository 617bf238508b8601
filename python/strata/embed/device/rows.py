"""The rows of a table a chunk uses, gathered once and stepped once: the device step's
:class:`Gathered` (each distinct row one Adagrad step with its uses' gradients summed), for a
typed run's featurized entities :class:`Featurized` (an entity's row is the mean of its
features' rows, PyTorch-BigGraph's ``featurized``), and for negatives drawn from partitions on
disk :class:`Banked` (their rows come from the negative banks, which sum their gradient).

Shapes: a table's rows are ``rows x width`` floats; ``keys`` are int64 row indices, one per use
(``n``); the gathered rows ``n x width``; the gradients given to ``step`` one row per use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.embed.device import adagrad

#: A table of at most this many rows per use in a chunk takes its Adagrad step over every row
#: (untouched rows add exact zeros): a pass over a few times the rows costs a GPU less than
#: the ten kernels of the sort that finds the used ones (:func:`unique_static`). A table no copy
#: writes while the step runs (the relations, the nodes of one partition) steps every row; out
#: of core, where the next partition is copied into a free slot of the buffer meanwhile, the
#: step skips the rows the chunk did not touch, so that it never writes that slot.
EVERY_ROW_PER_USE = 4


@dataclass(frozen=True)
class Places:
    """Where the tables of a slot buffer start: slot ``i`` at buffer row ``i * slot_rows``, the
    tail (a typed run's pinned region) at ``tail_row``. A bf16 value's rounding noise hashes its
    position in its own table (:mod:`strata.embed.device.bf16`)."""

    slot_rows: int
    tail_row: int

    def local(self, keys: torch.Tensor) -> torch.Tensor:
        """Each buffer row's row in its own table."""
        return torch.where(keys >= self.tail_row, keys - self.tail_row, keys % self.slot_rows)


@dataclass
class Table:
    """Rows and their Adagrad state: ``params`` ``rows x width``, ``state`` ``rows x width``
    (per-element Adagrad) or ``rows x 1`` (``adagrad_row``), both float32 or both bfloat16 (a
    ``table_dtype = "bf16"`` run's partitions, whose ``places`` say where each table starts)."""

    params: torch.Tensor
    state: torch.Tensor
    places: Places | None = None


class Gathered:
    """The rows a chunk uses of a table (``keys``: row indices, one per use) and the unique
    rows among them, which take the Adagrad step with the gradients of their uses summed.

    The set is found by sorting the keys, with a fixed-size result: one slot per use, the first
    ``count`` of them the unique keys in ascending order (``torch.unique``'s), the rest unused
    (the smallest key again, no gradient). Nothing depends on the count on the host, so a chunk runs
    without a host synchronisation and can be captured in a CUDA graph.

    A table of few rows for the chunk's uses (the relations, as a rule, and a small graph's
    nodes) needs no sort: its step runs over every row (``every``), an untouched row's gradient
    being zero, so that its step adds exact zeros to its state and its params; or, where a copy
    may write the table's untouched rows meanwhile (``touched``), over the rows the chunk
    touched, the others masked off and, for the torch twin, which steps every slot it is
    given, pointed at the first key's row."""

    @classmethod
    def of(cls, table: Table, keys: torch.Tensor, alone: bool = True) -> Gathered:
        """The rows ``keys`` of ``table``: every row stepped where the table has at most
        ``EVERY_ROW_PER_USE`` rows per key and is ``alone`` (no copy writes it meanwhile), every
        touched row where it has so few rows but is not alone, else the sorted unique rows."""
        if len(table.params) > EVERY_ROW_PER_USE * len(keys):
            return cls(table, keys, "unique")
        return cls(table, keys, "every" if alone else "touched")

    def __init__(self, table: Table, keys: torch.Tensor, rows: str = "unique"):
        self.table = table
        if rows == "unique":
            self.keys, self.inverse, self.valid = unique_static(keys)
        else:
            n, device = table.params.shape[0], keys.device
            every = torch.arange(n, device=device)
            if rows == "every":
                self.keys, self.valid = every, torch.ones(n, dtype=torch.bool, device=device)
            else:
                self.valid = torch.zeros(n, dtype=torch.bool, device=device).index_fill_(0, keys, True)
                self.keys = torch.where(self.valid, every, keys[0])
            self.inverse = keys
        self.rows = table.params.index_select(0, keys).float()

    def take(self, start: int, count: int) -> torch.Tensor:
        """Rows of uses ``start .. start + count`` of the keys given."""
        return self.rows[start : start + count]

    def step(self, grads: torch.Tensor, lr: float, salt: torch.Tensor | None = None) -> None:
        """One Adagrad step per unique row (:func:`adagrad.step`) with the gradients ``grads``
        of the uses (one row per key given) summed; ``salt`` (the chunk's key) rounds a bf16
        table's values."""
        grad = grads.new_zeros((len(self.keys), grads.shape[1])).index_add_(0, self.inverse, grads)
        adagrad.step(self.table, self.keys, self.valid, grad, lr, salt)


def unique_static(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(slots, inverse, valid)`` of int64 ``keys`` (``n``), each ``n`` long: ``slots[:count]``
    the distinct keys ascending and ``slots[count:]`` the smallest again (a row the chunk uses,
    which no copy writes meanwhile), ``inverse`` each key's slot, and ``valid`` the mask of the
    first ``count`` slots, where ``count`` stays on the device."""
    n = keys.numel()
    if n == 0:
        return keys, keys, keys.new_zeros(0, dtype=torch.bool)
    ordered, order = torch.sort(keys)
    first = torch.ones(n, dtype=torch.bool, device=keys.device)
    first[1:] = ordered[1:] != ordered[:-1]
    slot = torch.cumsum(first, 0) - 1
    inverse = torch.empty_like(slot).scatter_(0, order, slot)
    slots = ordered[:1].expand(n).clone().scatter_(0, slot, ordered)
    valid = torch.arange(n, device=keys.device) <= slot[-1]
    return slots, inverse, valid


@dataclass
class Feat:
    """A typed run's featurized entities on the device (``DeviceFeat``). Their keys start at
    ``first`` (past every buffer row, so that no slot's rows can be taken for one): key
    ``first + k`` is entity ``k``, the mean of buffer rows ``base + rows[offsets[k] ..
    offsets[k + 1]]`` (its features, stored in the pinned region's slot from buffer row
    ``base``), the zero row for an empty bag. ``part`` is the pinned region's index in the
    context's parts, ``plain`` its entity rows before the first featurized one, and ``ends``
    whether the bucket's source and destination ends lie there. ``offsets`` (entities + 1) and
    ``rows`` (the features, then one padding 0) are int64 on the device."""

    part: int
    plain: int
    base: int
    first: int
    ends: tuple[bool, bool]
    offsets: torch.Tensor
    rows: torch.Tensor


def featurized_ends(feat: Feat, local: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``ends`` (``2 x b`` buffer rows of the edges' source and destination ends, whose rows in
    their parts are ``local``) with each featurized entity keyed from ``feat.first``."""
    keyed = []
    for j, pinned in enumerate(feat.ends):
        entity = local[j] >= feat.plain
        keyed.append(torch.where(entity, feat.first + local[j] - feat.plain, ends[j]) if pinned else ends[j])
    return torch.stack(keyed)


class Featurized:
    """:class:`Gathered` where some keys are featurized entities (``key >= feat.first``): such a
    use gathers its features' rows and takes their sum times ``1 / |bag|`` (the Rust engine's
    ``FeatureBags::mean``), and its gradient goes to each feature times ``1 / |bag|``, summed
    with the feature's other uses into one Adagrad step (``Worker``'s sharing out). A bag's size
    is read on the host, so such chunks run op by op, not as CUDA graphs."""

    def __init__(self, feat: Feat, table: Table, keys: torch.Tensor, alone: bool):
        entity = keys >= feat.first
        k = torch.where(entity, keys - feat.first, 0)
        start = feat.offsets[k]
        sizes = torch.where(entity, feat.offsets[k + 1] - start, 1)
        # Entry e of the expanded keys belongs to use `use[e]`, its `within[e]`-th feature.
        self.use = torch.repeat_interleave(torch.arange(len(keys), device=keys.device), sizes)
        within = torch.arange(len(self.use), device=keys.device) - (torch.cumsum(sizes, 0) - sizes)[self.use]
        is_feature = entity[self.use]
        feature = feat.rows[torch.where(is_feature, start[self.use] + within, 0)]
        entries = torch.where(is_feature, feat.base + feature, keys[self.use])
        self.scale = torch.where(entity, 1.0 / sizes.clamp(min=1).to(torch.float32), 1.0)[:, None]
        self.gathered = Gathered.of(table, entries, alone)
        rows = self.gathered.rows
        summed = rows.new_zeros((len(keys), rows.shape[1])).index_add_(0, self.use, rows)
        self.rows = summed * self.scale

    def take(self, start: int, count: int) -> torch.Tensor:
        """Rows of uses ``start .. start + count`` of the keys given."""
        return self.rows[start : start + count]

    def step(self, grads: torch.Tensor, lr: float, salt: torch.Tensor | None = None) -> None:
        """One Adagrad step per distinct row (features and plain rows) with the uses' gradients
        (one row per key given), an entity's shared out over its features."""
        self.gathered.step((grads * self.scale)[self.use], lr, salt)


@dataclass
class Bank:
    """The negative banks on the device (the Rust ``DeviceBank``): ``rows`` (``partitions
    capacity x dim`` float32, a block of ``capacity`` rows per partition) and the gradient
    they received in the piece (``grad``, the same shape, summed: the Rust engine applies it as
    one Adagrad step per row when the partition is next loaded). Key ``first + p capacity + j``
    is row ``j`` of partition ``p``'s block; ``first`` lies past every buffer row and every
    featurized entity's key."""

    rows: torch.Tensor
    grad: torch.Tensor
    capacity: int
    first: int


class Banked:
    """Node rows where some keys are bank rows (``key >= bank.first``): such a use reads its
    bank row, and its gradient is added to the bank's (no step); the other uses are the rows
    ``table_rows(keys)`` gathers (:class:`Gathered` or :class:`Featurized`), stepped as usual (a
    bank use stands in there as the first key, a row the chunk uses, with no gradient)."""

    def __init__(self, bank: Bank, keys: torch.Tensor, table_rows):
        self.bank = bank
        banked = keys >= bank.first
        self.banked = banked[:, None]
        self.index = torch.where(banked, keys - bank.first, 0)
        self.gathered = table_rows(torch.where(banked, keys[:1], keys))
        self.rows = torch.where(self.banked, bank.rows.index_select(0, self.index), self.gathered.rows)

    def take(self, start: int, count: int) -> torch.Tensor:
        """Rows of uses ``start .. start + count`` of the keys given."""
        return self.rows[start : start + count]

    def step(self, grads: torch.Tensor, lr: float, salt: torch.Tensor | None = None) -> None:
        """The node rows' Adagrad step, the bank rows' gradient summed into the bank."""
        self.bank.grad.index_add_(0, self.index, torch.where(self.banked, grads, 0.0))
        self.gathered.step(torch.where(self.banked, 0.0, grads), lr, salt)
