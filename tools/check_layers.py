"""Checks that the workspace's crates depend on each other only downwards through the layers.

    python tools/check_layers.py                   # runs `cargo metadata --no-deps`
    python tools/check_layers.py --metadata FILE   # checks a saved `cargo metadata` output

The layers, lowest first (docs/architecture.md explains them):

    foundation  strata-io <- strata-store      (in this order)
    primitives  strata-graph
    tiers       strata-farmem
    engines     strata-embed, strata-gnn, strata-grid, strata-serve
    bindings    strata-py

A crate may depend on the crates of lower layers, and, in the foundation only, on the crates
listed before it in its own layer. Engines never depend on each other: what two of them share
moves down into strata-graph or strata-store. The same holds for the engines' Python packages
(python/strata/{embed,gnn,grid,serve}): one never imports another; what they share lives in a
module beside them (strata.torchrun, strata.store, ...). Every kind of dependency counts (normal, dev,
build), and every crate of the workspace named strata-* must be in a layer, so a new crate
cannot slip past the rule. Exits 1 naming each offending edge, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

# (layer, crates, whether a crate may depend on the ones listed before it in its layer)
LAYERS: list[tuple[str, list[str], bool]] = [
    ("foundation", ["strata-io", "strata-store"], True),
    ("primitives", ["strata-graph"], False),
    ("tiers", ["strata-farmem"], False),
    ("engines", ["strata-embed", "strata-gnn", "strata-grid", "strata-serve"], False),
    ("bindings", ["strata-py"], False),
]


#: The engines' Python packages under python/strata; none may import another.
PY_ENGINES = ["embed", "gnn", "grid", "serve"]


def _imported_engine(node: ast.AST, package: list[str]) -> str | None:
    """The engine package (other than the module's own) that the import ``node`` names, with
    relative imports resolved against the module's ``package`` (``["strata", "gnn", ...]``)."""
    if isinstance(node, ast.ImportFrom):
        base = package[: len(package) - (node.level - 1)] if node.level else []
        if node.module:
            names = [[*base, *node.module.split(".")]]
        else:
            # `from .. import grid` names the module in the alias.
            names = [[*base, a.name] for a in node.names]
    elif isinstance(node, ast.Import):
        names = [a.name.split(".") for a in node.names]
    else:
        return None
    for parts in names:
        if len(parts) >= 2 and parts[0] == "strata" and parts[1] in PY_ENGINES and parts[1] != package[1]:
            return parts[1]
    return None


def python_violations(root: Path) -> list[str]:
    """Each import in the engine packages under ``root`` (the ``python/strata`` folder) of another
    engine package, as a sentence naming the file, line and both engines; [] when none does."""
    problems: list[str] = []
    for package in PY_ENGINES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            module_package = list(path.relative_to(root.parent).parent.parts)
            for node in ast.walk(tree):
                other = _imported_engine(node, module_package)
                if other is not None:
                    problems.append(
                        f"{path.relative_to(root.parent)}:{node.lineno}: strata.{package} imports strata.{other}: "
                        "engines must not depend on each other; move what they share into a module beside them"
                    )
    return problems


def _position(crate: str) -> tuple[int, int, str, bool] | None:
    for level, (layer, crates, ordered) in enumerate(LAYERS):
        if crate in crates:
            return level, crates.index(crate), layer, ordered
    return None


def violations(metadata: dict) -> list[str]:
    """Each dependency edge of `metadata` (the JSON of `cargo metadata --format-version 1`) that
    breaks the layering, as a sentence naming both crates and their layers; [] when none does."""
    problems: list[str] = []
    for package in metadata["packages"]:
        name = package["name"]
        if not name.startswith("strata-"):
            continue
        here = _position(name)
        if here is None:
            problems.append(
                f"{name} is in no layer: add it to LAYERS in tools/check_layers.py and to docs/architecture.md"
            )
            continue
        level, index, layer, ordered = here
        seen: set[str] = set()
        for dep in package["dependencies"]:
            target = dep["name"]
            if not target.startswith("strata-") or target in seen:
                continue
            seen.add(target)
            there = _position(target)
            if there is None:
                problems.append(f"{name} ({layer}) depends on {target}, which is in no layer")
                continue
            t_level, t_index, t_layer, _ = there
            if t_level < level or (t_level == level and ordered and t_index < index):
                continue
            if t_level == level and layer == "engines":
                why = (
                    "engines must not depend on each other; move what they share down into strata-graph or strata-store"
                )
            elif t_level == level:
                why = f"within the {layer} layer a crate may only use the ones listed before it"
            else:
                why = "a crate may only depend on lower layers"
            problems.append(f"{name} ({layer}) depends on {target} ({t_layer}): {why}")
    return problems


def _shape_problem(metadata: object) -> str | None:
    """What keeps `metadata` from being read as cargo metadata (the fields `violations` reads)."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("packages"), list):
        return "no 'packages' list"
    for i, package in enumerate(metadata["packages"]):
        if not isinstance(package, dict) or not isinstance(package.get("name"), str):
            return f"packages[{i}] has no 'name'"
        deps = package.get("dependencies")
        if not isinstance(deps, list) or not all(isinstance(d, dict) and isinstance(d.get("name"), str) for d in deps):
            return f"packages[{i}] ({package['name']}): 'dependencies' is not a list of named dependencies"
    return None


def _cargo_metadata() -> dict:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"check_layers: cargo metadata failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the crate layering of the workspace.")
    parser.add_argument("--metadata", type=Path, help="a saved `cargo metadata --format-version 1` output")
    args = parser.parse_args(argv)
    if args.metadata is None:
        metadata = _cargo_metadata()
    else:
        try:
            metadata = json.loads(args.metadata.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"check_layers: {args.metadata}: {e}", file=sys.stderr)
            return 2
        problem = _shape_problem(metadata)
        if problem:
            print(f"check_layers: {args.metadata}: {problem} (not `cargo metadata` output)", file=sys.stderr)
            return 2
    problems = violations(metadata) + python_violations(Path(__file__).resolve().parents[1] / "python" / "strata")
    for p in problems:
        print(f"check_layers: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
