"""benches/bench_embed_pbg.py reads each epoch's training time off PyTorch-BigGraph's log, and
stops with what to do when it is given no PBG source tree, or one that does not import. (PBG's
GitHub main, which the bench runs, is not installable from a registry, so its runs are
measured by hand: docs/benchmarks.md, "PyTorch-BigGraph side by side".)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parents[1] / "benches"
sys.path.insert(0, str(BENCHES))

from bench_embed_pbg import epoch_seconds  # noqa: E402

#: Lines of PBG's log of a two-epoch run (one bucket an epoch).
LOG = """\
2026-11-26 07:00:01,512   [Trainer-0] Starting epoch 1 / 2, edge path 1 / 1, edge chunk 1 / 1
2026-11-26 07:00:06,508   [Trainer-0] ( 0 , 0 ): bucket 1 / 1 : Trained 272115 edges in 4.93 s ( 0.055 M/sec ); \
Eval 2*0 edges in 0.00 s ( 0 M/sec ); io: 0.01 s for 12,347,160 bytes ( 1197.16 MB/sec )
2026-11-26 07:00:06,528   [Trainer-0] Starting epoch 2 / 2, edge path 1 / 1, edge chunk 1 / 1
2026-11-26 07:00:11,425   [Trainer-0] ( 0 , 0 ): Training stats: loss:  4.61225 , reg:  0 , count:  272115
2026-11-26 07:00:11,425   [Trainer-0] ( 0 , 0 ): bucket 1 / 1 : Trained 272115 edges in 4.89 s ( 0.056 M/sec ); \
Eval 2*0 edges in 0.00 s ( 0 M/sec ); io: 0.01 s for 12,347,160 bytes ( 1197.16 MB/sec )
"""


def test_each_epoch_s_training_seconds_come_from_pbg_s_bucket_lines():
    assert epoch_seconds(LOG) == [4.93, 4.89]
    assert epoch_seconds("Starting epoch 1 / 2\n") == []


def bench(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, BENCHES / "bench_embed_pbg.py", "--no-doc", *args]
    return subprocess.run(list(map(str, cmd)), timeout=120, capture_output=True, text=True)


def test_the_bench_says_what_is_missing_before_it_trains(tmp_path):
    empty = bench("--pbg", tmp_path)
    assert empty.returncode != 0 and "no torchbiggraph/train_gpu.py there" in empty.stderr
    assert "GitHub main" in empty.stderr
    # A tree that is PBG's layout but does not import (as PBG without pkg_resources).
    pkg = tmp_path / "torchbiggraph"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import pkg_resources_of_old_setuptools\n")
    (pkg / "train_gpu.py").write_text("")
    (pkg / "train.py").write_text("")
    broken = bench("--pbg", tmp_path)
    assert broken.returncode != 0 and f"PyTorch-BigGraph from {tmp_path} does not import" in broken.stderr
    assert "pip install 'setuptools<81'" in broken.stderr
    assert "Traceback" not in broken.stderr
