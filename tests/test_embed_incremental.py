"""`strata embed train NEW --init-from RUN` through the CLI: a run on a grown store starts from
an earlier run (entities and relations matched by name), and mismatches exit 2 with a message.
The bit-exact carry of rows and optimizer state and the streaming remap are checked in
crates/strata-embed/tests/incremental.rs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cli_in_process import first_in_child
from conftest import run_strata
from strata.embed import Run

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_incremental")

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1", "-q"]


def write_kg(d: Path, triples: list[tuple[int, int, int]]) -> Path:
    """train/valid/test TSVs of named triples (valid and test: the same fixed 10% each)."""
    d.mkdir(parents=True)
    files = {"train": [], "valid": [], "test": []}
    for i, (h, r, t) in enumerate(triples):
        split = "valid" if i % 20 == 18 else "test" if i % 20 == 19 else "train"
        files[split].append(f"e{h}\tr{r}\te{t}\n")
    for split, lines in files.items():
        (d / f"{split}.txt").write_text("".join(lines))
    return d


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """An old store (90% of the triples), the grown store (all of them), a 3-epoch run on the
    old store with 3 partitions and a 1-epoch run from scratch on the grown store with 4."""
    d = tmp_path_factory.mktemp("incr")
    rng = random.Random(5)
    triples = []
    for _ in range(12000):
        h, r = rng.randrange(300), rng.randrange(6)
        triples.append((h, r, (h * (r + 1) + rng.randrange(3)) % 300))
    # New entities 300..339 appear only in the last 10% of the triples.
    triples += [(300 + i % 40, i % 6, i % 300) for i in range(1300)]
    stores = []
    for name, part in (("old", triples[:12000]), ("new", triples)):
        raw = write_kg(d / name, part)
        run_strata("convert", raw, "--relations", "--out", d / f"{name}.strata", "-q")
        stores.append(d / f"{name}.strata")
    run = d / "old-run"
    run_strata("embed", "train", stores[0], "--run-dir", run, "--epochs", "3", "--partitions", "3", *SMALL)
    fresh = d / "fresh-run"
    run_strata("embed", "train", stores[1], "--run-dir", fresh, "--epochs", "1", "--partitions", "4", *SMALL)
    return stores[0], stores[1], run, fresh


def first_valid_mrr(run: Path) -> float:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["valid"]["mrr"]


def test_init_from_carries_the_old_run(grown, tmp_path, strata_cli):
    _, new, base, fresh = grown
    incr = tmp_path / "incr"
    proc = strata_cli(
        "embed", "train", new, "--run-dir", incr, "--epochs", "1", "--partitions", "4", "--init-from", base, *SMALL[:-1]
    )
    old_nodes, new_nodes = Run(base).meta["num_nodes"], Run(incr).meta["num_nodes"]
    assert new_nodes > old_nodes
    assert (
        f"{old_nodes} known nodes and 6 relations carried with their optimizer state, {new_nodes - old_nodes} new"
        in proc.stderr
    )
    assert "3 partitions into 4" in proc.stderr
    assert Run(incr).meta["config"]["init_from"] == str(base)
    # One epoch on the grown graph: the carried model ranks far better than a random start.
    assert first_valid_mrr(incr) > first_valid_mrr(fresh) + 0.1, (first_valid_mrr(incr), first_valid_mrr(fresh))
    # The run resumes as an incremental run; another origin is another run.
    strata_cli("embed", "train", new, "--run-dir", incr, "--epochs", "2", "--init-from", base, *SMALL)
    assert Run(incr).meta["current"]["epoch"] == 2
    other = strata_cli(
        "embed", "train", new, "--run-dir", incr, "--epochs", "3", "--init-from", fresh, *SMALL, check=False
    )
    assert other.returncode == 2 and "different embed.train.init_from" in other.stderr


def test_mismatches_exit_2(grown, tmp_path, strata_cli, capsys):
    # The first command in a child process, the rest in this one (tests/cli_in_process.py).
    strata_cli = first_in_child(strata_cli, capsys)
    old, new, base, fresh = grown

    def refused(store, origin, *extra) -> str:
        proc = strata_cli(
            "embed", "train", store, "--run-dir", tmp_path / "r", "--init-from", origin, *SMALL, *extra, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "r").exists(), "refused before the run writes anything"
        return proc.stderr

    assert "was trained with dim 16, this run asks for 8" in refused(new, base, "--dim", "8")
    assert "was trained with model complex, this run asks for distmult" in refused(new, base, "--model", "distmult")
    assert "not a run directory" in refused(new, tmp_path / "nothing")
    # The old run's entities must all be in the new store (refused, not dropped).
    err = refused(old, fresh)
    assert "40 node(s) of the old run's store" in err and "'e30" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    err = refused(new, broken)
    assert "cannot use run" in err and "not a run record" in err
