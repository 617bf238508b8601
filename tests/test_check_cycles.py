"""tools/check_cycles.py: import circles among a crate's modules and the Python package's are
found with the line behind each dependency; re-exports are followed, test code is left out, and
a workspace without circles passes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "check_cycles.py"

_spec = importlib.util.spec_from_file_location("check_cycles", TOOL)
check_cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_cycles)


def write(root: Path, files: dict[str, str]) -> Path:
    """Writes `files` (path relative to `root` -> text) and returns `root`."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def run(root: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, str(TOOL), "--root", str(root)], capture_output=True, text=True, timeout=60)
    assert out.stderr == ""
    return out.returncode, out.stdout


def test_a_circle_between_two_modules_is_listed_with_the_line_of_each_dependency(tmp_path):
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\n",
            "crates/demo/src/a.rs": "use crate::b::Thing;\n\npub struct Other;\n",
            "crates/demo/src/b.rs": "pub struct Thing;\n\nfn f() -> crate::a::Other {\n    todo!()\n}\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "demo: 2 modules form a circle: a, b" in out
    assert "a -> b  (crates/demo/src/a.rs:1: crate::b::Thing)" in out
    assert "b -> a  (crates/demo/src/b.rs:3: crate::a::Other)" in out
    assert out.strip().endswith("check_cycles: 1 import circle(s)")


def test_a_re_export_is_followed_to_where_the_name_is_defined(tmp_path):
    # `a` imports Thing through lib.rs's facade; Thing lives in `b`, which uses `a`.
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\npub use b::Thing;\n",
            "crates/demo/src/a.rs": "use crate::Thing;\n\npub fn helper() {}\n",
            "crates/demo/src/b.rs": "pub struct Thing;\n\nfn f() {\n    crate::a::helper();\n}\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "a -> b  (crates/demo/src/a.rs:1: crate::Thing)" in out


def test_test_code_is_left_out(tmp_path):
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\n",
            "crates/demo/src/a.rs": "use crate::b::Thing;\n\npub struct Other;\n",
            "crates/demo/src/b.rs": ("pub struct Thing;\n\n#[cfg(test)]\nmod tests {\n    use crate::a::Other;\n}\n"),
        },
    )
    assert run(tmp_path) == (0, "check_cycles: no import circle\n")


def test_a_child_reaching_into_its_parent_mod_rs_is_a_circle(tmp_path):
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "pub mod pipe;\n",
            "crates/demo/src/pipe/mod.rs": (
                "mod stage;\n\nuse stage::go;\n\npub struct Batch;\n\npub fn run() {\n    go();\n}\n"
            ),
            "crates/demo/src/pipe/stage.rs": "use super::Batch;\n\npub fn go() {}\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "demo: 2 modules form a circle: pipe, pipe::stage" in out
    assert "pipe::stage -> pipe  (crates/demo/src/pipe/stage.rs:1: super::Batch)" in out


def test_a_parent_that_only_declares_and_re_exports_makes_no_circle(tmp_path):
    # The fix the one above calls for: what the children share lives in a child.
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "pub mod pipe;\n",
            "crates/demo/src/pipe/mod.rs": "mod batch;\nmod stage;\npub use batch::Batch;\n",
            "crates/demo/src/pipe/batch.rs": "pub struct Batch;\n",
            "crates/demo/src/pipe/stage.rs": "use super::Batch;\n\npub fn go(_: Batch) {}\n",
        },
    )
    assert run(tmp_path) == (0, "check_cycles: no import circle\n")


def test_a_path_written_in_code_without_a_use_line_counts(tmp_path):
    # The parent names its child only inline (a registry macro's list, `stage::Stage`), and
    # the child uses what the parent defines.
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "pub mod pipe;\n",
            "crates/demo/src/pipe/mod.rs": (
                "mod stage;\n\npub struct Batch;\n\ncrate::registry! {\n    stage::Stage,\n}\n"
            ),
            "crates/demo/src/pipe/stage.rs": "use super::Batch;\n\npub struct Stage(Batch);\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "demo: 2 modules form a circle: pipe, pipe::stage" in out
    assert "pipe -> pipe::stage  (crates/demo/src/pipe/mod.rs:6: stage::Stage)" in out


def test_an_inline_path_through_a_used_module_counts(tmp_path):
    # `a` uses the module `outer` (which only declares `inner`); its call `outer::inner::f()`
    # is what ties it to `inner`, which uses `a`.
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod outer;\n",
            "crates/demo/src/a.rs": "use crate::outer;\n\npub struct Other;\n\nfn h() {\n    outer::inner::f();\n}\n",
            "crates/demo/src/outer/mod.rs": "pub mod inner;\n",
            "crates/demo/src/outer/inner.rs": "pub fn f() {}\n\nfn g() -> crate::a::Other {\n    todo!()\n}\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "demo: 2 modules form a circle: a, outer::inner" in out
    assert "a -> outer::inner  (crates/demo/src/a.rs:6: outer::inner::f)" in out


def test_paths_outside_the_crate_and_to_local_types_make_no_dependency(tmp_path):
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\n",
            "crates/demo/src/a.rs": (
                "use std::fmt;\nuse crate::b::Thing;\n\npub enum Kind {\n    One,\n}\n\n"
                "fn f(_: &dyn fmt::Debug) -> Kind {\n    std::mem::drop(Thing);\n    Kind::One\n}\n"
            ),
            "crates/demo/src/b.rs": (
                "#[derive(serde::Serialize)]\npub struct Thing;\n\n"
                "impl Thing {\n    fn new() -> Self {\n        Self::make()\n    }\n}\n"
            ),
        },
    )
    assert run(tmp_path) == (0, "check_cycles: no import circle\n")


def test_python_circles_count_imports_inside_functions(tmp_path):
    write(
        tmp_path,
        {
            "python/strata/__init__.py": "",
            "python/strata/a.py": "from strata.b import g\n",
            "python/strata/b.py": "def g():\n    from strata import a\n    return a\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "python: 2 modules form a circle: strata.a, strata.b" in out
    assert "strata.b -> strata.a  (python/strata/b.py:2: import strata.a)" in out


def test_python_re_exports_of_a_package_are_followed(tmp_path):
    # `a` imports g through the package `pkg`, which re-exports it from `pkg.impl`.
    write(
        tmp_path,
        {
            "python/strata/__init__.py": "",
            "python/strata/a.py": "from strata.pkg import g\n\n\ndef h():\n    return 1\n",
            "python/strata/pkg/__init__.py": "from .impl import g\n",
            "python/strata/pkg/impl.py": "from strata.a import h\n\n\ndef g():\n    return h()\n",
        },
    )
    code, out = run(tmp_path)
    assert code == 1
    assert "strata.a -> strata.pkg.impl" in out


def test_no_circle_exits_0(tmp_path):
    write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\npub use a::Other;\n",
            "crates/demo/src/a.rs": "use crate::b::Thing;\n\npub struct Other(Thing);\n",
            "crates/demo/src/b.rs": "pub struct Thing;\n",
            "python/strata/__init__.py": "from .a import f\n",
            "python/strata/a.py": "from strata.b import g\n\n\ndef f():\n    return g()\n",
            "python/strata/b.py": "def g():\n    return 1\n",
        },
    )
    assert run(tmp_path) == (0, "check_cycles: no import circle\n")
    assert check_cycles.main(["--root", str(tmp_path)]) == 0


def test_the_workspace_has_no_circle():
    assert run(REPO) == (0, "check_cycles: no import circle\n")
