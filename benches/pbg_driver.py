"""PyTorch-BigGraph's side of benches/bench_embed_pbg.py, run by the Python that imports PBG:

    python benches/pbg_driver.py SETTINGS.json

SETTINGS: ``dataset`` (a folder of ``train.txt``, ``valid.txt``, ``test.txt``: tab-separated
head, relation, tail), ``work`` (PBG's entity path, edge files and checkpoints go there) and
``config`` (PBG's config values: dimension, operator, batch size, negatives, epochs, workers,
``num_gpus``...). Imports the triples with PBG's own importer (once; dynamic relations, one
entity type of one partition), then trains the training split with ``torchbiggraph.train``,
which logs each bucket's training time ("Trained N edges in T s"); the checkpoint goes to
``WORK/model``. Works with PBG 1.0.0 (PyPI: CPU trainer) and with its GitHub main (GPU
trainer too, `num_gpus`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attr
from torchbiggraph.config import ConfigSchema
from torchbiggraph.train import train
from torchbiggraph.util import SubprocessInitializer, setup_logging

SPLITS = ("train", "valid", "test")


def import_triples(config: ConfigSchema, dataset: Path) -> None:
    """The dataset's splits as PBG's entity and edge files (its importer of either version)."""
    sources = [dataset / f"{s}.txt" for s in SPLITS]
    try:  # GitHub main
        from torchbiggraph.converters.importers import TSVEdgelistReader, convert_input_data

        reader = (TSVEdgelistReader(lhs_col=0, rhs_col=2, rel_col=1),)
    except ImportError:  # 1.0.0
        from torchbiggraph.converters.import_from_tsv import convert_input_data

        reader = (0, 2, 1)
    convert_input_data(
        config.entities, config.relations, config.entity_path, config.edge_paths, sources, *reader,
        dynamic_relations=config.dynamic_relations,
    )  # fmt: skip


def main() -> None:
    settings = json.loads(Path(sys.argv[1]).read_text())
    work, dataset = Path(settings["work"]), Path(settings["dataset"])
    config = ConfigSchema.from_dict(
        {
            "entity_path": str(work / "entities"),
            "edge_paths": [str(work / f"edges-{s}") for s in SPLITS],
            "checkpoint_path": str(work / "model"),
            "entities": {"all": {"num_partitions": 1}},
            "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": settings["operator"]}],
            "dynamic_relations": True,
            **settings["config"],
        }
    )
    if not (work / "edges-train").exists():
        import_triples(config, dataset)
    setup_logging()
    init = SubprocessInitializer()
    init.register(setup_logging)
    train(attr.evolve(config, edge_paths=[config.edge_paths[0]]), subprocess_init=init)


if __name__ == "__main__":
    main()
