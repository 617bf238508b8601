"""Question: at B1's settings on FB15k-237, how fast does PyTorch-BigGraph's own trainer train
against Strata's on the same machine, to what test MRR: on its CPU cores, and on a GPU (PBG's
GPU trainer against `strata embed train --device cuda`)?

    python benches/bench_embed_pbg.py --pbg SRC [--pbg-path DIRS] [--device cpu|cuda]
        [--threads T] [--epochs N] [--dataset DIR] [--work DIR] [--out FILE] [--doc FILE | --no-doc]

SRC is a PyTorch-BigGraph source tree (GitHub main: `git clone
https://github.com/facebookresearch/PyTorch-BigGraph`; PyPI's 1.0.0 fails to read its own
config schema on Python 3.11, and has no GPU trainer). This script runs PBG's side as a
subprocess (`benches/pbg_driver.py`) with SRC, and ``--pbg-path`` (more folders, ``:``
separated), first on ``PYTHONPATH``: PBG imports ``pkg_resources``, which setuptools 81
dropped (`.venv/peers` has an older one). On ``cuda`` PBG's GPU trainer needs its C++ helpers
(``torchbiggraph._C``): when SRC lacks them they are built in place first
(``PBG_INSTALL_CPP=1 setup.py build_ext --inplace``, about a minute).

Both sides train the training split (272,115 triples) with B1's settings as PBG spells them:
ComplEx with 100 reals (PBG: operator ``complex_diagonal``, comparator ``dot``, dimension 100),
a relation's reverse direction its own parameters (PBG's dynamic relations, Strata's reciprocal
relations), batches of 1000 edges sharing 1000 uniform negatives (PBG: ``batch_size`` 1000,
``num_uniform_negs`` 1000, ``num_batch_negs`` 0), both sides corrupted, softmax, lr 0.1 and
row-wise Adagrad for the entities (PBG's; Strata's ``adagrad_row``), N epochs on T threads
(PBG: ``workers``, its HOGWILD processes; on ``cuda`` ``num_gpus`` 1). PBG's checkpoint is
imported with `strata embed import-pbg` and both last-epoch checkpoints are ranked by `strata
embed eval` (filtered, both directions, all entities). Epoch seconds are training only: PBG's
log line of each epoch's bucket ("Trained N edges in T s"), Strata's run history; medians.
Results go to bench-results/embed-pbg-DEVICE.json and, on the CPU, the embed-pbg section of
docs/benchmarks.md (a GPU's figures are written there by hand, with the device named).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import SHARED, machine, save, strata, timed, update_doc

#: B1's settings in PBG's terms (the driver adds the paths, entities and relation).
PBG_B1 = {
    "operator": "complex_diagonal",
    "config": {
        "dimension": 100, "comparator": "dot", "global_emb": False, "batch_size": 1000, "num_uniform_negs": 1000,
        "num_batch_negs": 0, "loss_fn": "softmax", "lr": 0.1, "regularization_coef": 0.0, "eval_fraction": 0.0,
    },
}  # fmt: skip
#: The same in Strata's.
STRATA_B1 = [
    "--model", "complex", "--dim", "100", "--chunk-size", "1000", "--negatives", "1000", "--corrupt", "both",
    "--loss", "softmax", "--optimizer", "adagrad_row", "--lr", "0.1",
]  # fmt: skip

#: PBG's log line of a trained bucket.
TRAINED = re.compile(r"Trained (\d+) edges in ([0-9.]+) s")


def epoch_seconds(log: str) -> list[float]:
    """Each epoch's training seconds from PBG's log (one bucket an epoch: one partition)."""
    return [float(m.group(2)) for m in TRAINED.finditer(log)]


def pbg_env(src: Path, extra: str) -> dict:
    paths = [str(src), *filter(None, extra.split(":")), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": ":".join(p for p in paths if p)}


def check_pbg(src: Path, env: dict) -> None:
    """Stops with what to do when SRC is no PBG tree or PBG does not import."""
    if not (src / "torchbiggraph" / "train_gpu.py").exists():
        raise SystemExit(f"--pbg {src}: no torchbiggraph/train_gpu.py there; clone PBG's GitHub main, name its folder")
    probe = subprocess.run(
        [sys.executable, "-c", "import torchbiggraph.train"], env=env, capture_output=True, text=True
    )
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "?"
        hint = " (pip install 'setuptools<81', or name its folder in --pbg-path)" if "pkg_resources" in why else ""
        raise SystemExit(f"PyTorch-BigGraph from {src} does not import: {why}{hint}")


def build_cpp(src: Path, env: dict) -> float:
    """Builds ``torchbiggraph._C`` in ``src`` (PBG's GPU trainer needs it); returns seconds."""
    if list((src / "torchbiggraph").glob("_C*.so")):
        return 0.0
    cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
    took = timed(cmd, env={**env, "PBG_INSTALL_CPP": "1"}, cwd=src)
    return took["seconds"]


def run_pbg(args, work: Path, env: dict) -> dict:
    settings = {
        "work": str(work), "dataset": str(args.dataset), "operator": PBG_B1["operator"],
        "config": {**PBG_B1["config"], "num_epochs": args.epochs, "workers": args.threads,
                   **({"num_gpus": 1} if args.device == "cuda" else {})},
    }  # fmt: skip
    (work / "settings.json").write_text(json.dumps(settings))
    driver = Path(__file__).with_name("pbg_driver.py")
    took = timed([sys.executable, str(driver), str(work / "settings.json")], env=env)
    seconds = epoch_seconds(took["stdout"] + took["stderr"])
    if len(seconds) != args.epochs:
        raise SystemExit(f"PBG's log shows {len(seconds)} trained epochs, expected {args.epochs}")
    run = work / "run"
    timed(strata("embed", "import-pbg", work / "model", "--store", args.store, "--out", run, "--overwrite", "-q"))
    return summary(seconds, took["seconds"], run, args)


def run_strata(args, work: Path) -> dict:
    run = work / "run"
    cmd = strata(
        "embed", "train", args.store, "--run-dir", run, "--fresh", "--json-summary", *STRATA_B1,
        "--epochs", args.epochs, "--eval-every", 0, "--threads", args.threads, "--device", args.device,
    )  # fmt: skip
    took = timed(cmd)
    history = json.loads(took["stdout"])["history"]
    return summary([e["seconds"] for e in history], took["seconds"], run, args)


def summary(seconds: list[float], wall: float, run: Path, args) -> dict:
    """Epoch seconds and the last checkpoint's test metrics (`strata embed eval`)."""
    cmd = strata("embed", "eval", run, "--split", "test", "--checkpoint", "last", "--json", "-q")
    metrics = json.loads(timed(cmd)["stdout"])["metrics"]
    return {
        "epoch_seconds": statistics.median(seconds),
        "epochs": seconds,
        "wall_seconds": wall,
        "edges_per_second": args.train_edges / statistics.median(seconds),
        "test": {k: metrics[k] for k in ("mrr", "hits@1", "hits@10")},
    }


def markdown(result: dict) -> str:
    pbg, ours = result["pbg"], result["strata"]
    cfg = result["settings"]
    lines = [
        f"### PyTorch-BigGraph side by side: B1 on FB15k-237, {cfg['device']} (`benches/bench_embed_pbg.py`)",
        "",
        f"{result['machine']['nproc']} cores ({result['machine']['cpu']}), the two sides one after the other, "
        f"each on {cfg['threads']} thread(s) (PBG: {cfg['threads']} HOGWILD worker(s)), {cfg['epochs']} epochs; "
        "PBG from its GitHub main; test filtered MRR of each last-epoch checkpoint, ranked by `strata embed eval` "
        "(PBG's imported with `strata embed import-pbg`). Epoch seconds: training only, medians.",
        "",
        "| trainer | epoch (s) | edges/s | test MRR | Hits@1 | Hits@10 | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in (("PyTorch-BigGraph", pbg), ("Strata", ours)):
        t = r["test"]
        lines.append(
            f"| {name} | {r['epoch_seconds']:.2f} | {r['edges_per_second']:,.0f} | {t['mrr']:.4f} | "
            f"{t['hits@1']:.4f} | {t['hits@10']:.4f} | {r['wall_seconds']:.1f} |"
        )
    lines += ["", f"Strata's epoch is {pbg['epoch_seconds'] / ours['epoch_seconds']:.2f}x as fast as PBG's."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pbg", type=Path, required=True, help="PyTorch-BigGraph source tree (GitHub main)")
    ap.add_argument("--pbg-path", default="", help="more folders for PBG's PYTHONPATH, ':' separated")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--dataset", type=Path, default=SHARED / "datasets" / "fb15k-237")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: bench-results/embed-pbg-DEVICE.json)")
    ap.add_argument("--doc", type=Path, default=None, help="markdown file for the CPU's section")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    args.pbg = args.pbg.resolve()
    env = pbg_env(args.pbg, args.pbg_path)
    check_pbg(args.pbg, env)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for side in ("pbg", "strata"):
            (work / side).mkdir(parents=True, exist_ok=True)
        args.store = work / "fb15k-237.strata"
        if not args.store.exists():
            timed(strata("convert", args.dataset, "--out", args.store, "--relations", "-q"))
        args.train_edges = json.loads((args.store / "manifest.json").read_text())["graph"]["num_edges"]["train"]
        built = build_cpp(args.pbg, env) if args.device == "cuda" else 0.0
        result = {
            "machine": machine(),
            "settings": {"device": args.device, "threads": args.threads, "epochs": args.epochs, "pbg": PBG_B1,
                         "strata": STRATA_B1, "pbg_cpp_build_seconds": built},
            "pbg": run_pbg(args, work / "pbg", env),
            "strata": run_strata(args, work / "strata"),
        }  # fmt: skip
    result["strata_over_pbg_epoch_speed"] = result["pbg"]["epoch_seconds"] / result["strata"]["epoch_seconds"]
    path = args.out or save(f"embed-pbg-{args.device}", result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    print(f"results: {path}", file=sys.stderr)
    if args.device == "cpu" and not args.no_doc:
        update_doc("embed-pbg", markdown(result), args.doc)


if __name__ == "__main__":
    main()
