"""A typed client of ``strata serve`` (the gRPC schema is ``proto/strata/serve/v1/serve.proto``).

Node ids are store ids; arrays come back as NumPy arrays. Every call raises
:class:`ServiceError` (with the gRPC status code name in ``code``) when the server refuses it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from .. import tokens
from ..errors import ConfigError, StrataError
from ..layer_kinds import served_kind
from ..units import check_seconds, parse_size
from . import _proto

#: Default address of ``strata serve``.
DEFAULT_ADDRESS = "127.0.0.1:7100"
#: Environment variable holding the shared-secret token.
TOKEN_ENV = "STRATA_SERVE_TOKEN"
#: The largest message gRPC's channel options take (a C int).
MAX_MESSAGE_BYTES = (1 << 31) - 1

TASKS = {
    "embedding": "TASK_NODE_EMBEDDING",
    "classification": "TASK_NODE_CLASSIFICATION",
    "link": "TASK_LINK_PREDICTION",
}


class ServiceError(StrataError):
    """The server refused a call; ``code`` is the gRPC status name (``NOT_FOUND``, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Block:
    """One layer of a sampled neighbourhood in local ids (as ``strata.gnn.models.Block.from_csc``
    takes it): destination ``i``'s sources are ``indices[indptr[i]:indptr[i + 1]]``."""

    num_src: int
    num_dst: int
    indptr: np.ndarray
    indices: np.ndarray


@dataclass
class Neighbourhood:
    """``SampleNeighbors``'s answer: ``nodes`` (store ids by local id, seeds first),
    ``hop_counts`` and ``blocks`` (input layer first)."""

    nodes: np.ndarray
    hop_counts: np.ndarray
    blocks: list[Block]


@dataclass
class AnalysisResult:
    """One analysis: ``state`` is ``PENDING``, ``DONE`` or ``FAILED``. Embeddings and class
    probabilities are in ``values`` ``(targets, width)``; classes in ``labels``; link scores in
    ``scores``. Latencies in seconds."""

    request_id: int
    state: str
    task: str
    values: np.ndarray | None
    labels: np.ndarray | None
    scores: np.ndarray | None
    error: str
    latency_s: float
    queued_s: float


class Mutations:
    """A batch of mutations for :meth:`Client.mutate`, built in order; each method mirrors the
    client's single mutation of the same name and returns the batch, so calls chain::

        batch = Mutations().add_vertices(rows).add_edges([0, 1], [2, 3])
    """

    def __init__(self) -> None:
        self._items: list = []

    def __len__(self) -> int:
        return len(self._items)

    def _add(self, kind: str, message: str, **fields) -> Mutations:
        self._items.append(_proto.message("Mutation")(**{kind: _proto.message(message)(**fields)}))
        return self

    def add_vertices(self, features: np.ndarray) -> Mutations:
        """Adds one vertex per row of ``features`` ``(n, dim)``."""
        return self._add("add_vertex", "AddVertexRequest", features=_tensor(features))

    def remove_vertices(self, ids: Sequence[int]) -> Mutations:
        """Removes vertices and all their edges."""
        return self._add("remove_vertex", "RemoveVertexRequest", ids=_ids(ids))

    def update_vertices(self, ids: Sequence[int], features: np.ndarray) -> Mutations:
        """Replaces the feature rows of ``ids``."""
        return self._add("update_vertex", "UpdateVertexRequest", ids=_ids(ids), features=_tensor(features))

    def add_edges(self, src: Sequence[int], dst: Sequence[int]) -> Mutations:
        """Adds edges ``src[i] -> dst[i]``."""
        return self._add("add_edge", "EdgeRequest", src=_ids(src), dst=_ids(dst))

    def remove_edges(self, src: Sequence[int], dst: Sequence[int]) -> Mutations:
        """Removes every copy of each edge ``src[i] -> dst[i]``."""
        return self._add("remove_edge", "EdgeRequest", src=_ids(src), dst=_ids(dst))


@dataclass
class MutateResult:
    """An acknowledged batch: ``lsn`` is the one log record holding all of it; per mutation, in
    order, ``applied`` (vertices or edges it applied to) and ``ids`` (the new vertices' ids for an
    addition, empty otherwise)."""

    lsn: int
    applied: list[int]
    ids: list[np.ndarray]


def _tensor(values: np.ndarray):
    arr = np.ascontiguousarray(values, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"features: expected a 2-D array (rows, dim), got shape {arr.shape}")
    return _proto.message("Tensor")(
        shape=list(arr.shape), dtype=_proto.enum_value("ElementType", "ELEMENT_TYPE_FLOAT32"), data=arr.tobytes()
    )


def _array(t) -> np.ndarray:
    return np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))


