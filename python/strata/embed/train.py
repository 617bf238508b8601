"""``strata embed train``: out-of-core embedding training (the work happens in ``strata._native``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .. import _native, torchrun
from ..config import engine_options, from_call
from ..config.embed import EmbedTrainConfig
from ..errors import ConfigError
from ..paths import make_dir, refuse_foreign_dir
from ..store import open_store
from ..units import fmt_bytes, fmt_duration
from . import dist, dist_owner
from .runs import RUN_FORMAT, Run, default_run_dir

#: Trainer options each rank may set for itself (its machine's resources and paths); every
#: other option must be the same on every rank of a distributed run.
RANK_OWN = ("memory", "threads", "device", "device_memory", "init_from", "dist_timeout", "dist_prefetch")


class _TensorBoard:
    """Scalars per epoch into TensorBoard event files in the run directory, when tensorboard
    is installed (it is optional; the metrics are always in metrics.jsonl)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.writer = None
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            self.available = False
            return
        self.available = True
        self.event_pb2, self.summary_pb2, self.writer_class = event_pb2, summary_pb2, EventFileWriter

    def epoch(self, record: dict) -> None:
        if not self.available:
            return
        if self.writer is None:
            # Opened at the first committed epoch: the trainer creates the run directory.
            self.writer = self.writer_class(str(self.run_dir))
        values = {
            "train/loss": record["loss"],
            "train/seconds": record["seconds"],
            "train/edges_per_second": record["edges_per_second"],
            "io/wait_fraction": record["io_wait_fraction"],
            "io/partition_bytes_read": record["partition_bytes_read"],
            "io/partition_bytes_written": record["partition_bytes_written"],
        }
        for key, value in (record.get("valid") or {}).items():
            if isinstance(value, (int, float)) and key not in ("queries", "seconds"):
                values[f"valid/{key}"] = value
        summary = self.summary_pb2.Summary(
            value=[self.summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        )
        self.writer.add_event(self.event_pb2.Event(wall_time=time.time(), step=record["epoch"], summary=summary))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def check_device(native: dict) -> None:
    """Refuses, before the run is touched, a ``device`` the torch backend cannot train
    (torch missing, CUDA absent, a model or table it does not implement)."""
    try:
        from strata.embed.device.backend import check_options
    except ImportError as e:
        raise ConfigError(
            f"device = {native['device']} needs PyTorch, which is not importable ({e}); install it "
            "(pip install 'strata[torch]') or use device = cpu"
        ) from None
    try:
        check_options(native)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def rank_device(device: str, env: torchrun.Environment | None) -> str:
    """The device a rank trains on: under torchrun ``cuda`` is the rank's local GPU
    (``cuda:LOCAL_RANK``, as PyTorch users' ranks take theirs); ``cuda:N`` and ``torch-cpu``
    are kept as given."""
    return f"cuda:{env.local_rank}" if device == "cuda" and env is not None else device


def train(
    config: EmbedTrainConfig | None = None,
    progress: Callable[..., bool] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    **options,
) -> Run:
    """Trains (or resumes) an embedding run and returns it.

    ``train(EmbedTrainConfig(store=...))`` or ``train(store="fb.strata", model="complex", epochs=10,
    memory="2G")``; every option of ``[embed.train]`` is accepted. ``on_epoch(record)`` sees each
    committed epoch (loss, timings, I/O, validation metrics).
    """
    cfg = from_call(EmbedTrainConfig, config, options)
    run_dir = cfg.run_dir if cfg.run_dir is not None else default_run_dir(cfg.store)
    native = engine_options(cfg)
    env = torchrun.environment()
    if native.get("device", "cpu") != "cpu":
        native["device"] = rank_device(native["device"], env)
        check_device(native)
    board = _TensorBoard(run_dir) if cfg.tensorboard else None

    def epoch_done(record: dict) -> None:
        if board is not None:
            board.epoch(record)
        if on_epoch is not None:
            on_epoch(record)

    # Opened (a few stats) before the run directory is made: a mistyped store must not leave a
    # STORE/runs/ behind.
    open_store(cfg.store)
    refuse_foreign_dir(run_dir, "--run-dir", lambda r: isinstance(r, dict) and r.get("format") == RUN_FORMAT)
    make_dir(run_dir.parent, "--run-dir")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file, not a directory")
    # Hashed before joining, so that a store without a kept digest costs no collective's timeout.
    digest = None if env is None else torchrun.data_digest(cfg.store)
    group = dist.from_environment(cfg.dist_timeout, policy=cfg.dist_policy, device=native.get("device", "cpu"))
    owners = None
    if group is not None:
        progress = torchrun.ranked(progress, group.rank)
    # --fresh starts the run over once: a group torchrun restarted resumes what it committed.
    fresh = cfg.fresh and (group is None or group.restart == 0)
    try:
        if group is not None:
            agreed = {k: v for k, v in native.items() if k not in RANK_OWN}
            torchrun.same_data(group.rank, group.timeout, group.address, cfg.store, digest, agreed)
        if group is not None and cfg.dist_storage == "owners":
            owners = dist_owner.Owners(group)
        _native.embed_train(str(cfg.store), str(run_dir), native, fresh, progress, epoch_done, group, owners)
    finally:
        if board is not None:
            board.close()
        if owners is not None:
            owners.close()
        if group is not None:
            group.close()
    # Owner mode: each rank's run is its own directory (docs/distributed.md).
    return Run(run_dir / f"rank-{group.rank}" if owners is not None else run_dir)


def format_metrics(m: dict) -> str:
    """One line of ranking metrics."""
    return (
        f"{m['protocol']} MRR {m['mrr']:.4f}  MR {m['mr']:.1f}  Hits@1 {m['hits@1']:.4f}  "
        f"Hits@3 {m['hits@3']:.4f}  Hits@10 {m['hits@10']:.4f}  ({m['queries']:,} queries)"
    )


def format_summary(run: Run) -> str:
    """The paragraph printed after training."""
    meta = run.meta
    hist = meta["history"]
    c = meta["config"]
    lines = [f"Run {run.path}: {c['model']} dim {c['dim']} on {meta['store']}, {run.epochs} epochs."]
    if hist:
        secs = sorted(h["seconds"] for h in hist)
        median = secs[len(secs) // 2]
        io = sum(h["partition_bytes_read"] + h["edge_bytes_read"] + h["partition_bytes_written"] for h in hist)
        wait = sum(h["io_wait_seconds"] for h in hist) / max(sum(h["seconds"] for h in hist), 1e-9)
        lines.append(
            f"  median epoch {fmt_duration(median)} ({hist[-1]['edges_per_second']:,.0f} edges/s last), "
            f"I/O {fmt_bytes(io)} in all, waiting on I/O {100 * wait:.1f}% of training; "
            f"step {hist[-1]['step_flops_per_thread'] / 1e9:.1f} GFLOP/s per thread vs SGEMM "
            f"{meta['sgemm_flops'] / 1e9:.1f} GFLOP/s on this machine."
        )
    if meta.get("world_size", 1) > 1 and hist and hist[-1].get("ranks"):
        lines.append(f"  distributed over {meta['world_size']} ranks; last epoch:")
        lines.extend(
            f"    rank {r['rank']}: {r['buckets']} buckets, {r['edges_per_second']:,.0f} edges/s, "
            f"{r['partition_loads']} partition loads, {r['relation_rounds']} relation rounds, "
            f"sent {fmt_bytes(r['bytes_sent'])}, received {fmt_bytes(r['bytes_received'])}"
            for r in hist[-1]["ranks"]
        )
    drops = [h["lr_dropped_to"] for h in hist if h.get("lr_dropped_to") is not None]
    if drops:
        lines.append(f"  lr {hist[0]['lr']:.6g} dropped {len(drops)} time(s) on a plateau, to {drops[-1]:.6g}.")
    stopped = (meta.get("schedule") or {}).get("stopped")
    if stopped:
        lines.append(f"  stopped early after epoch {meta['current']['epoch']}: {stopped}.")
    best = meta["best"]["epoch"]
    valid = next((h["valid"] for h in hist if h["epoch"] == best and h.get("valid")), None)
    if valid:
        lines.append(f"  best epoch {best}: valid {format_metrics(valid)}")
    if meta.get("test"):
        lines.append(f"  test: {format_metrics(meta['test'])}")
    return "\n".join(lines)
