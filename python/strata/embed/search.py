"""``strata embed search``: hyperparameter search over ``[embed.train]`` with Optuna.

A search space file holds the options every trial shares (``[embed.train]``) and the space
(``[space]``), one entry per option: a choice (``{choices = [...]}``) or a range
(``{low = ..., high = ..., log = true, step = ...}``; an integer option takes an integer
range). Each trial is an ordinary training run (``RUN/trial-N``) within the search's
``memory``, one after another; each validation reports its MRR to Optuna's pruner, which can
stop a trial that is behind the others. The results are one table, ``search.json`` and
``best.toml``, a config ``strata embed train STORE --config best.toml`` trains with.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.embed import EmbedSearchConfig, EmbedTrainConfig
from ..config.loading import read_toml
from ..config.schema import (
    _hints,
    _toml_value,
    _unknown_key,
    _unwrap_optional,
    coerce_field,
    type_name,
)
from ..errors import ConfigError, MissingDependencyError, StrataError
from ..paths import make_dir
from .train import train

#: ``[embed.train]`` options the search itself sets for every trial.
RESERVED = {
    "store": "the store is the search's STORE",
    "run_dir": "each trial runs in OUT/trial-N",
    "fresh": "every trial starts fresh",
    "memory": "every trial runs within the search's --memory",
}

OPTUNA_MISSING = "strata embed search needs Optuna: pip install 'strata-gl[search]' (or pip install 'optuna>=3')"


@dataclass(frozen=True)
class Dimension:
    """One option of the space: ``choices``, or a range ``low``..``high`` (``log`` scale, or
    ``step``) of integers (``integer``) or floats."""

    name: str
    choices: tuple | None = None
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    integer: bool = False

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class Space:
    """A search space file: the options every trial shares and the dimensions searched."""

    fixed: dict[str, Any]
    dimensions: tuple[Dimension, ...]


def load_space(path: Path) -> Space:
    """Reads and checks a search space file; every error names the file, the entry and what
    was expected."""
    doc = read_toml(path, "search space file")
    for key, value in doc.items():
        if key == "embed" and isinstance(value, dict) and set(value) <= {"train"}:
            continue
        if key != "space":
            raise ConfigError(f"{path}: unknown table or key '{key}': expected [embed.train] and [space]")
    fixed_table = doc.get("embed", {}).get("train", {})
    if not isinstance(fixed_table, dict):
        raise ConfigError(f"{path}: [embed.train] must be a table of options")
    fixed = {key: _option(path, "embed.train", key, value) for key, value in fixed_table.items()}
    space = doc.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{path}: expected a [space] table with at least one option to search")
    dimensions = []
    for key, spec in space.items():
        if key in fixed:
            raise ConfigError(f"{path}: [space] {key} is also set in [embed.train]; give it in one of them")
        dimensions.append(_dimension(path, key, spec))
    return Space(fixed=fixed, dimensions=tuple(dimensions))


def _option(path: Path, table: str, key: str, value: Any) -> Any:
    """``value`` of ``[embed.train]`` option ``key``, checked as the section checks it."""
    where = f"{path}: [{table}] {key}"
    if key not in EmbedTrainConfig.__dataclass_fields__:
        raise _unknown_key(EmbedTrainConfig, key, f"{path}: [{table}]")
    if key in RESERVED:
        raise ConfigError(f"{where}: cannot be searched or fixed here ({RESERVED[key]})")
    return coerce_field(EmbedTrainConfig, key, value, where)


def _dimension(path: Path, key: str, spec: Any) -> Dimension:
    where = f"{path}: [space] {key}"
    if key not in EmbedTrainConfig.__dataclass_fields__:
        raise _unknown_key(EmbedTrainConfig, key, f"{path}: [space]")
    if key in RESERVED:
        raise ConfigError(f"{where}: cannot be searched ({RESERVED[key]})")
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: expected a table {{choices = [...]}} or {{low = ..., high = ..., log = true}}, got {spec!r}"
        )
    unknown = set(spec) - {"choices", "low", "high", "log", "step"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}: expected choices, or low, high, log, step"
        )
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ConfigError(f"{where}: choices takes no low, high, log or step")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
        values = tuple(coerce_field(EmbedTrainConfig, key, v, f"{where} choices[{i}]") for i, v in enumerate(choices))
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
            raise ConfigError(f"{where}: choices must be numbers, strings or booleans")
        return Dimension(key, choices=values)
    return _range(where, key, spec)


def _range(where: str, key: str, spec: dict) -> Dimension:
    tp, _ = _unwrap_optional(_hints(EmbedTrainConfig)[key])
    if tp not in (int, float):
        raise ConfigError(f"{where}: a {type_name(tp)} option takes choices = [...], not a range")
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{where}: a range needs low and high (or give choices = [...])")
    integer = tp is int
    bounds = {}
    for k in ("low", "high", "step"):
        if k not in spec:
            continue
        v = spec[k]
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or not math.isfinite(v):
            raise ConfigError(f"{where}: {k} must be {'an integer' if integer else 'a number'}, got {v!r}")
        bounds[k] = v if integer else float(v)
    low, high, step = bounds["low"], bounds["high"], bounds.get("step")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if low > high:
        raise ConfigError(f"{where}: low {low} is above high {high}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0, got {low}")
    if log and step is not None:
        raise ConfigError(f"{where}: give log or step, not both (Optuna samples a log scale without steps)")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}: step must be positive, got {step}")
    for k, v in (("low", low), ("high", high)):
        coerce_field(EmbedTrainConfig, key, v, f"{where} {k}")
    return Dimension(key, low=low, high=high, log=log, step=step, integer=integer)


def _optuna():
    try:
        import optuna
    except ImportError as e:
        raise MissingDependencyError(OPTUNA_MISSING) from e
    return optuna


class _Pruned(Exception):
    """Raised through the trainer's progress callback to end a pruned trial's run."""


def search(cfg: EmbedSearchConfig, progress=None, report=print) -> dict:
    """Runs the search of ``cfg`` and returns its results (what ``search.json`` holds);
    ``report(line)`` sees one line per finished trial."""
    space = load_space(cfg.space)
    optuna = _optuna()
    out = Path(cfg.out) if cfg.out is not None else Path(cfg.store) / "runs" / "search"
    _prepare_out(out, cfg.overwrite)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=cfg.startup_trials)
        if cfg.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=cfg.seed), pruner=pruner)
    rows: list[dict] = []

    def objective(trial) -> float:
        row = _trial(cfg, space, out, trial, progress, optuna)
        rows.append(row)
        report(format_row(row))
        if row["state"] == "pruned":
            raise optuna.TrialPruned()
        if row["state"] == "failed":
            raise _TrialFailed(row["error"])
        return row["mrr"]

    study.optimize(objective, n_trials=cfg.trials, timeout=cfg.timeout, catch=(_TrialFailed,))
    results = _results(cfg, space, out, rows)
    (out / "search.json").write_text(json.dumps(results, indent=2) + "\n")
    if results["best"] is not None:
        (out / "best.toml").write_text(best_toml(results["best"]["config"]))
    return results


class _TrialFailed(Exception):
    pass


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / "search.json").exists() and not any(out.glob("trial-*")):
            raise ConfigError(f"--out {out} exists and holds no search; choose an empty or new directory")
        if not overwrite:
            raise ConfigError(f"--out {out} holds an earlier search; pass --overwrite to replace it")
        shutil.rmtree(out)
    make_dir(out, "--out")


def _trial(cfg: EmbedSearchConfig, space: Space, out: Path, trial, progress, optuna) -> dict:
    """Trains one trial's run and returns its row: state, best validation MRR, epochs, seconds."""
    params = {d.name: d.suggest(trial) for d in space.dimensions}
    run_dir = out / f"trial-{trial.number}"
    pruned = False

    def on_epoch(record: dict) -> None:
        nonlocal pruned
        valid = record.get("valid")
        if valid is not None:
            trial.report(valid["mrr"], step=record["epoch"])
            pruned = pruned or trial.should_prune()

    def watch(event: str, *args) -> bool:
        # The pruner decides after an epoch's commit; the run ends at its next progress event,
        # leaving the committed epochs (and the best checkpoint) as they are.
        if pruned:
            raise _Pruned()
        return progress(event, *args) if progress is not None else True

    row: dict[str, Any] = {"trial": trial.number, "params": params, "run": str(run_dir)}
    start = time.monotonic()
    try:
        options = {**space.fixed, **params, "memory": cfg.memory, "run_dir": run_dir, "fresh": True}
        run = train(EmbedTrainConfig(store=cfg.store, **options), progress=watch, on_epoch=on_epoch)
        meta = run.meta
        row["state"] = "complete"
    except _Pruned:
        meta = json.loads((run_dir / "run.json").read_text())
        row["state"] = "pruned"
    except StrataError as e:
        row.update(state="failed", error=str(e), mrr=None, epochs=0)
        row["seconds"] = time.monotonic() - start
        return row
    row["seconds"] = time.monotonic() - start
    row["epochs"] = meta["current"]["epoch"]
    row["mrr"] = meta.get("best_mrr")
    row["best_epoch"] = meta["best"]["epoch"]
    row["stopped"] = (meta.get("schedule") or {}).get("stopped")
    if row["mrr"] is None:
        row.update(
            state="failed", error="the run has no validation MRR (set eval_every >= 1; the store needs a valid split)"
        )
    return row


