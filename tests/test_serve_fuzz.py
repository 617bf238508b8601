"""Fuzzing ``strata serve`` through its gRPC surface: random bytes, well-formed messages whose
fields take hostile values (ids out of range, negative and huge counts, wrong graph and model
names, empty and gigantic repeated fields, unknown enum values), and valid messages with bytes
flipped, cut or appended, sent to every RPC. The server must answer each with a status of its
own (no panic, no UNKNOWN, no dropped connection; INTERNAL only for bytes that do not parse as
the request, the code gRPC prescribes for that) and keep serving: a normal call works after the
batch and the process is still up.

The number of cases is fixed (``STRATA_SERVE_FUZZ_CASES``, default 300; a few seconds) and so
is the seed (``STRATA_SERVE_FUZZ_SEED``, default 0), so a failure reproduces. For a longer
session: ``STRATA_SERVE_FUZZ_CASES=100000 STRATA_SERVE_FUZZ_SEED=$RANDOM pytest
tests/test_serve_fuzz.py``."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest

from conftest import symmetric_sbm_store
from serve_process import serving
from strata.serve import _proto
from test_serve import numpy_sage

CASES = int(os.environ.get("STRATA_SERVE_FUZZ_CASES", "300"))
SEED = int(os.environ.get("STRATA_SERVE_FUZZ_SEED", "0"))
NODES, DIM = 300, 16
#: The largest repeated field a case sends: well over the server's --max-ids of 20,000.
GIGANTIC = 60_000

U64 = [0, 1, 2, NODES - 1, NODES, NODES + 1, 2**31, 2**32, 2**63, 2**64 - 1]
I64 = [0, 1, -1, 2**31, -(2**31), 2**63 - 1, -(2**63)]
U32 = [0, 1, 2, 3, 16, 255, 2**16, 2**31, 2**32 - 1]
I32 = [0, 1, 2, -1, -2, 5, 2**31 - 1, -(2**31)]
FLOATS = [0.0, 1.0, -1.0, float("nan"), float("inf"), -float("inf"), 3.4e38, 1e-45]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-sbm")
    return symmetric_sbm_store(d, nodes=NODES, classes="4", dim=DIM, avg_degree=6)


class Fuzzer:
    """Makes request bytes for each RPC from one seeded generator."""

    def __init__(self, rng: random.Random, names: list[str], valid: dict[str, list[bytes]]):
        self.rng, self.names, self.valid = rng, names, valid

    def strings(self) -> str:
        return self.rng.choice([*self.names, "", "nope", "../../etc", ".hidden", "x" * 300, "g\x00", "é", "a/b"])

    def scalar(self, field):
        r, t = self.rng, field.type
        if t in (field.TYPE_UINT64, field.TYPE_FIXED64):
            return r.choice([*U64, r.randrange(2**64)])
        if t in (field.TYPE_INT64, field.TYPE_SINT64, field.TYPE_SFIXED64):
            return r.choice(I64)
        if t in (field.TYPE_UINT32, field.TYPE_FIXED32):
            return r.choice(U32)
        if t in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
            return r.choice(I32)
        if t == field.TYPE_ENUM:
            return r.choice([*field.enum_type.values_by_number, -1, 99, 2**31 - 1])
        if t in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
            return r.choice(FLOATS)
        if t == field.TYPE_BOOL:
            return r.random() < 0.5
        if t == field.TYPE_STRING:
            # Mostly the names that exist, so that the other fields reach the checks behind them.
            if field.name in ("graph", "model") and r.random() < 0.75:
                return "g" if field.name == "graph" else "m"
            return self.strings()
        if t == field.TYPE_BYTES:
            return self.tensor_data() if field.name == "data" else r.randbytes(r.randrange(64))
        raise AssertionError(f"unhandled field type {t}")

    def tensor_data(self) -> bytes:
        """Float bytes of a plausible or implausible length."""
        r = self.rng
        rows = r.choice([0, 1, 2, 3, 1000])
        values = np.array([r.choice(FLOATS) for _ in range(4)] * rows * DIM, dtype=np.float32)[: rows * DIM]
        return values.tobytes()[: r.choice([None, 3, len(values) * 4 - 1])]

    def fill(self, msg, depth: int = 0) -> None:
        """Gives some fields of ``msg`` hostile values (repeated ones: none, a few, or very many)."""
        r = self.rng
        for field in msg.DESCRIPTOR.fields:
            if r.random() < 0.3:
                continue
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
            if field.message_type is not None:
                if depth > 2:
                    continue
                if repeated:
                    for _ in range(r.choice([0, 1, 3])):
                        self.fill(getattr(msg, field.name).add(), depth + 1)
                else:
                    self.fill(getattr(msg, field.name), depth + 1)
            elif repeated:
                n = r.choice([0, 1, 2, 7, 100, GIGANTIC])
                value = self.scalar(field)
                # Mostly one repeated value (gigantic fields stay cheap to build), sometimes all distinct.
                values = [value] * n if n > 100 or r.random() < 0.5 else [self.scalar(field) for _ in range(n)]
                getattr(msg, field.name).extend(values)
            else:
                setattr(msg, field.name, self.scalar(field))

    def case(self, method: str) -> tuple[str, bytes]:
        """A request for ``method`` and how it was made."""
        r = self.rng
        how = r.random()
        if how < 0.2:
            return "random bytes", r.randbytes(r.randrange(256))
        if how < 0.7 or not self.valid.get(method):
            msg = _proto.message(_proto.METHODS[method][0])()
            self.fill(msg)
            return "hostile fields", msg.SerializeToString()
        data = bytearray(r.choice(self.valid[method]))
        for _ in range(r.randint(1, 4)):
            op = r.random()
            if op < 0.4 and data:
                data[r.randrange(len(data))] = r.randrange(256)
            elif op < 0.7 and data:
                del data[r.randrange(len(data)) :]
            else:
                data += r.randbytes(r.randrange(16))
        return "mutated bytes", bytes(data)


def valid_requests(store: Path) -> dict[str, list[bytes]]:
    """One well-formed request per RPC, for the byte-level mutations to start from."""

    def m(message, **fields):
        return _proto.message(message)(**fields).SerializeToString()

    tensor = _proto.message("Tensor")(
        shape=[1, DIM], dtype=_proto.enum_value("ElementType", "ELEMENT_TYPE_FLOAT32"), data=b"\0" * 4 * DIM
    )
    edges = m("EdgeRequest", graph="g", src=[1, 2], dst=[3, 4])
    mutation = _proto.message("Mutation")
    batch = [
        mutation(add_vertex=_proto.message("AddVertexRequest")(features=tensor)),
        mutation(add_edge=_proto.message("EdgeRequest")(src=[1, 2], dst=[3, 4])),
        mutation(remove_edge=_proto.message("EdgeRequest")(graph="g", src=[1], dst=[3])),
    ]
    return {
        "GetFeatures": [m("GetFeaturesRequest", graph="g", ids=[1, 2, 3])],
        "StreamFeatures": [m("GetFeaturesRequest", graph="g", ids=[1, 2, 3])],
        "SampleNeighbors": [m("SampleNeighborsRequest", graph="g", seeds=[1, 5], fanouts=[3, 2])],
        "AddVertex": [m("AddVertexRequest", graph="g", features=tensor)],
        "UpdateVertex": [m("UpdateVertexRequest", graph="g", ids=[1], features=tensor)],
        "RemoveVertex": [m("RemoveVertexRequest", graph="g", ids=[7])],
        "AddEdge": [edges],
        "RemoveEdge": [edges],
        "Mutate": [m("MutateRequest", graph="g", mutations=batch)],
        "GraphAnalysis": [m("GraphAnalysisRequest", graph="g", model="m", task=2, targets=[1, 2])],
        "GetAnalysisResult": [m("GetAnalysisResultRequest", request_id=1, wait_ms=10)],
        "StreamAnalysisResults": [m("StreamAnalysisResultsRequest", request_ids=[1])],
        "GraphRegister": [m("GraphRegisterRequest", name="g2", store_path=str(store))],
        "Status": [b""],
    }


def restore(c, store: Path, tmp: Path) -> None:
    """Registers graph ``g`` and model ``m`` again when a fuzz case unregistered them, so the
    cases after it reach the checks behind the names."""
    status = c.status()
    if "g" not in {g["name"] for g in status["graphs"]}:
        c.register_graph("g", store)
    if "m" not in {m["name"] for m in status["models"]}:
        c.register_model("m", numpy_sage(tmp / "m.npz", out_dim=4))


def call(channel: grpc.Channel, method: str, payload: bytes) -> str:
    """Sends raw ``payload`` to ``method``; returns the status code name."""
    streaming = _proto.METHODS[method][2]
    kind = channel.unary_stream if streaming else channel.unary_unary
    stub = kind(f"/{_proto.SERVICE}/{method}", request_serializer=None, response_deserializer=None)
    try:
        if streaming:
            for _ in stub(payload, timeout=30):
                pass
        else:
            stub(payload, timeout=30)
        return "OK"
    except grpc.RpcError as e:
        details = e.details() or ""
        assert "panic" not in details.lower(), f"{method}: {e.code().name} {details}"
        # INTERNAL is what gRPC prescribes for a request that does not parse, and nothing else
        # here may produce it.
        assert e.code().name != "INTERNAL" or details.startswith("failed to decode Protobuf message"), details
        return e.code().name


def test_random_and_mutated_messages_get_a_status(tmp_path, store):
    args = [f"g={store}", "--memory", "64M", "--max-ids", "20000", "--result-ttl", "5"]
    with serving(tmp_path / "state", *args) as server:
        c = server.client(timeout=60)
        names = ["g", "m", "g2", "m2"]
        fuzzer = Fuzzer(random.Random(SEED), names, valid_requests(store))
        methods = sorted(_proto.METHODS)
        codes: Counter = Counter()
        kinds: Counter = Counter()
        with grpc.insecure_channel(server.addr) as channel:
            for i in range(CASES):
                if i % 50 == 0:
                    restore(c, store, tmp_path)
                method = methods[i % len(methods)]
                kind, payload = fuzzer.case(method)
                code = call(channel, method, payload)
                # A status of the server's own: no crash, no unhandled error.
                assert code not in ("UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED"), (i, method, payload[:200])
                assert server.proc.poll() is None, f"case {i} ({method}) killed the server:\n{server.stderr}"
                codes[code] += 1
                kinds[kind] += 1
        # Every kind of refusal came up, and some calls went through.
        assert {"OK", "INVALID_ARGUMENT", "NOT_FOUND"} <= set(codes), codes
        # Still serving: a normal call on a graph the fuzz left registered (re-registering if
        # it removed them all).
        graphs = [g["name"] for g in c.status()["graphs"]]
        if not graphs:
            c.register_graph("again", store)
            graphs = ["again"]
        assert c.get_features(graphs[0], [0, 1, 2]).shape == (3, DIM)
        print(f"serve fuzz: {CASES} cases, seed {SEED}: {dict(kinds)}; statuses {dict(codes)}")
        c.close()
        assert server.stop() == 0, server.stderr
