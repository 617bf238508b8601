"""The [gnn.train] section."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..units import parse_size
from .schema import Size, option, section


@section("gnn.train")
class GnnTrainConfig:
    store: Path = option(positional=True, help="store with node features, labels and node splits")
    run_dir: Path | None = option(None, help="run directory (default: STORE/runs/gnn-MODEL)")
    model: Literal["sage", "sage_pool", "gcn", "gin", "gat"] = option(
        "sage", help="GraphSAGE (mean aggregator), GraphSAGE (max-pool), GCN, GIN or GAT, in plain torch"
    )
    fanouts: list[int] = option([15, 10], help="neighbours per hop from the seeds outwards; -1 keeps all", min=-1)
    batch_size: int = option(1024, help="seed nodes per mini-batch")
    hidden: int = option(256, help="hidden units per layer (per head for gat)")
    heads: int = option(4, help="attention heads of gat")
    dropout: float = option(0.5, help="dropout between layers")
    lr: float = option(0.01, help="Adam learning rate")
    weight_decay: float = option(5e-4, help="Adam weight decay")
    epochs: int = option(10, help="training epochs")
    eval_every: int = option(1, help="evaluate on the validation split every this many epochs (0: never)")
    device: str = option("auto", help="torch device: auto (cuda when available), cpu, cuda, cuda:1, ...")
    torch_threads: int = option(0, help="threads torch may use (0: its default)")
    memory: Size = option(
        1 << 30,
        help="budget of the whole process: torch and model (anonymous memory measured at start, and 96 MiB of "
        "code pages), training, topology, features, batches",
    )
    feature_memory: Size = option(0, help="cap on the feature tiers (hot set + cache); 0: what --memory leaves")
    device_memory: str = option(
        "auto",
        help="GPU memory for the device tier (the hottest rows in a device tensor, outside --memory): "
        "auto (a quarter of the free memory on CUDA, none on cpu), 0 (off) or a size such as 8G",
    )
    hot_ranking: Literal["reverse_pagerank", "presampling", "degree", "none"] = option(
        "reverse_pagerank", help="ranking of the static hot set: reverse PageRank (GIDS), pre-sampling (Helios), degree"
    )
    hot_share: float = option(0.5, help="share of the feature budget for the static hot set (rest: dynamic cache)")
    eviction: Literal["sieve", "clock"] = option("sieve", help="eviction policy of the dynamic cache")
    window: int = option(8, help="GIDS window: batches sampled and pinned ahead")
    accumulator: bool = option(True, help="merge the disk reads of consecutive batches (GIDS accumulator)")
    in_flight_target: int = option(0, help="reads to keep in flight; 0: p/(1-p) x IOPS x latency from the profile")
    pipeline: bool = option(True, help="run sampling, lookup, I/O and assembly on their own threads")
    sampler_threads: int = option(0, help="threads sampling batches (0: one per core)")
    io_threads: int = option(1, help="I/O threads, each completing one merged read while it submits the next")
    seed: int = option(0, help="seed of sampling, shuffling and model initialisation")

    def check(self) -> None:
        for name in ("batch_size", "hidden", "heads", "epochs", "io_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"gnn.train.{name}: need at least 1, got {getattr(self, name)}")
        if not self.fanouts or any(f != -1 and f < 1 for f in self.fanouts):
            raise ConfigError(f"gnn.train.fanouts: each hop needs a fanout >= 1 or -1, got {self.fanouts}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"gnn.train.dropout: must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.hot_share <= 1.0:
            raise ConfigError(f"gnn.train.hot_share: must be in [0, 1], got {self.hot_share}")
        if self.device_memory != "auto":
            try:
                parse_size(self.device_memory)
            except ValueError as e:
                raise ConfigError(f"gnn.train.device_memory: {e} (or auto)") from None
        if not self.lr > 0:
            raise ConfigError(f"gnn.train.lr: must be positive, got {self.lr}")
