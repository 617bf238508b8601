"""benches/show_profile.py prints every profile a bench's JSON holds, wherever it sits, most
time first as the bench ranked it, cut to ``--top`` rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benches" / "show_profile.py"


def test_each_nested_profile_is_printed_with_its_path(tmp_path):
    row = lambda name, us: {"name": name, "calls": 2.0, "device_us": us, "host_us": 1.5}  # noqa: E731
    result = {
        "b1": {"seconds": 0.1, "profile": [row("bmm", 30.0), row("softmax", 20.0), row("adagrad", 10.0)]},
        "figures": {"path": {"runs": {"alone": {"profile": [row("index", 5.0)]}}}},
        "failed_kernels": {},
    }
    (tmp_path / "r.json").write_text(json.dumps(result))
    out = subprocess.run(
        [sys.executable, SCRIPT, tmp_path / "r.json", "--top", "2"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert out[0].startswith("b1: per unit") and out[3].startswith("figures/path/runs/alone: per unit")
    assert [line.split()[-1] for line in out[1:3]] == ["bmm", "softmax"] and out[4].split()[-1] == "index"
    assert len(out) == 5
