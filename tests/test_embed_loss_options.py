"""Edge weights, self-adversarial negative weighting and Bernoulli corruption through the CLI:
weights carry signal into training (and can be ignored), bad weights and options that cannot
apply exit 2 naming them, and both training options train and are recorded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import run_strata

# One thread: Hogwild on more is not deterministic, and the weights test compares two runs.
SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--epochs", "3", "--threads", "1"]


def summary(strata_cli, store: Path, run: Path, *args) -> dict:
    proc = strata_cli("embed", "train", store, "--run-dir", run, *SMALL, "-q", *args, "--json-summary")
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def noisy(kg: Path, tmp_path_factory) -> Path:
    """The kg fixture's triples with weight 1, plus as many random triples with weight 0 (and
    one store with a negative weight beside it)."""
    raw = kg.parent / "raw"
    d = tmp_path_factory.mktemp("noisy")
    rng = random.Random(3)
    train = [line.split("\t") for line in (raw / "train.txt").read_text().split("\n") if line]
    nodes = sorted({t[0] for t in train} | {t[2] for t in train})
    rels = sorted({t[1] for t in train})
    noise = [(rng.choice(nodes), rng.choice(rels), rng.choice(nodes)) for _ in train]
    lines = [f"{h}\t{r}\t{t}\t1\n" for h, r, t in train] + [f"{h}\t{r}\t{t}\t0\n" for h, r, t in noise]
    rng.shuffle(lines)
    (d / "in").mkdir()
    (d / "in" / "train.txt").write_text("".join(lines))
    for split in ("valid", "test"):
        text = (raw / f"{split}.txt").read_text()
        (d / "in" / f"{split}.txt").write_text("".join(f"{line}\t1\n" for line in text.split("\n") if line))
    cols = ["--relations", "--columns", "src,rel,dst,weight", "-q"]
    run_strata("convert", d / "in", "--out", d / "noisy.strata", *cols)
    lines[7] = "\t".join(lines[7].split("\t")[:3]) + "\t-0.5\n"
    (d / "in" / "train.txt").write_text("".join(lines))
    run_strata("convert", d / "in", "--out", d / "negative.strata", *cols)
    return d


def test_weights_carry_signal_and_can_be_ignored(noisy, tmp_path, strata_cli):
    proc = strata_cli("embed", "train", noisy / "noisy.strata", "--run-dir", tmp_path / "w", *SMALL, "--json-summary")
    weighted = json.loads(proc.stdout)
    assert "each edge's loss scaled by its weight, min 0, max 1" in proc.stderr, proc.stderr
    ignored = summary(strata_cli, noisy / "noisy.strata", tmp_path / "i", "--no-edge-weights")
    assert ignored["config"]["edge_weights"] is False
    # Weight 0 silences the random half of the training edges.
    assert weighted["test"]["mrr"] > ignored["test"]["mrr"] + 0.05, (weighted["test"], ignored["test"])


def test_negative_weights_exit_2_naming_the_row_unless_ignored(noisy, tmp_path, strata_cli):
    bad = strata_cli("embed", "train", noisy / "negative.strata", "--run-dir", tmp_path / "r", *SMALL, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "edge_weights_train row 7: weight -0.5" in bad.stderr, bad.stderr
    assert "edge_weights = false" in bad.stderr
    assert not (tmp_path / "r" / "run.json").exists()
    args = ["--epochs", "1", "--eval-every", "0", "--no-edge-weights"]
    strata_cli("embed", "train", noisy / "negative.strata", "--run-dir", tmp_path / "r", *SMALL, *args)


def test_self_adversarial_weighting_trains_and_refuses_softmax(kg, tmp_path, strata_cli):
    adv = summary(strata_cli, kg, tmp_path / "a", "--model", "rotate", "--loss", "logistic", "-p",
                  "embed.train.adversarial_temperature=1.0")  # fmt: skip
    assert adv["config"]["adversarial_temperature"] == 1.0
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert adv["test"]["mrr"] > 0.1, adv["test"]

    def refused(*args: str) -> str:
        proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r").exists()
        return proc.stderr

    softmax = refused("--adversarial-temperature", "1")
    assert "embed.train.adversarial_temperature" in softmax and '"softmax"' in softmax, softmax
    zero = refused("--loss", "margin", "--adversarial-temperature", "0")
    assert "embed.train.adversarial_temperature" in zero and "positive" in zero, zero
    # gamma shifts the logistic loss's scores only: the other losses compare scores.
    gamma = refused("--loss", "margin", "--gamma", "9")
    assert "embed.train.gamma" in gamma and '"logistic"' in gamma, gamma


def test_bernoulli_corruption_trains_and_says_its_probabilities(kg, tmp_path, strata_cli):
    proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "b", *SMALL, "--corrupt", "bernoulli",
                      "--partitions", "2", "--buffer", "2", "--ordering", "beta", "--json-summary")  # fmt: skip
    meta = json.loads(proc.stdout)
    assert meta["config"]["corrupt"] == "bernoulli"
    assert "Bernoulli corruption: P(corrupt head) per relation min" in proc.stderr, proc.stderr
    # Evaluated in both directions, as training trained both.
    assert meta["test"]["head_mrr"] > 0.1 and meta["test"]["tail_mrr"] > 0.1, meta["test"]
    assert meta["test"]["mrr"] > 0.2, meta["test"]


def test_uniform_init_draws_node_and_relation_rows_between_its_bounds(kg, tmp_path, strata_cli):
    # LibKGE's uniform_ with only a lower bound keeps torch's upper bound 1.0: asymmetric.
    import numpy as np

    run = tmp_path / "u"
    strata_cli("embed", "train", kg, "--run-dir", run, "--dim", "16", "--epochs", "1", "--lr", "1e-7",
               "--init", "uniform", "--init-low", "-0.5", "--init-high", "0.25", "--eval-every", "0", "-q")  # fmt: skip
    strata_cli("embed", "export", run, "--out", tmp_path / "x", "--format", "npy", "-q")
    nodes = np.load(tmp_path / "x" / "embeddings.npy")
    relations = np.load(run / "relations-e1.npy")
    for rows in (nodes, relations):
        # An epoch at lr 1e-7 moves no real by more than a few 1e-7.
        assert rows.min() >= -0.5 - 1e-5 and rows.max() <= 0.25 + 1e-5, (rows.min(), rows.max())
        assert abs(rows.mean() + 0.125) < 0.02, rows.mean()
    # Not ComplEx's default unit relation rows.
    assert np.abs(relations).max() < 0.51

    def refused(*args: str) -> str:
        proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r").exists()
        return proc.stderr

    assert "embed.train.init_high" in refused("--init-high", "0.5")
    swapped = refused("--init", "uniform", "--init-low", "1", "--init-high", "-1")
    assert "embed.train.init_low" in swapped and "init_low < init_high" in swapped, swapped


def test_xavier_init_scales_node_and_relation_rows_by_their_tables(kg, tmp_path, strata_cli):
    # torch's xavier_normal_ on each table: std sqrt(2 / (rows + reals)), over the whole node
    # table however it is partitioned, and over the relation rows with their inverses.
    import numpy as np

    run = tmp_path / "x"
    strata_cli("embed", "train", kg, "--run-dir", run, "--dim", "16", "--epochs", "1", "--lr", "1e-7",
               "--partitions", "2", "--init", "xavier_normal", "--init-gain", "2", "--eval-every", "0",
               "-q")  # fmt: skip
    strata_cli("embed", "export", run, "--out", tmp_path / "out", "--format", "npy", "-q")
    nodes = np.load(tmp_path / "out" / "embeddings.npy")
    relations = np.load(run / "relations-e1.npy")
    for rows in (nodes, relations):
        want = 2 * np.sqrt(2 / (rows.shape[0] + rows.shape[1]))
        # Thousands of normals (at lr 1e-7 an epoch moves none measurably): within 8%.
        assert abs(rows.std() / want - 1) < 0.08, (rows.shape, rows.std(), want)
        assert abs(rows.mean()) < 4 * want / np.sqrt(rows.size), rows.mean()
    refused = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, "--init-gain", "2", check=False)
    assert refused.returncode == 2 and "embed.train.init_gain" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "r").exists()


def test_negatives_per_edge_train_in_and_out_of_core_and_refuse_what_they_do_not_apply_to(kg, tmp_path, strata_cli):
    # The device step's parity with these is in test_embed_device.py.
    per_edge = ["--no-shared-negatives", "--chunk-size", "50", "--negatives", "16"]
    for name, extra in (("mem", []), ("ooc", ["--partitions", "2", "--buffer", "2", "--ordering", "beta"])):
        meta = summary(strata_cli, kg, tmp_path / name, "--model", "distmult", *per_edge, *extra)
        assert meta["config"]["shared_negatives"] is False
        # 400 candidates: a random ranking has an MRR near 0.015.
        assert meta["test"]["mrr"] > 0.2, (name, meta["test"])

    def refused(*args: str) -> str:
        proc = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "r").exists()
        return proc.stderr

    one = refused("--no-shared-negatives", "--training", "1vsAll")
    assert "embed.train.shared_negatives" in one and '"negative_sampling"' in one, one
    big = refused("--no-shared-negatives", "--chunk-size", "100000", "--negatives", "10000")
    assert "embed.train.negatives" in big and "1000000000 rows" in big, big


def test_a_count_of_negatives_per_side_trains_out_of_core_and_is_refused_without_head_corruption(
    kg, tmp_path, strata_cli
):
    # LibKGE's num_samples s and o; the device step's parity is in test_embed_device.py.
    meta = summary(strata_cli, kg, tmp_path / "sides", "--negatives-head", "16", "--partitions", "2", "--buffer", "2")
    assert meta["config"]["negatives"] == 64 and meta["config"]["negatives_head"] == 16
    assert meta["test"]["mrr"] > 0.2, meta["test"]
    tail = strata_cli("embed", "train", kg, "--run-dir", tmp_path / "r", *SMALL, "--negatives-head", "16",
                      "--corrupt", "tail", "--no-reciprocal", check=False)  # fmt: skip
    assert tail.returncode == 2 and "embed.train.negatives_head" in tail.stderr, tail.stderr
    assert '"tail"' in tail.stderr and "Traceback" not in tail.stderr and not (tmp_path / "r").exists()
