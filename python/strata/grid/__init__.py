"""Graph analytics on graphs larger than memory (Fargraph+): ``strata grid build``, ``strata run``
and ``strata farmem serve``.

A grid (``STORE/grids/NAME``) holds a store's train edges in a P x P grid of blocks. ``run``
streams the blocks through a registered algorithm (:func:`algorithms`: PageRank, BFS, WCC,
SSSP, SpMV, k-core, ...) or a vertex program of your own (:class:`VertexProgram`,
:func:`run_program`) within a memory budget: vertex data stays local, edge blocks are offloaded to a memory server up to
``far_ratio`` of the footprint, kept resident where the budget allows, and streamed from disk
otherwise. A run directory holds the result arrays (``rank.npy``, ``level.npy``, ...),
``metrics.jsonl`` (one line per iteration, written as it ends) and ``run.json`` (format
``strata-grid-run``: the config, the native summary and the per-iteration history). The work
happens in ``strata._native``; see docs/grid.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from .. import _native, torchrun
from ..config import as_dict, engine_options, from_call
from ..config.grid import FarmemServeConfig, GridBuildConfig, RunConfig
from ..errors import ConfigError, InputNotFoundError, StoreFormatError
from ..paths import make_dir, refuse_foreign_dir
from ..stopping import run_until_stopped
from ..store import Store
from ..tokens import resolve_token
from ..units import fmt_bytes, fmt_count, fmt_duration
from . import dist
from .program import ProgramResult, VertexProgram, load_program, program_text, run_program

ProgressFn = Callable[..., bool]

#: The ``format`` of a grid run's ``run.json``.
RUN_FORMAT = "strata-grid-run"
RUN_FORMAT_VERSION = 1
#: Environment variable holding the far-memory server's shared secret (server and clients).
FARMEM_TOKEN_ENV = "STRATA_FARMEM_TOKEN"

#: Run options each rank of a distributed run may set for itself (its machine's resources and
#: paths; the far-memory options, ``far*``, too); every other option must be the same on every rank.
RANK_OWN = (
    "store", "grid", "memory", "threads", "segment", "prefetch", "vertex", "disk_fetchers", "keep_resident",
    "out", "dist_timeout", "checkpoints", "checkpoint_seconds",
)  # fmt: skip


def algorithms() -> list[dict]:
    """The algorithms ``strata run`` offers, from the engine's registry
    (``strata_grid::algo::registry``), in order: each one's ``name``, ``about``, result
    ``arrays``, iteration ``value`` (``{"kind": "real"|"count", "label": ...}`` or
    ``{"kind": "none"}``) and ``params`` (its options in the ``[run]`` section)."""
    return _native.grid_algorithms()


#: The result arrays each algorithm writes into the run directory.
RESULT_ARRAYS = {a["name"]: tuple(a["arrays"]) for a in algorithms()}

__all__ = [
    "RESULT_ARRAYS",
    "RUN_FORMAT",
    "ProgramResult",
    "VertexProgram",
    "algorithms",
    "build_grid",
    "default_out_dir",
    "format_build",
    "format_grids",
    "format_iteration",
    "format_serve",
    "format_summary",
    "grid_info",
    "iteration_metrics",
    "list_grids",
    "load_program",
    "run",
    "run_program",
    "serve_farmem",
]


def default_out_dir(store: str | Path, algorithm: str) -> Path:
    """Where ``strata run ALGO STORE`` writes by default: ``STORE/runs/grid-ALGO``
    (``grid-program-NAME`` for a vertex program's run)."""
    return Path(store) / "runs" / f"grid-{algorithm}"


def _require_store(store: Path) -> None:
    if not Path(store).exists():
        raise InputNotFoundError(f"{store}: no such store (make one with `strata convert` or `strata generate`)")


# ---------------------------------------------------------------------------------------------
# strata grid build / info


#: Options of ``[grid.build]`` that describe an input edge list (used with ``out`` only).
_INPUT_OPTIONS = ("format", "columns", "ids", "delimiter", "comment", "header", "num_nodes", "layout", "threads")


def build_grid(config: GridBuildConfig | None = None, progress: ProgressFn | None = None, **options) -> dict:
    """Builds the grid of ``config.store`` (or the keyword options of ``[grid.build]``), or with
    ``out`` the grid directory ``out`` straight from the input edge list ``config.store``;
    returns the build summary (dir, partitions, num_vertices, num_edges, bytes, seconds, stages
    with their bytes, plan)."""
    cfg = from_call(GridBuildConfig, config, options)
    if cfg.out is not None:
        _check_input(cfg)
        return _native.grid_build_input(as_dict(cfg), {"config": as_dict(cfg)}, progress)
    _require_store(cfg.store)
    if not (Path(cfg.store) / "manifest.json").is_file() and not Path(cfg.store).is_dir():
        raise ConfigError(
            f"grid.build: {cfg.store} is not a store; to build a grid straight from an input edge list, give the "
            "grid's directory with --out DIR"
        )
    defaults = GridBuildConfig(store=cfg.store)
    given = [k for k in _INPUT_OPTIONS if getattr(cfg, k) != getattr(defaults, k)]
    if given:
        raise ConfigError(
            f"grid.build.{given[0]}: describes an input edge list, used with --out only; a store's grid is built "
            "from its train edges"
        )
    return _native.grid_build(as_dict(cfg), progress)


def _check_input(cfg: GridBuildConfig) -> None:
    """Refuses a grid built "from an input" that is a store, or named as a store's grid; the
    input itself is planned by its format in ``strata._native``, as ``strata convert`` plans it."""
    if (Path(cfg.store) / "manifest.json").is_file():
        raise ConfigError(
            f"grid.build.out: {cfg.store} is a store: its grids go to {cfg.store}/grids/ (drop --out), or give an "
            "input edge list"
        )
    if cfg.name:
        raise ConfigError("grid.build.name: names a grid under STORE/grids/; with --out the directory is the grid")


def format_build(summary: dict) -> str:
    """The line printed after ``strata grid build``, with each step's time and rates."""

    def rate(n: int, secs: float) -> str:
        return f"{n / max(secs, 1e-9) / 1e6:,.0f} MB/s"

    steps = "; ".join(
        f"{st['name']} {fmt_duration(st['seconds'])} ({st['cpu_seconds']:.1f} s of CPU; read "
        f"{rate(st['read_bytes'], st['seconds'])}"
        + (f", wrote {rate(st['written_bytes'], st['seconds'])}" if st["written_bytes"] else "")
        + ")"
        for st in summary.get("stages", [])
    )
    return (
        f"Built grid {summary['dir']}: {summary['num_vertices']:,} vertices in {summary['partitions']} chunks, "
        f"{summary['num_edges']:,} edges in {summary['partitions'] ** 2:,} blocks, {fmt_bytes(summary['bytes'])} "
        f"on disk, in {fmt_duration(summary['seconds'])}" + (f": {steps}." if steps else ".")
    )


def grid_info(path: str | Path) -> dict:
    """The manifest (``grid.json``) of the grid directory ``path``."""
    return _native.grid_info(str(path))


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def list_grids(target: str | Path) -> list[dict]:
    """The grids of a store, or the one grid ``target`` names: one entry per grid with its
    ``name``, ``dir``, ``bytes`` and ``manifest`` (or ``error`` for a store's grid that does not
    open). A grid directory that does not open raises StoreFormatError."""
    target = Path(target)
    if not target.exists():
        raise InputNotFoundError(f"{target}: no such store or grid directory")
    if (target / "grid.json").is_file():
        return [{"name": target.name, "dir": str(target), "bytes": _dir_bytes(target), "manifest": grid_info(target)}]
    if not (target / "manifest.json").is_file() and ".partial-" not in target.name:
        raise StoreFormatError(
            f"{target}: neither a store (manifest.json) nor a grid directory (grid.json, from `strata grid build`)"
        )
    Store(target)  # validated as every reader does: an unfinished (.partial-PID) store is refused
    grids_dir = target / "grids"
    entries = []
    for d in sorted(grids_dir.iterdir()) if grids_dir.is_dir() else []:
        if not d.is_dir() or ".partial-" in d.name:
            continue  # a build in progress (or one that was killed)
        entry = {"name": d.name, "dir": str(d), "bytes": _dir_bytes(d)}
        try:
            entry["manifest"] = grid_info(d)
        except StoreFormatError as e:
            entry["error"] = str(e)
        entries.append(entry)
    return entries


def _grid_kind(m: dict) -> str:
    parts = [f"P={m['partitions']}", f"{m['order']} order"]
    if m.get("compression", "none") != "none":
        codes = m["arrays"]["edge_codes"]["shape"][0]
        parts.append(f"{m['compression']} compression ({codes / max(m['num_edges'], 1):.2f} B per edge)")
    if m.get("symmetric"):
        parts.append("symmetric")
    w = m.get("weights")
    if w and w["kind"] == "store":
        parts.append("weighted (the store's edge_weights_train)")
    elif w:
        parts.append(f"weighted (random, seed {w['seed']}, in ({w['low']:g}, {w['high']:g}])")
    return ", ".join(parts)


def format_grids(entries: list[dict], target: str | Path) -> str:
    """``strata grid info``: a line per grid of a store, or the details of one grid."""
    target = Path(target)
    if len(entries) == 1 and Path(entries[0]["dir"]) == target:
        e = entries[0]
        m = e["manifest"]
        lines = [
            f"Grid {target}: {_grid_kind(m)}",
            f"  {m['num_vertices']:,} vertices in {m['partitions']} chunks of {m['chunk_size']:,}",
            f"  {m['num_edges']:,} edges in {m['partitions'] ** 2:,} blocks; largest block "
            f"{m['largest_block_edges']:,} edges, largest {m['order']} {m['largest_major_edges']:,} edges",
            f"  {fmt_bytes(e['bytes'])} on disk: "
            + ", ".join(f"{name} {a['dtype']} {tuple(a['shape'])}" for name, a in sorted(m["arrays"].items())),
        ]
        prov = m.get("provenance") or {}
        if prov.get("store"):
            lines.append(f"  built from {prov['store']} ({prov.get('edges', 'edges_train')})")
        elif prov.get("input"):
            names = ", node names kept" if "node_names_offsets" in m["arrays"] else ""
            lines.append(f"  built from {prov.get('format')} input {', '.join(prov['input'])}{names}")
        return "\n".join(lines)
    if not entries:
        return f"Store {target} has no grids yet (build one with `strata grid build {target}`, or `strata run` does)."
    width = max(len(e["name"]) for e in entries)
    lines = [f"Grids of {target} ({len(entries)}):"]
    for e in entries:
        if "error" in e:
            lines.append(f"  {e['name']:<{width}}  invalid: {e['error']}")
            continue
        m = e["manifest"]
        lines.append(
            f"  {e['name']:<{width}}  {_grid_kind(m)}; {m['num_vertices']:,} vertices, {m['num_edges']:,} edges, "
            f"{fmt_bytes(e['bytes'])}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# strata run


def iteration_metrics(record: dict) -> dict:
    """The ``metrics.jsonl`` line of a native iteration record. ``iteration`` counts from 1 (the
    native record's from 0); byte figures are decimal MB, rates per second of the iteration."""
    p = record["pass"]
    secs = max(record["seconds"], 1e-9)
    return {
        "iteration": record["iteration"] + 1,
        "seconds": record["seconds"],
        "edges": p["edges"],
        "edges_per_s": p["edges"] / secs,
        "active": record["active"],
        "value": record["value"],
        "blocks": p["blocks"],
        "blocks_skipped": p["blocks_skipped"],
        "mb_disk": p["bytes_disk"] / 1e6,
        "mb_far": p["bytes_far"] / 1e6,
        "mb_local": p["bytes_local"] / 1e6,
        "mb_per_s_disk": p["bytes_disk"] / 1e6 / secs,
        "mb_per_s_far": p["bytes_far"] / 1e6 / secs,
        "mb_vertex_read": p["bytes_vertex_read"] / 1e6,
        "mb_vertex_written": p["bytes_vertex_written"] / 1e6,
        "wait_seconds": p["wait_seconds"],
        "far_fallbacks": p["far_fallbacks"],
        "edges_decoded": p["edges_decoded"],
        "decode_seconds": p["decode_seconds"],
        "mb_exchanged": record.get("bytes_exchanged", 0) / 1e6,
    }


_VALUES = {a["name"]: a["value"] for a in algorithms()}


def _value_text(algorithm: str | None, value: float) -> str:
    shown = _VALUES.get(algorithm, {"kind": "none"})
    if shown["kind"] == "real":
        return f"  {shown['label']} {value:.3e}"
    if shown["kind"] == "count":
        return f"  {shown['label']} {int(value):,}"
    return ""


def format_iteration(record: dict, algorithm: str | None = None) -> str:
    """One line per iteration, from a native record or a ``metrics.jsonl`` line:
    ``iter 3  1.23 s  45.6M edges/s  active 1,234  disk 812 MB/s  far 0 MB/s`` (and, given the
    algorithm, what the iteration's value means: the L1 change, vertices activated, k)."""
    m = iteration_metrics(record) if "pass" in record else record
    line = (
        f"iter {m['iteration']}  {m['seconds']:.2f} s  {fmt_count(m['edges_per_s'])} edges/s  "
        f"active {m['active']:,}  disk {m['mb_per_s_disk']:.0f} MB/s  far {m['mb_per_s_far']:.0f} MB/s"
    )
    if m.get("mb_vertex_read") or m.get("mb_vertex_written"):
        line += f"  vertex windows {m['mb_vertex_read']:.0f} MB in / {m['mb_vertex_written']:.0f} MB dirtied"
    if m.get("edges_decoded") and m.get("decode_seconds"):
        line += f"  decoded {m['edges_decoded'] * 8 / m['decode_seconds'] / 1e9:.2f} GB/s per fetcher"
    if m.get("far_fallbacks"):
        line += f"  ({m['far_fallbacks']} far reads fell back to disk)"
    if m.get("mb_exchanged"):
        line += f"  exchanged {m['mb_exchanged']:.2f} MB"
    return line + _value_text(algorithm, m["value"])


def _metrics_until(path: Path, iterations: int) -> list[dict]:
    """The ``metrics.jsonl`` lines of ``path`` for iterations 1 to ``iterations`` (none when
    ``iterations`` is 0 or the file is missing); reading stops at a line cut short by a kill."""
    if iterations == 0 or not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            break
        if m["iteration"] <= iterations:
            kept.append(m)
    return kept


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run(
    config: RunConfig | None = None,
    progress: ProgressFn | None = None,
    on_iteration: Callable[[dict], object] | None = None,
    **options,
) -> dict:
    """Runs ``config.algorithm`` on ``config.store`` (or the keyword options of ``[run]``) and
    returns the native summary. ``on_iteration(record)`` sees each native iteration record as it
    ends (an exception it raises stops the run). Writes ``metrics.jsonl`` (a line per iteration,
    as they end) and ``run.json`` (at the end) beside the result arrays in the run directory.

    Under torchrun (``WORLD_SIZE`` > 1) the process is one rank of a distributed run: it streams
    its own columns of the grid and exchanges vertex values with the other ranks; rank 0 writes
    the results, ``metrics.jsonl`` and ``run.json`` (with every rank's figures), the others only
    report."""
    cfg = from_call(RunConfig, config, options)
    _require_store(cfg.store)
    native = engine_options(cfg)
    if cfg.far:
        native["far_token"] = resolve_token(cfg.far_token or None, cfg.far_token_file, FARMEM_TOKEN_ENV) or ""
    program = None
    if cfg.algorithm == "program" and cfg.program:
        # A .py or .toml program is read here; the engine takes the program's JSON.
        native["program"], program = program_text(cfg.program)
    name = cfg.algorithm if program is None else f"program-{program.get('name', 'program')}"
    out = Path(cfg.out) if cfg.out is not None else default_out_dir(cfg.store, name)
    # An earlier grid run there, or one a kill interrupted (no run.json yet), is resumed or
    # replaced; a store, a grid or another engine's run is refused.
    refuse_foreign_dir(out, "--out", lambda r: isinstance(r, dict) and r.get("format") == RUN_FORMAT)
    history: list[dict] = []
    moved = [0]  # bytes from disk and far memory so far
    agreed = {k: v for k, v in native.items() if k not in RANK_OWN and not k.startswith("far")}
    exchange = dist.join(cfg.dist_timeout, agreed)
    writes = exchange is None or exchange.rank == 0
    if exchange is not None:
        progress = torchrun.ranked(progress, exchange.rank)

    def each(record: dict) -> None:
        m = iteration_metrics(record)
        if not history:
            if writes:
                # An earlier run there is touched only once this one is under way: a run that
                # fails its checks leaves it as it was.
                _drop_earlier_results(out)
                (out / "run.json").unlink(missing_ok=True)
                # A restarted group that resumed from a checkpoint starts past iteration 1: the
                # lines of the iterations the checkpoint holds stay.
                kept = _metrics_until(out / "metrics.jsonl", record["iteration"])
                (out / "metrics.jsonl").write_text("".join(json.dumps(k) + "\n" for k in kept))
                history.extend(kept)
            if progress:
                progress("stage", f"{cfg.algorithm}: iterations", 0, 0)
        history.append(m)
        if writes:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(m) + "\n")
        if progress:
            moved[0] += record["pass"]["bytes_disk"] + record["pass"]["bytes_far"]
            progress("update", 0, moved[0])
            progress("message", format_iteration(m, cfg.algorithm))
        if on_iteration is not None:
            on_iteration(record)

    # The lock on the run directory, held to the run's end and taken before anything is
    # computed, so a second run is refused before it writes there (a windowed run's scratch
    # files go there before the first iteration); a directory made for it is removed again if
    # the run leaves it empty (it failed its checks).
    with contextlib.ExitStack() as held:
        if writes:
            made = not out.exists()
            make_dir(out, "--out")
            held.callback(os.close, _lock_out(out))
            if made:
                held.callback(_remove_if_empty, out)
        try:
            summary = _native.grid_run({**native, "out": str(out)}, progress, each, exchange)
        finally:
            if exchange is not None:
                exchange.close()
        if writes:
            _write_record(out, cfg, summary, history, program, exchange)
    return summary


def _write_record(out: Path, cfg: RunConfig, summary: dict, history: list[dict], program, exchange) -> None:
    """Writes ``run.json`` of the finished run (and, when no iteration ran, an empty
    ``metrics.jsonl``) into ``out``."""
    if not history:  # no iteration ran (an empty graph): the directory still gets its files
        (out / "metrics.jsonl").write_text("")
    record = {
        "format": RUN_FORMAT,
        "format_version": RUN_FORMAT_VERSION,
        # The far-memory secret stays out of the record (the token file's path is kept).
        "config": {**as_dict(cfg), "far_token": ""},
        "world_size": 1 if exchange is None else exchange.world_size,
        "summary": summary,
        "history": history,
    }
    if program is not None:
        record["program"] = program
    _write_atomic(out / "run.json", json.dumps(record, indent=2, default=str))


def _remove_if_empty(path: Path) -> None:
    """Removes directory ``path`` if it holds nothing."""
    with contextlib.suppress(OSError):
        path.rmdir()


def _lock_out(out: Path) -> int:
    """A descriptor holding an exclusive lock on the run directory ``out`` (``flock``, which
    the kernel drops with a killed process), so that two runs never write one directory at
    once; a directory another run holds is refused, naming it."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"--out {out} is being written by another run (this process or another); wait for it to end, "
            "or choose another --out"
        ) from None
    return fd


def _drop_earlier_results(out: Path) -> None:
    """Removes the result arrays of the earlier run in ``out`` (its ``run.json`` lists them), so
    that a run of another algorithm there leaves none beside its own (a bfs run kept the
    pagerank run's rank.npy). Only files directly in ``out`` are touched."""
    try:
        earlier = json.loads((out / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    for path in (earlier.get("summary") or {}).get("arrays") or []:
        (out / Path(path).name).unlink(missing_ok=True)


def format_summary(summary: dict) -> str:
    """The paragraph printed after ``strata run``."""
    s = summary
    grid = Path(s["grid"])
    lines = [
        f"Ran {s['algorithm']} on grid {grid.name} ({grid}): {s['iterations']} iterations in "
        f"{fmt_duration(s['seconds'])} ({fmt_duration(s['compute_seconds'])} computing), "
        f"{s['edges']:,} edges streamed at {fmt_count(s['edges_per_second'])} edges/s.",
        f"  edge bytes read: {fmt_bytes(s['bytes_local'])} resident, {fmt_bytes(s['bytes_far'])} from far memory, "
        f"{fmt_bytes(s['bytes_disk'])} from disk",
    ]
    p = s["placement"]
    vertex = f"vertex data {fmt_bytes(p['vertex_bytes'])} local"
    if p.get("vertex_windowed"):
        vertex = (
            f"vertex data {fmt_bytes(p['vertex_bytes'])} in windows of {fmt_bytes(p['window_bytes'])} "
            f"({fmt_bytes(s['bytes_vertex_read'])} paged in, {fmt_bytes(s['bytes_vertex_written'])} dirtied)"
        )
    lines.append(
        f"  placement: {vertex}, edge blocks "
        f"{fmt_bytes(p['local_edge_bytes'])} resident / {fmt_bytes(p['far_bytes'])} far / "
        f"{fmt_bytes(p['disk_bytes'])} on disk "
        f"(far ratio {p['far_ratio']:.2f} of {fmt_bytes(p['footprint'])})"
    )
    if s.get("compression", "none") != "none":
        rate = s["edges_decoded"] * 8 / max(s["decode_seconds"], 1e-9)
        lines.append(
            f"  {s['compression']} compression: {s['stored_bytes_per_edge']:.2f} B per edge stored; "
            f"{s['edges_decoded']:,} edges decoded as fetched in {fmt_duration(s['decode_seconds'])} of "
            f"fetcher time ({fmt_bytes(rate)}/s of records per fetcher)"
        )
    far = s.get("far")
    if far:
        lines.append(
            f"  far memory {far['addr']}: {far['connections']} connections, {far['fetchers']} fetchers, "
            f"chunks of {fmt_bytes(far['chunk_bytes'])} over {far['transport']}, ping {far['ping_us']:.0f} us"
        )
    if s.get("far_failure"):
        lines.append(
            f"  far memory was lost during the run ({s['far_failure']}); the rest came from disk, "
            "results are unaffected"
        )
    if s.get("dist"):
        lines.append(f"  distributed over {s['dist']['world_size']} ranks:")
        for r in s["dist"]["ranks"]:
            lines.append(
                f"    rank {r['rank']}: columns {r['columns'][0]}..{r['columns'][1]}, {r['edges']:,} edges, "
                f"{fmt_bytes(r['bytes_disk'])} from disk, {fmt_bytes(r['bytes_far'])} far, "
                f"{fmt_bytes(r['bytes_sent'])} sent / {fmt_bytes(r['bytes_received'])} received, "
                f"{fmt_duration(r['compute_seconds'])} computing" + _checkpoint_text(r.get("checkpoints") or {})
            )
    if s.get("result"):
        lines.append("  result: " + ", ".join(f"{k} {_show(v)}" for k, v in s["result"].items()))
    if s.get("arrays"):
        lines.append(f"  wrote {', '.join(s['arrays'])}")
    return "\n".join(lines)


def _checkpoint_text(c: dict) -> str:
    """A rank's checkpoints, as its summary line ends (nothing when it wrote none)."""
    text = ""
    if c.get("resumed_from") is not None:
        text += f", resumed from the checkpoint after iteration {c['resumed_from']}"
    if c.get("written"):
        text += f", {c['written']} checkpoints ({fmt_bytes(c['bytes'])}, {fmt_duration(c['seconds'])})"
    return text


def _show(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# ---------------------------------------------------------------------------------------------
# strata farmem serve


def serve_farmem(config: FarmemServeConfig | None = None, on_ready: Callable[[str], object] | None = None, **options):
    """Serves far memory until SIGTERM or Ctrl-C (or the server stops); ``on_ready(addr)`` is
    called once it listens (default: prints ``listening on ADDR``, flushed). Returns a summary:
    ``addr``, ``capacity``, ``seconds``, ``stopped_by`` (``SIGTERM``, ``interrupt`` or
    ``server``), and the server's counters: ``requests``, ``received_bytes``, ``served_bytes``."""
    cfg = from_call(FarmemServeConfig, config, options)
    token = resolve_token(cfg.token or None, cfg.token_file, FARMEM_TOKEN_ENV)
    native = {**engine_options(cfg), "token": token or ""}
    info: dict = {"listen": cfg.listen, "addr": None, "capacity": int(cfg.capacity)}
    started = [time.monotonic()]

    def ready(addr: str) -> None:
        info["addr"] = addr
        started[0] = time.monotonic()
        if on_ready is not None:
            on_ready(addr)
        else:
            required = ", token required" if token else ""
            print(f"listening on {addr} ({fmt_bytes(cfg.capacity)} to lend{required})", flush=True)

    info["stopped_by"] = run_until_stopped(lambda: _native.farmem_serve(native, ready, info.update))
    info["seconds"] = time.monotonic() - started[0]
    return info


def format_serve(info: dict) -> str:
    """The line printed when ``strata farmem serve`` stops."""
    why = {"SIGTERM": "stopped by SIGTERM", "interrupt": "stopped by Ctrl-C", "server": "the server stopped"}
    line = (
        f"farmem: served {info['addr'] or info['listen']} ({fmt_bytes(info['capacity'])}) for "
        f"{fmt_duration(info['seconds'])}; {why.get(info.get('stopped_by'), info.get('stopped_by'))}"
    )
    if "requests" in info:
        line += (
            f"; {info['requests']:,} requests, {fmt_bytes(info['received_bytes'])} received, "
            f"{fmt_bytes(info['served_bytes'])} served"
        )
    return line
