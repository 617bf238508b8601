"""Question: how far does each shipped recipe (`examples/recipes/*.toml`) get towards the
published figures it follows (LibKGE's; Lacroix et al.'s for ComplEx-N3), at what validation
curve, and in how many training seconds on this machine?

    python benches/bench_recipes.py [--out DIR] [--datasets DIR] [--only NAME,...]
        [--max-epochs N] [--max-seconds S] [--threads N] [--eval-every K] [--memory SIZE]
        [--device DEV [--device-matmul tf32]] [--partitions P --buffer B] [--recipes DIR]
        [--doc FILE | --no-doc]

One resumable command to run the recipe table to its goals, meant to be left running
unattended (and started again after any stop): for each recipe (``--only`` picks some by file
name without ``.toml``), cheapest first, it converts the recipe's dataset once (the recipe's
file name ends in the dataset: ``complex-fb15k237`` trains ``DATASETS/fb15k-237``, a folder of
``train.txt``, ``valid.txt`` and ``test.txt``), trains the recipe in its own run directory
``OUT/runs/NAME`` and evaluates the best checkpoint on the test split (filtered MRR,
Hits@1, Hits@10, both directions).

Started again, it skips the recipes that finished (all their epochs, or stopped early by the
recipe's own early stopping) and resumes the others from their last committed epoch: a run
killed at any moment (the command interrupted, the machine restarted) loses at most the epoch
it was training, as the engine's run directory guarantees. ``--max-epochs N`` trains each
recipe up to N epochs in all (a later call with a larger N goes on from there);
``--max-seconds S`` stops each recipe's training after S wall seconds of this call (the epoch
under way is lost; its best checkpoint is tested as it stands, and the next call resumes it).

Per recipe the JSON ``OUT/recipes.json`` keeps: the validation MRR of every validated epoch
(the curve), epochs, training and validation wall seconds (sums over the run's epochs), the
CPU seconds of the calls that trained it, test metrics, the 1-minute load average at the start
and end of each call's training, and the published figures beside; it is rewritten after
each recipe. Calls may run side by side on one ``--out`` (one recipe per core, ``--only`` apart):
each writes its own recipes' entries under a lock and keeps the others'. The markdown table (every
recipe of the folder, the untrained ones queued) goes into the ``embed-recipes`` section of
docs/benchmarks.md (``--doc`` another file, ``--no-doc`` none).

``--partitions P --buffer B`` trains the recipes out of core (P node partitions on disk, B of
them resident); give such calls their own ``--out``: their table goes into the
``embed-recipes-pP`` section, beside the in-memory one.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import subprocess
import sys
import tomllib
from pathlib import Path

from common import REPO, SHARED, machine, strata, update_doc

#: Dataset folders whose names differ from the recipe files' spelling.
DATASET_FOLDERS = {"fb15k237": "fb15k-237"}

#: The published test filtered MRR each recipe reproduces: LibKGE's (Ruffinelli et al., ICLR 2020;
#: RotatE from LibKGE's model table) and, for ComplEx-N3, Lacroix et al.'s (ICML 2018, the kbc
#: README's table), with Hits@1 / Hits@10 where the recipe cites them, and the goal where one is set.
PUBLISHED = {
    "complex-fb15k237": {"mrr": 0.348, "hits@1": 0.253, "hits@10": 0.536, "goal": 0.345},
    "complex-wn18rr": {"mrr": 0.475, "hits@1": 0.438, "hits@10": 0.547, "goal": 0.47},
    "complex-n3-fb15k237": {"mrr": 0.37, "hits@1": 0.27, "hits@10": 0.56},
    "complex-n3-wn18rr": {"mrr": 0.49, "hits@1": 0.44, "hits@10": 0.58},
    "distmult-fb15k237": {"mrr": 0.343},
    "distmult-wn18rr": {"mrr": 0.452},
    "rotate-fb15k237": {"mrr": 0.333},
    "rotate-wn18rr": {"mrr": 0.478},
    "transe-fb15k237": {"mrr": 0.313},
    "transe-wn18rr": {"mrr": 0.228},
}

#: States after which a recipe has nothing left to train.
DONE = ("finished", "stopped early")


def dataset_of(name: str) -> str:
    """The dataset folder of recipe ``name`` (``MODEL-DATASET``)."""
    key = name.rsplit("-", 1)[-1]
    return DATASET_FOLDERS.get(key, key)


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def epoch_cost(recipe: dict, data: Path) -> float:
    """Multiply-adds of one epoch, roughly: train edges x reals x candidates per query x sides
    (candidates: the shared negatives, every entity for 1vsAll, 0.6 x every entity for KvsAll,
    which asks each distinct query once)."""
    train = recipe.get("training", "negative_sampling")
    edges = count_lines(data / "train.txt")
    if train == "negative_sampling":
        candidates = recipe.get("negatives", 1000)
    else:
        ids = set()
        for line in open(data / "train.txt"):
            h, _, t = line.rstrip("\n").split("\t")
            ids.update((h, t))
        candidates = len(ids) * (0.6 if train == "KvsAll" else 1.0)
    return edges * recipe.get("dim", 100) * candidates * 2


def queue(args) -> tuple[list[tuple[str, Path, dict, Path]], list[str]]:
    """The recipes to run, cheapest total first: (name, file, [embed.train], dataset folder),
    and the table's order: every recipe of the folder, cheapest first, run now or not."""
    files = sorted(args.recipes.glob("*.toml"))
    names = {f.stem for f in files}
    wanted = set(n for n in args.only.split(",") if n) if args.only else names
    unknown = sorted(wanted - names)
    if unknown:
        raise SystemExit(f"--only: no recipe {', '.join(unknown)} in {args.recipes} (have: {', '.join(sorted(names))})")
    items = []
    for name in sorted(names):
        path = args.recipes / f"{name}.toml"
        recipe = tomllib.loads(path.read_text())["embed"]["train"]
        data = args.datasets / dataset_of(name)
        if name in wanted and not (data / "train.txt").is_file():
            raise SystemExit(f"recipe {name}: no dataset at {data} (train.txt, valid.txt, test.txt); give --datasets")
        items.append((name, path, recipe, data))

    def cost(item) -> tuple[float, str]:
        # The recipe's own epochs, so that every call orders the same way whatever it runs;
        # recipes without data go last.
        name, _, recipe, data = item
        if not (data / "train.txt").is_file():
            return float("inf"), name
        return epoch_cost(recipe, data) * recipe.get("epochs", 10), name

    items.sort(key=cost)
    return [it for it in items if it[0] in wanted], [it[0] for it in items]


