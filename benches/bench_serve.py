"""Questions: how many fewer bytes cross the network, and how much faster is it, to classify
vertices next to the data than to pull their neighbourhoods and features to the client (S1)?
What does each of GLIST's mechanisms buy on a power-law request stream when the features do
not fit the cache (S2)? Do 16 clients mixing analyses and mutations for a minute get steady
latency, no errors and every acknowledged mutation (S3)? What accuracy does int8 cost (Q)?

    python benches/bench_serve.py [--only s1,s2,s3,q] [--nodes 200000] [--repeats 3]
        [--s2-requests 4000] [--s2-memory 84M] [--s2-locality 0.8] [--s3-seconds 60]
        [--s3-fold-after 10] [--s3-min-calls 0] [--s3-mix mixed|mutations] [--work DIR]

Graph of S1 to S3: `strata generate sbm` (16 classes, mean degree 10 written once, so 20 after
`convert --symmetrize`, power-law exponent 2.5, 128 float32 features: 102 MB at 200k nodes),
registered with Alg. 2 unless a run says otherwise. Model: 2-layer GraphSAGE (mean), hidden 128,
16 classes, fanouts 10,5 (seeds outwards); its weights are a fixed random draw, since throughput
does not depend on them. The server is a `strata serve` child; the client is this process.

S1: 10,000 distinct targets in requests of 256. near-data: `Client.classify`. pull: the client
asks `SampleNeighbors` for the neighbourhood an analysis samples, `GetFeatures` for its rows, and
runs the PyTorch reference model and an argmax, so both paths must give the same classes (the
agreement is reported). `--memory 1G` holds every feature page after a warm-up pass; the
embedding cache is off so each pass recomputes. Bytes: the TCP payload of the client's
connections (`ss -ti` bytes_sent + bytes_received), gRPC and HTTP/2 framing included. Medians of
`--repeats` passes, the two paths alternating.

S2: a power-law stream (Zipf exponent 1.1 over a random ranking of the vertices) of classification
requests of 4 targets, from 16 client threads with 8 requests in flight each; the server under a
512M memlimit with `--memory` 84M: the runtime (24 MiB) and the registered graph (21 MiB) come
off it, and the page cache keeps 24 MiB, a quarter of the 98 MiB of features (13 MiB beside the
embedding cache), as `--memory 24M` gave it before the server planned its runtime and graphs.
Configurations: everything on (batching window 2 ms, request re-ordering, groups of S = 256,
Alg. 2), each of the four off alone (batching: `--max-batch 1`; grouping: S = 1, each vertex on
its own as GLIST's baseline runs commands), all four off (GLIST's N), and everything on plus the
embedding cache (GLIST's C, a quarter of `--memory`). A fresh server per run, medians of
`--repeats` runs with the configurations alternating; the first quarter of the stream warms the
caches and is not counted. Reported: requests/s, page lookups and page-cache hit rate, MB read
from disk, server-side latency p50/p99.

S3: 16 client threads for `--s3-seconds`, each mixing classifications (8 targets), link
predictions, vertex additions, updates, edge additions and removals; folds every 10 s
(`--s3-fold-after`), and past `--s3-seconds` until the clients made `--s3-min-calls` calls in all
(the load test: whatever the machine's load, a thousand calls and a fold). Reported:
latency p50/p99 per operation, mutations/s, errors, and a check after the run and again after a
restart that every acknowledged mutation is present (features, in-neighbours, node and edge
counts). `--s3-mix mutations` leaves the analyses out, so the clients only mutate: the rate the
write path (log append, fdatasync, group commit) sustains for one graph.

Q: GraphSAGE (mean), GCN and GIN trained on Cora (`strata gnn train`, 20 epochs), exported,
registered in fp32 and int8, and asked to classify the test nodes: accuracy of each and how
often the two agree.

Results go to bench-results/serve-{s1,s2,s3,q}.json and the serve-* sections of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from common import MEMLIMIT, REPO, SHARED, machine, memlimit_available, save, strata, timed, update_doc
from strata.gnn import export_model
from strata.serve import Client, ServiceError

GRAPH = "g"
MODEL = "sage"
DIM, HIDDEN, CLASSES, FANOUTS = 128, 128, 16, [10, 5]


# Data and models ---------------------------------------------------------------------------


def sbm_store(work: Path, nodes: int) -> Path:
    """The S1 to S3 graph, generated and converted once."""
    store = work / f"sbm-n{nodes}-f{DIM}.strata"
    if store.exists():
        return store
    raw = work / f"sbm-n{nodes}-raw"
    progress(f"generating {store.name}")
    timed(strata("generate", "sbm", "--out", raw, "--nodes", nodes, "--classes", CLASSES, "--avg-degree", 10,
                 "--feature-dim", DIM, "--overwrite", "-q"))  # fmt: skip
    timed(strata("convert", raw, "--symmetrize", "--out", store, "-q"))
    shutil.rmtree(raw)
    return store


def sage_weights(path: Path, seed: int = 0):
    """A random 2-layer GraphSAGE (mean) exported to ``path``; returns the torch model."""
    import torch

    from strata.gnn.models import GNN

    torch.manual_seed(seed)
    model = GNN("sage", DIM, HIDDEN, CLASSES, layers=2).eval()
    export_model(model, path, fanouts=FANOUTS)
    return model


def num_nodes(store: Path) -> int:
    return json.loads((store / "manifest.json").read_text())["graph"]["num_nodes"]


# The server and what crosses its socket ---------------------------------------------------


class Server:
    """A ``strata serve`` child on a free loopback port (under ``memlimit LIMIT`` when given)."""

    def __init__(self, state: Path, *args, limit: str | None = None):
        cmd = strata("serve", *args, "--listen", "127.0.0.1:0", "--state-dir", state)
        if limit:
            cmd = [str(MEMLIMIT), limit, *cmd]
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.limited = bool(limit)
        self.head: list[str] = []
        for line in self.proc.stdout:
            self.head.append(line.rstrip())
            if line.startswith("listening on "):
                self.addr = line.split()[2]
                self.port = int(self.addr.rsplit(":", 1)[1])
                return
        self.stderr.seek(0)
        raise SystemExit(f"strata serve did not start: {' '.join(map(str, cmd))}\n{self.stderr.read()[-3000:]}")

    def client(self) -> Client:
        c = Client(self.addr, timeout=600)
        c.wait_ready()
        return c

    def stop(self) -> str:
        """SIGTERM, then the stop summary it printed."""
        pid = self.proc.pid
        if self.limited:  # the server is memlimit's child; memlimit reports its status
            pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        rest, _ = self.proc.communicate(timeout=300)
        self.stderr.seek(0)
        if self.proc.returncode != 0:
            raise SystemExit(f"strata serve exited {self.proc.returncode}:\n{self.stderr.read()[-3000:]}")
        return rest


def wire_bytes(port: int) -> int:
    """TCP payload bytes sent and received so far by this machine's connections to ``port``."""
    out = subprocess.run(["ss", "-tinH", "state", "all", f"( dport = :{port} )"], capture_output=True, text=True)
    return sum(int(n) for n in re.findall(r"bytes_(?:sent|received):(\d+)", out.stdout))


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


