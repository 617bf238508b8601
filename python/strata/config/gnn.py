"""The [gnn.train] section: the data path's options are the engine's
(``strata_gnn::data::DataConfig``); the model's and the run's, which only the Python trainer
uses, are declared here in front of them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..layer_kinds import LAYER_KINDS
from .schema import FanoutTable, native_section, option

#: `--model`'s choices: the registered layer kinds (:data:`strata.layer_kinds.LAYER_KINDS`).
LayerKindName = Literal[tuple(LAYER_KINDS)]


#: Attention heads of gat, the one layer kind with heads.
DEFAULT_HEADS = 4


class _TrainFrontEnd:
    """The [gnn.train] options Python handles: the store and run, the torch model and its
    training."""

    store: Path = option(
        positional=True,
        help="store with node features, labels and node splits (a typed store: per node type, see target_type)",
    )
    run_dir: Path | None = option(None, help="run directory (default: STORE/runs/gnn-MODEL)")
    model: LayerKindName = option(
        "sage",
        help="the layer kind, in plain torch: "
        + "; ".join(f"{name} ({kind.help})" for name, kind in LAYER_KINDS.items()),
    )
    target_type: str | None = option(
        None,
        help="typed stores: the node type to classify (its labels and splits are used); default: the only "
        "node type with labels",
    )
    edge_fanouts: FanoutTable | None = option(
        None,
        help="typed stores: fanouts per edge type, a table keyed by src:rel:dst (PyG's num_neighbors dict; "
        "on the command line a:b:c=15,10;d:e:f=5,5), each list one entry per layer; edge types not in it "
        "take fanouts",
    )
    hidden: int = option(256, help="hidden units per layer (per head for gat)", min=1)
    heads: int = option(DEFAULT_HEADS, help="attention heads of gat", min=1)
    dropout: float = option(0.5, help="dropout between layers")
    lr: float = option(0.01, help="Adam learning rate")
    weight_decay: float = option(5e-4, help="Adam weight decay")
    epochs: int = option(10, help="training epochs", min=1)
    eval_every: int = option(1, help="evaluate on the validation split every this many epochs (0: never)")
    device: str = option("auto", help="torch device: auto (cuda when available), cpu, cuda, cuda:1, ...")
    data_path: Literal["auto", "native", "device"] = option(
        "auto",
        help="who samples and serves the batches: auto (the device data path on a CUDA device, else native), "
        "native (the Rust sampler and feature tiers in host memory, rows copied to the device), or device "
        "(sampling and a feature cache managed from the device over device_memory and page-locked host memory; "
        "on cpu its CPU twin, the same code in order)",
    )
    producer: Literal["thread", "inline"] = option(
        "thread",
        help="on a CUDA device, which host thread issues the device data path's sampling and lookups: thread (a "
        "producer thread two batches ahead, so a miss's read from the SSD never holds the training loop; the two "
        "threads share the interpreter's lock, which every torch op hands over) or inline (the training loop "
        "issues them between its steps: one thread, no lock handed over; the device still overlaps them with "
        "training; suits a cache whose rows cannot miss)",
    )
    step: Literal["auto", "eager", "graphs"] = option(
        "auto",
        help="how each batch trains: auto (graphs on a CUDA device in one process with an untyped store, else "
        "eager), eager (every op dispatched from the host, over the batch as sampled), or graphs (each batch "
        "padded to one of a few shapes, and on a CUDA device each shape's step, forward, backward and Adam, "
        "captured once as a CUDA graph and replayed; on cpu the padded step runs op by op)",
    )
    torch_threads: int = option(0, help="threads torch may use (0: its default)", max=1024)
    dist_timeout: int = option(
        600, help="seconds a rank waits for the others (rendezvous, each collective) under torchrun", min=1
    )
    dist_features: Literal["replicated", "split"] = option(
        "replicated",
        help="feature rows under torchrun: replicated (each rank reads any row from its store) or split (rank r "
        "holds node ids [r N/W, (r+1) N/W) and fetches the others from their owners over torch RPC)",
    )

    def check(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"gnn.train.dropout: must be in [0, 1), got {self.dropout}")
        if not self.lr > 0:
            raise ConfigError(f"gnn.train.lr: must be positive, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ConfigError(f"gnn.train.weight_decay: must be >= 0, got {self.weight_decay}")
        if self.heads != DEFAULT_HEADS and self.model != "gat":
            raise ConfigError(f"gnn.train.heads: applies to model gat only (model is {self.model})")


GnnTrainConfig = native_section("gnn.train", "GnnTrainConfig", front=_TrainFrontEnd)
