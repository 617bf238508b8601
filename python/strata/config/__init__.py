"""Typed configuration of every subcommand (see :mod:`strata.config.schema`)."""

from .bench import BenchDiskConfig
from .convert import ConvertConfig
from .datasets import DatasetsListConfig, FetchConfig
from .embed import EmbedEvalConfig, EmbedExportConfig, EmbedPlanConfig, EmbedPredictConfig, EmbedTrainConfig, PlotConfig
from .generate import GENERATORS, KgConfig, RmatConfig, SbmConfig
from .gnn import GnnTrainConfig
from .info import InfoConfig
from .schema import SECTIONS, ConfigError, Fractions, Size, add_arguments, as_dict, describe, from_args, load

__all__ = [
    "GENERATORS",
    "SECTIONS",
    "BenchDiskConfig",
    "ConfigError",
    "ConvertConfig",
    "DatasetsListConfig",
    "EmbedEvalConfig",
    "EmbedExportConfig",
    "EmbedPlanConfig",
    "EmbedPredictConfig",
    "EmbedTrainConfig",
    "FetchConfig",
    "Fractions",
    "GnnTrainConfig",
    "InfoConfig",
    "KgConfig",
    "PlotConfig",
    "RmatConfig",
    "SbmConfig",
    "Size",
    "add_arguments",
    "as_dict",
    "describe",
    "from_args",
    "load",
]
