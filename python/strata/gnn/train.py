"""``strata gnn train``: node classification with a reference GNN on batches from the native
data path; validation accuracy per epoch, the best checkpoint kept, test accuracy at the end.

A run directory holds ``metrics.jsonl`` (one line per epoch: loss, accuracy, throughput, hit
rates, stage busy times, the share of the epoch the model waited for data), ``last.pt`` and
``best.pt`` (model state dicts) and ``run.json`` (config, plan, history, test accuracy).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..config import as_dict
from ..config.gnn import GnnTrainConfig
from ..errors import ConfigError
from ..paths import make_dir
from ..store import Store
from ..units import fmt_bytes, fmt_count
from ._torch import require_torch
from .loader import DATA_OPTIONS, GnnData, node_labels, process_bytes

ProgressFn = Callable[..., bool]


def default_run_dir(store: Path, model: str) -> Path:
    return Path(store) / "runs" / f"gnn-{model}"


def _device(torch, name: str):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def evaluate(model, data: GnnData, split: str, device) -> dict:
    """Accuracy of ``model`` on a node split, with the training fanouts (sampled inference)."""
    torch = require_torch()
    model.eval()
    correct = total = 0
    t = time.monotonic()
    with torch.no_grad():
        for b in data.loader(split, shuffle=False, device=str(device)):
            pred = model(b.blocks, b.x.float()).argmax(1)
            correct += int((pred == b.y).sum())
            total += b.num_seeds
    return {"accuracy": correct / max(total, 1), "nodes": total, "seconds": time.monotonic() - t}


def train_epoch(
    model, opt, data: GnnData, nodes, epoch: int, device, progress: ProgressFn | None = None, title: str = "train"
) -> dict:
    """One training epoch; returns its record (loss, accuracy, throughput, data wait, stats)."""
    torch = require_torch()
    f = torch.nn.functional
    model.train()
    loader = data.loader(nodes, shuffle=True, device=str(device), epoch=epoch)
    if progress:
        progress("stage", title, 0, len(nodes))
    loss_sum = correct = seeds = sampled = 0
    wait = 0.0
    t0 = time.monotonic()
    batches = iter(loader)
    while True:
        t = time.monotonic()
        b = next(batches, None)
        wait += time.monotonic() - t
        if b is None:
            break
        opt.zero_grad()
        out = model(b.blocks, b.x.float())
        loss = f.cross_entropy(out, b.y)
        loss.backward()
        opt.step()
        loss_sum += loss.item() * b.num_seeds
        correct += int((out.argmax(1) == b.y).sum())
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
    seconds = time.monotonic() - t0
    stats = loader.stats() or {}
    loader.close()
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
    }


def train(config: GnnTrainConfig | None = None, progress: ProgressFn | None = None, **options) -> dict:
    """Trains a GNN on ``config.store`` (or the keyword options of ``[gnn.train]``); returns
    the run record (also written to ``RUN/run.json``)."""
    torch = require_torch()
    cfg = config if config is not None else GnnTrainConfig(**options)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device = _device(torch, cfg.device)
    settings = as_dict(cfg)
    from .models import GNN

    # The model and optimizer are built before the store is opened, so that the process the
    # memory plan measures as its runtime holds them and torch's runtime they start.
    store = Store(cfg.store)
    features = store.manifest.get("features")
    if features is None:
        raise ConfigError(f"{cfg.store}: the store has no node features; GNN training needs them")
    labels = node_labels(store)
    if labels is None:
        raise ValueError(f"{cfg.store}: the store has no node labels; node classification needs them")
    classes = int(labels.max()) + 1
    model = GNN(cfg.model, features["dim"], cfg.hidden, classes, len(cfg.fanouts), cfg.dropout, cfg.heads)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    training = model.training_costs(optimizer_states=2)
    data = GnnData(
        cfg.store,
        progress,
        device=str(device),
        training=training,
        own_process=True,
        **{k: settings[k] for k in DATA_OPTIONS},
    )
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.store, cfg.model)
    make_dir(run_dir, "--run-dir")
    (run_dir / "metrics.jsonl").write_text("")
    train_nodes = data.nodes("train")
    has_valid = data.store.node_split("valid") is not None
    history, best = [], {"epoch": 0, "accuracy": -1.0}
    for e in range(cfg.epochs):
        rec = {
            "epoch": e + 1,
            **train_epoch(model, opt, data, train_nodes, e, device, progress, f"train epoch {e + 1}/{cfg.epochs}"),
        }
        if progress:
            progress("stage", "eval", 0, 0)
        if has_valid and cfg.eval_every and (e + 1) % cfg.eval_every == 0:
            rec["valid"] = evaluate(model, data, "valid", device)
            if rec["valid"]["accuracy"] > best["accuracy"]:
                best = {"epoch": e + 1, "accuracy": rec["valid"]["accuracy"]}
                torch.save(model.state_dict(), run_dir / "best.pt")
        torch.save(model.state_dict(), run_dir / "last.pt")
        history.append(rec)
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        if progress:
            progress("message", describe_epoch(rec, cfg.epochs))
    if best["epoch"]:
        model.load_state_dict(torch.load(run_dir / "best.pt", weights_only=True))
    else:
        best = {"epoch": cfg.epochs, "accuracy": None}
    test = evaluate(model, data, "test", device) if data.store.node_split("test") is not None else None
    record = {
        "config": settings | {"store": str(cfg.store), "run_dir": str(run_dir)},
        "device": str(device),
        "plan": data.plan,
        "memory_plan": data.memory_plan,
        "resident_peak_bytes": process_bytes("VmHWM"),
        "hot_seconds": data._native.hot_seconds,
        "history": history,
        "best": best,
        "test": test,
    }
    _write_atomic(run_dir / "run.json", json.dumps(record, indent=2, default=str))
    return record


def describe_epoch(rec: dict, epochs: int) -> str:
    """One line per epoch: loss, accuracy, throughput, data wait, reads and hit rates."""
    p = rec["pipeline"]
    tiers = p.get("tiers") or {}
    rows = max(tiers.get("rows", 0), 1)
    line = (
        f"epoch {rec['epoch']}/{epochs}: loss {rec['loss']:.4f}, train acc {rec['train_accuracy']:.4f}, "
        f"{rec['seconds']:.2f} s, {rec['seeds_per_second']:,.0f} seeds/s, "
        f"{rec['sampled_nodes_per_second']:,.0f} sampled nodes/s, "
        f"waited for data {100 * rec['data_wait_fraction']:.1f}%; "
        f"rows: hot {100 * tiers.get('hot_rows', 0) / rows:.1f}%, "
        f"cache {100 * tiers.get('cache_rows', 0) / rows:.1f}%, "
        f"disk {100 * tiers.get('disk_rows', 0) / rows:.1f}% ({fmt_bytes(tiers.get('disk_bytes_read', 0))} read)"
    )
    if rec.get("valid"):
        line += f"; valid acc {rec['valid']['accuracy']:.4f}"
    return line


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
    return "\n".join(lines)