def store_of(args, data: Path) -> Path:
    """Converts ``data`` once into ``OUT/stores`` (a store is committed by rename, so a killed
    conversion leaves none)."""
    store = args.out / "stores" / f"{data.name}.strata"
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(strata("convert", data, "--out", store, "--relations", "-q"), check=True)
    return store


def read_meta(run: Path) -> dict | None:
    path = run / "run.json"
    return json.loads(path.read_text()) if path.exists() else None


def train(args, store: Path, recipe_file: Path, recipe: dict, run: Path) -> tuple[bool, float]:
    """Trains (or resumes) the recipe in ``run``; returns whether the time limit stopped it and
    the CPU seconds it took."""
    cmd = strata("embed", "train", store, "--config", recipe_file, "--run-dir", run, "-q", "--json-summary")
    if args.max_epochs:
        cmd += ["--epochs", str(min(recipe.get("epochs", 10), args.max_epochs))]
    overrides = (
        ("--threads", args.threads),
        ("--eval-every", args.eval_every),
        ("--memory", args.memory),
        ("--device", args.device),
        ("--device-matmul", args.device_matmul),
        ("--partitions", args.partitions),
        ("--buffer", args.buffer),
        ("--early-stopping-patience", args.early_stopping_patience),
    )
    for flag, value in overrides:
        if value is not None:
            cmd += [flag, str(value)]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=args.max_seconds)
        limited = False
    except subprocess.TimeoutExpired:
        # The run directory commits whole epochs, so a kill loses only the epoch under way.
        proc.kill()
        _, err = proc.communicate()
        limited = True
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not limited and proc.returncode != 0:
        command = " ".join(map(str, cmd))
        raise SystemExit(f"training {recipe_file.stem} failed ({proc.returncode}): {command}\n{err[-3000:]}")
    return limited, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime


def test_metrics(meta: dict, run: Path, fresh: bool) -> dict | None:
    """Test metrics of the best checkpoint: the run's own when its training ended normally
    (``fresh``), else evaluated now; None before any epoch."""
    if not meta["history"]:
        return None
    if fresh and meta.get("test"):
        return meta["test"]
    out = subprocess.run(
        strata("embed", "eval", run, "--split", "test", "--checkpoint", "best", "--json", "-q"),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)["metrics"]


