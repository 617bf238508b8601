"""Checks that no crate of the workspace, and no part of the Python package, has an import circle.

    python tools/check_cycles.py            # every crate under crates/ and python/strata
    python tools/check_cycles.py --root DIR # the same for another checkout

A module is one source file: `src/a/b.rs` (or `src/a/b/mod.rs`) is `a::b`, `python/strata/a/b.py`
is `strata.a.b`. Module X depends on module Y when X's code names something of Y: a `use`
of a `crate::`, `super::` or `self::` path, or any path written in the code without a `use`
line (`crate::a::f()`, `super::x::Y`, a child's `stage::go()`, or `b::f()` after `use
crate::a::b;`, a macro's list of `module::Type` included). A name that
a module merely re-exports (`pub use`, or `from .x import Y` in an `__init__.py`) is followed to
where it is defined, so a facade hides nothing. Declaring a submodule (`mod x;`) is not a use.
Test code (`#[cfg(test)]` modules and files) is left out: tests may reach anywhere.

Python imports count wherever they are written, inside functions too: an import put off to
call time still ties the two modules together.

A circle is a set of modules each of which reaches every other through these dependencies
(a strongly connected component of two or more). Exits 1 listing each circle with one line of
evidence per dependency in it, 0 when there are none.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

Module = tuple[str, ...]
# (from, to) -> the first "file:line: path" that made the edge
Edges = dict[tuple[Module, Module], str]


# ---------------------------------------------------------------- Rust


def _strip_rust(text: str) -> str:
    """The source with comments, string and char literals blanked (newlines kept, so line
    numbers survive), and every `#[cfg(test)]` item removed."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i : i + 10]) and not _ident_before(text, i):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return _drop_test_items("".join(out))


def _ident_before(text: str, i: int) -> bool:
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _drop_test_items(text: str) -> str:
    """Blanks each item under `#[cfg(test)]` (a `mod x { ... }`, `mod x;`, a `use` or a fn)."""
    out, pos = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < pos:
            continue
        j = m.end()
        # the item runs to its first top-level `;` or to the brace matching its first `{`
        depth = 0
        while j < len(text):
            ch = text[j]
            if ch == ";" and depth == 0:
                j += 1
                break
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            j += 1
        out.append(text[pos : m.start()])
        out.append("\n" * text.count("\n", m.start(), j))
        pos = j
    out.append(text[pos:])
    return "".join(out)


