"""``strata gnn train``: node classification with a reference GNN on batches from the native
data path; validation accuracy per epoch, the best checkpoint kept, test accuracy at the end.

A run directory holds ``metrics.jsonl`` (one line per epoch: loss, accuracy, throughput, hit
rates, stage busy times, the share of the epoch the model waited for data), ``last.pt`` and
``best.pt`` (model state dicts) and ``run.json`` (config, plan, history, test accuracy).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from .. import torchrun
from ..config import as_dict, engine_options, from_call
from ..config.gnn import GnnTrainConfig
from ..errors import BudgetError, ConfigError, DivergedError
from ..paths import make_dir, refuse_foreign_dir
from ..store import Store
from ..units import fmt_bytes, fmt_count
from ._torch import require_torch, torch_device
from .dist import Ranks
from .loader import GnnData, node_labels, process_bytes
from .record import is_gnn_record
from .step import MAX_SHAPES, TrainStep, adam

ProgressFn = Callable[..., bool]
#: Options every rank of a distributed run must share (they shape the model, the samples and
#: the updates); the others (budgets, threads, devices, paths) are each rank's own.
AGREED = (
    "model", "hidden", "heads", "dropout", "lr", "weight_decay", "epochs", "eval_every", "fanouts",
    "batch_size", "seed", "dist_features", "feature_codec", "target_type", "edge_fanouts",
)  # fmt: skip


def default_run_dir(store: Path, model: str) -> Path:
    return Path(store) / "runs" / f"gnn-{model}"


def run_dir_of(cfg: GnnTrainConfig) -> Path:
    """The run directory of ``cfg``: ``run_dir``, else :func:`default_run_dir`."""
    return Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.store, cfg.model)


#: Tensors of the parameters' size that training adds: gradients and Adam's two moments.
ADAM_STATES = 2


def _built_within_budget(build: Callable, cfg: GnnTrainConfig, device):
    """``build()``'s model, built once its parameters, their gradients and Adam's state are
    known to fit where training holds them (``--memory``, or the CUDA device's memory): sized
    first on torch's meta device, which allocates nothing, so a model too large is refused
    naming its size where building it would end in the allocator's error."""
    torch = require_torch()
    with torch.device("meta"):
        probe = build()
    count = sum(p.numel() for p in probe.parameters())
    weights = sum(p.numel() * p.element_size() for p in probe.parameters())
    needs = weights * (2 + ADAM_STATES)
    if device.type == "cuda":
        where, room = f"{device}'s memory", torch.cuda.get_device_properties(device).total_memory
    else:
        where, room = f"memory budget {fmt_bytes(int(cfg.memory))}", int(cfg.memory)
    if needs > room:
        raise BudgetError(
            f"{where} cannot hold the model ({cfg.model}, hidden {cfg.hidden}): {count:,} parameters "
            f"({fmt_bytes(weights)}), {fmt_bytes(needs)} with their gradients and Adam's state; lower --hidden"
        )
    return build()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def evaluate(model, data: GnnData, split: str, device, ranks: Ranks | None = None) -> dict:
    """Accuracy of ``model`` on a node split, with the training fanouts (sampled inference);
    in a distributed run each rank scores its share of the split and the counts are summed."""
    torch = require_torch()
    model.eval()
    correct = total = 0
    t = time.monotonic()
    nodes = split if ranks is None else ranks.share(data.nodes(split), 0, 0, shuffle=False, pad=False)
    with torch.no_grad(), contextlib.closing(data.loader(nodes, shuffle=False, device=str(device))) as loader:
        for b in loader:
            pred = model(b.blocks, b.x.float()).argmax(1)
            correct = correct + (pred == b.y).sum()  # read once, after the last batch
            total += b.num_seeds
    correct = int(correct)
    if ranks is not None:
        correct, total = (int(v) for v in ranks.sum([correct, total], f"the {split} accuracy"))
    return {"accuracy": correct / max(total, 1), "nodes": total, "seconds": time.monotonic() - t}


def train_epoch(
    step: TrainStep,
    data: GnnData,
    nodes,
    epoch: int,
    device,
    progress: ProgressFn | None = None,
    title: str = "train",
    ranks: Ranks | None = None,
) -> dict:
    """One training epoch of ``step`` (its model and optimizer); returns its record (loss,
    accuracy, throughput, data wait, stats). In a distributed run ``nodes`` are split across the
    ``ranks`` and the record is the group's (see :func:`_group_record`)."""
    step.net.train()
    if ranks is None:
        loader = data.loader(nodes, shuffle=True, device=str(device), epoch=epoch)
    else:
        share = ranks.share(nodes, epoch, data.config["seed"])
        loader = data.loader(share, shuffle=False, device=str(device), epoch=epoch)
    if progress:
        progress("stage", title, 0, len(nodes) if ranks is None else len(share))
    seeds = sampled = 0
    wait = 0.0
    remote_before = data.split.stats() if data.split is not None else None
    t0 = time.monotonic()
    batches = iter(loader)
    while True:
        t = time.monotonic()
        b = next(batches, None)
        wait += time.monotonic() - t
        if b is None:
            break
        # The step sums the loss and correct predictions where the model runs, read once after
        # the epoch: a read per batch would hold the host until each step is done.
        step(b)
        seeds += b.num_seeds
        sampled += len(b.nodes)
        if progress:
            elapsed = max(time.monotonic() - t0, 1e-9)
            stats = loader.stats() or {}
            tiers = stats.get("tiers") or {}
            rows = max(tiers.get("rows", 0), 1)
            progress(
                "detail",
                f"{(b.index + 1) / elapsed:.1f} batches/s  {fmt_count(sampled / elapsed)} nodes/s  "
                f"read {tiers.get('disk_bytes_read', 0) / elapsed / 1e6:.0f} MB/s  "
                f"hot {100 * tiers.get('hot_rows', 0) / rows:.0f}% "
                f"cache {100 * tiers.get('cache_rows', 0) / rows:.0f}%",
            )
            progress("update", seeds, 0)
    loss_sum, correct = step.take_totals()
    seconds = time.monotonic() - t0
    stats = loader.stats() or {}
    loader.close()
    if ranks is not None:
        remote = None
        if remote_before is not None:
            remote = {k: v - remote_before[k] for k, v in data.split.stats().items()}
        return _group_record(ranks, loss_sum, correct, seeds, sampled, seconds, wait, stats, remote)
    return {
        "loss": loss_sum / max(seeds, 1),
        "train_accuracy": correct / max(seeds, 1),
        "seconds": seconds,
        "batches": stats.get("batches", 0),
        "seeds_per_second": seeds / max(seconds, 1e-9),
        "sampled_nodes_per_second": sampled / max(seconds, 1e-9),
        "data_wait_seconds": wait,
        "data_wait_fraction": wait / max(seconds, 1e-9),
        "pipeline": stats,
        "step": step.take_counts(),
    }


def _group_record(
    ranks: Ranks,
    loss_sum: float,
    correct: int,
    seeds: int,
    sampled: int,
    seconds: float,
    wait: float,
    stats: dict,
    remote: dict | None = None,
) -> dict:
    """A distributed epoch's record: loss and accuracy over every rank's seeds; ``seconds``
    the slowest rank's, throughput the group's seeds over it; ``data_wait_*`` the mean over
    the ranks; ``pipeline`` this rank's loader; ``ranks`` each rank's seeds, batches, seconds,
    seeds/s and data wait, and with split features ``remote``, the rows it fetched from other
    ranks (requests, rows, bytes, seconds waited)."""
    mine = {
        "rank": ranks.rank,
        "seeds": seeds,
        "batches": stats.get("batches", 0),
        "seconds": seconds,
        "seeds_per_second": seeds / max(seconds, 1e-9),
        "data_wait_seconds": wait,
        "data_wait_fraction": wait / max(seconds, 1e-9),
    }
    if remote is not None:
        mine["remote"] = remote
    per_rank = ranks.gather(mine, "the epoch's figures")
    loss_sum, correct, seeds, sampled = ranks.sum([loss_sum, correct, seeds, sampled], "the epoch's loss and counts")
    slowest = max(max(r["seconds"] for r in per_rank), 1e-9)
    return {
        "loss": loss_sum / max(seeds, 1),
        "train_accuracy": correct / max(seeds, 1),
        "seconds": slowest,
        "batches": mine["batches"],
        "seeds_per_second": seeds / slowest,
        "sampled_nodes_per_second": sampled / slowest,
        "data_wait_seconds": sum(r["data_wait_seconds"] for r in per_rank) / len(per_rank),
        "data_wait_fraction": sum(r["data_wait_fraction"] for r in per_rank) / len(per_rank),
        "pipeline": stats,
        "ranks": per_rank,
    }


def train(config: GnnTrainConfig | None = None, progress: ProgressFn | None = None, **options) -> dict:
    """Trains a GNN on ``config.store`` (or the keyword options of ``[gnn.train]``); returns
    the run record (also written to ``RUN/run.json``).

    Under torchrun (``WORLD_SIZE`` > 1) every rank trains the model in DistributedDataParallel
    on its share of each epoch's seeds (:mod:`strata.gnn.dist`); accuracies are the group's and
    rank 0 alone writes the run directory. Launched by torchrun, each epoch also leaves
    ``resume.pt`` (model, optimizer, history), from which a group that torchrun restarts goes
    on after the last completed epoch."""
    torch = require_torch()
    cfg = from_call(GnnTrainConfig, config, options)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    env = torchrun.environment()
    torch.manual_seed(cfg.seed)
    device = torch_device(cfg.device, env)
    settings = as_dict(cfg)
    from .models import GNN, LAYERS

    # The model, the process group and the optimizer are built before the store is opened, so
    # that the process the memory plan measures as its runtime holds them and torch's runtime
    # they start.
    store = Store(cfg.store)
    refuse_foreign_dir(run_dir_of(cfg), "--run-dir", is_gnn_record)
    if store.is_typed:
        model, open_data = _typed(cfg, store, env, device, progress)
    else:
        if LAYERS[cfg.model].typed:
            raise ConfigError(
                f"gnn.train.model: {cfg.model} needs a typed store (node and edge types, format 2); "
                f"{cfg.store} has no edge types"
            )
        if cfg.target_type is not None or cfg.edge_fanouts is not None:
            given = "target_type" if cfg.target_type is not None else "edge_fanouts"
            raise ConfigError(f"gnn.train.{given}: for typed stores; {cfg.store} has no node types")
        features = store.manifest.get("features")
        if features is None:
            raise ConfigError(f"{cfg.store}: the store has no node features; GNN training needs them")
        labels = node_labels(store)
        if labels is None:
            raise ConfigError(
                f"{cfg.store}: the store has no node labels; node classification needs them (convert with --labels)"
            )
        classes = int(labels.max()) + 1
        model = _built_within_budget(
            lambda: GNN(cfg.model, features["dim"], cfg.hidden, classes, len(cfg.fanouts), cfg.dropout, cfg.heads),
            cfg,
            device,
        )
        open_data = None
    model = model.to(device)
    # Hashed before joining, so that a store without a kept digest costs no collective's timeout.
    digest = None if env is None else torchrun.data_digest(cfg.store)
    ranks = None if env is None else Ranks(env, device, cfg.dist_timeout)
    completed = False
    try:
        if ranks is not None:
            agreed = {k: settings[k] for k in AGREED if k in settings}
            torchrun.same_data(ranks.rank, ranks.timeout, ranks.address, cfg.store, digest, agreed)
        record = _train(cfg, settings, model, device, ranks, progress, open_data)
        completed = True
        return record
    finally:
        if ranks is not None:
            ranks.close(completed)


def _typed(cfg: GnnTrainConfig, store: Store, env, device, progress):
    """The typed model of a typed store and the function that opens its data
    (:mod:`strata.gnn.typed`); checks the typed options, errors naming them."""
    from .models import LAYERS, TypedGNN
    from .typed import TypedGnnData, fanout_dict, target_type

    if not LAYERS[cfg.model].typed:
        typed = " or ".join(k for k, v in LAYERS.items() if v.typed)
        raise ConfigError(f"gnn.train.model: {cfg.store} is a typed store (node and edge types); it trains {typed}")
    if env is not None:
        raise ConfigError(f"{cfg.store}: a typed store trains in one process, not under torchrun")
    if cfg.data_path == "device":
        raise ConfigError(
            f"gnn.train.data_path: {cfg.store} is a typed store, which the native data path serves; use auto or native"
        )
    if cfg.feature_codec != "f32":
        raise ConfigError(
            f"gnn.train.feature_codec: {cfg.store} is a typed store, whose batches read every row from its files "
            "(no hot set or cache to hold rows encoded); use f32"
        )
    target = target_type(store, cfg.target_type)
    fanouts = fanout_dict(store, list(cfg.fanouts), cfg.edge_fanouts)
    names = store.node_types
    dims = [(store.node_type_info(t).get("features") or {}).get("dim") for t in range(len(names))]
    classes = store.node_type_info(target)["labels"]["num_classes"]
    edge_types = [(names.index(s), names.index(d)) for s, _, d in store.edge_types]
    model = _built_within_budget(
        lambda: TypedGNN(cfg.model, dims, cfg.hidden, classes, len(cfg.fanouts), cfg.dropout, edge_types), cfg, device
    )

    def open_data() -> TypedGnnData:
        return TypedGnnData(
            cfg.store,
            target,
            fanouts,
            batch_size=cfg.batch_size,
            memory=int(cfg.memory),
            seed=cfg.seed,
            threads=cfg.sampler_threads,
            device=str(device),
            training=model.training_costs(optimizer_states=ADAM_STATES),
            progress=progress,
        )

    return model, open_data


def _train(
    cfg: GnnTrainConfig, settings: dict, model, device, ranks: Ranks | None, progress, open_data: Callable | None
) -> dict:
    """The training loop; ``open_data()`` opens a typed store's data (None: the native data
    path, :class:`GnnData`)."""
    torch = require_torch()
    leader = ranks is None or ranks.rank == 0
    net = model
    if ranks is not None:
        net = ranks.wrap(model)
        # The parameters are rank 0's (DDP broadcasts them); dropout's draws differ by rank.
        torch.manual_seed(cfg.seed + ranks.rank)
        if not leader:
            progress = None
    mode = step_mode(cfg, device, ranks, typed=open_data is not None)
    opt = adam(model.parameters(), device, mode, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step = TrainStep(net, opt, device, mode)
    if progress and mode == "graphs":
        how = "each shape's step captured as a CUDA graph" if step.capture else "the padded step op by op (no CUDA)"
        progress("message", f"training step: batches padded to at most {MAX_SHAPES} shapes, {how}")
    split = None
    if ranks is not None and cfg.dist_features == "split":
        ranks.start_rpc()
        split = (ranks.rank, ranks.world_size)
    elif cfg.dist_features == "split" and progress:
        # Not refused: one config file may serve both this run and a torchrun group.
        progress("message", "dist_features = split applies under torchrun; this one process reads every row itself")
    if open_data is None:
        if split is not None and cfg.data_path == "device":
            raise ConfigError(
                "gnn.train.data_path: the device data path does not serve features split across ranks "
                "(dist_features = split); use auto or native"
            )
        data = GnnData(
            cfg.store,
            progress,
            device=str(device),
            training=model.training_costs(optimizer_states=ADAM_STATES),
            own_process=True,
            split=split,
            data_path=cfg.data_path,
            producer=cfg.producer,
            **engine_options(cfg),
        )
    else:
        data = open_data()
    run_dir = run_dir_of(cfg)
    if leader:
        make_dir(run_dir, "--run-dir")
    history, best = [], {"epoch": 0, "accuracy": -1.0}
    elastic = "TORCHELASTIC_RESTART_COUNT" in os.environ
    if torchrun.attempt() > 0:
        state = _shared(ranks, lambda: _load(torch, run_dir / RESUME), "the checkpoint to resume from")
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            history, best = state["history"], state["best"]
            if progress:
                progress("message", f"resuming {run_dir} after epoch {len(history)} (torchrun restart)")
    resumed = len(history)
    if leader:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in history))
    train_nodes = data.nodes("train")
    has_valid = data.has_split("valid")
    for e in range(len(history), cfg.epochs):
        title = f"train epoch {e + 1}/{cfg.epochs}"
        rec = {"epoch": e + 1, **train_epoch(step, data, train_nodes, e, device, progress, title, ranks)}
        if not math.isfinite(rec["loss"]):
            # Every rank holds the group's loss, so the group stops together.
            raise DivergedError(
                f"epoch {e + 1}: the loss is {rec['loss']}: the training diverged at learning rate {cfg.lr}; "
                f"nothing of this epoch is saved ({_kept(e, best)}); lower --lr"
            )
        if progress:
            progress("stage", "eval", 0, 0)
        if has_valid and cfg.eval_every and (e + 1) % cfg.eval_every == 0:
            rec["valid"] = evaluate(model, data, "valid", device, ranks)
            if rec["valid"]["accuracy"] > best["accuracy"]:
                best = {"epoch": e + 1, "accuracy": rec["valid"]["accuracy"]}
                if leader:
                    torch.save(model.state_dict(), run_dir / "best.pt")
        history.append(rec)
        if leader:
            torch.save(model.state_dict(), run_dir / "last.pt")
            if elastic:
                # Before the epoch's metrics line: metrics.jsonl never lists an epoch the
                # checkpoint lacks (a resume rewrites it from the checkpoint's history).
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "history": history, "best": best}
                torch.save(state, run_dir / (RESUME + ".tmp"))
                os.replace(run_dir / (RESUME + ".tmp"), run_dir / RESUME)
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
        if progress:
            progress("message", describe_epoch(rec, cfg.epochs))
    if best["epoch"]:
        state = _shared(ranks, lambda: torch.load(run_dir / "best.pt", weights_only=True), "the best parameters")
        model.load_state_dict(state)
    else:
        best = {"epoch": cfg.epochs, "accuracy": None}
    test = evaluate(model, data, "test", device, ranks) if data.has_split("test") else None
    peak = process_bytes("VmHWM")
    record = {
        "config": settings | {"store": str(cfg.store), "run_dir": str(run_dir)},
        "device": str(device),
        "world_size": 1 if ranks is None else ranks.world_size,
        "dist_features": "split" if data.split is not None else "replicated",
        # Which data path sampled and served the batches and why (typed stores: the native
        # one), and how rows no memory tier held were read.
        "data_path": getattr(data, "data_path", "native"),
        "data_path_note": getattr(data, "data_path_note", "typed stores are served by the native data path"),
        "feature_reads": getattr(data, "feature_reads", {"path": "engine", "note": "typed stores read their files"}),
        "train_step": step.describe(),
        "restarts": torchrun.attempt(),
        "resumed_after_epoch": resumed or None,
        "plan": data.plan,
        "memory_plan": data.memory_plan,
        "resident_peak_bytes": peak,
        "hot_seconds": data.hot_seconds,
        "history": history,
        "best": best,
        "test": test,
    }
    if ranks is not None:
        record["ranks"] = _rank_summary(history, ranks.gather(peak, "the resident peaks"))
    if leader:
        _write_atomic(run_dir / "run.json", json.dumps(record, indent=2, default=str))
    return record