# S1: near-data against pulling ------------------------------------------------------------


def s1(args) -> dict:
    import torch

    from strata.gnn.models import Block

    # The pull path hands torch the read-only rows as they arrived (the forward never writes
    # them); a copy to silence the warning would slow that path down.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    store = sbm_store(args.work, args.nodes)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        tmp = Path(tmp)
        model = sage_weights(tmp / "sage.safetensors")
        srv = Server(tmp / "state", f"{GRAPH}={store}", "--memory", "1G", "--no-embedding-cache")
        c = srv.client()
        c.register_model(MODEL, tmp / "sage.safetensors")
        targets = np.random.default_rng(0).choice(num_nodes(store), 10_000, replace=False)
        chunks = [targets[i : i + 256] for i in range(0, len(targets), 256)]

        def near() -> np.ndarray:
            return np.concatenate([c.classify(GRAPH, MODEL, ch)[0] for ch in chunks])

        def pull() -> np.ndarray:
            labels = []
            for ch in chunks:
                nb = c.sample_neighbors(GRAPH, ch, FANOUTS, seed=0, batch_key=0)
                x = torch.from_numpy(c.get_features(GRAPH, nb.nodes))
                blocks = [Block.from_csc(b.num_src, b.num_dst, b.indptr, b.indices) for b in nb.blocks]
                with torch.no_grad():
                    labels.append(model(blocks, x).argmax(1).numpy())
            return np.concatenate(labels)

        paths = {"near-data": near, "pull": pull}
        runs: dict[str, list[dict]] = {name: [] for name in paths}
        got = {name: fn() for name, fn in paths.items()}  # warm-up: every page read once
        for _ in range(args.repeats):
            for name, fn in paths.items():
                b0, t0 = wire_bytes(srv.port), time.perf_counter()
                got[name] = fn()
                seconds, moved = time.perf_counter() - t0, wire_bytes(srv.port) - b0
                runs[name].append({"seconds": seconds, "bytes": moved, "targets_per_s": len(targets) / seconds})
                progress(f"S1 {name}: {len(targets) / seconds:,.0f} targets/s, {moved / 1e6:.2f} MB")
        status = c.status()
        c.close()
        srv.stop()
    res = {"targets": len(targets), "request_targets": 256, "runs": runs}
    for name, rs in runs.items():
        res[name] = {
            "targets_per_s": statistics.median(r["targets_per_s"] for r in rs),
            "bytes_per_target": statistics.median(r["bytes"] for r in rs) / len(targets),
        }
    res["agreement"] = float(np.mean(got["near-data"] == got["pull"]))
    res["bytes_ratio"] = res["pull"]["bytes_per_target"] / res["near-data"]["bytes_per_target"]
    res["throughput_ratio"] = res["near-data"]["targets_per_s"] / res["pull"]["targets_per_s"]
    res["page_cache_hit_rate"] = status["page_cache"]["hit_rate"]
    return res


