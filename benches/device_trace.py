"""Where a device run's epochs go: torch's profiler over an in-process run, its Chrome trace
written out (open it in Perfetto or chrome://tracing), and a summary a log can show.

The run's Python phases are marked with ``record_function`` while it is traced (the methods
named in ``phases``, wrapped for the trace's length only, so that the product code carries no
profiling), and each epoch's start with an instant mark (``mark_epoch``). The summary gives per
epoch: its wall time, the union of the device's kernels and copies (busy), the device's idle
time and, for that idle time, what the host was doing: the innermost marked phase of any
thread, or nothing torch saw ("outside torch": the Rust engine's own work, the interpreter's);
and the kernels the busy time went to, longest first. On the CPU twin there is no device
lane; the summary then gives the host phases alone.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from pathlib import Path

#: The name prefix of the marks this module adds to a trace.
PREFIX = "strata::"
#: An epoch as a range (a marked call), and an epoch's start as a mark.
EPOCH = PREFIX + "epoch"
EPOCH_START = PREFIX + "epoch start"
#: The trace's device activity: kernels, copies and fills.
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
#: Idle stretches of the device shorter than this (µs) are launch latency, not a gap.
GAP_US = 50.0
#: Kernels (and copies) an epoch's summary names, by their device time.
TOP_KERNELS = 12


def mark_epoch() -> None:
    """An instant mark where an epoch starts (a zero-length range of the trace)."""
    from torch.profiler import record_function

    with record_function(EPOCH_START):
        pass


@contextmanager
def phases(targets: dict):
    """While active, each method of ``targets`` (``{class or module: [names]}``) runs inside
    a ``record_function`` range named ``strata::Owner.name``."""
    from torch.profiler import record_function

    def wrapped(cls, name):
        orig = cls.__dict__[name]

        def call(*args, **kwargs):
            with record_function(f"{PREFIX}{cls.__name__.rsplit('.', 1)[-1]}.{name}"):
                return orig(*args, **kwargs)

        return orig, call

    saved = []
    try:
        for cls, names in targets.items():
            for name in names:
                orig, call = wrapped(cls, name)
                setattr(cls, name, call)
                saved.append((cls, name, orig))
        yield
    finally:
        for cls, name, orig in reversed(saved):
            setattr(cls, name, orig)


@contextmanager
def epochs_at(owner, name: str, whole: bool):
    """While active, each call of ``owner.name`` (a class's method or a module's function)
    starts an epoch of the trace (:func:`mark_epoch`), or with ``whole`` is one (a range)."""
    from torch.profiler import record_function

    orig = owner.__dict__[name]

    def call(*args, **kwargs):
        if whole:
            with record_function(EPOCH):
                return orig(*args, **kwargs)
        mark_epoch()
        return orig(*args, **kwargs)

    setattr(owner, name, call)
    try:
        yield
    finally:
        setattr(owner, name, orig)


def traced(run, targets: dict, epochs: tuple, path: Path, cuda: bool) -> dict:
    """Runs ``run()`` under torch's profiler with ``targets``' phases marked and its epochs
    marked by ``epochs`` (``(owner, name, whole)``, :func:`epochs_at`); writes the Chrome trace
    to ``path`` (gzipped when it ends in ``.gz``) and returns :func:`summary`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with ExitStack() as stack:
        prof = stack.enter_context(profile(activities=activities))
        stack.enter_context(phases(targets))
        stack.enter_context(epochs_at(*epochs))
        run()
    plain = path.with_suffix("") if path.suffix == ".gz" else path
    prof.export_chrome_trace(str(plain))
    trace = json.loads(plain.read_text())
    if plain != path:
        path.write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    return summary(trace)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _clip(spans, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def _innermost(phases: list[tuple[float, float, str]], t: float) -> str:
    """The shortest marked phase running at ``t`` (any thread), or ``outside torch``."""
    best = None
    for a, b, name in phases:
        if a <= t < b and (best is None or b - a < best[1] - best[0]):
            best = (a, b, name)
    return best[2].removeprefix(PREFIX) if best else "outside torch"


def _attribute(phases: list[tuple[float, float, str]], a: float, b: float, into: dict) -> None:
    """Adds the stretch ``a .. b`` (µs) to ``into`` by the innermost phase at each moment."""
    inside = [p for p in phases if p[1] > a and p[0] < b]
    cuts = sorted({a, b, *(x for p in inside for x in p[:2] if a < x < b)})
    for lo, hi in itertools.pairwise(cuts):
        into[_innermost(inside, (lo + hi) / 2)] += (hi - lo) / 1e3


def summary(trace: dict) -> dict:
    """``{"epochs": [...]}`` of a Chrome trace with epoch marks (:func:`epochs_at`): an epoch is
    a marked call, or from a mark to the next (the last to the trace's end, so it holds
    whatever ran after the last epoch too). Per epoch: its ``ms``; the device's ``busy_ms``
    and ``busy_share`` (None without a device lane); ``idle_ms_by_host_phase``, the device's
    idle gaps of at least :data:`GAP_US` by what the host was doing; ``device_ms_by_kernel``
    (:func:`_by_kernel`); ``host_ms_by_phase``,
    each marked phase's time (nested ones counted in their callers' too); and
    ``host_unmarked_ms``, the time no thread was in a marked phase."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    end = max((e["ts"] + e.get("dur", 0) for e in events), default=0)
    starts = sorted(e["ts"] for e in events if e.get("name") == EPOCH_START)
    windows = sorted(
        [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == EPOCH]
        + list(zip(starts, [*starts[1:], end], strict=False))
    )
    kernels = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") in DEVICE_CATS]
    phases = [
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("name", "").startswith(PREFIX) and e["name"] not in (EPOCH, EPOCH_START)
    ]
    device = _union([k[:2] for k in kernels])
    return {"epochs": [_epoch(lo, hi, device, kernels, phases) for lo, hi in windows]}


def _by_kernel(kernels: list[tuple[float, float, str]], lo: float, hi: float) -> dict:
    """The device time (ms) of the :data:`TOP_KERNELS` longest-running names among
    ``kernels`` (``(start, end, name)``, µs) within ``lo .. hi``, longest first, the rest as
    one entry (overlapping kernels each counted: the sum may pass the busy time)."""
    total = defaultdict(float)
    for a, b, name in kernels:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            total[name] += (b - a) / 1e3
    ranked = sorted(total.items(), key=lambda kv: -kv[1])
    top = dict(ranked[:TOP_KERNELS])
    rest = sum(v for _, v in ranked[TOP_KERNELS:])
    return top | ({"(the rest)": rest} if rest else {})


def _epoch(lo: float, hi: float, device: list, kernels: list, phases: list) -> dict:
    """One epoch's record (:func:`summary`), from ``lo`` to ``hi`` (µs); ``device`` the
    trace's busy spans (the union of its ``kernels``)."""
    mine = [p for p in phases if lo <= p[0] < hi]
    host = defaultdict(float)
    for a, b, name in mine:
        host[name.removeprefix(PREFIX)] += (b - a) / 1e3
    marked = sum(b - a for a, b in _clip(_union([p[:2] for p in mine]), lo, hi))
    record = {"ms": (hi - lo) / 1e3, "host_ms_by_phase": dict(host), "host_unmarked_ms": (hi - lo - marked) / 1e3}
    if not kernels:
        return record | {"busy_ms": None, "busy_share": None}
    busy = _clip(device, lo, hi)
    idle = defaultdict(float)
    edges = [lo] + [x for span in busy for x in span] + [hi]
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        if b - a >= GAP_US:
            _attribute(mine, a, b, idle)
    busy_ms = sum(b - a for a, b in busy) / 1e3
    record |= {"busy_ms": busy_ms, "busy_share": busy_ms / max(record["ms"], 1e-9)}
    record["idle_ms_by_host_phase"] = dict(sorted(idle.items(), key=lambda kv: -kv[1]))
    record["device_ms_by_kernel"] = _by_kernel(kernels, lo, hi)
    return record


def show(name: str, summ: dict) -> str:
    """The summary as lines for a log."""
    lines = []
    for i, e in enumerate(summ["epochs"], 1):
        busy = "" if e["busy_ms"] is None else f", device busy {e['busy_ms']:.1f} ms ({e['busy_share']:.0%})"
        lines.append(f"{name} epoch {i}: {e['ms']:.1f} ms{busy}")
        idle = e.get("idle_ms_by_host_phase") or {}
        if idle:
            by = ", ".join(f"{k} {v:.1f} ms" for k, v in idle.items())
            lines.append(f"  device idle while the host was in: {by}")
        kernels = list((e.get("device_ms_by_kernel") or {}).items())[:6]
        if kernels:
            lines.append("  device time by kernel: " + ", ".join(f"{k[:60]} {v:.1f} ms" for k, v in kernels))
        top = sorted(e["host_ms_by_phase"].items(), key=lambda kv: -kv[1])[:8]
        phases = ", ".join(f"{k} {v:.1f} ms" for k, v in top)
        lines.append(f"  host phases: {phases}; in none: {e['host_unmarked_ms']:.1f} ms")
    return "\n".join(lines)
