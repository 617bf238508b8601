"""Shared fixtures: the real datasets beside the checkout, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


@pytest.fixture
def shared_datasets() -> Path:
    """``../shared/datasets`` (FB15k-237, WN18RR, Planetoid); tests skip when it is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"{SHARED_DATASETS} is absent (CI always has it)")
    return SHARED_DATASETS


def run_strata(*args: str | os.PathLike, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python -m strata ARGS`` and returns the completed process (text output)."""
    proc = subprocess.run([sys.executable, "-m", "strata", *map(str, args)], capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture
def strata_cli():
    return run_strata
