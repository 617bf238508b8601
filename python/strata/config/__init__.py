"""Typed configuration of every subcommand (see :mod:`strata.config.schema`)."""

from .bench import BenchDiskConfig
from .convert import ConvertConfig
from .datasets import DatasetsListConfig, FetchConfig
from .embed import (
    EmbedEvalConfig,
    EmbedExportConfig,
    EmbedGatherConfig,
    EmbedImportPbgConfig,
    EmbedIndexConfig,
    EmbedNeighborsConfig,
    EmbedPlanConfig,
    EmbedPredictConfig,
    EmbedScoreConfig,
    EmbedSearchConfig,
    EmbedTrainConfig,
    PlotConfig,
)
from .generate import GENERATORS, HetSbmConfig, KgConfig, RmatConfig, SbmConfig
from .gnn import GnnTrainConfig
from .grid import FarmemServeConfig, GridBuildConfig, GridInfoConfig, RunConfig
from .info import CheckConfig, InfoConfig
from .reorder import ReorderConfig
from .schema import (
    SECTIONS,
    ConfigError,
    Fractions,
    Size,
    add_arguments,
    as_dict,
    describe,
    engine_options,
    from_args,
    load,
)
from .serve import ServeConfig, ServeStatusConfig

__all__ = [
    "GENERATORS",
    "SECTIONS",
    "BenchDiskConfig",
    "CheckConfig",
    "ConfigError",
    "ConvertConfig",
    "DatasetsListConfig",
    "EmbedEvalConfig",
    "EmbedExportConfig",
    "EmbedGatherConfig",
    "EmbedImportPbgConfig",
    "EmbedIndexConfig",
    "EmbedNeighborsConfig",
    "EmbedPlanConfig",
    "EmbedPredictConfig",
    "EmbedScoreConfig",
    "EmbedSearchConfig",
    "EmbedTrainConfig",
    "FarmemServeConfig",
    "FetchConfig",
    "Fractions",
    "GnnTrainConfig",
    "GridBuildConfig",
    "GridInfoConfig",
    "HetSbmConfig",
    "InfoConfig",
    "KgConfig",
    "PlotConfig",
    "ReorderConfig",
    "RmatConfig",
    "RunConfig",
    "SbmConfig",
    "ServeConfig",
    "ServeStatusConfig",
    "Size",
    "add_arguments",
    "as_dict",
    "describe",
    "engine_options",
    "from_args",
    "load",
]
