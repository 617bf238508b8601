"""Question: at equal epochs of one shipped recipe, how fast does Strata train against PyKEEN on
the same machine, and to what validation MRR?

    python benches/bench_embed_pykeen.py --pykeen-python PY [--recipe NAME] [--epochs N]
        [--threads T] [--datasets DIR]

PY is a Python with PyKEEN installed (``pip install pykeen``; PyKEEN is no dependency of
Strata's and `make test` does not install it): this script runs PyKEEN's side in it as a
subprocess (``--pykeen-worker``), and Strata's through the CLI of the Python running it.

``NAME`` is a recipe of ``examples/recipes`` (default ``distmult-fb15k237``); both sides train
it on the whole splits of its dataset (``DATASETS/<dataset>``, as ``bench_recipes.py`` names
them) for ``N`` epochs on ``T`` threads, one side after the other. Strata runs the recipe file
as shipped, with ``--epochs N --eval-every N --threads T``. PyKEEN gets the recipe translated
option by option (:func:`pykeen_plan`): the model as an ``ERModel`` of the same interaction and
size; reciprocal relations as ``create_inverse_triples`` (with negative sampling, each triple
and its inverse corrupt their tail only: LibKGE's reciprocal recipe); negative sampling as the
sLCWA loop (``negatives`` per positive, batches of ``chunk_size`` triples, i.e.
``2 chunk_size`` positives with their inverses), KvsAll as the LCWA loop (batches of
``chunk_size`` distinct queries) with the label smoothing; the softmax loss as InfoNCE with
margin 0 and temperature 1 (sLCWA) or the cross-entropy against the normalised labels (LCWA),
the logistic loss (with no ``gamma``) as BCE; entity and relation dropout as the
representations' dropout; N3 or L2 as PyKEEN's Lp regularizer with the recipe's weights;
Adagrad, Adam or SGD at the recipe's rate. A recipe option PyKEEN cannot express stops the
script with its name.

Strata's chunks share one set of negatives (one matrix product per chunk), PyKEEN draws each
positive's own: with negative sampling, Strata also trains a second time with negatives per
edge (``--no-shared-negatives``), PyKEEN's sampling, so that the three rows separate the
sampling from the rest. What still differs, because the systems do: Strata's N3 is frequency-weighted
where the recipe says so, PyKEEN's is not (the recipes' weights are 1e-9 and below); each side
starts from its own initialisation; the learning-rate schedule and early stopping of the
recipe cannot act within a few epochs (their patience is longer) and are left out of PyKEEN's
side. Seconds per epoch are training only; the validation MRR is the filtered MRR of the whole
validation split, both directions, after the last epoch. Results go to
bench-results/embed-pykeen.json and the embed-pykeen section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

#: Recipe options and the values PyKEEN's side supports; anything else is refused by name.
SUPPORTED = {
    "model": {"complex", "distmult", "rotate", "transe"},
    "training": {"negative_sampling", "KvsAll"},
    "loss": {"softmax", "logistic"},
    "optimizer": {"adagrad", "adam", "sgd"},
    "regularizer": {"none", "n3", "l2"},
    "corrupt": {"both"},
}

#: Recipe options that change nothing PyKEEN's side could mirror in a few epochs, or that only
#: say how Strata runs (budget, threads, schedule and stopping).
IGNORED = {
    "epochs", "eval_every", "memory", "threads", "reg_weighted", "lr_scheduler", "lr_factor",
    "lr_patience", "lr_threshold", "early_stopping_patience", "early_stopping_threshold_epochs",
    "early_stopping_threshold_mrr",
}  # fmt: skip

#: Recipe options PyKEEN's side reads.
READ = set(SUPPORTED) | {
    "dim", "transe_norm", "reciprocal", "chunk_size", "negatives", "label_smoothing", "lr",
    "reg_weight", "relation_reg_weight", "entity_dropout", "relation_dropout",
}  # fmt: skip


def pykeen_plan(recipe: dict) -> dict:
    """The recipe (the ``[embed.train]`` table) as PyKEEN's side runs it; raises SystemExit
    naming the first option PyKEEN's side cannot express."""
    for key, value in recipe.items():
        if key not in READ | IGNORED:
            raise SystemExit(f"recipe option {key} = {value!r} has no PyKEEN counterpart in this benchmark")
        if key in SUPPORTED and value not in SUPPORTED[key]:
            raise SystemExit(f"recipe option {key} = {value!r}: PyKEEN's side supports {sorted(SUPPORTED[key])}")
    if not recipe.get("reciprocal", False):
        raise SystemExit("recipe option reciprocal = false: PyKEEN's side runs reciprocal recipes only")
    plan = {k: recipe[k] for k in READ if k in recipe}
    plan.setdefault("training", "negative_sampling")
    plan.setdefault("regularizer", "none")
    plan.setdefault("transe_norm", 2)
    return plan


