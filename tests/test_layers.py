"""The crate layering (docs/architecture.md): tools/check_layers.py passes on the workspace and
fails, naming both crates, on metadata that breaks the rule."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "check_layers.py"

_spec = importlib.util.spec_from_file_location("check_layers", TOOL)
check_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layers)


def workspace(kind: str | None = None, **edges: tuple[str, ...]) -> dict:
    """Metadata of the layered workspace as it should be (each crate also using serde), with
    `edges` of dependency kind `kind` (None: normal, "dev", "build") added; crate names with `_`
    for `-`, e.g. strata_serve=("strata-gnn",)."""
    base = {
        "strata-io": (),
        "strata-store": ("strata-io",),
        "strata-graph": ("strata-io", "strata-store"),
        "strata-farmem": (),
        "strata-embed": ("strata-io", "strata-store"),
        "strata-gnn": ("strata-io", "strata-store", "strata-graph"),
        "strata-grid": ("strata-io", "strata-store", "strata-farmem"),
        "strata-serve": ("strata-io", "strata-store", "strata-graph"),
        "strata-py": (
            "strata-io",
            "strata-store",
            "strata-graph",
            "strata-embed",
            "strata-gnn",
            "strata-grid",
            "strata-farmem",
            "strata-serve",
        ),
    }
    deps = {n: [{"name": d, "kind": None} for d in (*ds, "serde")] for n, ds in base.items()}
    for crate, extra in edges.items():
        deps.setdefault(crate.replace("_", "-"), []).extend({"name": d, "kind": kind} for d in extra)
    return {"packages": [{"name": n, "dependencies": d} for n, d in deps.items()]}


def test_the_workspace_keeps_its_layers():
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed")
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_the_reference_workspace_passes():
    assert check_layers.violations(workspace()) == []


def test_an_engine_depending_on_another_fails_naming_both(tmp_path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(workspace(strata_serve=("strata-gnn",))))
    out = subprocess.run([sys.executable, str(TOOL), "--metadata", str(meta)], capture_output=True, text=True)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "strata-serve (engines) depends on strata-gnn (engines)" in lines[0]
    assert "engines must not depend on each other" in lines[0]


def test_a_dev_dependency_between_engines_fails_too():
    problems = check_layers.violations(workspace("dev", strata_embed=("strata-grid",)))
    assert problems == [
        "strata-embed (engines) depends on strata-grid (engines): engines must not depend on each "
        "other; move what they share down into strata-graph or strata-store"
    ]


@pytest.mark.parametrize(
    ("edges", "words"),
    [
        # Upwards through the layers.
        (
            {"strata_graph": ("strata-gnn",)},
            ["strata-graph (primitives) depends on strata-gnn (engines)", "lower layers"],
        ),
        ({"strata_farmem": ("strata-grid",)}, ["strata-farmem (tiers) depends on strata-grid (engines)"]),
        (
            {"strata_io": ("strata-store",)},
            ["strata-io (foundation) depends on strata-store (foundation)", "listed before it"],
        ),
        # A crate the layers do not know.
        ({"strata_vision": ("strata-io",)}, ["strata-vision is in no layer"]),
        ({"strata_gnn": ("strata-vision",)}, ["strata-gnn (engines) depends on strata-vision, which is in no layer"]),
    ],
)
def test_each_kind_of_break_is_named(edges, words):
    problems = check_layers.violations(workspace(**edges))
    assert len(problems) == 1, problems
    for w in words:
        assert w in problems[0]


def test_non_strata_dependencies_are_ignored():
    meta = workspace(strata_gnn=("serde", "thiserror"))
    assert check_layers.violations(meta) == []


def test_input_that_is_not_metadata_exits_2(tmp_path):
    cases = [("{", "Expecting"), ('{"packages": [{"name": "strata-io"}]}', "packages[0] (strata-io)")]
    for text, words in cases:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        out = subprocess.run([sys.executable, str(TOOL), "--metadata", str(bad)], capture_output=True, text=True)
        assert out.returncode == 2
        assert str(bad) in out.stderr and words in out.stderr
        assert "Traceback" not in out.stderr


def test_the_engine_packages_do_not_import_each_other():
    assert check_layers.python_violations(REPO / "python" / "strata") == []


@pytest.mark.parametrize(
    "source",
    [
        "from ...grid import dist\n",
        "from ... import gnn\n",
        "from ...serve.client import Client\n",
        "import strata.grid.dist\n",
        "from strata.gnn.loader import NodeLoader\n",
    ],
)
def test_an_engine_package_importing_another_fails_naming_file_and_line(tmp_path, source):
    for name in check_layers.PY_ENGINES:
        (tmp_path / "strata" / name / "sub").mkdir(parents=True)
    (tmp_path / "strata" / "embed" / "sub" / "ok.py").write_text("from .. import dist\nfrom ...torchrun import join\n")
    (tmp_path / "strata" / "embed" / "sub" / "bad.py").write_text("import os\n" + source)
    problems = check_layers.python_violations(tmp_path / "strata")
    assert len(problems) == 1
    assert "strata/embed/sub/bad.py:2" in problems[0] and "strata.embed imports strata." in problems[0]