def _kept(epoch: int, best: dict) -> str:
    """What the run directory holds when 0-based ``epoch`` fails, its best so far ``best``."""
    if epoch == 0:
        return "the run directory holds no parameters yet"
    kept = f"last.pt holds epoch {epoch}"
    return kept + (f", best.pt epoch {best['epoch']}" if best["epoch"] else "")


def step_mode(cfg: GnnTrainConfig, device, ranks: Ranks | None, typed: bool) -> str:
    """The training step's mode (``TrainStep``) for ``cfg.step``: ``auto`` captures CUDA graphs on
    a CUDA device in one process over an untyped store's batches, and trains eagerly otherwise;
    ``graphs`` where it cannot work is refused by name."""
    if cfg.step == "graphs":
        if ranks is not None:
            raise ConfigError("gnn.train.step: graphs trains in one process; under torchrun use auto or eager")
        if typed:
            raise ConfigError(
                f"gnn.train.step: graphs pads untyped batches; {cfg.store} is a typed store; use auto or eager"
            )
        return "graphs"
    if cfg.step == "auto" and device.type == "cuda" and ranks is None and not typed:
        return "graphs"
    return "eager"


#: The checkpoint a run launched by torchrun leaves after each epoch, to resume from.
RESUME = "resume.pt"


def _load(torch, path: Path):
    """The checkpoint at ``path``, or None when there is none yet."""
    return torch.load(path, weights_only=True) if path.exists() else None