def record(args, name: str, recipe: dict, meta: dict, test: dict | None, status: str, old: dict | None) -> dict:
    """The recipe's entry of recipes.json from its run directory's history (and the device the
    call trained on)."""
    hist = meta["history"]
    curve = [[h["epoch"], h["valid"]["mrr"]] for h in hist if h.get("valid")]
    best = max(curve, key=lambda c: c[1])[0] if curve else None
    keep = lambda k: (old or {}).get(k, [])  # noqa: E731
    return {
        "recipe": name,
        "model": recipe.get("model"),
        "training": recipe.get("training", "negative_sampling"),
        "device": args.device or recipe.get("device", "cpu"),
        "device_matmul": args.device_matmul or recipe.get("device_matmul", "float32"),
        "status": status,
        "epochs": hist[-1]["epoch"] if hist else 0,
        "best_epoch": best,
        "curve": curve,
        "lr_drops": [[h["epoch"], h["lr_dropped_to"]] for h in hist if h.get("lr_dropped_to") is not None],
        "train_seconds": sum(h["seconds"] for h in hist),
        "valid_seconds": sum(h["valid"]["seconds"] for h in hist if h.get("valid")),
        "cpu_seconds": keep("cpu_seconds"),
        "load": keep("load"),
        "test": None if test is None else {k: test[k] for k in ("mrr", "hits@1", "hits@10")},
        "published": PUBLISHED.get(name, {}),
    }


def status_of(meta: dict, recipe: dict, limited: bool) -> str:
    """How the recipe's training stands after a call (see ``DONE``)."""
    hist = meta["history"]
    if limited:
        return "time limit"
    if hist and hist[-1].get("stopped"):
        return "stopped early"
    done = hist[-1]["epoch"] if hist else 0
    return "finished" if done >= recipe.get("epochs", 10) else "epoch cap"


def pending(entry: dict | None, args) -> bool:
    """Whether the recipe has epochs left to train in this call."""
    if entry is None:
        return True
    if entry["status"] in DONE:
        return False
    return not (args.max_epochs and entry["epochs"] >= args.max_epochs)