def s1_markdown(res: dict, nodes: int, repeats: int) -> str:
    lines = [
        f"### S1: near-data classification against pulling to the client (`benches/bench_serve.py --only s1`, "
        f"{nodes:,}-node SBM)",
        "",
        f"{res['targets']:,} targets in requests of {res['request_targets']}, 2-layer GraphSAGE (mean), fanouts "
        f"10,5, 128 float32 features; medians of {repeats} passes after a warm-up pass (page cache hit rate "
        f"{100 * res['page_cache_hit_rate']:.1f}%). Client and server share the 2 cores over loopback.",
        "",
        "| path | targets/s | bytes per target (TCP) |",
        "|---|---|---|",
    ]
    for name in ("near-data", "pull"):
        r = res[name]
        lines.append(f"| {name} | {r['targets_per_s']:,.0f} | {r['bytes_per_target']:,.0f} |")
    lines += [
        "",
        f"- Bytes: near-data moves **{res['bytes_ratio']:.0f}x fewer** (target at least 10x).",
        f"- Throughput: near-data is **{res['throughput_ratio']:.2f}x** the pull path (target at least 2x).",
        f"- The two paths gave the same class for {100 * res['agreement']:.2f}% of the targets (same sampled "
        "neighbourhoods, native kernels against PyTorch).",
    ]
    return "\n".join(lines)


# S2: the scheduling ablations -------------------------------------------------------------

#: Each S2 configuration: server flags, and whether the graph is registered with Alg. 2.
NO_C = "--no-embedding-cache"
S2_CONFIGS: dict[str, tuple[list[str], bool]] = {
    "all on (B R S G)": ([NO_C], True),
    "no batching": ([NO_C, "--max-batch", "1"], True),
    "no request re-ordering": ([NO_C, "--no-reorder-requests"], True),
    "no grouping (S = 1)": ([NO_C, "--group-size", "1"], True),
    "no Alg. 2": ([NO_C], False),
    "all off (N)": ([NO_C, "--max-batch", "1", "--no-reorder-requests", "--group-size", "1"], False),
    "all on + embedding cache (C)": ([], True),
}
S2_CLIENTS, S2_DEPTH, S2_TARGETS = 16, 8, 4


def zipf_stream(n: int, requests: int, seed: int = 0) -> np.ndarray:
    """``(requests, S2_TARGETS)`` vertex ids: Zipf(1.1) ranks over a random ranking of ``n`` vertices."""
    rng = np.random.default_rng(seed)
    ranking = rng.permutation(n)
    weights = 1.0 / np.arange(1, n + 1) ** 1.1
    return ranking[rng.choice(n, size=(requests, S2_TARGETS), p=weights / weights.sum())]


