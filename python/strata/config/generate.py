"""The [generate.rmat], [generate.kg], [generate.sbm] and [generate.hetsbm] sections (see
docs/generators.md), declared by the generators
(``strata_store::generate::{RmatOptions, KgOptions, SbmOptions, HetSbmOptions}``)."""

from __future__ import annotations

from .schema import native_section

RmatConfig = native_section("generate.rmat", "RmatConfig")
KgConfig = native_section("generate.kg", "KgConfig")
SbmConfig = native_section("generate.sbm", "SbmConfig")
HetSbmConfig = native_section("generate.hetsbm", "HetSbmConfig")

GENERATORS = {"rmat": RmatConfig, "kg": KgConfig, "sbm": SbmConfig, "hetsbm": HetSbmConfig}
