"""The GNN training step padded to fixed shapes (CUDA graphs on a GPU) against the eager step
over the batch as sampled: the same loss, predictions and Adam updates for every untyped layer
kind, batches reusing a shape that holds them, the cap on shapes, and `strata gnn train --step`
end to end. On the CPU the padded step runs op by op (the twin); where torch sees a GPU the
same comparison runs there with the step captured and replayed."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import gpu_devices, needs, run_strata

torch = needs("torch")

from strata.errors import ConfigError  # noqa: E402
from strata.gnn import step as step_mod  # noqa: E402
from strata.gnn.loader import GnnData  # noqa: E402
from strata.gnn.models import GNN, LAYERS  # noqa: E402
from strata.gnn.step import Shape, TrainStep, round_up  # noqa: E402
from strata.gnn.train import step_mode  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_gnn_step")

UNTYPED = [k for k, v in LAYERS.items() if not v.typed]


def test_round_up_pads_at_most_an_eighth_and_keeps_order():
    sizes = [1, 7, 8, 9, 15, 16, 17, 100, 1000, 1024, 1025, 26_001, 1 << 20, (1 << 20) + 1]
    padded = [round_up(n) for n in sizes]
    for n, p in zip(sizes, padded, strict=True):
        assert n <= p <= max(8, n + n // 8), (n, p)
    assert padded == sorted(padded)
    assert round_up(1025) == 1152 and round_up(1024) == 1024


def test_a_shape_holds_the_batches_with_fewer_nodes_in_every_hop_and_no_more_edges():
    a = Shape((64, 200, 500), (300, 40))
    assert a.holds(Shape((63, 199, 499), (300, 40)))
    assert a.holds(Shape((10, 10, 2), (10, 3)))
    assert not a.holds(Shape((64, 10, 10), (3, 4)))  # every hop keeps a pad row
    assert not a.holds(Shape((10, 10, 10), (300, 41)))
    assert not a.holds(Shape((10, 10), (30,)))
    b = Shape((64, 199, 500), (300, 40))
    assert b.padded().holds(b) and all(p > h for p, h in zip(b.padded().hops, b.hops, strict=True))


def batches(cora, device: str, count: int, fanouts=(5, 5), data_path: str = "native") -> list:
    on = {"device": device} if data_path == "device" else {}  # the device path's own device
    data = GnnData(cora, fanouts=list(fanouts), batch_size=64, data_path=data_path, **on)
    loader = data.loader(data.nodes("train"), shuffle=True, device=device, epoch=0)
    return [b for _, b in zip(range(count), loader, strict=False)]


def pair(kind: str, data_dim: int, classes: int, device: str, capturable: bool, layers: int = 2):
    torch.manual_seed(7)
    model = GNN(kind, data_dim, 16, classes, layers=layers, dropout=0.0, heads=2).to(device)
    twin = copy.deepcopy(model)

    # eps 1e-3, not 1e-8: on cuda a padded batch's sums (GAT's attention by atomic adds) take
    # another order than the eager one's, and Adam's step turns a gradient near eps that differs
    # in its sixth digit into a step of another size (a 3-layer GAT's first weights differed by
    # more than 1e-5 on an H200); eps 1e-3 keeps such noise well inside the tolerance and a
    # wrong gradient outside it.
    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=5e-4, eps=1e-3, capturable=capturable)

    return (model, adam(model)), (twin, adam(twin))


@pytest.mark.parametrize("device", gpu_devices("cpu"))
@pytest.mark.parametrize(
    ("kind", "fanouts"), [(kind, (5, 5)) for kind in UNTYPED] + [("gcn", (4, 3, 2)), ("gat", (4, 3, 2))]
)
def test_padded_steps_train_as_the_eager_steps_do(cora, kind, fanouts, device):
    assert_padded_trains_as_eager(batches(cora, device, 4, fanouts), kind, len(fanouts), device)


@pytest.mark.parametrize("device", gpu_devices("cpu"))
@pytest.mark.parametrize(("kind", "fanouts"), [("sage", (5, 5)), ("gat", (4, 3, 2))])
def test_device_path_batches_hand_the_padded_step_their_draw_s_sizes(cora, kind, fanouts, device):
    """The device data path's batches carry their bounded draw's sizes, which the padded step
    copies in one op where it fills them for a native batch: it trains as the eager step does."""
    bs = batches(cora, device, 4, fanouts, data_path="device")
    assert all(b.drawn_sizes is not None for b in bs)
    assert_padded_trains_as_eager(bs, kind, len(fanouts), device)


def assert_padded_trains_as_eager(bs: list, kind: str, layers: int, device: str) -> None:
    """Two twins of a ``kind`` GNN trained on ``bs``, eager and padded, take the same losses,
    predictions, updates and epoch sums."""
    (m1, o1), (m2, o2) = pair(kind, bs[0].x.shape[1], 7, device, device == "cuda", layers=layers)
    eager, padded = TrainStep(m1, o1, device, "eager"), TrainStep(m2, o2, device, "graphs")
    loss_sum = correct = 0
    for b in bs:
        l1, c1 = eager(b)
        l2, c2 = padded(b)
        assert float(l2) == pytest.approx(float(l1), rel=1e-5, abs=1e-6)
        assert int(c2) == int(c1)
        for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
            assert torch.allclose(p1, p2, rtol=1e-4, atol=1e-5), (kind, name)
        loss_sum, correct = loss_sum + float(l1) * b.num_seeds, correct + int(c1)
    # Each step adds its batch to the epoch's sums on the device (a replayed graph included).
    for step in (eager, padded):
        totals = step.take_totals()
        assert totals == (pytest.approx(loss_sum, rel=1e-5), correct), step.mode
        assert step.take_totals() == (0.0, 0)
    counts = padded.take_counts()
    assert counts["eager"] == 0 and sum(counts.values()) - counts["captured"] == len(bs)
    assert len(padded.shapes) < len(bs)  # later batches reuse shapes that hold them
    if device == "cuda":
        assert counts["captured"] == len(padded.shapes) and counts["replayed"] == len(bs) - len(padded.shapes)
    else:
        assert counts["padded"] == len(bs) and counts["captured"] == 0
    assert eager.take_counts()["eager"] == len(bs)


def test_a_batch_no_shape_holds_trains_as_sampled_once_the_shapes_are_full(cora, monkeypatch):
    monkeypatch.setattr(step_mod, "MAX_SHAPES", 1)
    bs = batches(cora, "cpu", 6)
    (m1, o1), (m2, o2) = pair("sage", bs[0].x.shape[1], 7, "cpu", capturable=False)
    eager, padded = TrainStep(m1, o1, "cpu", "eager"), TrainStep(m2, o2, "cpu", "graphs")
    held = Shape.of(bs[0]).padded()
    for b in bs:
        assert float(padded(b)[0]) == pytest.approx(float(eager(b)[0]), rel=1e-5, abs=1e-6)
    outside = sum(not held.holds(Shape.of(b)) for b in bs)
    counts = padded.take_counts()
    assert len(padded.shapes) == 1 and counts == {"eager": outside, "padded": len(bs) - outside, "replayed": 0,
                                                  "captured": 0}  # fmt: skip
    assert padded.describe() == {"mode": "graphs", "cuda_graphs": False,
                                 "shapes": [{"hops": list(held.hops), "edges": list(held.edges)}]}  # fmt: skip


def test_the_step_mode_refuses_graphs_where_they_cannot_work():
    cfg = SimpleNamespace(step="graphs", store="s.strata")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    with pytest.raises(ConfigError, match=r"gnn\.train\.step: graphs trains in one process"):
        step_mode(cfg, cuda, ranks=object(), typed=False)
    with pytest.raises(ConfigError, match=r"s\.strata is a typed store"):
        step_mode(cfg, cuda, ranks=None, typed=True)
    assert step_mode(cfg, cpu, None, False) == "graphs"
    auto = SimpleNamespace(step="auto", store="s.strata")
    assert step_mode(auto, cuda, None, False) == "graphs"
    assert step_mode(auto, cpu, None, False) == "eager"
    assert step_mode(auto, cuda, object(), False) == "eager"
    assert step_mode(auto, cuda, None, True) == "eager"
    with pytest.raises(ValueError, match="mode must be one of eager, graphs"):
        TrainStep(None, None, "cpu", "fast")


def test_gnn_train_with_padded_steps_matches_the_eager_run(cora, tmp_path):
    runs = {}
    for mode in ("eager", "graphs"):
        out = run_strata(
            "gnn", "train", cora, "--device", "cpu", "--step", mode, "--dropout", "0", "--epochs", "2",
            "--fanouts", "5,5", "--batch-size", "64", "--hidden", "16", "--run-dir", tmp_path / mode,
        )  # fmt: skip
        runs[mode] = json.loads((tmp_path / mode / "run.json").read_text())
        if mode == "graphs":
            assert "training step: batches padded to at most" in out.stdout + out.stderr
    eager, graphs = runs["eager"], runs["graphs"]
    assert graphs["train_step"]["mode"] == "graphs" and graphs["train_step"]["shapes"]
    assert eager["train_step"] == {"mode": "eager", "cuda_graphs": False, "shapes": []}
    for e, g in zip(eager["history"], graphs["history"], strict=True):
        assert np.isclose(g["loss"], e["loss"], rtol=1e-4)
        assert g["step"]["padded"] + g["step"]["eager"] == e["step"]["eager"] == e["batches"]
    assert np.isclose(graphs["test"]["accuracy"], eager["test"]["accuracy"], atol=0.01)


@pytest.mark.parametrize("device", gpu_devices("cpu"))
@pytest.mark.parametrize("mode", ["eager", "auto"])
def test_each_step_trains_with_dropout_beside_the_device_path_s_sampler(cora, tmp_path, device, mode):
    # On CUDA the sampler captures its graphs on the data path's thread while the step draws
    # dropout masks op by op or captures its own: torch fails either beside a capture unless
    # they take turns (strata.device.capture).
    run = tmp_path / mode
    run_strata(
        "gnn", "train", cora, "--device", device, "--data-path", "device", "--step", mode, "--dropout", "0.5",
        "--epochs", "2", "--fanouts", "5,5", "--batch-size", "64", "--hidden", "16", "--run-dir", run,
    )  # fmt: skip
    history = json.loads((run / "run.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [1, 2] and all(np.isfinite(h["loss"]) for h in history)
