"""Typed configuration of every subcommand (see :mod:`strata.config.schema`)."""

from .bench import BenchDiskConfig
from .convert import ConvertConfig
from .datasets import DatasetsListConfig, FetchConfig
from .embed import EmbedPlanConfig
from .generate import GENERATORS, KgConfig, RmatConfig, SbmConfig
from .info import InfoConfig
from .schema import SECTIONS, ConfigError, Fractions, Size, add_arguments, as_dict, describe, from_args, load

__all__ = [
    "GENERATORS",
    "SECTIONS",
    "BenchDiskConfig",
    "ConfigError",
    "ConvertConfig",
    "DatasetsListConfig",
    "EmbedPlanConfig",
    "FetchConfig",
    "Fractions",
    "InfoConfig",
    "KgConfig",
    "RmatConfig",
    "SbmConfig",
    "Size",
    "add_arguments",
    "as_dict",
    "describe",
    "from_args",
    "load",
]