def pykeen_model(plan: dict, train):
    """An ``ERModel`` of the plan's interaction, size, dropout and regularizer."""
    import torch
    from pykeen.losses import BCEWithLogitsLoss, CrossEntropyLoss, InfoNCELoss
    from pykeen.models import ERModel

    complex_valued = plan["model"] in ("complex", "rotate")
    shape = plan["dim"] // 2 if complex_valued else plan["dim"]
    dtype = torch.cfloat if complex_valued else torch.float

    def side(dropout_key: str, weight_key: str) -> dict:
        kw = {"shape": shape, "dtype": dtype, "dropout": plan.get(dropout_key) or None}
        if plan["regularizer"] != "none" and plan.get(weight_key):
            p = 3.0 if plan["regularizer"] == "n3" else 2.0
            kw.update(regularizer="lp", regularizer_kwargs={"p": p, "weight": plan[weight_key]})
        return kw

    # PyKEEN's own defaults for each model class: normal for ComplEx, Xavier for the others;
    # RotatE's relations start as unit phases and stay on the unit circle.
    entity = side("entity_dropout", "reg_weight")
    relation = side("relation_dropout", "relation_reg_weight" if "relation_reg_weight" in plan else "reg_weight")
    entity["initializer"] = relation["initializer"] = "normal" if plan["model"] == "complex" else "xavier_normal"
    interaction_kwargs = None
    if plan["model"] == "rotate":
        relation.update(initializer="init_phases", constrainer="complex_normalize")
    if plan["model"] == "transe":
        interaction_kwargs = {"p": plan["transe_norm"]}
    if plan["training"] == "KvsAll":
        loss = CrossEntropyLoss() if plan["loss"] == "softmax" else BCEWithLogitsLoss()
    else:
        softmax = plan["loss"] == "softmax"
        loss = InfoNCELoss(margin=0.0, log_adversarial_temperature=0.0) if softmax else BCEWithLogitsLoss()
    return ERModel(
        triples_factory=train,
        interaction=plan["model"],
        interaction_kwargs=interaction_kwargs,
        entity_representations_kwargs=entity,
        relation_representations_kwargs=relation,
        loss=loss,
        random_seed=0,
    )


