"""Question: does incremental training (`strata embed train NEW --init-from RUN`) reach the
from-scratch quality in fewer epochs on a graph that grew?

    python benches/bench_embed_incremental.py [--epochs 6] [--base-epochs 6] [--incr-epochs 6]
        [--incr-lr 0.1,0.05] [--seed 0]

FB15k-237 with the B1 settings of bench_embed.py (ComplEx, 100 reals, 1000 negatives, Adagrad
lr 0.1, one partition), validation every epoch, fewer epochs than B1's 10 (the machine is
shared). The runs, in one go:

- scratch: all training edges, from a random start;
- base: 90% of the training edges (a fixed-seed sample written as a TSV beside the data), the
  same validation and test files; entities of the other 10% that are in no kept edge and in no
  validation or test edge only get names in the full store;
- incremental: all training edges, started from the base run's best checkpoint with --init-from
  (known entities and relations matched by name keep their rows and Adagrad state), once per
  --incr-lr value: B1's learning rate, and a lower one as usual when fine-tuning.

The figure is the filtered validation MRR per epoch of scratch and each incremental run, the
epoch each first reaches scratch's best, and their test MRR. Results go to bench-results/embed-incremental.json,
a plot to docs/images/embed-incremental.png and the embed-incremental section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from bench_embed import B1, convert, train
from common import REPO, SHARED, machine, median, save, update_doc
from strata.plot import integer_axis, pyplot
from strata.plot import save as save_png

PLOT = REPO / "docs" / "images" / "embed-incremental.png"


def with_epochs(epochs: int) -> list[str]:
    """The B1 settings with another epoch count, validating every epoch."""
    args = list(B1)
    args[args.index("--epochs") + 1] = str(epochs)
    return [*args, "--eval-every", "1", "--partitions", "1", "--memory", "4G"]


def sample_dataset(src: Path, dst: Path, fraction: float, seed: int) -> tuple[int, int]:
    """Writes ``dst`` as ``src`` with a ``fraction`` of its train lines (a seeded sample, in
    their original order) and the same valid and test files; returns (kept, all) lines."""
    lines = (src / "train.txt").read_text().splitlines(keepends=True)
    keep = sorted(random.Random(seed).sample(range(len(lines)), round(fraction * len(lines))))
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "train.txt").write_text("".join(lines[i] for i in keep))
    for split in ("valid.txt", "test.txt"):
        shutil.copyfile(src / split, dst / split)
    return len(keep), len(lines)


def curve(meta: dict) -> list[float]:
    """Validation MRR after each epoch."""
    return [h["valid"]["mrr"] for h in meta["history"]]


def first_reaching(mrrs: list[float], target: float) -> int | None:
    """The first epoch (1-based) whose MRR is at least ``target``."""
    return next((i + 1 for i, m in enumerate(mrrs) if m >= target), None)


def run(args) -> dict:
    data = SHARED / "datasets" / "fb15k-237"
    sample = args.work / f"fb15k-237-90-seed{args.seed}"
    kept, total = sample_dataset(data, sample, 0.9, args.seed)
    full = convert(data, args.work / "fb15k-237.strata", "--relations")
    part = convert(sample, args.work / f"fb15k-237-90-seed{args.seed}.strata", "--relations")
    runs = {"base": train(part, args.work / "run-base", with_epochs(args.base_epochs))}
    runs["scratch"] = train(full, args.work / "run-scratch", with_epochs(args.epochs))
    for lr in args.incr_lr:
        origin = ["--init-from", args.work / "run-base", "--lr", str(lr)]
        runs[f"incremental-lr{lr}"] = train(
            full, args.work / f"run-incremental-lr{lr}", [*with_epochs(args.incr_epochs), *origin]
        )
    best = max(curve(runs["scratch"]))
    for name, meta in runs.items():
        print(f"{name}: valid MRR per epoch {[round(m, 4) for m in curve(meta)]}, test {meta['test']['mrr']:.4f}")
    return {
        "seed": args.seed,
        "base_epochs": args.base_epochs,
        "incr_lr": args.incr_lr,
        "train_edges": {"base": kept, "full": total},
        "nodes": {"base": runs["base"]["num_nodes"], "full": runs["scratch"]["num_nodes"]},
        "curves": {k: curve(m) for k, m in runs.items()},
        "best_epoch": {k: m["best"]["epoch"] for k, m in runs.items()},
        "test_mrr": {k: m["test"]["mrr"] for k, m in runs.items()},
        "epoch_seconds": {k: median([h["seconds"] for h in m["history"]]) for k, m in runs.items()},
        "scratch_best": best,
        "reach": {k: first_reaching(curve(m), best) for k, m in runs.items() if k != "base"},
    }


def plot(res: dict) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = [("scratch", "from scratch (all edges), lr 0.1")] + [
        (f"incremental-lr{lr}", f"--init-from the 90% run, lr {lr}") for lr in res["incr_lr"]
    ]
    for key, label in keys:
        ys = res["curves"][key]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=label)
    ax.axhline(res["scratch_best"], color="grey", linestyle=":", label="best from scratch")
    integer_axis(ax, "epoch on all training edges")
    ax.set_ylabel("filtered validation MRR")
    ax.set_title("FB15k-237: incremental vs from-scratch training")
    ax.legend()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    return save_png(fig, PLOT)


def markdown(res: dict, info: dict) -> str:
    c = res["curves"]
    incr = [f"incremental-lr{lr}" for lr in res["incr_lr"]]
    n = max(len(c[k]) for k in ["scratch", *incr])
    cell = lambda ys, i: f"{ys[i]:.4f}" if i < len(ys) else ""  # noqa: E731
    reach = res["reach"]
    reached = "; ".join(
        f"with lr {lr} " + (f"at epoch {reach[k]}" if reach[k] else "in none of its epochs")
        for lr, k in zip(res["incr_lr"], incr, strict=True)
    )
    lines = [
        "### Incremental training on FB15k-237 (`benches/bench_embed_incremental.py`)",
        "",
        f"{info['nproc']} cores ({info['cpu']}), shared with other engineers' builds while it ran (epoch times are "
        "not comparable with B1's). The B1 settings (ComplEx, 100 reals, 1000 negatives, softmax, Adagrad lr 0.1, "
        "one partition) with fewer epochs than B1's 10, validation every epoch. The base run trains "
        f"{res['base_epochs']} epochs on {res['train_edges']['base']:,} of the {res['train_edges']['full']:,} "
        f"training edges (90%, sampled with seed {res['seed']}; {res['nodes']['base']:,} of "
        f"{res['nodes']['full']:,} entities). Each incremental run continues from its best checkpoint (epoch "
        f"{res['best_epoch']['base']}) on all edges with `--init-from` (entities and relations matched by name, rows "
        "and Adagrad state carried), at B1's learning rate or a lower one; the scratch run trains all edges from a "
        "random start. Filtered validation MRR after each epoch on all edges:",
        "",
        "| epoch | from scratch (lr 0.1) | " + " | ".join(f"incremental (lr {lr})" for lr in res["incr_lr"]) + " |",
        "|---|---|" + "---|" * len(incr),
        *(f"| {i + 1} | {cell(c['scratch'], i)} | " + " | ".join(cell(c[k], i) for k in incr) + " |" for i in range(n)),
        "",
        f"Best from scratch: {res['scratch_best']:.4f} (epoch {reach['scratch']}); the incremental run reaches it "
        f"{reached}. Test MRR (best validation epoch): scratch {res['test_mrr']['scratch']:.4f}, "
        + ", ".join(f"incremental lr {lr} {res['test_mrr'][k]:.4f}" for lr, k in zip(res["incr_lr"], incr, strict=True))
        + f"; the base run on 90% of the edges {res['test_mrr']['base']:.4f} (validation "
        + ", ".join(f"{m:.4f}" for m in c["base"])
        + "). Median epoch: "
        + ", ".join(f"{k} {res['epoch_seconds'][k]:.1f} s" for k in ["scratch", *incr])
        + ".",
        "",
        "Epochs each incremental run needs to reach the from-scratch MRR after k epochs: "
        + "; ".join(
            f"k = {i + 1} ({m:.4f}): "
            + ", ".join(
                f"lr {lr}: {first_reaching(c[k], m) or 'not reached'}"
                for lr, k in zip(res["incr_lr"], incr, strict=True)
            )
            for i, m in enumerate(c["scratch"])
        )
        + ".",
        "",
        "![validation MRR per epoch, from scratch and incremental](images/embed-incremental.png)",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6, help="epochs of the from-scratch run")
    ap.add_argument("--base-epochs", type=int, default=6, help="epochs of the run on 90%% of the edges")
    ap.add_argument("--incr-epochs", type=int, default=6, help="epochs of each incremental run")
    ap.add_argument(
        "--incr-lr",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[0.1, 0.05],
        help="learning rates of the incremental runs (comma-separated)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the 90% sample")
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "embed-incremental")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    info = machine()
    res = run(args)
    plot(res)
    save("embed-incremental", {"machine": info, **res})
    update_doc("embed-incremental", markdown(res, info))
    print(markdown(res, info))


if __name__ == "__main__":
    main()
