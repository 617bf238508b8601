"""`strata plot` on GNN runs: a finished run through the CLI and the Python API, a store naming
its only GNN run, a run still training (metrics.jsonl only), a record with the device tier,
and directories that are no run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import needs

needs("torch")
needs("matplotlib")

from cli_in_process import strata_in_process  # noqa: E402
from conftest import run_strata  # noqa: E402
from strata.errors import ConfigError, RunError  # noqa: E402
from strata.plot import plot_run  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_plot_gnn")

PNG = b"\x89PNG\r\n\x1a\n"
CHARTS = ["accuracy.png", "loader.png", "loss.png", "tiers.png"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small labelled SBM store with a 2-epoch GraphSAGE run at its default run directory."""
    d = tmp_path_factory.mktemp("gnnplot")
    run_strata("generate", "sbm", "--out", d / "raw", "--nodes", "600", "--classes", "3", "--feature-dim", "16",
               "--avg-degree", "8", "-q")  # fmt: skip
    run_strata("convert", d / "raw", "--symmetrize", "--out", d / "sbm.strata", "-q")
    run_strata("gnn", "train", d / "sbm.strata", "--fanouts", "5,5", "--batch-size", "64", "--epochs", "2",
               "--hidden", "16", "--feature-memory", "16K", "--device", "cpu", "-q")  # fmt: skip
    return d / "sbm.strata"


def _check_pngs(paths, names=CHARTS) -> None:
    assert sorted(Path(p).name for p in paths) == sorted(names)
    for p in paths:
        data = Path(p).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, p


def test_cli_plots_a_gnn_run(store, tmp_path, capsys):
    run = store / "runs" / "gnn-sage"
    out = run_strata("plot", run, "--out", tmp_path / "charts").stdout.split()
    _check_pngs(out)
    assert all(Path(p).parent == tmp_path / "charts" for p in out)
    # A store without an embedding run means its only GNN run; charts land in RUN/plots. In this
    # process (tests/cli_in_process.py): matplotlib's import costs a child ~1 CPU s.
    _check_pngs(strata_in_process(capsys)("plot", store).stdout.split())
    assert sorted(p.name for p in (run / "plots").iterdir()) == CHARTS


def test_api_plots_a_run_in_progress_and_a_device_tier(store, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(store / "runs" / "gnn-sage", run, ignore=shutil.ignore_patterns("plots"))
    _check_pngs(plot_run(run))
    # While training, only metrics.jsonl exists; a half-written last line is ignored.
    (run / "run.json").unlink()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        tiers = r["pipeline"]["tiers"]
        tiers["device_rows"], tiers["hot_rows"] = tiers["hot_rows"] // 2, tiers["hot_rows"] - tiers["hot_rows"] // 2
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"epoch": 3, "lo')
    _check_pngs(plot_run(run, tmp_path / "live"))


def test_bad_directories(store, tmp_path):
    stuff = tmp_path / "stuff"
    stuff.mkdir()
    proc = run_strata("plot", stuff, check=False)
    assert proc.returncode == 2 and f"{stuff}: not a run directory" in proc.stderr
    assert "strata gnn train" in proc.stderr
    proc = run_strata("plot", tmp_path / "missing", check=False)
    assert proc.returncode == 2 and "no such run directory" in proc.stderr
    (stuff / "run.json").write_text('{"config": {}}')
    with pytest.raises(RunError, match=r"neither an embedding run .* nor a GNN run"):
        plot_run(stuff)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    with pytest.raises(RunError, match="not a run directory"):
        plot_run(empty)
    two = tmp_path / "two.strata"
    shutil.copytree(store, two)
    shutil.copytree(two / "runs" / "gnn-sage", two / "runs" / "gnn-gcn")
    with pytest.raises(RunError, match="several GNN runs"):
        plot_run(two)
    # An epoch picks an embedding run's timeline; a GNN run's charts were drawn as if it were not given.
    with pytest.raises(ConfigError, match=r"plot\.epoch: picks an embedding run's timeline; .* is a gnn run"):
        plot_run(store / "runs" / "gnn-sage", tmp_path / "e", epoch=2)
