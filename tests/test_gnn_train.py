"""The GNN data path end to end through Python and the CLI: batches equal the store's features,
an epoch covers every seed once, training learns a planted-community graph while reading most
feature rows from disk, and bad inputs fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")

from cli_in_process import in_process  # noqa: E402
from conftest import run_strata  # noqa: E402
from strata.errors import BudgetError, ConfigError  # noqa: E402
from strata.gnn import GnnData, NodeLoader  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_gnn_train")


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> Path:
    """A labelled SBM graph (3000 nodes, 4 communities, 32 float32 features) as a store."""
    d = tmp_path_factory.mktemp("sbm")
    raw = d / "raw"
    run_strata("generate", "sbm", "--out", raw, "--nodes", "3000", "--classes", "4", "--feature-dim", "32",
               "--avg-degree", "12", "-q")  # fmt: skip
    run_strata("convert", raw, "--symmetrize", "--out", d / "sbm.strata", "-q")
    return d / "sbm.strata"


@pytest.mark.parametrize("pipeline", [True, False])
def test_batches_hold_the_features_of_their_nodes(sbm, pipeline):
    loader = NodeLoader(sbm, fanouts=[5, 5], batch_size=100, feature_memory="32K", pipeline=pipeline)
    feats = np.asarray(loader.data.store.features)
    labels = np.asarray(loader.data.store.labels)
    seen = []
    for b in loader:
        assert torch.equal(b.x, torch.from_numpy(feats[b.nodes.numpy()]))
        assert torch.equal(b.nodes[: b.num_seeds], b.seeds)
        assert torch.equal(b.y, torch.from_numpy(labels[b.seeds.numpy()].astype(np.int64)))
        assert len(b.blocks) == 2 and b.blocks[-1].num_dst == b.num_seeds
        assert b.blocks[0].num_src == len(b.nodes)
        seen.extend(b.seeds.tolist())
    train = np.asarray(loader.data.store.node_split("train"))
    assert sorted(seen) == sorted(train.tolist())
    tiers = loader.stats["tiers"]
    assert tiers["rows"] == tiers["hot_rows"] + tiers["cache_rows"] + tiers["disk_rows"]
    assert tiers["device_rows"] == 0
    assert tiers["disk_rows"] > 0, "a 32 KiB feature budget must leave reads for the disk"
    # The batches share the small file's pages: reads merge batches by default, as the
    # feature_memory cap leaves room for them beside the tiers.
    st = loader.stats
    assert st["in_flight_source"] == "page_sharing" and st["mean_batches_per_read"] > 1, st


def test_merged_reads_take_no_room_from_the_tiers(sbm):
    """The same batches under a budget with room for some feature rows but not for the larger
    reads: each read is flushed at GIDS's target (or the engine's depth) instead."""
    plan = NodeLoader(sbm, fanouts=[5, 5], batch_size=100, feature_memory="32K", in_flight_target=16).data.plan
    fixed = sum(plan[k] for k in ("runtime_bytes", "training_bytes", "topology_bytes", "batch_buffers_bytes",
                                  "window_bytes", "device_index_bytes"))  # fmt: skip
    loader = NodeLoader(sbm, fanouts=[5, 5], batch_size=100, memory=fixed + (200 << 10))
    for _ in loader:
        pass
    st = loader.stats
    assert st["in_flight_source"] in ("profile", "engine_depth") and st["mean_batches_per_read"] == 1, st
    assert 0 < loader.data.plan["hot_rows"] + loader.data.plan["cache_rows"] < 3000


def test_the_device_tier_serves_the_hottest_rows(sbm):
    # On cpu an explicit device_memory builds the tier in RAM: the code path a GPU takes.
    loader = NodeLoader(sbm, fanouts=[5, 5], batch_size=100, feature_memory="32K", device_memory=200 * 32 * 4)
    data = loader.data
    feats = np.asarray(data.store.features)
    device_nodes = np.frombuffer(data._native.device_nodes(), dtype="<u4")
    assert data.plan["device_rows"] == 200 and data.device_table.shape == (200, 32)
    assert torch.equal(data.device_table, torch.from_numpy(feats[device_nodes]))
    # The device takes the best of the ranking, the hot set the next: no row in both.
    hot = NodeLoader(sbm, fanouts=[5, 5], batch_size=100, feature_memory="32K").data
    assert data.plan["hot_rows"] == hot.plan["hot_rows"]
    for b in loader:
        assert torch.equal(b.x, torch.from_numpy(feats[b.nodes.numpy()]))
    tiers = loader.stats["tiers"]
    assert tiers["rows"] == tiers["device_rows"] + tiers["hot_rows"] + tiers["cache_rows"] + tiers["disk_rows"]
    assert tiers["device_rows"] > tiers["hot_rows"] > 0, "the device tier holds the hottest rows"
    with pytest.raises(ValueError, match="expected a size"):
        NodeLoader(sbm, fanouts=[5], device_memory="lots")


def test_loader_nodes_are_ids_a_mask_or_a_split_checked_at_construction(sbm):
    n = GnnData(sbm).num_nodes
    mask = np.zeros(n, dtype=bool)
    mask[[3, 17, 40]] = True
    batch = next(iter(NodeLoader(sbm, fanouts=[2], batch_size=8, nodes=mask)))
    assert sorted(batch.seeds.tolist()) == [3, 17, 40]  # a mask, as PyG's input_nodes takes
    bad = [
        (np.array([1.5, 2.0]), "expected integer node ids, got an array of float64"),  # was truncated to 1, 2
        (np.array([2**32 + 3]), "node ids are 32-bit"),  # was wrapped onto node 3
        (np.array([-1]), "must not be negative"),
        (np.array([0, n]), rf"node {n} is out of range \(the graph has {n} nodes\)"),  # was refused once iterated
        (mask[:10], rf"a boolean mask must have one entry per node \({n}\)"),
        ("trian", "has no node split 'trian'"),  # was refused only once iterated
    ]
    for nodes, message in bad:
        with pytest.raises(ValueError, match=message):
            NodeLoader(sbm, fanouts=[2], batch_size=8, nodes=nodes)
    # Fanouts and options, as the loader's keywords take them.
    assert NodeLoader(sbm, fanouts=np.array([3, 2]), batch_size=8).data.config["fanouts"] == [3, 2]
    for fanouts, message in [([2.5], "fanouts must be whole numbers, got 2.5"), ("5,5", "expected a list of fanouts")]:
        with pytest.raises(ValueError, match=message):  # 2.5 was truncated to 2
            NodeLoader(sbm, fanouts=fanouts, batch_size=8)
    with pytest.raises(TypeError, match="unknown option 'hot_shares'; did you mean 'hot_share'"):
        NodeLoader(sbm, fanouts=[2], hot_shares=0.5)


def test_encoded_features_are_decoded_into_the_batches(sbm):
    """feature_codec: every row is hot, held encoded, and served decoded to float32. f16 is
    exactly numpy's float16 rounding; int8 is within half its row's scale."""
    feats = np.asarray(GnnData(sbm).store.features)
    scale = np.abs(feats).max(axis=1, keepdims=True) / 127
    for codec in ("f16", "int8"):
        loader = NodeLoader(sbm, fanouts=[5, 5], batch_size=500, feature_codec=codec)
        plan = loader.data.plan
        assert plan["codec"] == codec and plan["held_row_bytes"] == {"f16": 64, "int8": 36}[codec]
        assert plan["hot_rows"] == 3000
        for b in loader:
            assert b.x.dtype == torch.float32
            want = feats[b.nodes.numpy()]
            if codec == "f16":
                assert torch.equal(b.x, torch.from_numpy(want.astype(np.float16).astype(np.float32)))
            else:
                err = np.abs(b.x.numpy() - want)
                assert (err <= scale[b.nodes.numpy()] * 0.5001).all()
                assert err.max() > 0, "int8 is lossy on these features"
        assert loader.stats["tiers"]["hot_rows"] == loader.stats["tiers"]["rows"]


def test_epochs_reshuffle_and_are_deterministic(sbm):
    def seeds_of(loader):
        return [b.seeds.tolist() for b in loader]

    a, b = (NodeLoader(sbm, fanouts=[3], batch_size=64, seed=7) for _ in range(2))
    first = seeds_of(a)
    assert first == seeds_of(b)
    assert seeds_of(a) != first  # the second epoch is shuffled differently


def test_cli_train_learns_with_features_on_disk(sbm, tmp_path):
    run = tmp_path / "run"
    args = ["--fanouts", "10,5", "--batch-size", "128", "--epochs", "3", "--hidden", "32", "--feature-memory", "64K"]
    # Features split across ranks are a torchrun setting: one process says so and reads them all.
    proc = run_strata("gnn", "train", sbm, "--run-dir", run, *args, "--device", "cpu", "--dist-features", "split")
    out = proc.stdout
    record = json.loads((run / "run.json").read_text())
    assert record["test"]["accuracy"] > 0.6, out  # 4 classes: chance is about 0.25
    said = "dist_features = split applies under torchrun; this one process reads every row itself"
    assert said in out + proc.stderr and record["dist_features"] == "replicated"
    # No --data-path: auto takes the native path on the CPU, and says why.
    assert "data path: native (the device is not a GPU)" in proc.stdout + proc.stderr
    assert record["data_path"] == "native" and record["data_path_note"] == "the device is not a GPU"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert (run / "best.pt").exists() and (run / "last.pt").exists()
    last = record["history"][-1]
    assert last["pipeline"]["tiers"]["disk_rows"] > 0 and 0 <= last["data_wait_fraction"] <= 1
    assert "test accuracy" in out
    # The plan in the common shape: the measured process and training are parts of it, and the
    # 64K of feature tiers hold part of the features.
    plan = record["memory_plan"]
    parts = {p["name"]: p for p in plan["parts"]}
    assert plan["engine"] == "gnn" and parts["runtime"]["detail"].startswith("anonymous memory as measured at open")
    assert parts["training"]["bytes"] == record["plan"]["training_bytes"] > 0
    features = plan["data"][0]
    assert features["name"] == "node features" and 0 < features["resident"] < features["bytes"]


def test_bad_inputs(sbm, tmp_path, capsys):
    kg = tmp_path / "kg"
    run_strata("generate", "kg", "--out", kg, "--entities", "50", "--triples", "400", "-q")
    run_strata("convert", kg, "--relations", "--out", tmp_path / "kg.strata", "-q")
    with pytest.raises(ConfigError, match="no node features"):
        GnnData(tmp_path / "kg.strata")
    with pytest.raises(BudgetError, match="raise --memory"):
        GnnData(sbm, memory="8M")
    with pytest.raises(TypeError, match="unknown option"):
        GnnData(sbm, fanout=[3])
    # torch's own refusal, from deep in a lookup; now checked as `strata gnn train` checks it.
    with pytest.raises(ConfigError, match=r"gnn\.train\.device: 'tpu:x' is not a torch device"):
        GnnData(sbm, device="tpu:x")
    proc = run_strata("gnn", "train", sbm, "--fanouts", "0,5", check=False)
    assert proc.returncode == 2 and "gnn.train.fanouts" in proc.stderr
    proc = run_strata("gnn", "train", sbm, "--feature-codec", "f8", check=False)
    assert proc.returncode == 2 and "--feature-codec: unknown choice 'f8' (choices: f32, f16, int8)" in proc.stderr
    # Refused once torch is imported: in this process, which has imported it already.
    if not torch.cuda.is_available():
        code, out = in_process(["gnn", "train", sbm, "--device", "cuda"], capsys)
        assert code == 2 and "torch sees no CUDA device" in out, out
    code, out = in_process(["gnn", "train", sbm, "--device", "tpu:x"], capsys)
    assert code == 2 and "not a torch device" in out, out
    code, out = in_process(["gnn", "train", sbm, "--device", "mps"], capsys)  # was torch's traceback
    assert code == 2 and "runs on cpu or cuda (cuda:N), not mps" in out, out
    foreign = tmp_path / "embed-run"
    foreign.mkdir()
    (foreign / "run.json").write_text('{"format": "strata-embed-run"}')
    # torch's own refusal of a negative decay was a traceback; 10^5 torch threads, an abort.
    for flags, words in [
        (["--weight-decay", "-1"], "gnn.train.weight_decay: must be >= 0"),
        (["--torch-threads", "100000"], "--torch-threads: must be <= 1024"),
        # Read by nothing: sage has no heads; without a ranking the hot set holds no row.
        (["--heads", "8"], "gnn.train.heads: applies to model gat only (model is sage)"),
        (["--hot-ranking", "none", "--hot-share", "0.3"], "gnn.train.hot_share: applies with a hot-set ranking"),
        # Building the model was the allocator's traceback, before the plan could refuse it.
        (["--hidden", "100000000"], "cannot hold the model (sage, hidden 100000000): "),
        (["--run-dir", "/proc/strata-run"], "--run-dir /proc/strata-run: the directory cannot be created"),
        # Another engine's run or a store: its run.json was replaced, its directory written into.
        (["--run-dir", sbm], f"--run-dir {sbm} is a store"),
        (["--run-dir", foreign], f"--run-dir {foreign} is another kind of run"),
    ]:
        code, out = in_process(["gnn", "train", sbm, *flags], capsys)
        assert code == 2 and words in out, out
    np.save(tmp_path / "edges.npy", np.array([[0, 1], [1, 2], [2, 0]], dtype=np.int64))
    np.save(tmp_path / "x.npy", np.ones((3, 4), dtype=np.float32))
    run_strata("convert", tmp_path / "edges.npy", "--features", tmp_path / "x.npy", "--out", tmp_path / "nl", "-q")
    code, out = in_process(["gnn", "train", tmp_path / "nl"], capsys)
    assert code == 2 and "the store has no node labels" in out and "--labels" in out, out
    assert (foreign / "run.json").read_text() == '{"format": "strata-embed-run"}'
    assert not (sbm / "run.json").exists()


def test_a_diverging_epoch_is_refused_and_a_batch_beyond_the_seeds_is_one_batch(sbm, tmp_path, capsys):
    small = ["--fanouts", "5,5", "--hidden", "16", "--device", "cpu", "-q"]
    run = tmp_path / "run"
    code, out = in_process(["gnn", "train", sbm, "--run-dir", run, "--epochs", "2", "--lr", "1e30", *small], capsys)
    assert code == 1 and "epoch 1: the loss is nan: the training diverged at learning rate 1e+30" in out, out
    assert (run / "metrics.jsonl").read_text() == "" and not (run / "last.pt").exists()
    # The plan's batch estimate drew batch_size seeds with replacement: 10^9 of them took minutes.
    code, out = in_process(["gnn", "train", sbm, "--run-dir", run, "--epochs", "1", "--batch-size", "1000000000",
                            *small], capsys)  # fmt: skip
    record = json.loads((run / "run.json").read_text())
    assert code == 0 and record["history"][0]["batches"] == 1, out


def test_a_second_local_rank_on_a_one_gpu_machine_is_refused():
    # Seen on an H100 machine: torchrun --nproc-per-node 2 --device cuda put local rank 1 on
    # cuda:1, which torch rejected mid-setup with "invalid device ordinal" and a traceback.
    from types import SimpleNamespace

    from strata.gnn._torch import torch_device
    from strata.torchrun import Environment

    one_gpu = SimpleNamespace(
        device=torch.device, cuda=SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
    )
    env = Environment(rank=1, world_size=2, addr="127.0.0.1", port=1, local_rank=1)
    first = Environment(rank=0, world_size=2, addr="127.0.0.1", port=1)
    assert torch_device("cuda", first, torch=one_gpu) == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"rank 1 \(local rank 1\) would train on cuda:1, but this machine has 1"):
        torch_device("cuda", env, torch=one_gpu)
    assert torch_device("cuda:0", env, torch=one_gpu) == torch.device("cuda", 0)


def test_without_a_hot_set_ranking_the_cache_takes_the_whole_feature_budget(sbm):
    # The plan held half of the feature budget for a hot set that loaded no row.
    opts = {"fanouts": [5, 5], "batch_size": 100, "feature_memory": "200K"}  # under half the rows
    ranked, unranked = GnnData(sbm, **opts).plan, GnnData(sbm, **opts, hot_ranking="none").plan
    assert ranked["hot_rows"] > 0 and (unranked["hot_rows"], unranked["hot_bytes"]) == (0, 0)
    assert unranked["cache_bytes"] > ranked["hot_bytes"] + ranked["cache_bytes"] - (64 << 10)
    assert unranked["cache_rows"] > ranked["hot_rows"] + ranked["cache_rows"] - 100


def test_the_plan_holds_the_process_and_what_training_adds(sbm):
    from strata.gnn.loader import process_bytes
    from strata.gnn.models import GNN

    model = GNN("sage", 32, 16, 4, layers=2)
    costs = model.training_costs(optimizer_states=2)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert costs["fixed_bytes"] == 3 * params
    # Layer 0 reads 32-wide rows into 16 outputs; layer 1 reads 16 into 4. SAGE transforms no
    # source row; its edges carry the input rows.
    assert costs["layers"] == [
        {"src_row": 0, "dst_row": 4 * (3 * 32 + 7 * 16), "edge": 4 * 2 * 32 + 16},
        {"src_row": 0, "dst_row": 4 * (3 * 16 + 7 * 4), "edge": 4 * 2 * 16 + 16},
    ]
    gat = GNN("gat", 32, 8, 4, layers=2, heads=2).training_costs(optimizer_states=2)["layers"]
    assert gat[0]["src_row"] == 4 * 2 * (16 + 2) and gat[1]["dst_row"] == 4 * (3 * 16 + 7 * 4)
    before = process_bytes("RssAnon")
    data = GnnData(sbm, fanouts=[5, 5], batch_size=100, memory="1G", training=costs, own_process=True)
    plan = data.plan
    # The runtime is this process's anonymous memory as measured at open (it moves a little
    # as the store opens) and 96 MiB of code pages (strata_gnn::budget::CODE_PAGES_BYTES),
    # not a fixed reserve, nor torch's mapped libraries (~0.3-1 GiB of reclaimable page cache).
    assert plan["runtime_measured"] and abs(plan["runtime_bytes"] - (96 << 20) - before) < 32 << 20
    assert plan["training_bytes"] > costs["fixed_bytes"]
    measured = "anonymous memory as measured at open, and 96.0 MiB of code pages"
    assert any(line.endswith(measured) for line in data.plan_lines())
    with pytest.raises(ConfigError, match="the model has 1 layers but the sampler makes 2 blocks"):
        GnnData(sbm, fanouts=[5, 5], training={"layers": costs["layers"][:1], "fixed_bytes": 0})
    with pytest.raises(BudgetError, match=r"the runtime \(.*: anonymous memory as measured at open, and 96.0 MiB"):
        GnnData(sbm, memory="64M", training=costs, own_process=True)
    # In a caller's own script the budget is the data path's: the process is not measured.
    plan = GnnData(sbm, fanouts=[5, 5], batch_size=100, memory="256M", training=costs).plan
    assert not plan["runtime_measured"] and plan["runtime_bytes"] == 64 << 20