def save_entry(path: Path, name: str, entry: dict | None, order: list[str]) -> dict:
    """Writes recipe ``name``'s ``entry`` (None: none) into recipes.json and returns the whole
    file. The file is read again under a lock first, so calls running side by side (one recipe
    per core) keep each other's entries."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = json.loads(path.read_text()) if path.exists() else {"recipes": {}}
        result.update(machine=machine(), order=order)
        if entry is not None:
            result["recipes"][name] = entry
        tmp = path.with_suffix(f".json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, path)
    return result


def fmt(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def out_of_core(args) -> str:
    """The partition options of the call, as given (empty in memory)."""
    return f"--partitions {args.partitions} --buffer {args.buffer}" if args.partitions else ""


def markdown(result: dict, partitions: str) -> str:
    m = result["machine"]
    lines = [
        f"### Recipe table{f' out of core (`{partitions}`)' if partitions else ''} (`benches/bench_recipes.py`)",
        "",
        f"{m['nproc']} cores ({m['cpu']}); each recipe as shipped unless the command says otherwise, one "
        "run directory each, resumed across calls. Test: filtered metrics of the best checkpoint, both "
        "directions. Training and validation seconds are wall seconds summed over the epochs; load: the "
        "1-minute load average at the start and end of each call's training. To continue the table: "
        f"`python benches/bench_recipes.py{f' {partitions}' if partitions else ''}` (again after any stop).",
        "",
        "| recipe | training | epochs (best) | status | test MRR | Hits@1 | Hits@10 | published MRR (goal) | "
        "train s | valid s | CPU s | load | validation MRR (epoch: MRR, last 6) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in result["order"]:
        r = result["recipes"].get(name)
        if r is None and partitions:
            continue  # out of core, only the recipes trained so: the in-memory table queues all
        if r is None:
            lines.append(f"| {name} | | | queued | | | | {fmt(PUBLISHED.get(name, {}).get('mrr'), 3)} | | | | | |")
            continue
        t, p = r["test"] or {}, r["published"]
        goal = f" ({p['goal']})" if "goal" in p else ""
        loads = [x for pair in r["load"] for x in pair]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else ""
        curve = ", ".join(f"{e}: {v:.4f}" for e, v in r["curve"][-6:])
        lines.append(
            f"| {name} | {r['training']} | {r['epochs']} ({r['best_epoch'] or '-'}) | {r['status']} | "
            f"{fmt(t.get('mrr'))} | {fmt(t.get('hits@1'))} | {fmt(t.get('hits@10'))} | {fmt(p.get('mrr'), 3)}{goal} | "
            f"{r['train_seconds']:,.0f} | {r['valid_seconds']:,.0f} | {sum(r['cpu_seconds']):,.0f} | {load} | {curve} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench-data" / "recipes", help="stores, runs, recipes.json")
    parser.add_argument("--datasets", type=Path, default=SHARED / "datasets", help="one folder per dataset")
    parser.add_argument("--recipes", type=Path, default=REPO / "examples" / "recipes")
    parser.add_argument("--only", default="", help="recipes by file name without .toml, comma-separated")
    parser.add_argument("--max-epochs", type=int, default=None, help="train each recipe up to this many epochs in all")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop each recipe's training after this long")
    parser.add_argument("--threads", type=int, default=None, help="override the recipes' threads (0: every core)")
    parser.add_argument("--eval-every", type=int, default=None, help="override the recipes' validation interval")
    parser.add_argument("--memory", default=None, help="override the recipes' memory budget")
    parser.add_argument("--device", default=None, help="train on this device (cuda, cuda:N, torch-cpu; default cpu)")
    parser.add_argument("--device-matmul", default=None, help="a torch device's training products: float32 or tf32")
    parser.add_argument("--partitions", type=int, default=None, help="train out of core on this many partitions")
    parser.add_argument("--buffer", type=int, default=None, help="resident partitions (with --partitions)")
    parser.add_argument(
        "--early-stopping-patience", type=int, default=None, help="override the recipes' patience (0: no early stop)"
    )
    parser.add_argument("--doc", type=Path, default=None, help="markdown file to update (default docs/benchmarks.md)")
    parser.add_argument("--no-doc", action="store_true", help="write no markdown")
    args = parser.parse_args()
    for key in ("max_epochs", "threads", "eval_every"):
        value = getattr(args, key)
        if value is not None and value < (0 if key == "threads" else 1):
            raise SystemExit(f"--{key.replace('_', '-')} must be at least {0 if key == 'threads' else 1}, got {value}")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise SystemExit(f"--max-seconds must be positive, got {args.max_seconds}")
    if (args.partitions is None) != (args.buffer is None) or (args.partitions is not None and args.partitions < 2):
        raise SystemExit("--partitions P (at least 2) and --buffer B go together")
    section = f"embed-recipes-p{args.partitions}" if args.partitions else "embed-recipes"
    args.out.mkdir(parents=True, exist_ok=True)
    items, order = queue(args)
    path = args.out / "recipes.json"
    result = save_entry(path, "", None, order)
    for name, recipe_file, recipe, data in items:
        entry = result["recipes"].get(name)
        if not pending(entry, args):
            print(f"{name}: {entry['status']} after {entry['epochs']} epochs, skipped", flush=True)
            continue
        store = store_of(args, data)
        run = args.out / "runs" / name
        load = [os.getloadavg()[0]]
        limited, cpu = train(args, store, recipe_file, recipe, run)
        load.append(os.getloadavg()[0])
        meta = read_meta(run)
        if meta is None:
            print(f"{name}: stopped before its first epoch was committed", flush=True)
            continue
        test = test_metrics(meta, run, fresh=not limited)
        entry = record(args, name, recipe, meta, test, status_of(meta, recipe, limited), entry)
        entry["cpu_seconds"].append(round(cpu, 1))
        entry["load"].append([round(x, 2) for x in load])
        result = save_entry(path, name, entry, order)
        if not args.no_doc:
            update_doc(section, markdown(result, out_of_core(args)), doc=args.doc)
        print(
            f"{name}: {entry['status']}, {entry['epochs']} epochs, test MRR {fmt((test or {}).get('mrr'))}", flush=True
        )
    result = save_entry(path, "", None, order)
    if not args.no_doc:
        update_doc(section, markdown(result, out_of_core(args)), doc=args.doc)
    print(markdown(result, out_of_core(args)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
