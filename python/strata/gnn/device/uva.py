"""Reading page-locked host memory from device kernels (unified virtual addressing).

A CUDA kernel can load from page-locked ("pinned") host memory through the same pointer the
host uses: each load crosses PCIe, so a gather of a few scattered rows costs only the bytes it
reads, with no host thread and no staging copy. GIDS and Helios keep the graph topology and the
host feature tier there. Torch's own indexing refuses a host tensor with a device index, so the
gather here is a small Triton kernel; on a CPU device (the CUDA path's twin) it is plain
indexing, and the kernel's logic is tested on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from strata.device import kernels

#: Elements one kernel program copies.
BLOCK = 1024


def pinned(array, device: torch.device) -> torch.Tensor:
    """A host copy of ``array`` (NumPy or tensor) that kernels on ``device`` can read over UVA:
    page-locked when ``device`` is CUDA, an ordinary tensor otherwise."""
    t = torch.as_tensor(array)
    if device.type == "cuda":
        return t.pin_memory()
    return t.contiguous()


def gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` on ``index``'s device, for ``table`` of shape ``(rows,)`` or ``(rows,
    width)`` on that device or in page-locked host memory (read in place over UVA)."""
    if table.device == index.device:
        return table[index]
    if not table.is_pinned():
        return host_gather(table, index)
    kernel, twin = (lambda: kernel_gather(table, index)), (lambda: host_gather(table, index))
    return kernels.fused("UVA gather", index.device, kernel, twin)


def host_gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` gathered where ``table`` is, then copied to ``index``'s device."""
    return table[index.to(table.device)].to(index.device)


def kernel_gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` computed by the Triton kernel, the output on ``index``'s device: the UVA
    path on CUDA, and under ``TRITON_INTERPRET=1`` the same kernel on CPU tensors (tests)."""
    table = table.contiguous()
    width = 1 if table.dim() == 1 else table.shape[1]
    out = torch.empty((index.numel(), *table.shape[1:]), dtype=table.dtype, device=index.device)
    total = index.numel() * width
    if total:
        grid = (triton_cdiv(total, BLOCK),)
        # Triton launches on the current device: make it the index's (a run on cuda:1 whose
        # process never set its device, or a rank's LOCAL_RANK device).
        with kernels.on_device(index):
            _kernel()[grid](table, index.contiguous(), out, total, width, BLOCK=BLOCK, **kernels.OPTIONS)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # ``total`` changes with every call: left unspecialised (Triton would otherwise compile a
    # variant for totals divisible by 16 and one for the others). ``width`` is one per table.
    @triton.jit(do_not_specialize=["total"])
    def uva_gather(table, index, out, total, width, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < total
        row = offs // width
        col = offs - row * width
        src = tl.load(index + row, mask=mask, other=0).to(tl.int64) * width + col
        tl.store(out + offs, tl.load(table + src, mask=mask), mask=mask)

    return uva_gather