def _shared(ranks: Ranks | None, read: Callable, what: str):
    """``read()`` on rank 0 (which keeps the run directory), sent to the other ranks."""
    if ranks is None:
        return read()
    return ranks.from_rank0(read() if ranks.rank == 0 else None, what)


def _rank_summary(history: list[dict], peaks: list[int | None]) -> list[dict]:
    """Each rank over the whole run: seeds per second of its training time, the share of
    that time it waited for data, and its resident peak in bytes."""
    out = []
    for rank, peak in enumerate(peaks):
        rows = [next(r for r in rec["ranks"] if r["rank"] == rank) for rec in history if "ranks" in rec]
        seconds = max(sum(r["seconds"] for r in rows), 1e-9)
        out.append(
            {
                "rank": rank,
                "seeds_per_second": sum(r["seeds"] for r in rows) / seconds,
                "data_wait_fraction": sum(r["data_wait_seconds"] for r in rows) / seconds,
                "resident_peak_bytes": peak,
            }
        )
    return out


def describe_epoch(rec: dict, epochs: int) -> str:
    """One line per epoch: loss, accuracy, throughput, data wait, reads and hit rates."""
    p = rec["pipeline"]
    tiers = p.get("tiers") or {}
    rows = max(tiers.get("rows", 0), 1)
    line = (
        f"epoch {rec['epoch']}/{epochs}: loss {rec['loss']:.4f}, train acc {rec['train_accuracy']:.4f}, "
        f"{rec['seconds']:.2f} s, {rec['seeds_per_second']:,.0f} seeds/s, "
        f"{rec['sampled_nodes_per_second']:,.0f} sampled nodes/s, "
        f"waited for data {100 * rec['data_wait_fraction']:.1f}%{_model_idle(p)}; "
        f"rows: hot {100 * tiers.get('hot_rows', 0) / rows:.1f}%, "
        f"cache {100 * tiers.get('cache_rows', 0) / rows:.1f}%, "
        f"disk {100 * tiers.get('disk_rows', 0) / rows:.1f}% ({fmt_bytes(tiers.get('disk_bytes_read', 0))} read)"
    )
    step = rec.get("step") or {}
    if step.get("padded") or step.get("replayed"):
        line += f"; steps: {step['replayed']} replayed, {step['padded']} padded, {step['eager']} as sampled"
    if rec.get("valid"):
        line += f"; valid acc {rec['valid']['accuracy']:.4f}"
    return line


