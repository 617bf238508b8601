"""The [convert] section, declared by the converters (``strata_store::convert::ConvertOptions``);
Python plans the inputs from the checked values (:mod:`strata.convert`)."""

from __future__ import annotations

from .schema import native_section

ConvertConfig = native_section("convert", "ConvertConfig")
