"""The device path of embedding training (`device = torch-cpu`: the torch backend behind the
compute seam, on torch's CPU device) against the Rust engine: with one thread and a fixed seed,
one epoch gives the same loss and the same table within float tolerance for every score model
and loss option the device step implements, the same partition loads out of core, and one run
format that either engine evaluates, exports and resumes. Where torch sees a GPU the parity
tests run on ``cuda`` too (``gpu_devices``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import gpu_devices, run_strata  # noqa: E402
from strata.config import EmbedTrainConfig  # noqa: E402
from strata.embed import Run, train  # noqa: E402
from strata.errors import BudgetError, ConfigError  # noqa: E402

# init_scale 0.1: from the default 1e-3, a node's first gradients are near zero, and Adagrad's
# first step (lr g / |g|: a whole lr whichever sign g has) turns summation-order rounding into
# steps of opposite signs; a table that starts at 0.1 compares the arithmetic, not that.
BASE = dict(epochs=1, dim=16, chunk_size=200, threads=1, seed=7, eval_every=0, tensorboard=False, init_scale=0.1)


def configured(options: dict) -> dict:
    """BASE under ``options``, with 64 negatives where the run samples them (1vsAll and KvsAll
    score every entity and refuse the option)."""
    sampled = options.get("training", "negative_sampling") == "negative_sampling"
    return {**BASE, **({"negatives": 64} if sampled else {}), **options}


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    """A small generated knowledge graph (200 entities, 8 relations, 4,000 triples): every
    test trains it on both engines, the device one in Python chunk by chunk."""
    d = tmp_path_factory.mktemp("kg")
    run_strata("generate", "kg", "--out", d / "raw", "--entities", "200", "--relations", "8", "--triples", "4000", "-q")
    run_strata("convert", d / "raw", "--relations", "--out", d / "kg.strata", "-q")
    return d / "kg.strata"


@pytest.fixture(autouse=True)
def short_runs(monkeypatch):
    """Graphs of runs of 4 chunks: an epoch of these small graphs is about 18 chunks, which the
    default runs of 16 would train op by op, so the parity tests would not cover the replays."""
    from strata.embed.device import graphs

    monkeypatch.setattr(graphs, "RUN", 4)


#: The CPU twin, and the GPU where torch sees one.
DEVICES = gpu_devices("torch-cpu")

#: Relative tolerance of an epoch's loss and table against the Rust engine's, per device. Both
#: engines compute in float32 and differ only in the order of their sums: the CPU twin's loss is
#: within about 1e-9 and its table within 2e-7 (measured), well inside 1e-5. CUDA runs full
#: float32 too (TorchCompute turns TF32 off; TF32's 10-bit mantissa would err about 5e-4 per
#: product), so its errors are the same ulp-level rounding, but its gradient sums are atomic adds
#: in no fixed order (the result varies from run to run) and cuBLAS splits its reductions its own
#: way: it gets 1e-4. A real fault (a missed copy, a stream race) moves the table by far more.
RTOL = {"torch-cpu": 1e-5, "cuda": 1e-4}


def trained(kg, run_dir, **options) -> Run:
    return train(EmbedTrainConfig(store=kg, run_dir=run_dir, **configured(options)))


def table(run: Run, out) -> np.ndarray:
    run.export(out)
    return np.load(out / "embeddings.npy")


def assert_same_training(kg, tmp_path, device="torch-cpu", device_options=None, **options):
    cpu = trained(kg, tmp_path / "cpu", **options)
    dev = trained(kg, tmp_path / "dev", device=device, **(device_options or {}), **options)
    a, b = cpu.history[-1], dev.history[-1]
    rtol = RTOL[device]
    assert b["loss"] == pytest.approx(a["loss"], rel=rtol), (a["loss"], b["loss"])
    ta, tb = table(cpu, tmp_path / "cpu-npy"), table(dev, tmp_path / "dev-npy")
    err = np.linalg.norm(ta - tb)
    assert err < rtol * np.linalg.norm(ta), err
    return cpu, dev


@pytest.mark.parametrize(
    "options",
    [
        dict(model="dot"),
        dict(model="distmult"),
        dict(model="complex"),
        dict(model="transe"),
        dict(model="transe", transe_norm=1, loss="margin", margin=1.0),
        dict(model="rotate", loss="logistic", gamma=6.0, adversarial_temperature=1.0),
        dict(model="complex", regularizer="n3", reg_weight=0.01, optimizer="adagrad_row"),
        dict(model="distmult", corrupt="bernoulli", degree_fraction=0.5, negative_pool="partition"),
        dict(model="complex", corrupt="head", reciprocal=False, loss="margin", adversarial_temperature=0.5),
        dict(model="complex", entity_dropout=0.2, relation_dropout=0.1),
        # LibKGE's independent masks: the positives' query rows dropped again.
        dict(model="complex", entity_dropout=0.2, relation_dropout=0.1, dropout_masks="independent"),
        dict(model="transe", entity_dropout=0.3, dropout_masks="independent", shared_negatives=False, negatives=8),
        dict(model="rotate", loss="logistic", gamma=6.0, entity_dropout=0.2, dropout_masks="independent"),
        dict(
            model="distmult", entity_dropout=0.1, relation_dropout=0.3, dropout_masks="independent", corrupt="bernoulli"
        ),
        dict(model="complex", regularizer="n3", reg_weight=0.01, reg_weighted=True, relation_reg_weight=0.03),
        # Negatives per edge (LibKGE's and PyKEEN's sampling): batched products and pairs.
        dict(model="transe", shared_negatives=False, negatives=8, entity_dropout=0.2),
        dict(model="complex", shared_negatives=False, negatives=8, degree_fraction=0.5, negative_pool="partition"),
        dict(
            model="rotate",
            loss="logistic",
            gamma=6.0,
            adversarial_temperature=1.0,
            shared_negatives=False,
            negatives=8,
            corrupt="bernoulli",
        ),
        # A count of negatives per side (LibKGE's num_samples s and o): both sides as two
        # stacks, their masks after their own draws, the weighted regularizer's repeat.
        dict(
            model="complex", negatives_head=24, entity_dropout=0.2, regularizer="n3", reg_weight=0.01, reg_weighted=True
        ),
        dict(
            model="transe",
            negatives_head=3,
            shared_negatives=False,
            negatives=8,
            corrupt="bernoulli",
            degree_fraction=0.5,
        ),
        # 1vsAll and KvsAll: every candidate row steps each chunk; masks over all of them.
        dict(model="complex", training="1vsAll"),
        dict(
            model="complex",
            training="1vsAll",
            reciprocal=False,
            regularizer="l2",
            reg_scope="table",
            reg_weight=0.01,
            relation_reg_weight=0.001,
            entity_dropout=0.2,
        ),
        dict(
            model="distmult",
            training="KvsAll",
            label_smoothing=0.1,
            entity_dropout=0.2,
            relation_dropout=0.1,
            regularizer="n3",
            reg_weighted=True,
            reg_weight=0.01,
        ),
        dict(model="dot", training="KvsAll", loss="logistic", gamma=1.0, corrupt="tail", reciprocal=False),
        dict(model="distmult", training="1vsAll", corrupt="head", reciprocal=False, entity_dropout=0.1),
        # PyTorch-BigGraph's operators and comparators (model pbg; its defaults: none, cos).
        dict(model="pbg"),
        dict(model="pbg", operator="translation", comparator="l2", reciprocal=False, loss="margin", margin=1.0),
        dict(model="pbg", operator="linear", comparator="dot", reciprocal=False, corrupt="bernoulli"),
        dict(
            model="pbg", operator="affine", comparator="squared_l2", loss="logistic", regularizer="l2", reg_weight=0.01
        ),
        dict(model="pbg", operator="complex_diagonal", comparator="cos", shared_negatives=False, negatives=8),
        dict(model="pbg", operator="diagonal", comparator="dot", entity_dropout=0.2, relation_dropout=0.1),
        dict(model="pbg", operator="complex_diagonal", comparator="dot", regularizer="n3", reg_weight=0.01),
        dict(model="pbg", operator="affine", comparator="dot", training="1vsAll"),
        dict(model="pbg", operator="linear", comparator="dot", training="KvsAll", reciprocal=False, loss="logistic"),
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("device", DEVICES)
def test_one_epoch_matches_the_rust_engine(kg, tmp_path, options, device):
    assert_same_training(kg, tmp_path, device, **options)


@pytest.mark.parametrize("model", ["complex", "transe"])
@pytest.mark.parametrize("device", DEVICES)
def test_the_sorted_update_of_a_large_table_trains_alike(kg, tmp_path, monkeypatch, device, model):
    """A table of many rows per use in a chunk steps only the rows the chunk used, found by a
    sort (``unique_static``); the test graph's are few, and take the every-row step unless
    told otherwise."""
    from strata.embed.device import rows

    monkeypatch.setattr(rows, "EVERY_ROW_PER_USE", 0)
    assert_same_training(kg, tmp_path, device, model=model)


@pytest.mark.parametrize("training", ["negative_sampling", "1vsAll"])
@pytest.mark.parametrize("device", DEVICES)
def test_weighted_edges_train_alike(weighted_kg, tmp_path, device, training):
    """Each edge's terms scaled by its weight: a negative-sampling edge's, a 1vsAll query's."""
    assert_same_training(weighted_kg, tmp_path, device, model="complex", training=training)


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_run_checks_theorem_3_at_the_rate_of_its_first_epoch(kg, tmp_path, device):
    # The host's step says nothing of a device's, so the check waits for an epoch's rate.
    proc = run_strata(
        "embed", "train", kg, "--run-dir", tmp_path / "run", "--device", device, "--epochs", "2", "--partitions", "4",
        "--buffer", "3", "--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1",
    )  # fmt: skip
    err = proc.stderr
    said = err.index("Theorem 3: checked after the first epoch, at the rate the device trains")
    rate = re.search(r"the device trained ([0-9.]+) us/edge in its first epoch", err)
    assert rate and float(rate.group(1)) > 0 and err.count("the device trained") == 1
    assert said < rate.start() < err.index("epoch 2/2:")