def pykeen_worker(args) -> dict:
    """PyKEEN's side (run in the Python that has PyKEEN): trains epoch by epoch, timing each,
    then evaluates the validation split filtered by every split."""
    import torch
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.training import LCWATrainingLoop, SLCWATrainingLoop
    from pykeen.triples import TriplesFactory

    plan = json.loads(args.plan)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = Path(args.data)
    train = TriplesFactory.from_path(data / "train.txt", create_inverse_triples=True)
    maps = {"entity_to_id": train.entity_to_id, "relation_to_id": train.relation_to_id}
    valid = TriplesFactory.from_path(data / "valid.txt", **maps)
    test = TriplesFactory.from_path(data / "test.txt", **maps)
    model = pykeen_model(plan, train)
    optimizer = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[plan["optimizer"]]
    optimizer = optimizer(model.parameters(), lr=plan["lr"])
    if plan["training"] == "KvsAll":
        loop = LCWATrainingLoop(model=model, triples_factory=train, optimizer=optimizer)
        batch, extra = plan["chunk_size"], {"label_smoothing": plan.get("label_smoothing", 0.0)}
    else:
        negatives = {"num_negs_per_pos": plan["negatives"], "corruption_scheme": ["tail"]}
        loop = SLCWATrainingLoop(
            model=model,
            triples_factory=train,
            optimizer=optimizer,
            negative_sampler="basic",
            negative_sampler_kwargs=negatives,
        )
        # A chunk of Strata's is chunk_size triples asked both ways: PyKEEN's batch holds the
        # triples and their inverses, so the same number of steps makes an epoch.
        batch, extra = 2 * plan["chunk_size"], {}
    seconds, losses = [], []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        # continue_training trains from the last epoch up to num_epochs (one epoch a call) and
        # returns every epoch's loss so far.
        losses = loop.train(
            triples_factory=train,
            num_epochs=epoch,
            batch_size=batch,
            use_tqdm=False,
            continue_training=True,
            **extra,
        )
        seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    result = RankBasedEvaluator(filtered=True).evaluate(
        model,
        valid.mapped_triples,
        batch_size=256,
        use_tqdm=False,
        additional_filter_triples=[train.mapped_triples, test.mapped_triples],
    )
    return {
        "epoch_seconds": seconds,
        "loss": losses,
        "valid_mrr": float(result.get_metric("both.realistic.inverse_harmonic_mean_rank")),
        "valid_hits_at_10": float(result.get_metric("both.realistic.hits_at_10")),
        "eval_seconds": time.perf_counter() - start,
        "batch": batch,
    }


def strata_side(args, recipe_file: Path, data: Path, work: Path, run: str, *options: str) -> dict:
    """Strata trains the recipe (with ``options`` after it) into run directory ``run``."""
    from bench_embed import convert, train

    store = convert(data, work / f"{data.name}.strata", "--relations")
    epochs = ["--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--threads", str(args.threads)]
    meta = train(store, work / run, ["--config", str(recipe_file), *epochs, *options, "-q"])
    hist = meta["history"]
    return {
        "epoch_seconds": [h["seconds"] for h in hist],
        "loss": [h["loss"] for h in hist],
        "valid_mrr": hist[-1]["valid"]["mrr"],
        "valid_hits_at_10": hist[-1]["valid"]["hits@10"],
        "eval_seconds": hist[-1]["valid"]["seconds"],
    }


