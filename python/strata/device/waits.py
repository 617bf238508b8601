"""Counting what a stretch of torch code costs a GPU's host: the ops it dispatches, the ops
after which the host waits for the device, and the values it reads back.

On a GPU the host queues kernels and runs ahead of them; it stops to wait when it needs a value
the device computes: a read back (``item``, ``int(t)``, ``bool(t)``, ``tolist``) or an output
whose size only the device knows (``nonzero``, ``unique``, boolean-mask indexing, ``bincount``,
``repeat_interleave`` without ``output_size``). The same ops dispatch on the CPU, so counting
them on the CPU twin says what the code will cost on a GPU.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops whose output size only the device knows.
SIZED_BY_DATA = frozenset(["nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "bincount"])
#: Ops that read a value back to the host.
READ_BACK = frozenset(["_local_scalar_dense", "is_nonzero", "item"])
#: Ops that make views, launching no kernel.
VIEWS = frozenset([
    "view", "slice", "select", "unsqueeze", "squeeze", "expand", "reshape", "alias", "_unsafe_view", "transpose",
    "permute", "t", "as_strided", "diagonal", "unfold", "split", "split_with_sizes", "unbind", "detach",
    "_reshape_alias", "view_as_real", "view_as_complex",
])  # fmt: skip


class HostWaits(TorchDispatchMode):
    """While active, on the entering thread: ``ops`` (torch ops dispatched), ``kernels`` (those
    on a tensor of one or more dimensions, alone or in a list, that are no view: a kernel
    launch each on a GPU),
    ``waits`` (the names of the ops after which the host waits, read backs and data-sized
    outputs) and ``reads`` (the element count of each ``Tensor.tolist()``, from any thread)."""

    def __init__(self):
        super().__init__()
        self.ops = self.kernels = 0
        self.waits: list[str] = []
        self.reads: list[int] = []
        self._tolist = None  # Tensor's own tolist attribute before entering, if any

    def __enter__(self):
        # Tensor.tolist is torch._C.TensorBase's; a Tensor attribute shadows it while active.
        self._tolist = torch.Tensor.__dict__.get("tolist")
        tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda t: self.reads.append(t.numel()) or tolist(t)
        return super().__enter__()

    def __exit__(self, *exc):
        if self._tolist is None:
            del torch.Tensor.tolist
        else:
            torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        self.ops += 1
        # Tensors in lists count too (``cat``, ``stack``).
        tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])]
        if name not in VIEWS and any(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
            self.kernels += 1
        masked = name in ("index", "index_put_", "index_put") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        )
        unsized = name == "repeat_interleave" and kwargs.get("output_size") is None
        if name in SIZED_BY_DATA or name in READ_BACK or masked or unsized:
            self.waits.append(func.__name__)
        return func(*args, **kwargs)
