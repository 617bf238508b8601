"""A killed conversion, grid build or training run never leaves output that opens half-written.

Two kinds of kill: SIGKILL at named steps (``STRATA_FAULT=POINT[@N]`` makes the process kill
itself there: right after the manifest is written, just before and just after the rename, at an
epoch's checkpoint), and SIGKILL from outside at a spread of moments through a conversion that
takes about a second. After each, every directory that opens must be the complete output, every
``.partial-PID`` directory is refused with a store-format error, and running the command again
succeeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_strata
from strata import Store
from strata.errors import StoreFormatError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_crash_consistency")

STRATA = [sys.executable, "-m", "strata"]


def killed_at(point: str, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``strata ARGS`` with the fault point ``point`` armed; it must die by SIGKILL there."""
    env = {**os.environ, "STRATA_FAULT": point}
    proc = subprocess.run([*STRATA, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd)
    assert proc.returncode == -signal.SIGKILL, f"{point} was not reached: {proc.returncode}\n{proc.stderr}"
    return proc


def partials(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if ".partial-" in p.name)


def assert_refused(partial: Path, cli: bool = True) -> None:
    """A `.partial-PID` directory does not open, through the API or (``cli``) the CLI."""
    with pytest.raises(StoreFormatError, match="unfinished"):
        Store(partial)
    for command in (("info",), ("check",), ("grid", "info")) if cli else ():
        proc = run_strata(*command, partial, check=False)
        # `strata check` reports what it found on stdout; the others fail with a message.
        assert proc.returncode == 2 and "unfinished" in proc.stdout + proc.stderr, (command, proc.stderr)
        assert "Traceback" not in proc.stderr


def same_store(path: Path, reference: Path) -> None:
    """``path`` opens and holds what the uninterrupted conversion wrote."""
    got, want = Store(path).manifest, Store(reference).manifest
    assert got["arrays"] == want["arrays"] and got["graph"] == want["graph"]
    for name, info in want["arrays"].items():
        assert (path / info["file"]).read_bytes() == (reference / info["file"]).read_bytes(), name


def generated_kg(tmp_path_factory, entities: int, relations: int, triples: int) -> Path:
    """A generated knowledge graph's text splits."""
    raw = tmp_path_factory.mktemp("kg") / "raw"
    sizes = ["--entities", str(entities), "--relations", str(relations), "--triples", str(triples)]
    run_strata("generate", "kg", "--out", raw, *sizes, "-q")
    return raw


@pytest.fixture(scope="module")
def edges(tmp_path_factory) -> Path:
    return generated_kg(tmp_path_factory, 300, 4, 3000)


@pytest.fixture(scope="module")
def reference(edges, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "g.strata"
    run_strata("convert", edges, "--relations", "--out", out, "-q")
    return out


@pytest.mark.parametrize("point", ["store.manifest_written", "store.before_rename"])
def test_kill_before_the_rename_leaves_only_a_refused_partial(edges, reference, tmp_path, point):
    out = tmp_path / "g.strata"
    killed_at(point, "convert", edges, "--relations", "--out", out, "-q")
    assert not out.exists()
    (partial,) = partials(tmp_path)
    assert (partial / "manifest.json").is_file(), "the kill came after the manifest was written"
    # The CLI's refusal once (three child processes); the other point's partial through the API.
    assert_refused(partial, cli=point == "store.manifest_written")
    # A new conversion removes the dead process's partial and succeeds.
    run_strata("convert", edges, "--relations", "--out", out, "-q")
    assert partials(tmp_path) == []
    same_store(out, reference)


def test_kill_right_after_the_rename_leaves_the_complete_store(edges, reference, tmp_path):
    out = tmp_path / "g.strata"
    killed_at("store.after_rename", "convert", edges, "--relations", "--out", out, "-q")
    assert partials(tmp_path) == []
    same_store(out, reference)


@pytest.mark.parametrize("point", ["store.before_rename", "store.after_rename"])
def test_kill_while_overwriting_leaves_the_old_or_the_new_store(edges, reference, tmp_path, point):
    out = tmp_path / "g.strata"
    small = tmp_path / "small.tsv"
    small.write_text("a\tr\tb\nb\tr\tc\n")
    run_strata("convert", small, "--relations", "--out", out, "-q")
    old = Store(out).manifest
    killed_at(point, "convert", edges, "--relations", "--out", out, "--overwrite", "-q")
    if point == "store.before_rename":
        assert Store(out).manifest == old
        for partial in partials(tmp_path):
            assert_refused(partial, cli=False)  # the CLI refuses one: the test above
    else:
        same_store(out, reference)


def test_outputs_named_like_partials_are_refused(edges, tmp_path):
    proc = run_strata("convert", edges, "--relations", "--out", tmp_path / "g.partial-12", check=False)
    assert proc.returncode == 2 and "unfinished output" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def big_edges(tmp_path_factory) -> Path:
    """Input that takes about a second to convert on a small machine."""
    return generated_kg(tmp_path_factory, 25000, 20, 250000)


def test_sigkill_at_a_spread_of_moments_never_leaves_a_store_that_opens_half_written(big_edges, tmp_path):
    cmd = [*STRATA, "convert", str(big_edges), "--relations", "--threads", "2", "-q", "--out"]
    reference = tmp_path / "ref.strata"
    t0 = time.monotonic()
    subprocess.run([*cmd, str(reference)], check=True, capture_output=True)
    whole = time.monotonic() - t0
    work = tmp_path / "kills"
    work.mkdir()
    out = work / "g.strata"
    # Moments spread over the whole conversion, the last ones near and after its end (the
    # manifest, the fsyncs and the rename); which step each hits does not matter: all must hold.
    # A partial is opened through the API only: the tests above check that the CLI commands
    # refuse one too (the same check, three child processes each).
    for fraction in (0.05, 0.3, 0.5, 0.7, 0.85, 0.93, 0.97, 1.0):
        if out.exists():
            subprocess.run(["rm", "-rf", str(out)], check=True)
        proc = subprocess.Popen([*cmd, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(whole * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for entry in work.iterdir():
            if ".partial-" in entry.name:
                assert_refused(entry, cli=False)
            else:
                assert entry == out
                same_store(out, reference)
    subprocess.run([*cmd, str(out), "--overwrite"], check=True, capture_output=True)
    assert partials(work) == []
    same_store(out, reference)


@pytest.mark.parametrize("point", ["grid.manifest_written", "grid.before_rename"])
def test_killed_grid_build_leaves_no_grid_that_opens(reference, tmp_path, point):
    store = tmp_path / "g.strata"
    subprocess.run(["cp", "-r", str(reference), str(store)], check=True)
    killed_at(point, "grid", "build", store, "--partitions", "2", "--name", "g2")
    grids = store / "grids"
    assert not (grids / "g2").exists()
    (partial,) = partials(grids)
    assert (partial / "grid.json").is_file()
    proc = run_strata("grid", "info", partial, check=False)
    assert proc.returncode == 2 and "unfinished grid" in proc.stderr, proc.stderr
    assert "has no grids yet" in run_strata("grid", "info", store).stdout
    # `strata run` never picks the partial: it builds (and publishes) a grid of its own.
    run_strata("run", "pagerank", store, "--iterations", "2", "-q")
    assert len(json.loads(run_strata("grid", "info", store, "--json").stdout)) == 1
    # The next build of the same name removes the dead build's partial.
    run_strata("grid", "build", store, "--partitions", "2", "--name", "g2", "-q")
    assert partials(grids) == []
    assert [e["name"] for e in json.loads(run_strata("grid", "info", store, "--json").stdout)].count("g2") == 1


EMBED = ["--dim", "8", "--chunk-size", "200", "--negatives", "16", "--threads", "1", "-q"]


@pytest.mark.parametrize(
    ("point", "epoch_left"),
    [
        # The run's one partition is written behind validation: epoch 2's copy written to its
        # table, not yet synced.
        ("embed.written_behind@2", 1),
        # Setup commits the new run once (visit 1), then each epoch commits once.
        ("embed.checkpoint_written@3", 1),  # epoch 2's table and relations written, run.json not yet
        ("embed.run_json_written@3", 1),  # run.json.tmp written, not yet renamed over run.json
        ("embed.committed@3", 2),  # epoch 2 committed
    ],
)
def test_killed_checkpoint_leaves_the_previous_one_resumable(reference, tmp_path, point, epoch_left):
    run = tmp_path / "run"
    killed_at(point, "embed", "train", reference, "--run-dir", run, "--epochs", "3", *EMBED)
    meta = json.loads((run / "run.json").read_text())
    assert meta["current"]["epoch"] == epoch_left
    # The committed checkpoint loads and scores.
    run_strata("embed", "eval", run, "-q")
    run_strata("embed", "train", reference, "--run-dir", run, "--epochs", "3", *EMBED)
    assert json.loads((run / "run.json").read_text())["current"]["epoch"] == 3
    # The resumed run's commits removed the killed writer's temporary files.
    assert [p.name for p in run.iterdir() if ".tmp-" in p.name] == []


def test_run_creation_killed_before_its_first_commit_starts_again(reference, tmp_path):
    run = tmp_path / "run"
    killed_at("embed.checkpoint_written", "embed", "train", reference, "--run-dir", run, "--epochs", "1", *EMBED)
    assert not (run / "run.json").exists() and any(run.iterdir())
    proc = run_strata("embed", "eval", run, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    run_strata("embed", "train", reference, "--run-dir", run, "--epochs", "1", *EMBED)
    assert json.loads((run / "run.json").read_text())["current"]["epoch"] == 1