@pytest.mark.parametrize("training", ["negative_sampling", "1vsAll"])
@pytest.mark.parametrize("device", DEVICES)
def test_out_of_core_loads_the_same_partitions(kg, tmp_path, device, training):
    """Out of core, negative sampling from the resident partitions, and 1vsAll against them
    (``vsall_candidates = resident``)."""
    options = dict(model="complex", partitions=6, buffer=3, memory="128M")
    if training == "1vsAll":
        options.update(training=training, vsall_candidates="resident")
    else:
        options.update(negative_pool="resident")
    cpu, dev = assert_same_training(kg, tmp_path, device, **options)
    a, b = cpu.history[-1], dev.history[-1]
    for key in ("partition_loads", "swaps", "partition_bytes_read", "partition_bytes_written"):
        assert a[key] == b[key], key
    assert a["partition_loads"] > 2


#: Out of core with the ``all`` pool: 6 partitions, 3 resident, the others' negatives drawn
#: from their banks (34 rows each in 128M).
BANKED = dict(partitions=6, buffer=3, negative_pool="all", memory="128M", epochs=2)


@pytest.mark.parametrize(
    "options",
    [
        dict(model="complex"),
        dict(model="complex", shared_negatives=False, negatives=8, degree_fraction=0.5),
        dict(model="transe", corrupt="bernoulli", degree_fraction=0.25, chunk_size=50),
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("device", DEVICES)
def test_negatives_from_banks_train_alike(kg, tmp_path, device, options):
    """Negatives drawn uniformly over every node, those of partitions on disk from their banks:
    the device picks the bank rows the Rust engine picks, sums their gradient into the banks
    (applied when the partition is next loaded, or flushed at the epoch's end: the same loads),
    and the banks take an evicted partition's rows after they left the device. Two epochs,
    so that the second starts from banks the first filled."""
    cpu, dev = assert_same_training(kg, tmp_path, device, **BANKED, **options)
    for a, b in zip(cpu.history, dev.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=RTOL[device])
        assert a["partition_loads"] == b["partition_loads"] > 6
    plan = {p["name"]: p for p in dev.meta["memory_plan"]["parts"]}
    assert plan["negative banks"]["bytes"] > 0, plan


@pytest.mark.parametrize("partitions", [1, 6])
def test_only_a_lone_slot_steps_every_node_row(kg, tmp_path, monkeypatch, partitions):
    """Out of core the next partition is copied into a free slot of the device buffer while a
    step runs (on cuda asynchronously, on a copy stream), so a chunk's node rows must not take
    the Adagrad step over every row of the buffer, which would write that slot's stale rows
    back: only the rows the chunk touched. With one partition nothing else is copied in, and
    the small test graph's rows all take it."""
    from strata.embed.device import rows

    modes = []
    of = rows.Gathered.of.__func__

    def record(cls, table, keys, alone=None):
        gathered = of(cls, table, keys, True if alone is None else alone)
        if alone is not None:  # the node table's (the relations' take the default)
            every = len(gathered.keys) == len(table.params) and bool(gathered.valid.all())
            modes.append(every)
        return gathered

    monkeypatch.setattr(rows.Gathered, "of", classmethod(record))
    options = dict(partitions=partitions, buffer=min(partitions, 3), negative_pool="resident", memory="128M")
    trained(kg, tmp_path / "run", device="torch-cpu", model="complex", **options)
    assert modes and all(modes) == (partitions == 1) and any(modes) == (partitions == 1), modes[:8]


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """A small typed knowledge graph (people, films, genres; tests/typed_kg.py) whose films are
    bags of one to three words: with bags of one size, sharing an entity's gradient out over its
    bag would scale every feature's gradients alike, which Adagrad's step does not see."""
    from typed_kg import FILMS, WORDS, typed_kg

    d = tmp_path_factory.mktemp("typed")
    args = typed_kg(d)
    bags = [f"f{f}\t" + " ".join(f"w{(f + i) % WORDS}" for i in range(1 + f % 3)) for f in range(FILMS)]
    (d / "bags.tsv").write_text("\n".join(bags) + "\n")
    run_strata("convert", *args, "-o", d / "kg.strata", "-q")
    return d / "kg.strata"


#: People and films in 4 partitions each, 3 resident, the genres held in memory.
TYPED = dict(entity_partitions=["person=4", "film=4", "genre=1"], buffer=3, chunk_size=50, negatives=16)


@pytest.mark.parametrize(
    "options",
    [
        dict(negative_pool="resident"),
        dict(negative_pool="partition", model="transe"),
        dict(negative_pool="resident", typed_negatives=False, corrupt="bernoulli"),
        dict(negative_pool="resident", shared_negatives=False, negatives=4, degree_fraction=0.5),
        # Films are bags of words: a film's row is its words' mean (held in memory).
        dict(entity_partitions=["person=4"], featurized=["film"], negative_pool="resident"),
        dict(entity_partitions=["person=4"], featurized=["film"], negative_pool="partition", typed_negatives=False),
        # Negatives over every entity of the type, those of partitions on disk from banks (a
        # block per type), beside featurized entities' keys.
        dict(negative_pool="all"),
        dict(negative_pool="all", negatives_head=6),
        dict(entity_partitions=["person=4"], featurized=["film"], negative_pool="all", typed_negatives=False),
        # One partition: every type in it but the featurized films, in the pinned region.
        dict(entity_partitions=[], partitions=1, buffer=1, featurized=["film"], model="distmult"),
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("device", DEVICES)
def test_entity_types_train_alike(typed, tmp_path, device, options):
    """PyTorch-BigGraph's entity types: each side's negatives drawn among its corrupted end's
    type in the resident partitions and the in-memory region (or, untyped, among every type),
    featurized entities as their features' means, in one partition or out of core with the
    same partition loads."""
    options = {"model": "complex", **TYPED, **options}
    cpu, dev = assert_same_training(typed, tmp_path, device, **options)
    a, b = cpu.history[-1], dev.history[-1]
    assert a["partition_loads"] == b["partition_loads"]
    assert (a["partition_loads"] > 3) == (options.get("partitions") != 1)
    if options.get("negative_pool") == "all":
        plan = {p["name"]: p for p in dev.meta["memory_plan"]["parts"]}
        assert plan["negative banks"]["bytes"] > 0, plan


#: bf16 tables (``table_dtype = "bf16"``): the device rounds every stored value stochastically
#: with the Rust engine's noise (the chunk's key and the value's place in its own table), so
#: after an epoch most values are bit for bit the Rust engine's. Where the float32 sums differ in
#: their last bits (above), a value can fall on the other side of a rounding threshold, and the
#: row goes on from there: one state value of ``adagrad_row`` scales its whole row's steps, and
#: 1vsAll's gradients sum over a chunk (measured on the CPU twin: 99.99% to all of the stored
#: values identical for ComplEx in and out of core and for 1vsAll, 99.96% with ``adagrad_row``,
#: its exported table within 2e-5).
#: Noise of another salt or place would round about half the updated values otherwise.
BF16_IDENTICAL = {"torch-cpu": 0.9, "cuda": 0.5}
BF16_RTOL = 3e-3


def assert_same_bf16_training(store, tmp_path, device, **options):
    """One epoch of a bf16 table on both engines: the loss within the device's tolerance, the
    table within :data:`BF16_RTOL` with at least :data:`BF16_IDENTICAL` of its values
    identical, the same partition loads."""
    options = {**options, "table_dtype": "bf16"}
    cpu = trained(store, tmp_path / "cpu", **options)
    dev = trained(store, tmp_path / "dev", device=device, **options)
    a, b = cpu.history[-1], dev.history[-1]
    assert b["loss"] == pytest.approx(a["loss"], rel=RTOL[device]), (a["loss"], b["loss"])
    assert a["partition_loads"] == b["partition_loads"]
    # The table files as stored (rows and Adagrad state), and the rows as exported.
    stored = [stored_values(tmp_path / run) for run in ("cpu", "dev")]
    identical = float(np.mean(stored[0] == stored[1]))
    assert identical >= BF16_IDENTICAL[device], identical
    ta, tb = table(cpu, tmp_path / "cpu-npy"), table(dev, tmp_path / "dev-npy")
    assert np.linalg.norm(ta - tb) < BF16_RTOL * np.linalg.norm(ta)


def stored_values(run_dir) -> np.ndarray:
    """Every bf16 value of a run's table files (``table-*.bin``: rows, then Adagrad state, per
    partition), as stored."""
    return np.concatenate([np.fromfile(f, dtype=np.uint16) for f in sorted(run_dir.glob("table-*.bin"))])


@pytest.mark.parametrize(
    "options",
    [
        dict(model="complex"),
        dict(model="transe", optimizer="adagrad_row"),
        dict(model="complex", training="1vsAll"),
        dict(model="complex", partitions=6, buffer=3, negative_pool="resident", memory="128M"),
        dict(model="distmult", optimizer="adagrad_row", **{**BANKED, "epochs": 1}),
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_tables_round_as_the_rust_engine_rounds_them(kg, tmp_path, device, options):
    assert_same_bf16_training(kg, tmp_path, device, **options)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_pinned_region_rounds_by_its_own_rows(typed, tmp_path, device):
    """The pinned region (the genres, and the films' words) sits in the slot buffer's tail: its
    values are placed by their rows in the region, not in the buffer."""
    options = {**TYPED, "entity_partitions": ["person=4"], "featurized": ["film"], "negative_pool": "resident"}
    assert_same_bf16_training(typed, tmp_path, device, model="complex", **options)


def test_a_typed_run_trains_on_the_device_through_the_cli(typed, tmp_path, strata_cli):
    """`strata embed train --device torch-cpu` on a typed store with a featurized type: the
    device plan holds the pinned region beside the slots, and the run predicts films for a
    person on the CPU engine afterwards (one run format)."""
    run = tmp_path / "run"
    proc = strata_cli(
        "embed", "train", typed, "--run-dir", run, "--device", "torch-cpu", "--featurized", "film",
        "--entity-partitions", "person=4", "--buffer", "3", "--negative-pool", "resident", "--epochs", "2",
        "--dim", "16", "--chunk-size", "50", "--negatives", "16",
    )  # fmt: skip
    assert "embed device torch-cpu" in proc.stderr and "in-memory entity types" in proc.stderr, proc.stderr
    got = json.loads(
        strata_cli("embed", "predict", run, "--head", "p3", "--relation", "0", "--top", "5", "--json").stdout
    )
    assert {p["name"][0] for p in got["predictions"]} == {"f"}, got


@pytest.mark.parametrize("table_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_runs_cross_between_engines(kg, tmp_path, device, table_dtype):
    """A device run evaluates and resumes on the CPU engine, and the reverse: one run format,
    float32 or bf16."""
    dev = trained(kg, tmp_path / "dev", model="complex", device=device, table_dtype=table_dtype)
    assert dev.evaluate("test")["metrics"]["queries"] > 0
    resumed = trained(kg, tmp_path / "dev", model="complex", epochs=2, table_dtype=table_dtype)
    assert resumed.epochs == 2
    cpu = trained(kg, tmp_path / "cpu", model="complex", table_dtype=table_dtype)
    back = trained(kg, tmp_path / "cpu", model="complex", epochs=2, device=device, table_dtype=table_dtype)
    assert back.epochs == 2 and back.history[-1]["loss"] < back.history[0]["loss"]
    assert cpu.evaluate("test")["metrics"]["mrr"] > 0


def test_unsupported_settings_are_refused_by_name(kg, tmp_path, strata_cli):
    with pytest.raises(ConfigError, match="device"):
        trained(kg, tmp_path / "a", device="tpu")
    with pytest.raises(ConfigError, match=r"device_matmul.*\"tf32\" applies to a torch device"):
        trained(kg, tmp_path / "run", device_matmul="tf32")
    assert not (tmp_path / "run").exists()
    proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "c", "--device", "cuda", "-q", check=False)
    if not torch.cuda.is_available():
        assert proc.returncode == 2 and "CUDA is not available" in proc.stderr, proc.stderr


def test_tf32_holds_for_the_training_steps_only(kg, tmp_path, monkeypatch, strata_cli):
    """``device_matmul = tf32`` reaches the backend: CUDA's TF32 flag is on while a piece's
    steps run and back off after (the evaluation's products stay float32); the run says what it
    asked for, and that the CPU twin has no TF32 (its table is the float32 one)."""
    from strata.embed.device import graphs

    seen = []
    run = graphs.StepGraphs.run

    def record(self, *args):
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return run(self, *args)

    monkeypatch.setattr(graphs.StepGraphs, "run", record)
    assert_same_training(kg, tmp_path, model="complex", device_options=dict(device_matmul="tf32"))
    assert seen and all(seen) and not torch.backends.cuda.matmul.allow_tf32
    proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "cli", "--device", "torch-cpu", "--epochs", "1",
                      "--device-matmul", "tf32")  # fmt: skip
    assert "device_matmul = tf32 asked for, but the CPU twin has no TF32" in proc.stdout + proc.stderr


def test_slots_stay_on_the_device_between_pieces(kg, tmp_path):
    """With the slot hooks the device copies each slot in once per fill and out once per
    write-back, not per piece: what crosses host -> device in an epoch is the slots, the
    relations in the first epoch only (the device keeps them for the run) and the edges."""
    dev = trained(kg, tmp_path / "dev", model="complex", device="torch-cpu", epochs=2, chunk_size=100)
    first, second = dev.history
    edges = 4000 * 0.8  # the train split of the generated graph is about 80%
    for e in (first, second):
        d = e["device"]
        assert d["busy_seconds"] > 0 and 0 < d["busy_share"] <= 1
        assert d["ssd_to_device_bytes_per_second"] >= 0
    slot_and_rels = first["device"]["d2h_bytes"]
    assert second["device"]["d2h_bytes"] == slot_and_rels
    rels = first["device"]["h2d_bytes"] - second["device"]["h2d_bytes"]
    assert rels > 0  # relations copied in once, in the first epoch
    edge_bytes = second["device"]["h2d_bytes"] - (slot_and_rels - rels)
    # 12 bytes per train edge (three int32), whatever the number of pieces and chunks.
    assert edge_bytes % 12 == 0 and 0.5 * edges < edge_bytes / 12 < 1.5 * edges


def test_a_missed_write_back_fails_the_parity(kg, tmp_path, monkeypatch):
    """The hooks are what carries the device's rows to the table file: without the
    write-back before each swap the out-of-core run no longer matches the Rust engine."""
    from strata.embed.device.backend import TorchCompute

    def forget(self, table, evict, later=False):
        if evict:
            self.slots.pop(table[3], None)
        return (lambda _table: None) if later else None

    monkeypatch.setattr(TorchCompute, "slot_out", forget)
    options = dict(model="complex", partitions=6, buffer=3, negative_pool="resident", memory="128M")
    with pytest.raises(AssertionError):
        assert_same_training(kg, tmp_path, **options)


def test_the_run_says_the_device_and_why_no_gpudirect_storage(kg, tmp_path, strata_cli):
    proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", "--device", "torch-cpu", "--epochs", "1")
    assert proc.stdout.count("GPUDirect Storage is not used") + proc.stderr.count("GPUDirect Storage is not used") == 1
    assert "device cpu (the CPU twin)" in proc.stdout + proc.stderr
    assert "GPUDirect Storage is not used (no GPU (the device is cpu))" in proc.stdout + proc.stderr


class _Defaults:
    def __init__(self, compat: bool):
        self.compat = compat

    def is_compat_mode_preferred(self) -> bool:
        return self.compat


def test_the_gpudirect_storage_note_gives_the_machine_s_answer():
    """On a GPU the note says what kvikio says of this machine (a fake kvikio here): not
    importable, reading through host memory (its compatibility mode), or reading through cuFile,
    which the embedding tables' partitions do not use."""
    from types import SimpleNamespace

    from strata.embed.device.backend import storage_note

    cuda = torch.device("cuda")

    def absent(name):
        raise ImportError(f"No module named {name!r}")

    assert "(kvikio does not import (No module named 'kvikio'))" in storage_note(cuda, load=absent)
    compat = storage_note(cuda, load=lambda n: SimpleNamespace(defaults=_Defaults(True)))
    assert "(kvikio would read through host memory here: KVIKIO_COMPAT_MODE is on, or libcufile did not load)" in compat
    direct = storage_note(cuda, load=lambda n: SimpleNamespace(defaults=_Defaults(False)))
    assert "(cuFile reads on this machine, but the embedding tables' partitions do not go through it)" in direct
    assert storage_note(torch.device("cpu")).startswith("GPUDirect Storage is not used (no GPU (the device is cpu)): ")


#: A device budget whose room beside its fixed parts (relations, one staged edge piece at
#: --memory 128M, the step's scratch) holds three slots of 4 KiB but not of 8 KiB: the table of
#: 200 nodes x 16 x 2 floats (25 KiB on the host plan's one partition) then needs 7 partitions.
SMALL_DEVICE = "8180K"


def test_device_memory_partitions_the_table_as_a_cpu_run_of_that_many_slots(kg, tmp_path, strata_cli):
    """An explicit device budget shrinks the CPU twin's slots exactly as it would a GPU's: the
    run is out of core on the device (the host plan alone keeps the table resident), prints and
    records both budgets, and loads the partitions and trains the table of a CPU run of the
    same partitions."""
    options = dict(model="complex", negative_pool="resident", memory="128M")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in configured(options).items() if k != "tensorboard"]
    proc = strata_cli(
        "embed", "train", kg, "--run-dir", tmp_path / "dev", "--device", "torch-cpu",
        "--device-memory", SMALL_DEVICE, *args,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "embed budget 128 MiB" in out and "embed device torch-cpu budget 7.99 MiB" in out, out
    dev = Run(tmp_path / "dev")
    plan = dev.meta["device_memory_plan"]
    slots = next(p for p in plan["parts"] if p["name"] == "partition slots")
    assert plan["memory"] == 8180 << 10 and slots["bytes"] == 3 * 4096, plan
    partitions = dev.meta["partitioning"]["partitions"]
    assert partitions == 7
    cpu = trained(kg, tmp_path / "cpu", partitions=partitions, buffer=3, **options)
    a, b = cpu.history[-1], dev.history[-1]
    for key in ("partition_loads", "swaps", "partition_bytes_read", "partition_bytes_written"):
        assert a[key] == b[key], key
    assert b["partition_loads"] > 3
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    ta, tb = table(cpu, tmp_path / "cpu-npy"), table(dev, tmp_path / "dev-npy")
    assert np.linalg.norm(ta - tb) < 1e-5 * np.linalg.norm(ta)


def test_a_device_budget_below_the_minimum_buffer_is_refused(kg, tmp_path, strata_cli):
    proc = strata_cli(
        "embed", "train", kg, "--run-dir", tmp_path / "r", "--device", "torch-cpu", "--device-memory", "1M",
        "--memory", "128M", "--negative-pool", "resident", "-q", check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "device_memory 1.00 MiB on torch-cpu cannot hold the minimum buffer of 3 partition slot(s)" in err, err
    assert "memory budget (host) 128 MiB" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match=r"device_memory.*applies to a torch device"):
        trained(kg, tmp_path / "cpu", device_memory="1G")


def test_kvsall_answers_count_against_the_device_budget(kg, tmp_path, strata_cli):
    """KvsAll's answers are indexed on the device, 64 bytes a training edge beyond the plan: a
    device budget that holds the plan but not them is refused naming device_memory, before the
    run directory is made; one that holds both trains, and says what they take."""
    options = dict(device="torch-cpu", training="KvsAll", memory="128M")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in configured(options).items() if k != "tensorboard"]
    roomy = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "roomy", "--device-memory", "1G", *args)
    assert "all its answers (84.4 KiB, 225 KiB on the device)" in roomy.stdout + roomy.stderr
    planned = sum(p["bytes"] for p in Run(tmp_path / "roomy").meta["device_memory_plan"]["parts"])
    answers = 64 * 3600  # the generated graph's training edges
    with pytest.raises(BudgetError, match=r"indexes the answers of every training query on torch-cpu.*device_memory"):
        trained(kg, tmp_path / "tight", device_memory=str(planned + answers // 2), **options)
    assert not (tmp_path / "tight").exists()
    trained(kg, tmp_path / "fits", device_memory=str(planned + answers), **options)


def test_a_victim_lands_the_rows_it_had_when_its_write_back_started():
    """The asynchronous write-back (Legend's order): ``slot_out(..., later=True)`` forgets the
    victim at once and leaves its host memory alone until the landing, which puts there the
    rows the device had when the write-back was issued, whatever trains in between."""
    from strata.embed.device.backend import TorchCompute

    dev = TorchCompute("torch-cpu")
    rows = np.arange(8, dtype=np.float32)
    params, state = bytearray(rows.tobytes()), bytearray(8 * 4)
    victim = (memoryview(params), memoryview(state), 2, 1, "f32")
    other = (memoryview(bytearray(32)), memoryview(bytearray(32)), 2, 2, "f32")
    dev.slot_in("partition", victim)
    dev.slot_in("partition", other)
    dev.held(1).params.mul_(2)  # the victim's last training on the device
    land = dev.slot_out(victim, True, True)
    assert 1 not in dev.slots and 2 in dev.slots
    dev.held(2).params.add_(1)  # the next piece trains the retained slot
    assert np.array_equal(np.frombuffer(params, np.float32), rows), "landed before its time"
    land(victim)
    assert np.array_equal(np.frombuffer(params, np.float32), 2 * rows)
    assert dev.counters()[2] == 2 * 8 * 4  # both tables of the victim went out


@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_static_unique_equals_torch_unique(device):
    # The step finds a chunk's unique rows without reading their count on the host: the first
    # `count` slots must be torch.unique's keys, the inverse the same, the rest unused (the
    # smallest key again: a row the chunk uses, which no copy writes meanwhile).
    from strata.embed.device.rows import unique_static

    gen = torch.Generator().manual_seed(3)
    for n, high in [(1, 5), (7, 3), (1000, 50), (5000, 1 << 40), (300, 1 << 62)]:
        keys = torch.randint(0, high, (n,), generator=gen).to(device)
        slots, inverse, valid = unique_static(keys)
        want, want_inverse = torch.unique(keys, return_inverse=True)
        count = len(want)
        assert valid.cpu().tolist() == [True] * count + [False] * (n - count)
        assert torch.equal(slots[:count].cpu(), want.cpu()) and bool((slots[count:] == want[0]).all())
        assert torch.equal(inverse.cpu(), want_inverse.cpu())
    empty = unique_static(torch.zeros(0, dtype=torch.int64, device=device))
    assert [len(t) for t in empty] == [0, 0, 0]


def test_the_cpu_twin_replays_captured_steps(kg, tmp_path, monkeypatch):
    # The CUDA graphs' bookkeeping runs on the CPU twin (a "replay" runs the steps on the static
    # inputs with a tensor key). An epoch's 18 chunks are four runs of four and two lone
    # chunks: the first run op by op, the second op by op as the warm-up, the third captured and
    # replayed, the fourth replayed; the lone chunks op by op (two of a key are not yet
    # captured). The parity tests above therefore cover the replays. Bernoulli sides are never
    # captured.
    from strata.embed.device import graphs

    seen = []
    report = graphs.StepGraphs.report

    def record(self):
        seen.append((self.replays, self.captures, self.eager_steps))
        return report(self)

    monkeypatch.setattr(graphs.StepGraphs, "report", record)
    runs = trained(kg, tmp_path / "a", device="torch-cpu")
    assert seen[-1] == (8, 1, 10), seen
    # A graph a chunk: the first two op by op, then every one replays. The same table, bit for
    # bit: a replayed run is its chunks' steps one after another.
    monkeypatch.setattr(graphs, "RUN", 1)
    alone = trained(kg, tmp_path / "b", device="torch-cpu")
    assert seen[-1] == (16, 1, 2), seen
    assert np.array_equal(table(runs, tmp_path / "a-npy"), table(alone, tmp_path / "b-npy"))
    assert runs.history[-1]["loss"] == alone.history[-1]["loss"]
    seen.clear()
    trained(kg, tmp_path / "c", device="torch-cpu", corrupt="bernoulli")
    replays, captures, eager = seen[-1]
    assert (replays, captures) == (0, 0) and eager >= 12, seen


def test_a_piece_replays_runs_of_one_context_and_size():
    """``chunk_runs``: consecutive chunks of one context and one size, ``longest`` at a time;
    the rest (a shorter tail, a change of context, a run cut short) alone."""
    from strata.embed.device.graphs import chunk_runs

    assert chunk_runs([0] * 7, [0, 2, 4, 6, 8, 10, 12, 13], 3) == [(0, 3), (3, 6), (6, 7)]
    assert chunk_runs([0, 0, 1, 1, 1, 1], list(range(0, 14, 2)), 2) == [(0, 2), (2, 4), (4, 6)]
    assert chunk_runs([0, 0, 0, 1, 1], [0, 2, 4, 6, 8, 10], 2) == [(0, 2), (2, 3), (3, 5)]
    assert chunk_runs([0] * 4, [0, 2, 3, 5, 7], 2) == [(0, 1), (1, 2), (2, 4)]
    assert chunk_runs([0] * 5, list(range(6)), 1) == [(c, c + 1) for c in range(5)]
    assert chunk_runs([], [0], 4) == []


def test_out_of_core_buckets_share_the_captured_steps(kg, tmp_path, monkeypatch):
    # The slots are one device buffer and where a bucket's partitions sit in it is an input of
    # the step, so the 36 buckets of six partitions in a buffer of three replay the graphs of
    # a few chunk sizes (keyed by each slot's address, they made 35 graphs): runs of four
    # chunks of 20 edges, and lone chunks of a bucket's tail sizes.
    from strata.embed.device import graphs

    seen = []
    report = graphs.StepGraphs.report

    def record(self):
        seen.append((self.replays, self.captures))
        return report(self)

    monkeypatch.setattr(graphs.StepGraphs, "report", record)
    options = dict(model="complex", partitions=6, buffer=3, negative_pool="resident", memory="128M", chunk_size=20)
    trained(kg, tmp_path / "a", device="torch-cpu", **options)
    replays, captures = seen[-1]
    assert captures <= 5 and replays > 100, seen


@pytest.mark.parametrize("keep", [False, True], ids=["loads-from-ssd", "partitions-kept"])
def test_slot_buffers_are_lent_whole_pinned_once_and_let_go_at_the_end(kg, tmp_path, monkeypatch, keep):
    """Each partition slot is lent with the length of its own host buffer (page-aligned, at
    least its params and state), which the backend registers once whatever partitions the
    buffer holds in turn and unregisters when the trainer ends; relations, whose memory is not
    a buffer of the slot's, go through staging. With the partitions kept in host memory, their
    buffers move through the slots and are registered once each too. With a recorder in place
    of CUDA's runtime."""
    from strata.device.pins import HostPins
    from strata.embed.device.backend import Lent, TorchCompute

    registered, unregistered, lent = [], [], []
    pins = lambda self: HostPins(lambda a, n: registered.append((a, n)) or 0, lambda a: unregistered.append(a) or 0)  # noqa: E731
    monkeypatch.setattr(TorchCompute, "_host_pins", pins)
    slot_in = TorchCompute.slot_in

    def record(self, kind, table):
        t = Lent(*table)
        lent.append((kind, t.key, t.span, len(t.params) + len(t.state)))
        return slot_in(self, kind, table)

    monkeypatch.setattr(TorchCompute, "slot_in", record)
    options = dict(model="complex", partitions=6, buffer=3, negative_pool="resident", memory="128M", epochs=2)
    trained(kg, tmp_path / "run", device="torch-cpu", keep_partitions=keep, **options)
    parts = [(key, span, used) for kind, key, span, used in lent if kind == "partition"]
    assert len(parts) > 6 and all(span >= used and span % 4096 == 0 for _, span, used in parts)
    assert all(span == 0 for kind, _, span, _ in lent if kind == "relations")
    buffers = {key: span for key, span, _ in parts}
    # Three slots, and the swap spare's one or two buffers when the budget holds them, or with
    # the partitions kept at most one buffer a partition and that spare: each registered once.
    assert 3 <= len(buffers) <= (6 + 2 if keep else 5) and sorted(registered) == sorted(buffers.items())
    assert sorted(unregistered) == sorted(buffers)
