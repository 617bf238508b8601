"""The package a user installs: the abi3 wheel maturin builds, installed into a fresh virtualenv
(its dependencies resolved by pip as a user's would be) and run outside the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*cmd, cwd: Path, env: dict) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = tmp_path / "wheels"
    run(bin_dir / "maturin", "build", "--release", "--quiet", "--out", wheels, cwd=REPO, env=env)
    (wheel,) = wheels.glob("*.whl")
    # One wheel for every CPython from 3.11 on, distributed as strata-gl.
    assert wheel.name.startswith("strata_gl-") and "-cp311-abi3-" in wheel.name, wheel.name

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=tmp_path, env=env)

    work = tmp_path / "work"
    work.mkdir()
    where = run(
        venv / "bin" / "python",
        "-c",
        "import importlib.metadata as m, strata; print(strata.__file__, m.version('strata-gl'))",
        cwd=work,
        env=env,
    )
    assert str(venv) in where and str(REPO) not in where, where
    strata = venv / "bin" / "strata"
    assert "convert" in run(strata, "--help", cwd=work, env=env)
    run(strata, "generate", "kg", "--out", "kg", "--entities", "300", "--relations", "4", "--triples", "6000", "-q",
        cwd=work, env=env)  # fmt: skip
    run(strata, "convert", "kg", "--relations", "--out", "kg.strata", "-q", cwd=work, env=env)
    out = run(strata, "embed", "train", "kg.strata", "--dim", "16", "--epochs", "2", "--negatives", "32", cwd=work,
              env=env)  # fmt: skip
    assert "filtered MRR" in out, out
