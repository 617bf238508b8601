"""Question: at equal epochs of the same recipe, how fast does Strata train ComplEx on FB15k-237
against PyKEEN on the same machine, and to what validation MRR?

    python benches/bench_embed_pykeen.py --pykeen-python PY [--epochs 2] [--negatives 128]
        [--dim 100] [--batch 1000] [--lr 0.1] [--threads 2] [--train-triples N] [--valid-triples M]

PY is a Python with PyKEEN installed (``pip install pykeen``; PyKEEN is no dependency of
Strata's and `make test` does not install it): this script runs PyKEEN's side in it as a
subprocess (``--pykeen-worker``), and Strata's through the CLI of the Python running it.

The recipe, the same on both sides: ComplEx with ``dim`` reals (``dim/2`` complex coordinates:
PyKEEN's ``embedding_dim``), negative sampling with ``negatives`` negatives per positive scored
by the cross-entropy of the positive among them (Strata's softmax loss; PyKEEN's ``InfoNCELoss``
with margin 0 and temperature 1), batches (Strata's chunks) of ``batch`` positives, Adagrad at
``lr``, no regularizer, ``epochs`` epochs, one process on ``threads`` threads. The sides differ
where the systems do: Strata's chunk shares its negatives (one matrix product) and corrupts
both sides of every positive; PyKEEN draws negatives per positive, each corrupting the head or
the tail (its basic sampler). Seconds per epoch are training only (no validation); the
validation MRR is the filtered MRR of the whole validation split, both directions, against
every entity, after the last epoch. Results go to bench-results/embed-pykeen.json and the
embed-pykeen section of docs/benchmarks.md.

On a loaded machine a whole FB15k-237 epoch of PyKEEN may not finish in the time there is;
``--train-triples N`` trains both sides on the same N training triples (a seeded sample), and
``--valid-triples M`` validates both on the same M validation triples, so that equal epochs
stay equal work and end in bounded time. Both sides then rank against the same entities:
those of the sampled training triples (the validation and test triples are kept only where
all their entities and relations occur in the sample, as PyKEEN requires; the filter uses
every kept split).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHARED_FB = "fb15k-237"


def pykeen_worker(args) -> dict:
    """PyKEEN's side (run in the Python that has PyKEEN): trains epoch by epoch, timing each,
    then evaluates the validation split filtered by every split."""
    import torch
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.losses import InfoNCELoss
    from pykeen.models import ComplEx
    from pykeen.training import SLCWATrainingLoop
    from pykeen.triples import TriplesFactory

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = Path(args.data)
    train = TriplesFactory.from_path(data / "train.txt")
    maps = {"entity_to_id": train.entity_to_id, "relation_to_id": train.relation_to_id}
    valid = TriplesFactory.from_path(data / "valid.txt", **maps)
    test = TriplesFactory.from_path(data / "test.txt", **maps)
    model = ComplEx(
        triples_factory=train,
        embedding_dim=args.dim // 2,
        regularizer=None,
        loss=InfoNCELoss(margin=0.0, log_adversarial_temperature=0.0),
        random_seed=0,
    )
    optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=train,
        optimizer=optimizer,
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": args.negatives},
    )
    seconds, losses = [], []
    for epoch in range(1, args.epochs + 1):
        # continue_training trains on from the last epoch up to num_epochs: one epoch a call.
        start = time.perf_counter()
        # It returns every epoch's loss so far.
        losses = loop.train(
            triples_factory=train, num_epochs=epoch, batch_size=args.batch, use_tqdm=False, continue_training=True
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
        "valid_triples": int(valid.num_triples),
    }


def sample(data: Path, work: Path, n: int, m: int, seed: int = 0) -> Path:
    """A folder of train/valid/test text files: ``n`` training triples of ``data`` drawn with
    ``seed`` (all of them when ``n`` is 0), the validation and test triples whose entities and
    relations occur among them (at most ``m`` validation triples, the first ones, when ``m`` is
    not 0). Returns ``data`` itself when neither bounds anything."""
    import random

    if n == 0 and m == 0:
        return data

    def read(name: str) -> list[str]:
        return [line for line in (data / name).read_text().splitlines() if line.strip()]

    train = read("train.txt")
    if n:
        train = random.Random(seed).sample(train, min(n, len(train)))
    entities = {x for line in train for x in line.split("\t")[::2]}
    relations = {line.split("\t")[1] for line in train}

    def known(line: str) -> bool:
        h, r, t = line.split("\t")
        return h in entities and t in entities and r in relations

    valid = [line for line in read("valid.txt") if known(line)]
    test = [line for line in read("test.txt") if known(line)]
    out = work / f"data-n{n}-m{m}"
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in [("train.txt", train), ("valid.txt", valid[: m or None]), ("test.txt", test)]:
        (out / name).write_text("".join(f"{line}\n" for line in rows))
    return out


def strata_side(args, work: Path) -> dict:
    from bench_embed import convert, train

    store = convert(Path(args.data), work / "fb.strata", "--relations")
    recipe = ["--model", "complex", "--dim", str(args.dim), "--chunk-size", str(args.batch)]
    recipe += ["--negatives", str(args.negatives), "--loss", "softmax", "--optimizer", "adagrad"]
    recipe += ["--lr", str(args.lr), "--epochs", str(args.epochs), "--eval-every", "1", "--partitions", "1"]
    recipe += ["--threads", str(args.threads), "--memory", "4G", "-q"]
    meta = train(store, work / "strata-run", recipe)
    hist = meta["history"]
    return {
        "epoch_seconds": [h["seconds"] for h in hist],
        "loss": [h["loss"] for h in hist],
        "valid_mrr": hist[-1]["valid"]["mrr"],
        "valid_hits_at_10": hist[-1]["valid"]["hits@10"],
        "eval_seconds": hist[-1]["valid"]["seconds"],
    }


def pykeen_side(args) -> dict:
    cmd = [args.pykeen_python, __file__, "--pykeen-worker", "--data", args.data, "--epochs", str(args.epochs)]
    cmd += ["--negatives", str(args.negatives), "--dim", str(args.dim), "--batch", str(args.batch)]
    cmd += ["--lr", str(args.lr), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"PyKEEN's side failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sampled(args) -> str:
    """The sampling options of the command line, as given."""
    out = f" --train-triples {args.train_triples}" if args.train_triples else ""
    return out + (f" --valid-triples {args.valid_triples}" if args.valid_triples else "")


def trained_on(args, result: dict) -> str:
    """What the sides trained and validated on, for the report."""
    if not (args.train_triples or args.valid_triples):
        return " (the whole splits)"
    return (
        f"; both sides trained on the same {result['triples']['train']:,} sampled training triples and "
        f"validated on the same {result['triples']['valid']:,} validation triples, ranked against the "
        f"{result['triples']['entities']:,} entities of the sample"
    )


def report(args, result: dict) -> str:
    from common import median

    batches = -(-result["triples"]["train"] // args.batch)

    def row(name: str, side: dict) -> str:
        per_epoch = median(side["epoch_seconds"])
        return (
            f"| {name} | {per_epoch:.1f} | {per_epoch / batches:.3f} | {side['valid_mrr']:.4f} | "
            f"{side['valid_hits_at_10']:.4f} | {side['eval_seconds']:.1f} |"
        )

    m, load = result["machine"], result["load"]
    s, p = result["strata"], result["pykeen"]
    return "\n".join(
        [
            "### PyKEEN side by side: ComplEx on FB15k-237 at equal epochs (`benches/bench_embed_pykeen.py`)",
            "",
            f"`python benches/bench_embed_pykeen.py --pykeen-python PY --epochs {args.epochs} --negatives "
            f"{args.negatives} --dim {args.dim} --batch {args.batch} --lr {args.lr} --threads {args.threads}"
            f"{sampled(args)}` "
            f"(PyKEEN {result['pykeen_version']}, torch {result['torch_version']}). {m['nproc']} cores ({m['cpu']}), "
            f"both sides one after the other in one run on {args.threads} threads, 1-minute load average "
            f"{load[0]:.1f} before and {load[1]:.1f} after (the machine is shared: the seconds compare only "
            f"roughly). The recipe on both sides: ComplEx with {args.dim} reals, {args.negatives} negatives per "
            f"positive under the cross-entropy of the positive among them, batches of {args.batch}, Adagrad lr "
            f"{args.lr}, no regularizer, {args.epochs} epochs; Strata's chunks share their negatives and corrupt "
            "both sides of each positive, PyKEEN's basic sampler draws each positive's own and corrupts one side "
            "per negative. Validation: filtered MRR and Hits@10 of the validation triples after the last "
            f"epoch, both directions{trained_on(args, result)}.",
            "",
            f"| system | s per epoch (median, training only) | s per batch ({batches} an epoch) | valid MRR | "
            "valid Hits@10 | validation (s) |",
            "|---|---|---|---|---|---|",
            row("Strata", s),
            row("PyKEEN", p),
            "",
            f"Strata trains an epoch {median(p['epoch_seconds']) / median(s['epoch_seconds']):.1f}x faster at equal "
            f"epochs; validation MRR {s['valid_mrr']:.4f} against {p['valid_mrr']:.4f} after {args.epochs} epochs.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pykeen-python", help="a Python with PyKEEN installed")
    parser.add_argument("--pykeen-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help="FB15k-237 folder (default: shared/datasets/fb15k-237)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--negatives", type=int, default=128)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: bench-data/pykeen)")
    parser.add_argument("--train-triples", type=int, default=0, help="train both on this many sampled triples (0: all)")
    parser.add_argument("--valid-triples", type=int, default=0, help="validate both on this many triples (0: all)")
    args = parser.parse_args()
    if args.pykeen_worker:
        print(json.dumps(pykeen_worker(args)))
        return
    from common import REPO, SHARED, machine, save, update_doc

    if args.pykeen_python is None:
        raise SystemExit("give --pykeen-python, a Python with PyKEEN installed (pip install pykeen)")
    args.data = args.data or str(SHARED / "datasets" / SHARED_FB)
    work = args.work or REPO / "bench-data" / "pykeen"
    work.mkdir(parents=True, exist_ok=True)
    args.data = str(sample(Path(args.data), work, args.train_triples, args.valid_triples))
    versions = subprocess.run(
        [args.pykeen_python, "-c", "import importlib.metadata as m; print(m.version('pykeen'), m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    load = [os.getloadavg()[0]]
    result = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "work"}}
    folder = Path(args.data)
    lines = {n: (folder / f"{n}.txt").read_text().splitlines() for n in ("train", "valid")}
    entities = {x for line in lines["train"] for x in line.split("\t")[::2]}
    result["triples"] = {"train": len(lines["train"]), "valid": len(lines["valid"]), "entities": len(entities)}
    result["strata"] = strata_side(args, work)
    result["pykeen"] = pykeen_side(args)
    load.append(os.getloadavg()[0])
    result.update(load=load, pykeen_version=versions[0], torch_version=versions[1])
    save("embed-pykeen", result)
    markdown = report(args, result)
    update_doc("embed-pykeen", markdown)
    print(markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
