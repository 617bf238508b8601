"""CUDA graph captures that another thread's random draws cannot break.

Every capture registers torch's default CUDA generator, whatever the graph draws, and marks it
capturing until the capture ends; a draw from that generator on another thread meanwhile (a
training step's dropout beside the sampler's capture on the data path's thread) fails with
"Offset increment outside graph capture encountered unexpectedly", and so does a replay of any
graph (a replay advances every generator its capture registered). So each capture holds one
process-wide lock, and so do each replay and each op-by-op step that draws from the generator
on CUDA: they wait for each other (a capture takes milliseconds, a few times a run; the lock is
otherwise uncontended), never fail.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext

# Re-entrant: a step that holds it to draw may capture (the GNN step's warm-up, then capture).
_LOCK = threading.RLock()


@contextmanager
def capturing(graph):
    """Captures into ``graph`` (a ``torch.cuda.CUDAGraph``) what the block launches on this
    thread, with other threads' captures and generator draws held off. Errors are thread-local:
    other threads' CUDA calls go on beside the capture."""
    import torch

    with _LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"):
        yield


def drawing(device) -> AbstractContextManager:
    """Held around op-by-op work on ``device`` (a ``torch.device``) that draws from torch's
    default generator, such as dropout in training: off CUDA, where nothing is captured, it
    holds nothing."""
    return _LOCK if device.type == "cuda" else nullcontext()


def replay(graph) -> None:
    """Replays ``graph`` (a captured ``torch.cuda.CUDAGraph``), held off while another thread
    captures."""
    with _LOCK:
        graph.replay()
