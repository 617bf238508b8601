"""PyTorch-BigGraph checkpoints both ways: a run exported with `--format pbg` and imported back
with `import-pbg` has bit-identical embeddings and relations and the same scores; PBG's own code
(when torchbiggraph is importable) loads the export and scores as Strata does; a checkpoint laid
out by hand as PBG writes it (static relations, global embeddings, max_norm, two partitions)
imports with PBG's scores; and bad checkpoints exit 2 naming the file."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import needs, run_strata, without
from strata.embed import Run, import_pbg
from strata.errors import ConfigError, InputError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_pbg_interchange")

h5py = needs("h5py")

SMALL = ["--epochs", "1", "--dim", "16", "--chunk-size", "200", "--negatives", "64", "--partitions", "3", "-q"]

#: (label, training options): named models whose PBG form is exact, with and without reciprocal relations.
MODELS = {
    "distmult": ["--model", "distmult", "--no-reciprocal"],
    "complex": ["--model", "complex"],
    "transe": ["--model", "transe", "--transe-norm", "2"],
    "affine-cos": ["--model", "pbg", "--operator", "affine", "--comparator", "cos"],
}


@pytest.fixture(scope="module")
def runs(kg, tmp_path_factory) -> dict:
    """A trained run of each of MODELS, its PBG export and the store's names."""
    d = tmp_path_factory.mktemp("pbg")
    out = {}
    for label, args in MODELS.items():
        run_strata("embed", "train", kg, "--run-dir", d / label, *SMALL, *args)
        Run(d / label).export(d / f"{label}.pbg", format="pbg")
        out[label] = (d / label, d / f"{label}.pbg")
    Run(d / "distmult").export(d / "names")
    names = (d / "names" / "node_names.txt").read_text().splitlines()
    rel_names = (d / "names" / "relation_names.txt").read_text().splitlines()
    return {"runs": out, "names": names, "rel_names": rel_names, "dir": d}


