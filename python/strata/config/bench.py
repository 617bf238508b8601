"""The [bench_disk] section: the benchmark's options are declared natively
(``BenchDiskOptions`` in strata-py's io module, where the benchmark and the engine choice
meet); saving the profile is Python's."""

from __future__ import annotations

from pathlib import Path

from .schema import native_section, option


class _BenchFrontEnd:
    """The [bench_disk] options of the profile Python saves."""

    profile: Path | None = option(
        None, help="where to save the device profile (default: per device, under ~/.local/share/strata/devices)"
    )
    save: bool = option(True, help="save the device profile for the engines to plan with")


BenchDiskConfig = native_section("bench_disk", "BenchDiskConfig", front=_BenchFrontEnd)
