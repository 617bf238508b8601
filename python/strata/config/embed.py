"""The [embed.*] sections."""

from __future__ import annotations

from typing import Literal

from ..errors import ConfigError
from .schema import option, section


@section("embed.plan")
class EmbedPlanConfig:
    partitions: int = option(help="number of node partitions n")
    buffer: int = option(3, help="partitions resident at once (legend needs 3; sequential needs 2)")
    ordering: Literal["legend", "beta", "sequential"] = option(
        "legend",
        help="legend: Legend's Alg. 1+2, built for prefetching; beta: Marius's BETA; sequential: one pair at a time",
    )
    show_buckets: bool = option(False, help="list the buckets trained in each state")
    json: bool = option(False, help="print the whole schedule as JSON")

    def check(self) -> None:
        if self.partitions < 1:
            raise ConfigError(f"embed.plan.partitions: need at least 1, got {self.partitions}")
