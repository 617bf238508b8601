"""Choosing between a Triton kernel and its torch twin.

A fused kernel runs on ``cuda`` where Triton is installed (it comes with torch's CUDA wheels);
everywhere else its torch twin computes the same values. Triton compiles a kernel for the GPU
at hand on its first call, and a Triton that cannot (an older release, a GPU it does not know)
must not stop a training run: the kernel's failure is said once on stderr, naming it, and the
twin serves every later call in the process. Tests check each kernel against its twin on the
CPU under Triton's interpreter, so the run's results do not change with the path taken.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

#: Compile options every launch passes. Fusing ``a * b + c`` into one FMA is explicit: Triton 3.9
#: fuses unless told otherwise, 3.10 will not. The kernels' figures and their agreement with the
#: twins were measured fused (an FMA rounds once where the twin's two ops round twice), and a
#: newer Triton must not change them unasked.
OPTIONS = {"enable_fp_fusion": True}

#: Kernels that failed in this process, with the reason said.
_FAILED: dict[str, str] = {}

#: Every kernel builder (:func:`builder`), for :func:`clear_builders`.
_BUILDERS: list[Callable[[], object]] = []


def builder(build: Callable[[], T]) -> Callable[[], T]:
    """A kernel's builder, cached (``functools.cache``): the kernel is jitted on first use, for
    Triton's interpreter or for the GPU as ``TRITON_INTERPRET`` says then, and the jitted
    helpers it calls are globals of its module, which a build binds."""
    cached = functools.cache(build)
    _BUILDERS.append(cached)
    return cached


def clear_builders() -> None:
    """Drops every built kernel, so that each is built again on its next use with the
    interpreter setting of then, its helpers with it. For tests, which switch the setting
    between a kernel's CPU and CUDA cases in one process: a kernel built for one setting, or one
    whose helpers another build rebound, must not be launched under the other."""
    for cached in _BUILDERS:
        cached.cache_clear()


def on_device(t: torch.Tensor):
    """The context a Triton launch over ``t`` runs in: ``t``'s CUDA device current (Triton
    launches on the current device), nothing on the CPU (the interpreter)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@functools.cache
def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def failed() -> dict[str, str]:
    """The kernels that failed in this process and why (name: reason), for a run's report."""
    return dict(_FAILED)


def fused(name: str, device: torch.device, kernel: Callable[[], T], twin: Callable[[], T]) -> T:
    """``kernel()`` on a ``cuda`` ``device`` where Triton is installed and kernel ``name`` has
    not failed before, else ``twin()``. A kernel that raises (it fails to compile or launch
    before writing anything) is replaced by its twin from then on, as said once on stderr."""
    if device.type == "cuda" and has_triton() and name not in _FAILED:
        try:
            return kernel()
        except Exception as e:
            # Any failure of Triton's: the twin computes the same values.
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            _FAILED[name] = reason
            print(
                f"strata: the {name} Triton kernel failed on {device} ({reason}); torch ops do its work instead",
                file=sys.stderr,
            )
    return twin()