def _model_idle(pipeline: dict) -> str:
    """The device data path's own measure of the model's wait, beside the host's: with
    replayed steps the host runs ahead of the device and waits in the loader while the model
    still trains, so the host's wait overstates the model's."""
    idle = pipeline.get("model_idle_share")
    return "" if idle is None else f" (the model idle {100 * idle:.1f}%)"


def format_summary(record: dict) -> str:
    """The paragraph printed after training."""
    h = record["history"]
    secs = sorted(r["seconds"] for r in h)
    lines = [
        f"Run {record['config']['run_dir']}: {record['config']['model']} on {record['config']['store']} "
        f"({record['device']}), {len(h)} epochs, median epoch {secs[len(secs) // 2]:.2f} s."
    ]
    if record["best"]["accuracy"] is not None:
        lines.append(f"  best epoch {record['best']['epoch']}: valid accuracy {record['best']['accuracy']:.4f}")
    if record["test"]:
        lines.append(f"  test accuracy {record['test']['accuracy']:.4f} ({record['test']['nodes']:,} nodes)")
    for r in record.get("ranks", []):
        lines.append(
            f"  rank {r['rank']} of {record['world_size']}: {r['seeds_per_second']:,.0f} seeds/s, "
            f"waited for data {100 * r['data_wait_fraction']:.1f}%"
        )
    return "\n".join(lines)
