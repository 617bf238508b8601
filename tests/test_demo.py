"""`strata demo` (what `make demo` runs) end to end: it trains out of core and prints its results."""

from __future__ import annotations

import json
import os
import re

from conftest import run_strata


def test_demo_trains_out_of_core_and_reports(tmp_path):
    env = {**os.environ, "STRATA_PROFILE_DIR": str(tmp_path / "profiles")}
    out = run_strata("demo", "--dir", tmp_path / "demo", env=env).stdout
    # More partitions on disk than buffer slots: the table does not fit the budget.
    meta = json.loads((tmp_path / "demo" / "kg.strata" / "runs" / "embed" / "run.json").read_text())
    assert meta["partitioning"]["partitions"] > 3
    test_mrr = float(re.search(r"test: filtered MRR (\d\.\d+)", out).group(1))
    assert test_mrr > 0.1, out
    assert re.search(r"median epoch [\d.]+ s", out)
    assert "saved to" in out and list((tmp_path / "profiles").glob("*.json"))
    assert "<- the held-out answer" in out or re.search(r"   1\. e\d+", out)
    assert "Demo finished" in out
