"""``strata serve`` and ``strata serve status``."""

from __future__ import annotations

from pathlib import Path

from .grid import check_address
from .schema import ConfigError, Size, option, section


@section("serve")
class ServeConfig:
    stores: list[str] = option(
        [],
        positional=True,
        help="stores to register at start, each as NAME=PATH or PATH (named after its directory); skipped when the "
        "name is already registered",
    )
    listen: str = option("127.0.0.1:7100", help="HOST:PORT to listen on; port 0 picks a free one")
    state_dir: Path = option(Path("strata-serve-state"), help="where registered graphs, models and logs live")
    memory: Size = option(
        Size(1 << 30), help="whole budget: runtime (24 MiB), graphs, models, working memory, executor, caches"
    )
    embedding_cache: bool = option(
        True, help="cache node embeddings until the graph changes (GLIST's C); off gives all of --memory to pages"
    )
    token: str = option("", help="shared secret clients must send (default $STRATA_SERVE_TOKEN); required off loopback")
    max_message: Size = option(Size(64 << 20), help="largest request or response message")
    max_ids: int = option(1_000_000, help="most ids (targets, seeds, vertices, edges) in one request")
    rate: float = option(0.0, help="requests per second over all clients; 0 means no limit")
    window_ms: float = option(2.0, help="batching window: how long a request waits for others to join its batch")
    max_batch: int = option(4096, help="most requests in one batch")
    group_size: int = option(256, help="S: distinct vertices embedded together as one fused batch (GLIST Alg. 1)")
    reorder_requests: bool = option(True, help="re-order a batch's vertices by id distance (GLIST Alg. 1)")
    reorder: bool = option(True, help="re-number the vertices of stores registered at start (GLIST Alg. 2)")
    reorder_hops: int = option(1, help="h of Alg. 2: hops of a centre vertex's working set")
    reorder_centers: int = option(0, help="Cn of Alg. 2: centre vertices; 0 picks enough to cover the graph")
    reorder_max_degree: int = option(0, help="Td of Alg. 2: centres have in-degree below this; 0 means no limit")
    sample_seed: int = option(0, help="seed of the neighbour sampling of analyses")
    result_ttl: float = option(300.0, help="seconds a finished result waits to be fetched")
    fold_records: int = option(50_000, help="fold a graph's log into a new store version at this many records")
    fold_after: float = option(30.0, help="... or once its oldest unfolded record is this many seconds old")

    def check(self) -> None:
        check_address("serve.listen", self.listen)
        for name in ("memory", "max_message", "max_ids", "max_batch", "group_size", "fold_records"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"serve.{name}: must be positive, got {getattr(self, name)}")
        for name in ("rate", "window_ms", "result_ttl", "fold_after"):
            if getattr(self, name) < 0:
                raise ConfigError(f"serve.{name}: must not be negative, got {getattr(self, name)}")
        if not 1 <= self.reorder_hops <= 4:
            raise ConfigError(f"serve.reorder_hops: expected 1 to 4, got {self.reorder_hops}")


@section("serve.status")
class ServeStatusConfig:
    address: str = option("127.0.0.1:7100", help="HOST:PORT of the server")
    token: str = option("", help="shared secret (default $STRATA_SERVE_TOKEN)")
    timeout: float = option(10.0, help="seconds to wait for the answer")

    def check(self) -> None:
        check_address("serve.status.address", self.address)
