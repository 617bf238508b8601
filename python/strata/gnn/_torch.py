"""PyTorch is an optional extra: the parts of ``strata.gnn`` that train import it through here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from ..torchrun import Environment


def require_torch():
    """Returns the ``torch`` module, or raises a message that says how to install it."""
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError("strata.gnn needs PyTorch for training: pip install torch") from e
    return torch


def torch_device(name: str, env: Environment | None = None, torch=None):
    """The torch device of ``--device``; under torchrun a CUDA device without an index is the
    rank's local one (``LOCAL_RANK``). Errors name ``gnn.train.device``: a name torch does not
    know, a backend other than cpu and cuda, a CUDA device this machine lacks. ``torch``: the
    module to ask (a stand-in, in tests of machines this one is not)."""
    torch = torch or require_torch()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"gnn.train.device: {name!r} is not a torch device ({e})") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        # Other backends (mps, xpu, ...) are untested here, and most torch builds lack them.
        raise ConfigError(f"gnn.train.device: {name!r}: the GNN trainer runs on cpu or cuda (cuda:N), not {dev.type}")
    if env is not None and dev.index is None:
        dev = torch.device("cuda", env.local_rank)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(
            f"gnn.train.device: {name!r} asks for CUDA, but torch sees no CUDA device here; use cpu or auto"
        )
    if (dev.index or 0) >= count:
        rank = f"rank {env.rank} (local rank {env.local_rank}) " if env is not None else ""
        raise ConfigError(
            f"gnn.train.device: {rank}would train on {dev}, but this machine has {count} CUDA device(s); "
            "run at most one rank per GPU (torchrun --nproc-per-node) or name the device"
        )
    return dev