def _results(cfg: EmbedSearchConfig, space: Space, out: Path, rows: list[dict]) -> dict:
    done = [r for r in rows if r["state"] == "complete"]
    best = max(done, key=lambda r: r["mrr"], default=None)
    memory = int(cfg.memory)
    return {
        "store": str(cfg.store),
        "space": str(cfg.space),
        "out": str(out),
        "memory": memory,
        "trials": rows,
        "best": None
        if best is None
        else {
            "trial": best["trial"],
            "mrr": best["mrr"],
            "config": {**space.fixed, **best["params"], "memory": int(cfg.memory)},
        },
    }


def best_toml(config: dict) -> str:
    """The ``[embed.train]`` table of a trial's options, for ``strata embed train --config``."""
    hints = _hints(EmbedTrainConfig)
    lines = ["# The best trial of strata embed search: strata embed train STORE --config best.toml", "[embed.train]"]
    for key, value in config.items():
        if value is not None:
            lines.append(f"{key} = {_toml_value(value, _unwrap_optional(hints[key])[0])}")
    return "\n".join(lines) + "\n"


def format_row(row: dict) -> str:
    """One line of the results table."""
    mrr = "-" if row.get("mrr") is None else f"{row['mrr']:.4f}"
    params = ", ".join(f"{k}={_short(v)}" for k, v in row["params"].items())
    tail = f"  ({row['error']})" if row["state"] == "failed" else ""
    head = f"{row['trial']:>5}  {row['state']:<8}  {mrr:>7}  {row.get('epochs', 0):>6}  {row['seconds']:>8.1f}"
    return f"{head}  {params}{tail}"


HEADER = f"{'trial':>5}  {'state':<8}  {'MRR':>7}  {'epochs':>6}  {'seconds':>8}  options"


def format_table(results: dict) -> str:
    """The results table, best first, and the best trial."""
    rows = sorted(results["trials"], key=lambda r: (r["state"] != "complete", -(r.get("mrr") or 0.0)))
    lines = [HEADER, *map(format_row, rows)]
    best = results["best"]
    if best is None:
        lines.append("No trial completed.")
    else:
        lines.append(
            f"Best: trial {best['trial']}, validation MRR {best['mrr']:.4f}; its config is "
            f"{results['out']}/best.toml (strata embed train {results['store']} --config {results['out']}/best.toml)."
        )
    return "\n".join(lines)


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
