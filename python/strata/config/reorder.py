"""The [reorder] section, declared by the reorderer (``strata_graph::reorder::ReorderOptions``)."""

from __future__ import annotations

from .schema import native_section

ReorderConfig = native_section("reorder", "ReorderConfig")