def _expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e as f}}` -> ["a::b", "a::c::d", "a::c::e"] (self and globs kept)."""
    # drop renames (`X as Y` names X) before the spaces go, so a name ending in "as..." survives
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    depth, cut = 0, -1
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0 and cut < 0:
                cut = k
            depth += 1
        elif ch == "}":
            depth -= 1
    if cut < 0:
        return [tree]
    prefix, inner = tree[:cut], tree[cut + 1 : -1]
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:k])
            start = k + 1
    parts.append(inner[start:])
    paths = []
    for p in filter(None, parts):
        for sub in _expand_use(p):
            paths.append(prefix.rstrip(":") if sub == "self" else prefix + sub)
    return paths


class RustCrate:
    """The modules of one crate: their files, `pub use` re-exports and dependencies."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files: dict[Module, Path] = {}
        self.texts: dict[Module, str] = {}
        self.reexports: dict[Module, dict[str, list[str]]] = defaultdict(dict)
        self._collect((), src / "lib.rs")

    def _collect(self, module: Module, path: Path) -> None:
        text = _strip_rust(path.read_text())
        self.files[module] = path
        self.texts[module] = text
        folder = path.parent if path.name in ("lib.rs", "mod.rs") else path.with_suffix("")
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            name = m.group(1)
            for child in (folder / f"{name}.rs", folder / name / "mod.rs"):
                if child.exists():
                    self._collect((*module, name), child)
                    break
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for p in _expand_use(m.group(1)):
                segs = p.split("::")
                alias = re.search(r"\bas\s+(\w+)\s*$", m.group(1))
                name = alias.group(1) if alias and len(_expand_use(m.group(1))) == 1 else segs[-1]
                self.reexports[module][name] = self._absolute(module, segs)

    def _absolute(self, module: Module, segs: list[str]) -> list[str]:
        """A path's segments from the crate root, or [] for an outside crate."""
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] in ("super", "self"):
            base = list(module)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
            return [*base, *segs]
        if segs[0] in {m[len(module)] for m in self.files if len(m) == len(module) + 1 and m[: len(module)] == module}:
            return [*module, *segs]  # `use child::X` in edition 2018+
        return []

    def resolve(self, segs: list[str], hops: int = 0) -> Module | None:
        """The module that defines what the crate-absolute path `segs` names."""
        if not segs:
            return ()
        k = len(segs)
        while k > 0 and tuple(segs[:k]) not in self.files:
            k -= 1
        module = tuple(segs[:k])
        rest = segs[k:]
        if rest and rest[0] in self.reexports.get(module, {}) and hops < 16:
            target = self.reexports[module][rest[0]]
            if target:
                return self.resolve([*target, *rest[1:]], hops + 1)
        return module

    def edges(self, root: Path) -> Edges:
        found: Edges = {}
        for module, text in self.texts.items():
            where = self.files[module].relative_to(root)
            spans = [m.span() for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text)]
            uses = [(m, m.group(1)) for m in re.finditer(r"\buse\s+([^;]+);", text)]
            # (position, path to resolve, path as written)
            candidates: list[tuple[int, str, str]] = []
            # names a `use` line binds (its last segment, or its `as` name) -> the path
            bound: dict[str, str] = {}
            for m, tree in uses:
                for p in _expand_use(tree):
                    bound.setdefault(p.rsplit("::", 1)[-1], p)
                for alias in re.finditer(r"(\w+(?:::\w+)*)\s+as\s+(\w+)", tree):
                    bound[alias.group(2)] = alias.group(1)
                if any(s <= m.start() < e for s, e in spans):
                    continue  # a re-export is followed where it is used, not counted here
                candidates += [(m.start(), p, p) for p in _expand_use(tree)]
            used_spans = [m.span() for m, _ in uses]
            for m in re.finditer(r"(?<![\w:])(\w+(?:::\w+)+)", text):
                if any(s <= m.start() < e for s, e in used_spans):
                    continue
                path = written = m.group(1)
                head, _, rest = path.partition("::")
                if head not in ("crate", "super", "self") and head in bound:
                    path = f"{bound[head]}::{rest}"  # `use crate::a::b;` then `b::f()`
                candidates.append((m.start(), path, written))
            for pos, path, written in candidates:
                segs = [s for s in path.split("::") if s and s != "*"]
                absolute = self._absolute(module, segs) if segs else []
                if not absolute and segs and segs[0] not in ("crate", "super", "self"):
                    continue
                target = self.resolve(absolute)
                if target is None or target == module:
                    continue
                line = text.count("\n", 0, pos) + 1
                found.setdefault((module, target), f"{where}:{line}: {written}")
        return found


def rust_name(module: Module) -> str:
    return "::".join(module) or "lib"


# ---------------------------------------------------------------- Python


def python_edges(package: Path, root: Path) -> Edges:
    """Dependencies among the modules of the Python package at ``package`` (python/strata)."""
    base = package.parent
    modules: dict[Module, Path] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(base).with_suffix("").parts
        modules[parts[:-1] if parts[-1] == "__init__" else parts] = path
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in modules.items()}

    def is_package(m: Module) -> bool:
        return modules[m].name == "__init__.py"

    def resolve(parts: Module, hops: int = 0) -> Module | None:
        k = len(parts)
        while k and parts[:k] not in modules:
            k -= 1
        if not k:
            return None
        module, rest = parts[:k], parts[k:]
        if rest and is_package(module) and hops < 16:
            target = reexports(module).get(rest[0])
            if target:
                return resolve((*target, *rest[1:]), hops + 1)
        return module

    cache: dict[Module, dict[str, Module]] = {}

    def reexports(module: Module) -> dict[str, Module]:
        if module not in cache:
            cache[module] = {}
            for node in trees[module].body:
                if isinstance(node, ast.ImportFrom):
                    for alias, target in _from_targets(node, module, True):
                        cache[module][alias] = target
        return cache[module]

    found: Edges = {}
    for module, tree in trees.items():
        where = modules[module].relative_to(root)
        top_level = set(map(id, tree.body)) if is_package(module) else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if id(node) in top_level:
                    continue  # a package's own imports are its re-exports, followed above
                targets = [t for _, t in _from_targets(node, module, is_package(module))]
            else:
                continue
            for parts in targets:
                if parts[0] != package.name:
                    continue
                target = resolve(parts)
                # importing an enclosing package only runs its __init__, which re-exports
                if target is None or module[: len(target)] == target:
                    continue
                found.setdefault((module, target), f"{where}:{node.lineno}: import {'.'.join(parts)}")
    return found


def _from_targets(node: ast.ImportFrom, module: Module, package: bool) -> list[tuple[str, Module]]:
    """(name bound, dotted path it names) for each alias of a `from ... import ...`."""
    here = module if package else module[:-1]
    base = here[: len(here) - (node.level - 1)] if node.level else ()
    prefix = (*base, *(node.module.split(".") if node.module else ()))
    return [(a.asname or a.name, (*prefix, a.name)) for a in node.names if a.name != "*"]


# ---------------------------------------------------------------- circles


def circles(edges: Edges) -> list[list[Module]]:
    """The strongly connected components of two or more modules (Tarjan, iterative)."""
    graph: dict[Module, list[Module]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
        graph.setdefault(b, [])
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    found: list[list[Module]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def report(label: str, edges: Edges, name) -> list[str]:
    lines = []
    for component in circles(edges):
        members = set(component)
        lines.append(f"{label}: {len(component)} modules form a circle: " + ", ".join(map(name, component)))
        for (a, b), evidence in sorted(edges.items()):
            if a in members and b in members:
                lines.append(f"    {name(a)} -> {name(b)}  ({evidence})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check that no crate or Python package has an import circle.")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    problems: list[str] = []
    for lib in sorted(root.glob("crates/*/src/lib.rs")):
        crate = RustCrate(lib.parent)
        problems += report(lib.parent.parent.name, crate.edges(root), rust_name)
    package = root / "python" / "strata"
    if package.is_dir():
        problems += report("python", python_edges(package, root), ".".join)
    for line in problems:
        print(line)
    count = sum(1 for p in problems if not p.startswith(" "))
    print(f"check_cycles: {count} import circle(s)" if count else "check_cycles: no import circle")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