def _plain(msg) -> dict:
    """A message as plain Python values (64-bit integers stay ints, enums become names)."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        # protobuf 6 has `is_repeated`; older versions only `label`.
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED

        def one(v, f=f):
            if f.message_type is not None:
                return _plain(v)
            if f.enum_type is not None:
                return f.enum_type.values_by_number[v].name if v in f.enum_type.values_by_number else v
            return v

        out[f.name] = [one(v) for v in value] if repeated else one(value)
    return out


def _ids(ids) -> list[int]:
    return [int(i) for i in np.asarray(ids, dtype=np.int64).ravel()]


def resolve_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """The token of ``strata serve``: :func:`strata.tokens.resolve_token` with
    ``$STRATA_SERVE_TOKEN`` as the environment's."""
    return tokens.resolve_token(token, token_file, TOKEN_ENV)


class Client:
    """Talks to one ``strata serve``. The token is ``token``, else the one in ``token_file``,
    else ``$STRATA_SERVE_TOKEN`` (:func:`resolve_token`); ``timeout`` is per call, in seconds
    (finite, positive); ``max_message_bytes`` bounds each message both ways (at most
    :data:`MAX_MESSAGE_BYTES`)."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        token: str | None = None,
        token_file: str | os.PathLike | None = None,
        timeout: float = 120.0,
        max_message_bytes: int = 256 << 20,
    ):
        try:
            timeout = check_seconds(timeout)
        except ValueError as e:
            raise ConfigError(f"Client: timeout {e}") from None
        # gRPC's channel options are C ints.
        if isinstance(max_message_bytes, bool) or not (
            isinstance(max_message_bytes, int) and 0 < max_message_bytes <= MAX_MESSAGE_BYTES
        ):
            raise ConfigError(
                f"Client: max_message_bytes must be an integer from 1 to {MAX_MESSAGE_BYTES}, got {max_message_bytes!r}"
            )
        self.address = address
        self.timeout = timeout
        token = resolve_token(token, token_file)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._channel = grpc.insecure_channel(address, options=options)
        self._calls = {}
        for name, (req, resp, streaming) in _proto.METHODS.items():
            make = self._channel.unary_stream if streaming else self._channel.unary_unary
            self._calls[name] = (
                _proto.message(req),
                make(
                    f"/{_proto.SERVICE}/{name}",
                    request_serializer=_proto.message(req).SerializeToString,
                    response_deserializer=_proto.message(resp).FromString,
                ),
            )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, timeout: float | None = None, **fields):
        request_cls, stub = self._calls[method]
        try:
            return stub(request_cls(**fields), timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _stream(self, method: str, **fields) -> Iterator:
        """The messages of a server-streaming call."""
        request_cls, stub = self._calls[method]
        try:
            yield from stub(request_cls(**fields), timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: grpc.RpcError) -> ServiceError:
        """``e`` as a ServiceError; gRPC's own words for a server nobody runs (a connection
        refused) say where the client looked and what starts one."""
        details = e.details() or ""
        if e.code() == grpc.StatusCode.UNAVAILABLE and details.startswith("failed to connect"):
            details = f"no Strata server answers on {self.address} ({details}); start one with `strata serve`"
        return ServiceError(e.code().name, details)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Blocks until the server answers (it may still be starting)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise ServiceError("UNAVAILABLE", f"no server answered on {self.address} within {timeout} s") from None

    # Registration -----------------------------------------------------------------------

    def register_graph(
        self,
        name: str,
        store: str | Path,
        *,
        reorder: bool = True,
        hops: int = 1,
        centers: int = 0,
        max_degree: int = 0,
        seed: int = 0,
    ) -> dict:
        """Registers the store at ``store`` (a path on the server, under one of its data roots) as
        ``name``; with ``reorder``, GLIST's Alg. 2 re-numbers vertices for page locality (``hops`` =
        h, ``centers`` = Cn with 0 for automatic, ``max_degree`` = Td with 0 for no limit). Returns
        the graph's info."""
        options = _proto.message("ReorderOptions")(
            enabled=reorder, hops=hops, centers=centers, max_degree=max_degree, seed=seed
        )
        info = self._call("GraphRegister", name=name, store_path=str(store), reorder=options)
        return _plain(info)

    def unregister_graph(self, name: str) -> None:
        self._call("GraphUnregister", name=name)

    def register_model(
        self,
        name: str,
        path: str | Path,
        *,
        upload: bool = True,
        format: str | None = None,
        architecture: dict | None = None,
        precision: str = "fp32",
    ) -> dict:
        """Registers a weights file exported by :func:`strata.gnn.export_model`. With ``upload``
        its bytes are sent; otherwise ``path`` names a file on the server, under one of its data
        roots. ``architecture`` (``kind``, ``in_dim``, ``hidden_dim``, ``out_dim``, ``layers``,
        ``fanouts``) overrides the one the file declares; ``precision`` is ``fp32`` or ``int8``."""
        fields: dict = {"name": name, "format": format or ""}
        if upload:
            fields["data"] = Path(path).read_bytes()
        else:
            fields["path"] = str(path)
        if architecture is not None:
            arch = dict(architecture)
            kind = served_kind(str(arch["kind"]))
            arch["kind"] = _proto.enum_value("ModelKind", f"MODEL_KIND_{kind.upper()}")
            fields["architecture"] = _proto.message("ModelArchitecture")(**arch)
        fields["precision"] = _proto.enum_value("Precision", f"PRECISION_{precision.upper()}")
        info = self._call("ModelRegister", **fields)
        return _plain(info)

    def unregister_model(self, name: str) -> None:
        self._call("ModelUnregister", name=name)

    def register_embedding(
        self, name: str, run: str | Path, *, checkpoint: str = "best", memory: int | str | None = None
    ) -> dict:
        """Registers the embedding run at ``run`` (a run directory of ``strata embed train`` on the
        server, under one of its data roots) as ``name``: the server serves a copy of its ``best``
        (or ``last``) checkpoint, with ``memory`` bytes resident (``512M`` or a number; ``None``
        holds the whole table, fewer bytes hold fewer partitions and queries scan the rest from
        disk). Returns the run's info."""
        size = 0 if memory is None else parse_size(memory)
        info = self._call("EmbeddingRegister", name=name, run_path=str(run), checkpoint=checkpoint, memory=size)
        return _plain(info)

    def unregister_embedding(self, name: str) -> None:
        self._call("EmbeddingUnregister", name=name)

    # Mutations: each returns once the server has the change in its log on disk ---------------

    def add_vertices(self, graph: str, features: np.ndarray) -> np.ndarray:
        """Adds one vertex per row of ``features`` ``(n, dim)``; returns their ids."""
        r = self._call("AddVertex", graph=graph, features=_tensor(features))
        return np.asarray(r.ids, dtype=np.int64)

    def remove_vertices(self, graph: str, ids: Sequence[int]) -> int:
        """Removes vertices and all their edges; returns the log sequence number."""
        return self._call("RemoveVertex", graph=graph, ids=_ids(ids)).lsn

    def update_vertices(self, graph: str, ids: Sequence[int], features: np.ndarray) -> int:
        """Replaces the feature rows of ``ids``; returns the log sequence number."""
        return self._call("UpdateVertex", graph=graph, ids=_ids(ids), features=_tensor(features)).lsn

    def add_edges(self, graph: str, src: Sequence[int], dst: Sequence[int]) -> int:
        """Adds edges ``src[i] -> dst[i]``; returns the log sequence number."""
        return self._call("AddEdge", graph=graph, src=_ids(src), dst=_ids(dst)).lsn

    def remove_edges(self, graph: str, src: Sequence[int], dst: Sequence[int]) -> int:
        """Removes every copy of each edge ``src[i] -> dst[i]``; returns the log sequence number."""
        return self._call("RemoveEdge", graph=graph, src=_ids(src), dst=_ids(dst)).lsn

    def mutate(self, graph: str, mutations: Mutations) -> MutateResult:
        """Applies a batch of mutations (:class:`Mutations`) to ``graph`` all or nothing, as one
        log record: each is checked against the graph as the earlier ones leave it, and if one is
        refused, none is applied and the :class:`ServiceError` names it (``mutations[i]: ...``).
        An empty batch is refused (``INVALID_ARGUMENT``). Returns once the whole batch is on
        disk."""
        r = self._call("Mutate", graph=graph, mutations=mutations._items)
        return MutateResult(
            lsn=r.lsn,
            applied=[m.applied for m in r.results],
            ids=[np.asarray(m.ids, dtype=np.int64) for m in r.results],
        )

    # Analysis -----------------------------------------------------------------------------

    def analyze(self, graph: str, model: str, task: str, targets, targets_dst=None) -> int:
        """Queues an analysis (``task``: ``embedding``, ``classification`` or ``link``) and
        returns its request id; link prediction pairs ``targets`` with ``targets_dst``."""
        if task not in TASKS:
            raise ValueError(f"task: expected one of {', '.join(TASKS)}, got {task!r}")
        fields = {"graph": graph, "model": model, "task": _proto.enum_value("Task", TASKS[task])}
        fields["targets"] = _ids(targets)
        if targets_dst is not None:
            fields["targets_dst"] = _ids(targets_dst)
        return self._call("GraphAnalysis", **fields).request_id

    def result(self, request_id: int, wait: float = 0.0) -> AnalysisResult:
        """The result of ``request_id``, waiting up to ``wait`` seconds while it is pending. A
        finished result is handed out once."""
        try:
            wait = check_seconds(wait, zero=True)
        except ValueError as e:
            raise ConfigError(f"Client.result: wait {e}") from None
        r = self._call(
            "GetAnalysisResult", timeout=self.timeout + wait, request_id=request_id, wait_ms=int(wait * 1000)
        )
        return _result(r)

    def results(self, request_ids: Sequence[int]) -> Iterator[AnalysisResult]:
        """The results of ``request_ids`` as they finish (server streaming)."""
        for r in self._stream("StreamAnalysisResults", request_ids=[int(i) for i in request_ids]):
            yield _result(r)

    def wait(self, request_id: int, timeout: float | None = None) -> AnalysisResult:
        """The finished result of ``request_id``; raises :class:`ServiceError` if it failed."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            left = deadline - time.monotonic()
            r = self.result(request_id, wait=max(0.0, min(left, 30.0)))
            if r.state == "FAILED":
                raise ServiceError("ANALYSIS_FAILED", r.error)
            if r.state == "DONE":
                return r
            if left <= 0:
                raise ServiceError("DEADLINE_EXCEEDED", f"analysis {request_id} still pending")

    def embed(self, graph: str, model: str, targets) -> np.ndarray:
        """Embeddings ``(len(targets), out_dim)`` of ``targets``."""
        return self.wait(self.analyze(graph, model, "embedding", targets)).values

    def classify(self, graph: str, model: str, targets) -> tuple[np.ndarray, np.ndarray]:
        """Predicted classes and class probabilities ``(len(targets), classes)``."""
        r = self.wait(self.analyze(graph, model, "classification", targets))
        return r.labels, r.values

    def predict_links(self, graph: str, model: str, src, dst) -> np.ndarray:
        """``sigmoid(h_src . h_dst)`` per pair."""
        return self.wait(self.analyze(graph, model, "link", src, dst)).scores

    # Remote training ----------------------------------------------------------------------

    def sample_neighbors(self, graph: str, seeds, fanouts: Sequence[int], *, seed: int = 0, batch_key: int = 0):
        """The sampled neighbourhood of ``seeds`` (``fanouts`` seeds outwards; the sample an
        analysis uses is ``seed`` = the server's ``--sample-seed``, ``batch_key`` = 0)."""
        r = self._call(
            "SampleNeighbors", graph=graph, seeds=_ids(seeds), fanouts=list(fanouts), seed=seed, batch_key=batch_key
        )
        blocks = [
            Block(b.num_src, b.num_dst, np.asarray(b.indptr, dtype=np.int64), np.asarray(b.indices, dtype=np.int64))
            for b in r.blocks
        ]
        return Neighbourhood(np.asarray(r.nodes, dtype=np.int64), np.asarray(r.hop_counts, dtype=np.int64), blocks)

    def get_features(self, graph: str, ids) -> np.ndarray:
        """Feature rows ``(len(ids), dim)`` float32, any number of them: they come as a stream of
        pieces, each within the server's message limit (``StreamFeatures``)."""
        ids = _ids(ids)
        out: np.ndarray | None = None
        at = 0
        for t in self._stream("StreamFeatures", graph=graph, ids=ids):
            piece = _array(t)
            if out is None:
                out = np.empty((len(ids), piece.shape[1]), dtype=np.float32)
            out[at : at + len(piece)] = piece
            at += len(piece)
        if out is None or at != len(ids):
            raise ServiceError("DATA_LOSS", f"StreamFeatures sent {at} of {len(ids)} rows")
        return out

    # Embedding runs -------------------------------------------------------------------------

    def top_k(self, run: str, nodes, relations, k: int = 10, *, filtered: bool = False, heads: bool = False) -> list:
        """The ``k`` best tails of ``(node, relation, ?)`` for each of ``nodes`` (or with ``heads``
        the best heads of ``(?, relation, node)``), computed next to the table: ``nodes`` are names
        or ids (one or a list), ``relations`` one name or id for all queries or one per query.
        With ``filtered``, answers already in the store (any split) are left out, as
        ``strata embed predict --exclude-known``; otherwise they are marked ``known``. Returns per
        query ``{"node", "name", "predictions": [{"node", "name", "score", "known"}, ...]}``, best
        first."""
        r = self._call(
            "EmbeddingTopK",
            run=run,
            nodes=_node_refs(nodes, "nodes"),
            relations=_relation_refs(relations),
            k=k,
            filtered=filtered,
            predict_heads=heads,
        )
        return [_ranked(q, "predictions", known=True) for q in r.results]

    def score(self, run: str, heads, relations, tails) -> np.ndarray:
        """Scores (float32) of the triples ``(heads[i], relations[i], tails[i])`` with the run's
        score function; ``relations`` may be one name or id for all."""
        r = self._call(
            "EmbeddingScore",
            run=run,
            heads=_node_refs(heads, "heads"),
            relations=_relation_refs(relations),
            tails=_node_refs(tails, "tails"),
        )
        return np.asarray(r.scores, dtype=np.float32)

    def neighbors(self, run: str, nodes, k: int = 10, *, metric: str = "model", any_type: bool = False) -> dict:
        """The ``k`` nearest nodes of each of ``nodes`` (names or ids) by ``metric`` (``model``,
        ``cos``, ``dot`` or ``l2``): ``{"metric", "results": [{"node", "name", "neighbors": [{"node",
        "name", "score"}, ...]}]}``, nearest first, as ``strata embed neighbors --json``. In a run
        with entity types, neighbours are of each node's own type unless ``any_type``."""
        r = self._call(
            "EmbeddingNeighbors", run=run, nodes=_node_refs(nodes, "nodes"), k=k, metric=metric, any_type=any_type
        )
        return {"metric": r.metric, "results": [_ranked(q, "neighbors") for q in r.results]}

    def status(self) -> dict:
        """Registered graphs, models and embedding runs, cache hit rates, queue depth and
        counters."""
        r = self._call("Status")
        return _plain(r)


def _as_list(values) -> list:
    """One value or a sequence of them as a list."""
    if isinstance(values, (str, bytes, int, np.integer)):
        return [values]
    return list(values)


def _refs(values, field: str, message: str):
    """``values`` (names, or ids) as a ``NodeRefs``/``RelationRefs`` message."""
    items = _as_list(values)
    if all(isinstance(v, str) for v in items):
        return _proto.message(message)(names=items)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        return _proto.message(message)(ids=[int(v) for v in items])
    raise ValueError(f"{field}: give names (str) or ids (int), not a mix")


def _node_refs(nodes, field: str):
    return _refs(nodes, field, "NodeRefs")


def _relation_refs(relations):
    return _refs(relations, "relations", "RelationRefs")


def _ranked(q, key: str, known: bool = False) -> dict:
    """A ``RankedList`` as ``{"node", "name", key: [{"node", "name", "score"[, "known"]}]}``."""

    def answer(a) -> dict:
        out = {"node": a.id, "name": a.name, "score": a.score}
        if known:
            out["known"] = a.known
        return out

    return {"node": q.id, "name": q.name, key: [answer(a) for a in q.answers]}


def _result(r) -> AnalysisResult:
    has_values = r.HasField("values") and len(r.values.shape) == 2
    return AnalysisResult(
        request_id=r.request_id,
        state=_proto.enum_name("ResultState", r.state).removeprefix("RESULT_STATE_"),
        task=_proto.enum_name("Task", r.task).removeprefix("TASK_"),
        values=_array(r.values) if has_values else None,
        labels=np.asarray(r.labels, dtype=np.int64) if len(r.labels) else None,
        scores=np.asarray(r.scores, dtype=np.float32) if len(r.scores) else None,
        error=r.error,
        latency_s=r.latency_us / 1e6,
        queued_s=r.queued_us / 1e6,
    )