def pykeen_side(args, plan: dict, data: Path) -> dict:
    cmd = [args.pykeen_python, __file__, "--pykeen-worker", "--data", str(data), "--epochs", str(args.epochs)]
    cmd += ["--threads", str(args.threads), "--plan", json.dumps(plan)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"PyKEEN's side failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(args, result: dict) -> str:
    from common import median

    plan, m, load = result["plan"], result["machine"], result["load"]
    s, p, e = result["strata"], result["pykeen"], result.get("strata_per_edge")

    def row(name: str, side: dict) -> str:
        return (
            f"| {name} | {median(side['epoch_seconds']):.1f} | {side['valid_mrr']:.4f} | "
            f"{side['valid_hits_at_10']:.4f} | {side['eval_seconds']:.1f} |"
        )

    sampling = (
        f"KvsAll (PyKEEN's LCWA, batches of {plan['chunk_size']} queries, label smoothing "
        f"{plan.get('label_smoothing', 0.0)})"
        if plan["training"] == "KvsAll"
        else f"{plan['negatives']} negatives per query (PyKEEN's sLCWA, tails of each triple and its inverse, "
        f"batches of {2 * plan['chunk_size']} positives)"
    )
    sides = [s] + ([e] if e else []) + [p]
    names = "Strata/" + ("Strata per edge/" if e else "") + "PyKEEN"
    curve = ", ".join("/".join(f"{x:.0f}" for x in xs) for xs in zip(*(d["epoch_seconds"] for d in sides), strict=True))
    per_edge = []
    if e:
        per_edge = [
            f"With PyKEEN's sampling (negatives per edge), Strata trains an epoch "
            f"{median(p['epoch_seconds']) / median(e['epoch_seconds']):.1f}x faster than PyKEEN and "
            f"{median(e['epoch_seconds']) / median(s['epoch_seconds']):.1f}x slower than with the chunk's shared "
            f"negatives; validation MRR {e['valid_mrr']:.4f}.",
        ]
    return "\n".join(
        [
            f"### PyKEEN side by side: the {args.recipe} recipe at equal epochs (`benches/bench_embed_pykeen.py`)",
            "",
            f"`python benches/bench_embed_pykeen.py --pykeen-python PY --recipe {args.recipe} --epochs "
            f"{args.epochs} --threads {args.threads}` (PyKEEN {result['pykeen_version']}, torch "
            f"{result['torch_version']}). {m['nproc']} cores ({m['cpu']}), the sides one after the other "
            f"in one run, each one process on {args.threads} thread(s); 1-minute load average "
            f"{load[0]:.1f} before and {load[1]:.1f} after. Each side trains the whole training split "
            f"({result['triples']['train']:,} triples) of {result['dataset']} with the shipped recipe: "
            f"{plan['model']}, dim {plan['dim']}, reciprocal relations, {sampling}, {plan['loss']} loss, "
            f"{plan['optimizer']} lr {plan['lr']}, entity dropout {plan.get('entity_dropout', 0.0)}, relation "
            f"dropout {plan.get('relation_dropout', 0.0)}, regularizer {plan['regularizer']}. Validation: "
            f"filtered MRR and Hits@10 of all {result['triples']['valid']:,} validation triples after epoch "
            f"{args.epochs}, both directions, against every entity.",
            "",
            "| system | s per epoch (median, training only) | valid MRR | valid Hits@10 | validation (s) |",
            "|---|---|---|---|---|",
            row("Strata (the chunk's shared negatives, as shipped)", s),
            *([row("Strata, negatives per edge (`--no-shared-negatives`)", e)] if e else []),
            row("PyKEEN", p),
            "",
            f"Strata trains an epoch {median(p['epoch_seconds']) / median(s['epoch_seconds']):.1f}x faster at equal "
            f"epochs; validation MRR {s['valid_mrr']:.4f} against {p['valid_mrr']:.4f} after {args.epochs} epochs. "
            + " ".join(per_edge)
            + f" Seconds of each epoch ({names}): {curve}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pykeen-python", help="a Python with PyKEEN installed")
    parser.add_argument("--pykeen-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--recipe", default="distmult-fb15k237", help="a recipe of examples/recipes, without .toml")
    parser.add_argument("--datasets", type=Path, default=None, help="dataset folders (default: shared/datasets)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: bench-data/pykeen)")
    args = parser.parse_args()
    if args.pykeen_worker:
        print(json.dumps(pykeen_worker(args)))
        return
    from bench_recipes import dataset_of
    from common import REPO, SHARED, machine, save, update_doc

    if args.pykeen_python is None:
        raise SystemExit("give --pykeen-python, a Python with PyKEEN installed (pip install pykeen)")
    recipe_file = REPO / "examples" / "recipes" / f"{args.recipe}.toml"
    if not recipe_file.is_file():
        raise SystemExit(f"no recipe {recipe_file}")
    plan = pykeen_plan(tomllib.loads(recipe_file.read_text())["embed"]["train"])
    data = (args.datasets or SHARED / "datasets") / dataset_of(args.recipe)
    work = args.work or REPO / "bench-data" / "pykeen"
    work.mkdir(parents=True, exist_ok=True)
    versions = subprocess.run(
        [args.pykeen_python, "-c", "import importlib.metadata as m; print(m.version('pykeen'), m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    load = [os.getloadavg()[0]]
    count = {n: sum(1 for line in open(data / f"{n}.txt") if line.strip()) for n in ("train", "valid")}
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "plan": plan}
    result.update(dataset=data.name, triples=count)
    result["strata"] = strata_side(args, recipe_file, data, work, "strata-run")
    if plan["training"] == "negative_sampling":
        per_edge = ("strata-per-edge", "--no-shared-negatives")
        result["strata_per_edge"] = strata_side(args, recipe_file, data, work, *per_edge)
    result["pykeen"] = pykeen_side(args, plan, data)
    load.append(os.getloadavg()[0])
    result.update(load=load, pykeen_version=versions[0], torch_version=versions[1])
    save("embed-pykeen", result)
    markdown = report(args, result)
    update_doc("embed-pykeen", markdown)
    print(markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