def table(run: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    Run(run).export(out)
    return np.load(out / "embeddings.npy"), np.load(out / "relations.npy")


def imported(checkpoint: Path, store: Path, out: Path, **options) -> dict:
    return import_pbg({"checkpoint": str(checkpoint), "store": str(store), "out": str(out), **options})


@pytest.mark.parametrize("label", list(MODELS))
def test_round_trip_is_bit_exact(runs, kg, tmp_path, label):
    run, pbg = runs["runs"][label]
    names, rel_names = runs["names"], runs["rel_names"]
    config = json.loads((pbg / "config.json").read_text())
    assert config["dynamic_relations"] and config["entities"] == {"all": {"num_partitions": 3}}
    assert sum(int((pbg / f"entity_count_all_{p}.txt").read_text()) for p in range(3)) == 400
    summary = imported(pbg, kg, tmp_path / "back")
    source, back = Run(run), Run(tmp_path / "back")
    assert back.meta["config"]["model"] == source.meta["config"]["model"]
    assert back.meta["config"]["reciprocal"] == source.meta["config"]["reciprocal"] == summary["reciprocal"]
    emb, rels = table(run, tmp_path / "a")
    emb2, rels2 = table(tmp_path / "back", tmp_path / "b")
    assert np.array_equal(emb, emb2) and np.array_equal(rels, rels2)
    triples = [(names[i], rel_names[i % 8], names[(7 * i + 3) % 400]) for i in range(0, 400, 37)]
    assert back.score(triples) == source.score(triples)


def test_an_imported_run_evaluates_predicts_and_reexports(runs, kg, tmp_path):
    _, pbg = runs["runs"]["complex"]
    args = ["--store", kg, "--out", tmp_path / "r", "--partitions", "2", "--json-summary", "-q"]
    summary = json.loads(run_strata("embed", "import-pbg", pbg, *args).stdout)
    assert (summary["partitions"], summary["model"], summary["reciprocal"]) == (2, "complex", True)
    back = Run(tmp_path / "r")
    assert back.meta["partitioning"]["partitions"] == 2
    got = back.evaluate("test", protocol="filtered")["metrics"]
    want = Run(runs["runs"]["complex"][0]).evaluate("test", protocol="filtered")["metrics"]
    ranks = ("queries", "mrr", "mr", "hits@1", "hits@10", "tail_mrr", "head_mrr")
    assert [got[k] for k in ranks] == [want[k] for k in ranks]
    assert len(back.predict(head=runs["names"][0], relation=runs["rel_names"][0], top=3)["predictions"]) == 3
    back.export(tmp_path / "again", format="pbg")
    for name in ("model.v1.h5", "embeddings_all_1.v1.h5", "entity_names_all_1.json", "dynamic_rel_names.json"):
        assert (tmp_path / "again" / name).is_file()
    back.export(tmp_path / "again", format="pbg", overwrite=True)  # an earlier PBG export is replaced
    # Importing over a store (or anything but an earlier run) is refused, the store left whole.
    over = run_strata("embed", "import-pbg", pbg, "--store", kg, "--out", kg, "--overwrite", check=False)
    assert over.returncode == 2 and "is not an earlier output of this command (no run.json)" in over.stderr
    assert (kg / "manifest.json").is_file()


def pbg_modules():
    """torchbiggraph's modules (from the venv's ``peers`` folder, where ``make test`` installs
    them), or a skip that says how to get them."""
    peers = Path(sys.prefix) / "peers"
    if peers.is_dir() and str(peers) not in sys.path:
        sys.path.append(str(peers))
    try:
        from torchbiggraph.checkpoint_manager import CheckpointManager
        from torchbiggraph.config import ConfigSchema
        from torchbiggraph.model import make_model
    except ImportError as e:
        pytest.skip(
            f"torchbiggraph is not importable ({e}): `make test` installs it, or `pip install --no-deps "
            "--target DIR torchbiggraph==1.0.0` (it pins an old torch; its checkpoint code runs with this one) "
            "and run with PYTHONPATH=DIR"
        )
    return CheckpointManager, ConfigSchema, make_model


@pytest.mark.parametrize("label", ["complex", "transe", "affine-cos"])
def test_pytorch_biggraph_loads_the_export_and_scores_like_strata(runs, label):
    CheckpointManager, ConfigSchema, make_model = pbg_modules()
    import torch

    run, pbg = runs["runs"][label]
    config = ConfigSchema.from_dict(json.loads((pbg / "config.json").read_text()))
    model = make_model(config)
    manager = CheckpointManager(config.checkpoint_path)
    state, _ = manager.read_model()
    if state is not None:
        model.load_state_dict(state, strict=False)
    rows, names = [], []
    for p in range(3):
        rows.append(manager.read("all", p)[0])
        names += json.loads((pbg / f"entity_names_all_{p}.json").read_text())
    table = torch.cat(rows)
    at = {n: i for i, n in enumerate(names)}
    rel_names = json.loads((pbg / "dynamic_rel_names.json").read_text())
    triples = [(runs["names"][i], rel_names[i % 8], runs["names"][(5 * i + 11) % 400]) for i in range(0, 400, 23)]
    h = table[[at[t[0]] for t in triples]]
    t = table[[at[t[2]] for t in triples]]
    r = torch.tensor([rel_names.index(x[1]) for x in triples])
    empty = torch.empty(1, 0, table.shape[1])

    def compare(a, b):
        prep = model.comparator.prepare
        return model.comparator(prep(a).unsqueeze(0), prep(b).unsqueeze(0), empty, empty)[0][0]

    with torch.no_grad():
        # Tails corrupted: c(g_r(h), t) with the left-hand operators (Strata's tail queries).
        tails = compare(model.lhs_operators[0](h, r), t)
        # Heads corrupted: c(h, h_r(t)) with the right-hand operators (Strata's head queries).
        heads = compare(h, model.rhs_operators[0](t, r))
    assert np.allclose(tails.numpy(), Run(run).score(triples), rtol=1e-4, atol=1e-4)
    first = triples[0]
    answers = Run(run).predict(tail=first[2], relation=first[1], top=400)["predictions"]
    strata_head = next(a["score"] for a in answers if a["name"] == first[0])
    assert heads[0].item() == pytest.approx(strata_head, rel=1e-4, abs=1e-4)


def write_h5(path: Path, datasets: dict, version: int = 1) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["format_version"] = version
        for name, values in datasets.items():
            f.create_dataset(name, data=np.asarray(values, dtype=np.float32))


@pytest.fixture
def handmade(runs, tmp_path) -> tuple[Path, dict]:
    """A checkpoint as PBG writes one with static relations (translation, l2), global embeddings,
    max_norm and two partitions, entities in shuffled order; and what PBG would score with it."""
    names, rel_names = runs["names"], runs["rel_names"]
    rng = np.random.default_rng(7)
    d, ck = 8, tmp_path / "ckpt"
    ck.mkdir()
    order = rng.permutation(400)
    parts = [order[:150], order[150:]]
    raw = rng.normal(scale=0.5, size=(400, d)).astype(np.float32)
    glob = rng.normal(scale=0.1, size=d).astype(np.float32)
    trans = rng.normal(scale=0.3, size=(8, d)).astype(np.float32)
    config = {
        "entities": {"ent": {"num_partitions": 2}},
        "relations": [{"name": n, "lhs": "ent", "rhs": "ent", "operator": "translation"} for n in rel_names],
        "dimension": d,
        "comparator": "l2",
        "global_emb": True,
        "max_norm": 1.0,
        "entity_path": str(ck),
        "edge_paths": [],
        "checkpoint_path": str(ck),
    }
    (ck / "config.json").write_text(json.dumps(config))
    (ck / "checkpoint_version.txt").write_text("4\n")
    (ck / "dynamic_rel_names.json").write_text(json.dumps(rel_names))
    for p, ids in enumerate(parts):
        (ck / f"entity_count_ent_{p}.txt").write_text(f"{len(ids)}\n")
        (ck / f"entity_names_ent_{p}.json").write_text(json.dumps([names[i] for i in ids]))
        write_h5(ck / f"embeddings_ent_{p}.v4.h5", {"embeddings": raw[ids]})
    model = {f"model/relations/{r}/operator/rhs/translation": trans[r] for r in range(8)}
    model["model/entities/ent/global_embedding"] = glob
    write_h5(ck / "model.v4.h5", model)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    rows = np.where(norms > 1.0, raw * (1.0 / (norms + 1e-7)), raw) + glob

    def pbg_score(h: int, r: int, t: int) -> float:
        # Static relations: c(u, f_r(v)) = -|u - (v + translation_r)|.
        return -float(np.linalg.norm(rows[h] - (rows[t] + trans[r])))

    return ck, {"score": pbg_score}


def test_a_pbg_checkpoint_with_static_relations_imports_with_its_scores(runs, kg, tmp_path, handmade):
    ck, expect = handmade
    names, rel_names = runs["names"], runs["rel_names"]
    imported(ck, kg, tmp_path / "run")
    run = Run(tmp_path / "run")
    assert (run.meta["config"]["model"], run.meta["config"]["reciprocal"]) == ("transe", False)
    triples = [(i, i % 8, (11 * i + 5) % 400) for i in range(0, 400, 19)]
    scores = run.score([(names[h], rel_names[r], names[t]) for h, r, t in triples])
    assert np.allclose(scores, [expect["score"](*x) for x in triples], rtol=1e-5, atol=1e-4)


def test_bad_checkpoints_are_refused_naming_the_file(runs, kg, tmp_path, handmade):
    ck, _ = handmade
    out = tmp_path / "out"

    def broken(name: str, change) -> str:
        copy = tmp_path / name
        shutil.copytree(ck, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "entity_path": str(copy)}))
        change(copy)
        with pytest.raises((ConfigError, InputError)) as e:
            imported(copy, kg, out)
        assert not out.exists() and not list(tmp_path.glob(".out.partial-*")), "nothing half-written"
        return str(e.value)

    assert "config.json: cannot read it" in broken("noconfig", lambda c: (c / "config.json").unlink())
    assert "model.v4.h5: missing" in broken("nomodel", lambda c: (c / "model.v4.h5").unlink())

    def edit(key, value):
        def change(c):
            cfg = json.loads((c / "config.json").read_text())
            cfg[key] = value
            (c / "config.json").write_text(json.dumps(cfg))

        return change

    relations = json.loads((ck / "config.json").read_text())["relations"]
    op = broken("op", edit("relations", [{**r, "operator": "rotation"} for r in relations]))
    assert "config.json: unknown operator 'rotation'" in op
    assert "bias = true" in broken("bias", edit("bias", True))
    two = {"ent": {"num_partitions": 2}, "b": {"num_partitions": 2}}
    assert "entity types" in broken("types", edit("entities", two))
    static = broken("static", edit("comparator", "cos"))
    assert "config.json" in static and "dynamic_relations" in static

    def wrong_dim(c):
        write_h5(c / "embeddings_ent_1.v4.h5", {"embeddings": np.zeros((250, 9))})

    shape = broken("dim", wrong_dim)
    assert "embeddings_ent_1.v4.h5: dataset embeddings has shape [250, 9], expected [250, 8]" in shape

    def stranger(c):
        names = json.loads((c / "entity_names_ent_1.json").read_text())
        names[3] = "no-such-entity"
        (c / "entity_names_ent_1.json").write_text(json.dumps(names))

    assert "entity_names_ent_1.json entry 3: node 'no-such-entity' is not in store" in broken("names", stranger)
    version = broken("version", lambda c: write_h5(c / "model.v4.h5", {"x": [1.0]}, version=2))
    assert "model.v4.h5: format_version 2" in version
    # From the command line: exit 2, the message, no traceback.
    proc = run_strata("embed", "import-pbg", tmp_path / "names", "--store", kg, "--out", out, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "entity_names_ent_1.json entry 3" in proc.stderr


def test_without_h5py_the_error_says_how_to_install(runs, tmp_path, monkeypatch):
    without(monkeypatch, "h5py")
    with pytest.raises(ConfigError, match=r"pip install h5py"):
        Run(runs["runs"]["complex"][0]).export(tmp_path / "x", format="pbg")
    assert not (tmp_path / "x").exists()
