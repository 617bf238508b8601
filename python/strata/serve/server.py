"""Running ``strata serve`` from Python (the server itself is native: ``crates/strata-serve``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import _native
from ..config import engine_options, from_call
from ..config.serve import ServeConfig
from ..paths import refuse_foreign_dir
from ..stopping import run_until_stopped
from ..units import fmt_bytes
from .client import resolve_token


def serve(config: ServeConfig | None = None, on_ready: Callable[[str, dict], object] | None = None, **options) -> dict:
    """Serves until SIGTERM or Ctrl-C, then drains (queued analyses finish, in-flight calls are
    answered) and returns a summary (``addr``, ``seconds``, ``stopped_by``, ``folds``, ``status``).
    ``on_ready(addr, plan)`` is called once it listens (default: prints the memory plan and
    ``listening on ADDR``, flushed); the summary keeps ``plan`` (the split, bytes) and
    ``memory_plan`` (the same in the shape every engine's plan takes)."""
    cfg = from_call(ServeConfig, config, options)
    # The state directory is the server's own: registering there writes graphs/ and models/.
    refuse_foreign_dir(cfg.state_dir, "--state-dir", lambda record: False)
    token = resolve_token(cfg.token or None, cfg.token_file)
    # The server reads the checked section itself; the token from a file or the environment
    # is filled in here, where the ready line says whether one is required.
    native_options = {**engine_options(cfg), "token": token or ""}
    info: dict = {"listen": cfg.listen, "addr": None}

    def ready(addr: str, plan: dict, memory_plan: dict) -> None:
        info["addr"] = addr
        info["plan"] = plan
        info["memory_plan"] = memory_plan
        if on_ready is not None:
            on_ready(addr, plan)
        else:
            for line in _native.describe_memory_plan(memory_plan):
                print(line, flush=True)
            print(f"state in {cfg.state_dir}", flush=True)
            print(f"listening on {addr}" + (" (token required)" if token else ""), flush=True)

    started = time.monotonic()
    info["stopped_by"] = run_until_stopped(lambda: _native.serve_run(native_options, ready, info.update))
    info.setdefault("seconds", time.monotonic() - started)
    return info


def format_stop(info: dict) -> str:
    """The line printed when ``strata serve`` stops."""
    why = {"SIGTERM": "stopped by SIGTERM", "interrupt": "stopped by Ctrl-C", "server": "the server stopped"}
    s = info.get("status", {})
    pc = s.get("page_cache", {})
    return (
        f"serve: {info.get('addr') or info['listen']} for {info.get('seconds', 0):.1f} s, "
        f"{why[info['stopped_by']]} after draining; {s.get('requests_done', 0)} analyses "
        f"({s.get('requests_failed', 0)} failed), {fmt_bytes(s.get('bytes_in', 0))} in, "
        f"{fmt_bytes(s.get('bytes_out', 0))} out, page cache hit rate {pc.get('hit_rate', 0.0):.1%}, "
        f"{info.get('folds', 0)} folds"
    )


def format_status(status: dict) -> str:
    """``strata serve status`` as text."""
    lines = [
        f"strata serve on {status['listen']}, up {status['uptime_s']:.0f} s"
        + (" (draining)" if status.get("draining") else ""),
        f"queue depth {status['queue_depth']}; analyses {status['requests_done']} done, "
        f"{status['requests_failed']} failed; {fmt_bytes(int(status['bytes_in']))} in, "
        f"{fmt_bytes(int(status['bytes_out']))} out",
    ]
    lines.append(
        f"working memory: {fmt_bytes(int(status.get('working_used_bytes', 0)))} of "
        f"{fmt_bytes(int(status.get('working_capacity_bytes', 0)))} in use (requests, replies, unfetched results); "
        f"messages up to {fmt_bytes(int(status.get('max_message_bytes', 0)))}"
    )
    for label, key in (("page cache", "page_cache"), ("embedding cache", "embedding_cache")):
        c = status.get(key, {})
        lines.append(
            f"{label}: {fmt_bytes(int(c.get('used_bytes', 0)))} of {fmt_bytes(int(c.get('capacity_bytes', 0)))}, "
            f"hit rate {c.get('hit_rate', 0.0):.1%} ({c.get('hits', 0)} hits, {c.get('misses', 0)} misses)"
        )
    lines.append(f"graphs ({len(status.get('graphs', []))}):")
    for g in status.get("graphs", []):
        lines.append(
            f"  {g['name']}: {g['live_nodes']} vertices, {g['num_edges']} edges, {g['feature_dim']}-dim features, "
            f"version {g['version']}, {g['pending_log_records']} log records to fold"
            + (", re-ordered (Alg. 2)" if g.get("reordered") else "")
        )
    lines.append(f"models ({len(status.get('models', []))}):")
    for m in status.get("models", []):
        a = m.get("architecture", {})
        kind = str(a.get("kind", "")).removeprefix("MODEL_KIND_").lower()
        lines.append(
            f"  {m['name']}: {kind}, {a.get('layers')} layers {a.get('in_dim')}->{a.get('out_dim')}, fanouts "
            f"{a.get('fanouts')}, {str(m.get('precision', '')).removeprefix('PRECISION_').lower()}, "
            f"{m.get('parameters')} parameters"
        )
    lines.append(f"embedding runs ({len(status.get('embeddings', []))}):")
    for e in status.get("embeddings", []):
        lines.append(
            f"  {e['name']}: {e['model']} dim {e['dim']}, {e['num_nodes']} nodes, {e['num_relations']} relations, "
            f"epoch {e['epoch']} ({e['checkpoint']}), {e['resident_partitions']} of {e['partitions']} partitions "
            f"resident ({fmt_bytes(int(e['resident_bytes']))}), from {e['source_path']}"
        )
    return "\n".join(lines)
