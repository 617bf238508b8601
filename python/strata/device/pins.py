"""Host memory page-locked in place, so that copies between it and a GPU need no staging.

A copy between pageable host memory and a GPU goes through a page-locked bounce buffer: either
the driver's, synchronously, or one of our own, which costs a host memcpy of every byte first
(for a partition slot of 267 MiB, tens of milliseconds of a host thread). Legend keeps its
partition buffer in page-locked memory instead, so the SSD reads into memory the GPU's copy
engine reads directly. Strata's slots are the I/O engine's own aligned buffers (allocated by the
Rust partition buffer for the whole job), so :class:`HostPins` registers them with CUDA in place
(``cudaHostRegister``) the first time they are lent, and unregisters them when the job lets go of
them (:meth:`HostPins.release`, before the buffers are freed).
"""

from __future__ import annotations

from collections.abc import Callable

#: ``cudaHostRegisterPortable``: page-locked for every CUDA context of the process, not only
#: the one current at registration.
REGISTER_PORTABLE = 1


def cuda_register(device) -> tuple[Callable[[int, int], int], Callable[[int], int]]:
    """``(register(address, bytes), unregister(address))`` through CUDA's runtime, each
    returning its ``cudaError_t`` as an int (0: success), called with ``device`` (a torch CUDA
    device) current: a rank of a torchrun group registers in its own GPU's context, and creates
    none on GPU 0."""
    import torch

    cudart = torch.cuda.cudart()

    def register(address: int, nbytes: int) -> int:
        with torch.cuda.device(device):
            return int(cudart.cudaHostRegister(address, nbytes, REGISTER_PORTABLE))

    def unregister(address: int) -> int:
        with torch.cuda.device(device):
            return int(cudart.cudaHostUnregister(address))

    return register, unregister


class HostPins:
    """Host buffers registered in place, each by its start address and length (a buffer is
    registered whole, once, as the same length every time it is lent). A buffer whose
    registration is refused (e.g. the driver's limit on locked memory) is remembered, and its
    copies go through staging; :attr:`refused` says why, for the run's output."""

    def __init__(self, register: Callable[[int, int], int], unregister: Callable[[int], int]):
        self._register, self._unregister = register, unregister
        self.pinned: dict[int, int] = {}
        self._refused: set[int] = set()
        self.refused: str | None = None

    def pin(self, address: int, nbytes: int) -> bool:
        """Whether the buffer at ``address`` (``nbytes`` long) is page-locked, registering it
        now if it was not; False for a buffer of unknown length (``nbytes`` 0) or one refused."""
        if nbytes <= 0 or address in self._refused:
            return False
        held = self.pinned.get(address)
        if held is not None:
            return held >= nbytes
        error = self._register(address, nbytes)
        if error:
            self._refused.add(address)
            self.refused = f"cudaHostRegister refused {nbytes:,} bytes (CUDA error {error})"
            return False
        self.pinned[address] = nbytes
        return True

    def release(self) -> list[str]:
        """Unregisters every buffer (the device must be done with them); returns the errors,
        one line each, of those CUDA refused to unregister."""
        errors = []
        for address, nbytes in self.pinned.items():
            error = self._unregister(address)
            if error:
                errors.append(f"cudaHostUnregister of {nbytes:,} bytes at {address:#x}: CUDA error {error}")
        self.pinned.clear()
        self._refused.clear()
        return errors