def drive(addr: str, stream: np.ndarray, clients: int, depth: int) -> tuple[float, list[float]]:
    """Sends ``stream``'s requests from ``clients`` threads, ``depth`` in flight each; returns the
    seconds taken and the server-side latency of each request."""
    latencies: list[float] = []
    failures: list[BaseException] = []

    def work(rows: np.ndarray) -> None:
        try:
            with Client(addr, timeout=600) as c:
                for i in range(0, len(rows), depth):
                    ids = [c.analyze(GRAPH, MODEL, "classification", r) for r in rows[i : i + depth]]
                    latencies.extend(c.wait(rid).latency_s for rid in ids)
        except BaseException as e:  # reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(stream[k::clients],)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"S2 client failed: {failures[0]!r}")
    return time.perf_counter() - t0, latencies


def locality_stream(store: Path, requests: int, locality: float, seed: int = 0) -> np.ndarray:
    """GLIST's N-L request generator (Eq. 7): the Zipf stream, except that with probability
    ``locality`` a request's targets are out-neighbours of the previous request's first target,
    so adjacent requests share most of their sampled subgraphs."""
    indptr = np.load(store / "csr_indptr.npy", mmap_mode="r")
    indices = np.load(store / "csr_indices.npy", mmap_mode="r")
    out = zipf_stream(len(indptr) - 1, requests, seed)
    rng = np.random.default_rng(seed + 1)
    for i in range(1, requests):
        v = out[i - 1, 0]
        neighbours = indices[indptr[v] : indptr[v + 1]]
        if len(neighbours) and rng.random() < locality:
            out[i] = rng.choice(neighbours, S2_TARGETS)
    return out


def s2(args) -> dict:
    store = sbm_store(args.work, args.nodes)
    streams = {
        "Zipf": (zipf_stream(num_nodes(store), args.s2_requests), list(S2_CONFIGS)),
        f"Zipf, locality {args.s2_locality:g}": (
            locality_stream(store, args.s2_requests, args.s2_locality),
            ["all on (B R S G)", "no request re-ordering", "no Alg. 2"],
        ),
    }
    limit = "512M" if memlimit_available() else None
    runs: dict[str, list[dict]] = {f"{st}: {name}": [] for st, (_, names) in streams.items() for name in names}
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        tmp = Path(tmp)
        sage_weights(tmp / "sage.safetensors")
        for _ in range(args.repeats):  # configurations alternate, so drift hits them alike
            for st, (stream, names) in streams.items():
                for name in names:
                    r = s2_run(store, tmp, stream, name, args.s2_memory, limit)
                    runs[f"{st}: {name}"].append(r)
                    progress(f"S2 {st}: {name}: {r['requests_per_s']:,.0f} req/s, "
                          f"hit {100 * r['page_cache_hit_rate']:.1f}%, {r['mb_read']:.0f} MB read, "
                          f"p50 {r['p50_ms']:.1f} ms")  # fmt: skip
    rows = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
        for name, rs in runs.items()
    }
    return {"requests": args.s2_requests * 3 // 4, "memory": args.s2_memory, "memlimit": limit,
            "repeats": args.repeats, "locality": args.s2_locality, "rows": rows, "runs": runs}  # fmt: skip


