"""The [datasets.list] and [datasets.fetch] sections (see docs/datasets.md)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .schema import Size, option, section


@section("datasets.list")
class DatasetsListConfig:
    json: bool = option(False, help="print the catalogue as JSON instead of a table")


@section("datasets.fetch")
class FetchConfig:
    name: str = option(positional=True, help="dataset to fetch, as `strata datasets list` names it (any case)")
    dir: Path = option(help="data directory: files go to DIR/NAME/raw/, the store to DIR/NAME/NAME.strata")
    out: Path | None = option(None, help="store to create instead of DIR/NAME/NAME.strata", short="o")
    mirror: str | None = option(
        None,
        help="base URL replacing the catalogue's hosts: file F of dataset N is "
        "fetched from MIRROR/N/F (default: $STRATA_DATASETS_MIRROR)",
    )
    convert: bool = option(True, help="convert the downloaded files into a store")
    memory: Size = option(Size(2 << 30), help="memory budget of the conversion and of the staging before it")
    threads: int = option(0, help="parsing threads of the conversion; 0 = one per core")
    symmetrize: bool | None = option(
        None, help="store every edge both ways (default: the dataset's own convention, e.g. OGB's add_inverse_edge)"
    )
    force: bool = option(False, help="download every file again, even those already complete")
    overwrite: bool = option(False, help="replace an existing store")
    keep_archives: bool = option(
        True, help="keep .zip/.tar.gz files once extracted (without them a later run trusts the extracted files)"
    )
    timeout: float = option(60.0, help="seconds to wait on the server before an attempt fails")
    retries: int = option(3, help="further attempts after a failed transfer, each resuming where the last stopped")

    def check(self) -> None:
        if self.mirror is not None and not self.mirror.startswith(("http://", "https://")):
            raise ConfigError(f"datasets.fetch.mirror: expected an http:// or https:// URL, got {self.mirror!r}")
        if self.timeout <= 0:
            raise ConfigError(f"datasets.fetch.timeout: must be positive, got {self.timeout}")