def s2_run(store: Path, tmp: Path, stream: np.ndarray, config: str, memory: str, limit: str | None) -> dict:
    """One S2 configuration on a fresh server: the stream's first quarter warms the caches, the
    rest is measured."""
    flags, alg2 = S2_CONFIGS[config]
    warm, measured = stream[: len(stream) // 4], stream[len(stream) // 4 :]
    shutil.rmtree(tmp / "state", ignore_errors=True)
    srv = Server(tmp / "state", "--memory", memory, "--data-root", store.parent, *flags, limit=limit)
    with srv.client() as c:
        c.register_graph(GRAPH, store, reorder=alg2)
        c.register_model(MODEL, tmp / "sage.safetensors")
        drive(srv.addr, warm, S2_CLIENTS, S2_DEPTH)
        before = c.status()
        seconds, lat = drive(srv.addr, measured, S2_CLIENTS, S2_DEPTH)
        after = c.status()
    srv.stop()
    r = s2_counts(before, after, NO_C not in flags)
    r.update(requests_per_s=len(measured) / seconds, p50_ms=1e3 * pct(lat, 50), p99_ms=1e3 * pct(lat, 99))
    return r


def s2_counts(before: dict, after: dict, embeddings: bool) -> dict:
    """Page-cache and embedding-cache counters between two ``Status`` answers."""

    def delta(cache: str, key: str) -> int:
        return after[cache][key] - before[cache][key]

    lookups = delta("page_cache", "hits") + delta("page_cache", "misses")
    emb = delta("embedding_cache", "hits") + delta("embedding_cache", "misses")
    return {
        "page_lookups": lookups,
        "page_cache_hit_rate": delta("page_cache", "hits") / max(lookups, 1),
        "embedding_cache_hit_rate": delta("embedding_cache", "hits") / max(emb, 1) if embeddings else None,
        "mb_read": delta("page_cache", "bytes_read") / 1e6,
    }


def s2_markdown(res: dict, nodes: int) -> str:
    rows = res["rows"]
    lines = [
        f"### S2: GLIST's mechanisms on a power-law stream (`benches/bench_serve.py --only s2`, {nodes:,}-node SBM)",
        "",
        f"{res['requests']:,} classification requests of {S2_TARGETS} targets (after a warm-up quarter), "
        f"{S2_CLIENTS} clients x {S2_DEPTH} in flight; server `--memory {res['memory']}` under a "
        f"{res['memlimit'] or 'no'} memlimit; a fresh server per run, medians of {res['repeats']} runs per "
        "configuration. Zipf: targets drawn Zipf(1.1); locality: in addition, with that probability a request's "
        "targets are neighbours of the previous request's (GLIST's N-L generator). Page lookups count each distinct "
        "page of a fused group once.",
        "",
        "| stream: configuration | requests/s | vs all on | vs N | page lookups | page-cache hit rate | MB read | "
        "p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    none = rows["Zipf: all off (N)"]["requests_per_s"]
    for name, r in rows.items():
        stream = name.split(": ")[0]
        base = rows[f"{stream}: all on (B R S G)"]["requests_per_s"]
        vs_n = f"{r['requests_per_s'] / none:.2f}x" if stream == "Zipf" else ""
        hit = f"{100 * r['page_cache_hit_rate']:.1f}%"
        if "embedding_cache_hit_rate" in r:
            hit += f" (embeddings {100 * r['embedding_cache_hit_rate']:.1f}%)"
        lines.append(
            f"| {name} | {r['requests_per_s']:,.0f} | {r['requests_per_s'] / base:.2f}x | {vs_n} | "
            f"{r['page_lookups'] / 1e3:,.0f}k | {hit} | {r['mb_read']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    return "\n".join(lines)


# S3: many clients, analyses and mutations --------------------------------------------------


class Calls:
    """The calls S3's clients have made together, against the least the run must make."""

    def __init__(self, least: int):
        self.least, self.made, self.lock = least, 0, threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.made += 1

    def enough(self) -> bool:
        return self.made >= self.least


class Mixer(threading.Thread):
    """One S3 client: a random mix of analyses and mutations until ``deadline`` and until the
    clients together made ``calls.least`` calls; records the
    latency of each call and what its acknowledged mutations left in the graph. Edges are added
    only into this client's own vertices, so their in-neighbours are known exactly here."""

    OPS = (("classify", 0.4), ("link", 0.1), ("add", 0.15), ("update", 0.1), ("add_edges", 0.17),
           ("remove_edges", 0.08))  # fmt: skip

    MUTATIONS = ("add", "update", "add_edges", "remove_edges")

    def __init__(self, addr: str, base_nodes: int, deadline: float, seed: int, mix: str, calls: Calls):
        super().__init__(daemon=True)
        self.addr, self.base_nodes, self.deadline, self.calls = addr, base_nodes, deadline, calls
        self.ops = [(op, w) for op, w in self.OPS if mix == "mixed" or op in self.MUTATIONS]
        self.rng, self.nprng = random.Random(seed), np.random.default_rng(seed)
        self.latency: dict[str, list[float]] = {op: [] for op, _ in self.OPS}
        self.errors: list[str] = []
        self.rows: dict[int, np.ndarray] = {}  # own vertex -> last acknowledged row
        self.edges: set[tuple[int, int]] = set()

    def run(self) -> None:
        ops, weights = zip(*self.ops, strict=True)
        with Client(self.addr, timeout=120) as c:
            while time.monotonic() < self.deadline or not self.calls.enough():
                op = self.rng.choices(ops, weights)[0]
                if op in ("update", "add_edges", "remove_edges") and not self.rows:
                    op = "add"
                if op == "remove_edges" and not self.edges:
                    op = "add_edges"
                t0 = time.perf_counter()
                self.calls.add()
                try:
                    getattr(self, op)(c)
                except ServiceError as e:
                    self.errors.append(f"{op}: {e.code} {e}")
                    continue
                self.latency[op].append(time.perf_counter() - t0)

    def targets(self, k: int) -> list[int]:
        own = list(self.rows)
        return [self.rng.choice(own) if own and self.rng.random() < 0.2 else self.rng.randrange(self.base_nodes)
                for _ in range(k)]  # fmt: skip

    def classify(self, c: Client) -> None:
        c.classify(GRAPH, MODEL, self.targets(8))

    def link(self, c: Client) -> None:
        c.predict_links(GRAPH, MODEL, self.targets(4), self.targets(4))

    def add(self, c: Client) -> None:
        rows = self.nprng.standard_normal((self.rng.randint(1, 4), DIM)).astype(np.float32)
        ids = c.add_vertices(GRAPH, rows)
        self.rows.update(zip(ids.tolist(), rows, strict=True))

    def update(self, c: Client) -> None:
        ids = self.rng.sample(list(self.rows), min(len(self.rows), self.rng.randint(1, 3)))
        rows = self.nprng.standard_normal((len(ids), DIM)).astype(np.float32)
        c.update_vertices(GRAPH, ids, rows)
        self.rows.update(zip(ids, rows, strict=True))

    def add_edges(self, c: Client) -> None:
        pairs = {(self.rng.randrange(self.base_nodes), self.rng.choice(list(self.rows))) for _ in range(3)}
        pairs -= self.edges
        if pairs:
            c.add_edges(GRAPH, [u for u, _ in pairs], [v for _, v in pairs])
            self.edges |= pairs

    def remove_edges(self, c: Client) -> None:
        pairs = self.rng.sample(sorted(self.edges), min(len(self.edges), 2))
        c.remove_edges(GRAPH, [u for u, _ in pairs], [v for _, v in pairs])
        self.edges.difference_update(pairs)


def s3_verify(c: Client, mixers: list[Mixer], base_nodes: int, base_edges: int) -> dict:
    """Every acknowledged mutation is in the served graph; returns what was checked."""
    (info,) = c.status()["graphs"]
    rows = {v: r for m in mixers for v, r in m.rows.items()}
    edges = {e for m in mixers for e in m.edges}
    problems = []
    if info["num_nodes"] != base_nodes + len(rows):
        problems.append(f"num_nodes {info['num_nodes']}, expected {base_nodes + len(rows)}")
    if info["num_edges"] != base_edges + len(edges):
        problems.append(f"num_edges {info['num_edges']}, expected {base_edges + len(edges)}")
    added = sorted(rows)
    if not np.array_equal(c.get_features(GRAPH, added), np.stack([rows[v] for v in added])):
        problems.append("a feature row differs from its last acknowledged value")
    nb = c.sample_neighbors(GRAPH, added, [-1])
    (block,) = nb.blocks
    want: dict[int, list[int]] = {v: [] for v in added}
    for u, v in edges:
        want[v].append(u)
    for i, v in enumerate(added):
        got = sorted(nb.nodes[block.indices[block.indptr[i] : block.indptr[i + 1]]].tolist())
        if got != sorted(want[v]):
            problems.append(f"vertex {v}: in-neighbours {got[:5]}..., expected {sorted(want[v])[:5]}...")
            break
    if problems:
        raise SystemExit("S3: acknowledged mutations missing:\n" + "\n".join(problems))
    return {"vertices": len(rows), "edges": len(edges), "version": info["version"], "last_lsn": info["last_lsn"]}


def s3(args) -> dict:
    store = sbm_store(args.work, args.nodes)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        tmp = Path(tmp)
        sage_weights(tmp / "sage.safetensors")
        flags = ["--memory", "256M", "--fold-after", str(args.s3_fold_after)]
        srv = Server(tmp / "state", f"{GRAPH}={store}", *flags)
        with srv.client() as c:
            c.register_model(MODEL, tmp / "sage.safetensors")
            (info,) = c.status()["graphs"]
        base_nodes, base_edges = info["num_nodes"], info["num_edges"]
        deadline = time.monotonic() + args.s3_seconds
        calls = Calls(args.s3_min_calls)
        mixers = [Mixer(srv.addr, base_nodes, deadline, seed, args.s3_mix, calls) for seed in range(16)]
        t0 = time.perf_counter()
        for m in mixers:
            m.start()
        for m in mixers:
            m.join()
        seconds = time.perf_counter() - t0
        with srv.client() as c:
            live = s3_verify(c, mixers, base_nodes, base_edges)
        srv.stop()
        srv = Server(tmp / "state", *flags)
        with srv.client() as c:
            restarted = s3_verify(c, mixers, base_nodes, base_edges)
        srv.stop()
    ops = {}
    for op, _ in Mixer.OPS:
        lat = [x for m in mixers for x in m.latency[op]]
        ops[op] = {"count": len(lat), "p50_ms": 1e3 * pct(lat, 50), "p99_ms": 1e3 * pct(lat, 99)}
    errors = [e for m in mixers for e in m.errors]
    total = sum(o["count"] for o in ops.values())
    mutations = sum(ops[op]["count"] for op in Mixer.MUTATIONS)
    progress(
        f"S3 ({args.s3_mix}): {total:,} calls in {seconds:.0f} s, {mutations / seconds:,.0f} mutations/s, "
        f"{len(errors)} errors; after restart {restarted}"
    )
    return {
        "mix": args.s3_mix,
        "seconds": seconds,
        "ops": ops,
        "calls": total,
        "mutations_per_s": mutations / seconds,
        "errors": errors,
        "live": live,
        "restarted": restarted,
    }


def s3_markdown(res: dict, nodes: int) -> str:
    lines = [
        f"### S3: 16 clients mixing analyses and mutations (`benches/bench_serve.py --only s3`, {nodes:,}-node SBM)",
        "",
        f"Mix: {res['mix']}. {res['calls']:,} calls in {res['seconds']:.0f} s "
        f"({res['calls'] / res['seconds']:,.0f}/s, of them {res['mutations_per_s']:,.0f} mutations/s), "
        f"**{len(res['errors'])} errors**; folds every 10 s (store version {res['live']['version']} at the end).",
        "",
        "| operation | calls | p50 ms | p99 ms |",
        "|---|---|---|---|",
    ]
    for op, r in res["ops"].items():
        lines.append(f"| {op} | {r['count']:,} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    r = res["restarted"]
    lines += [
        "",
        f"Every acknowledged mutation was present after the run and again after a restart: {r['vertices']:,} "
        f"added vertices with their last features, {r['edges']:,} added edges as in-neighbours, exact node and "
        f"edge counts (last LSN {r['last_lsn']:,}).",
    ]
    return "\n".join(lines)


# Q: what int8 costs -----------------------------------------------------------------------

Q_DATASETS = ("cora", "citeseer")
Q_KINDS = {"sage": "25,10", "gcn": "10,10", "gin": "10,10"}


def q(args) -> dict:
    rows = {}
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        tmp = Path(tmp)
        srv = Server(tmp / "state", "--data-root", args.work)
        with srv.client() as c:
            for dataset in Q_DATASETS:
                store = args.work / f"{dataset}.strata"
                if not store.exists():
                    timed(strata("convert", SHARED / "datasets" / "planetoid", "--name", dataset, "--out", store, "-q"))
                c.register_graph(dataset, store)
                for kind, fanouts in Q_KINDS.items():
                    rows[f"{dataset}/{kind}"] = q_one(c, store, dataset, kind, fanouts, tmp)
                    progress(f"Q {dataset}/{kind}: {rows[f'{dataset}/{kind}']}")
        srv.stop()
    return {"rows": rows}


def q_one(c: Client, store: Path, dataset: str, kind: str, fanouts: str, tmp: Path) -> dict:
    """Trains ``kind`` on ``store``, serves it in fp32 and int8; test accuracies and agreement."""
    import torch

    from strata.gnn.models import GNN

    test, labels = np.load(store / "node_test.npy"), np.load(store / "labels.npy")
    dim = json.loads((store / "manifest.json").read_text())["arrays"]["features"]["shape"][1]
    run_dir = tmp / f"run-{dataset}-{kind}"
    train = ["--model", kind, "--fanouts", fanouts, "--hidden", 64, "--epochs", 20, "--device", "cpu", "--seed", 0]
    res = timed(strata("gnn", "train", store, "--run-dir", run_dir, *train, "-q", "--json-summary"))
    model = GNN(kind, dim, 64, int(labels.max()) + 1, layers=2)
    model.load_state_dict(torch.load(run_dir / "best.pt"))
    weights = export_model(
        model.eval(), tmp / f"{dataset}-{kind}.safetensors", fanouts=list(map(int, fanouts.split(",")))
    )
    got = {}
    for precision in ("fp32", "int8"):
        name = f"{dataset}-{kind}-{precision}"
        c.register_model(name, weights, precision=precision)
        got[precision] = c.classify(dataset, name, test)[0]
    return {
        "test_nodes": len(test),
        "trained_test_accuracy": json.loads(res["stdout"])["test"]["accuracy"],
        "fp32": float(np.mean(got["fp32"] == labels[test])),
        "int8": float(np.mean(got["int8"] == labels[test])),
        "agreement": float(np.mean(got["fp32"] == got["int8"])),
    }


def q_markdown(res: dict) -> str:
    lines = [
        "### Q: the accuracy int8 costs, Cora and CiteSeer (`benches/bench_serve.py --only q`)",
        "",
        "Models trained by `strata gnn train` (hidden 64, 20 epochs, best validation epoch), exported, served in "
        "fp32 and int8 (weights per output channel, inputs per row, i32 accumulation) and asked for the classes of "
        "the test nodes. GLIST's Table 6 reports 79.1% (float-32) against 77.1% (fixed-8) for GCN on Cora.",
        "",
        "| dataset/model | fanouts | trained (PyTorch) | served fp32 | served int8 | int8 - fp32 | same class |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in res["rows"].items():
        lines.append(
            f"| {key} | {Q_KINDS[key.split('/')[1]]} | {100 * r['trained_test_accuracy']:.1f}% | "
            f"{100 * r['fp32']:.1f}% | {100 * r['int8']:.1f}% | {100 * (r['int8'] - r['fp32']):+.1f} points | "
            f"{100 * r['agreement']:.1f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="s1,s2,s3,q")
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--s2-requests", type=int, default=4000)
    p.add_argument("--s2-memory", default="84M")
    p.add_argument("--s2-locality", type=float, default=0.8)
    p.add_argument("--s3-seconds", type=float, default=60.0)
    p.add_argument("--s3-fold-after", type=float, default=10.0, help="the server's --fold-after (seconds)")
    p.add_argument("--s3-min-calls", type=int, default=0, help="S3 runs on past --s3-seconds until this many calls")
    p.add_argument("--s3-mix", choices=("mixed", "mutations"), default="mixed")
    p.add_argument("--work", type=Path, default=REPO / "bench-data" / "serve")
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of recording them (the load test)"
    )
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    parts = {
        "s1": (s1, lambda res: s1_markdown(res, args.nodes, args.repeats)),
        "s2": (s2, lambda res: s2_markdown(res, args.nodes)),
        "s3": (s3, lambda res: s3_markdown(res, args.nodes)),
        "q": (q, q_markdown),
    }
    results = {}
    for name in args.only.split(","):
        run, markdown = parts[name]
        results[name] = res = run(args)
        if not args.json:
            save(f"serve-{name}", {"machine": machine(), **res})
            update_doc(f"serve-{name}", markdown(res))
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
