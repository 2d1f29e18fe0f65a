#!/usr/bin/env python3
"""Checks the import structure of the project's packages against their layering.

    python scripts/check_imports.py [--graph]

Layers, bottom to top (docs/ARCHITECTURE.md):

    resources -> spark_ops -> photon_assets -> sensors -> photon -> definitions

A package may import from its own layer and from layers below it, never from a layer above.
Inside `resources/` its subpackages are layered the same way, bottom to top:

    resources.runtime -> resources.state -> resources.spark -> resources.event_store
        -> resources.registry -> resources (the Dagster resources: its own modules)

Every `import` statement counts, at any depth: module level, inside functions, under
`if TYPE_CHECKING:`. Imports of anything outside these packages are ignored. Imports done by name at
run time (`importlib.import_module`, a `module:function` setting, a module name handed to Dagster)
are not seen.

Prints each package (and subpackage, such as resources.registry) bottom to top with its modules,
the layers it may import and the packages it does import; then every import cycle between packages,
every import cycle between modules, and every import that goes up the layering, then a one-line
summary. Exit status 1 if any was found, else 0.
`--graph` also prints both import graphs. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["resources", "spark_ops", "photon_assets", "sensors", "photon", "definitions"]
LAYER = {name: index for index, name in enumerate(LAYERS)}
# The floors inside resources/, bottom to top; a subpackage not listed here is refused (it needs a floor).
RESOURCE_FLOORS = ["resources.runtime", "resources.state", "resources.spark", "resources.event_store",
                   "resources.registry", "resources"]
MAX_CYCLES = 500  # per graph; more are counted, not printed


@dataclass(frozen=True)
class Import:
    source: str  # importing module, e.g. "photon_assets.clicks"
    target: str  # imported module of the project, e.g. "resources.runtime.faults"
    path: str  # file, relative to the repository
    line: int
    nested: bool  # inside a function or class body, not at module level


def package_of(module: str) -> str:
    return module.split(".")[0]


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every .py file of the layered packages and definitions.py."""
    modules: dict[str, Path] = {}
    for package in LAYERS:
        single = root / f"{package}.py"
        if single.is_file():
            modules[package] = single
        directory = root / package
        if not directory.is_dir():
            continue
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, or its closest enclosing module (an attribute
    of a module, such as `resources.state.layout.DataLayout`); None outside the project."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


class ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, path: Path, modules: dict[str, Path], root: Path):
        self.module = module
        self.is_package = path.name == "__init__.py"
        self.path = str(path.relative_to(root))
        self.modules = modules
        self.depth = 0
        self.found: list[Import] = []

    def _add(self, target: str | None, node: ast.AST) -> None:
        imp = Import(self.module, target or "", self.path, node.lineno, self.depth > 0)
        # `from m import a, b` is one import of m, however many names it takes.
        if target is not None and target != self.module and imp not in self.found:
            self.found.append(imp)

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _nested

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(resolve(alias.name, self.modules), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            # Relative: `from . import x` in package p (or in a module of p) means p.x.
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        for alias in node.names:
            # `from resources.runtime import faults` imports the module resources.runtime.faults when there is one.
            target = resolve(f"{stem}.{alias.name}", self.modules) if alias.name != "*" else None
            self._add(target or resolve(stem, self.modules), node)


def collect(root: Path) -> tuple[dict[str, Path], list[Import]]:
    modules = project_modules(root)
    imports: list[Import] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = ImportCollector(module, path, modules, root)
        collector.visit(tree)
        imports.extend(collector.found)
    return modules, imports


def elementary_cycles(graph: dict[str, set[str]], limit: int) -> tuple[list[list[str]], int]:
    """Every elementary cycle of `graph`, each listed once, starting at its smallest node
    (a depth-first search from each node over larger nodes only). Returns at most `limit` of them
    and the total count."""
    cycles: list[list[str]] = []
    total = 0
    for start in sorted(graph):
        stack = [(start, iter(sorted(graph[start])))]
        path, on_path = [start], {start}
        while stack:
            node, successors = stack[-1]
            advanced = False
            for successor in successors:
                if successor == start:
                    total += 1
                    if len(cycles) < limit:
                        cycles.append(path + [start])
                elif successor > start and successor not in on_path:
                    stack.append((successor, iter(sorted(graph.get(successor, ())))))
                    path.append(successor)
                    on_path.add(successor)
                    advanced = True
                    break
            if not advanced:
                stack.pop()
                on_path.discard(path.pop())
    cycles.sort(key=lambda cycle: (len(cycle), cycle))
    return cycles, total


def package_path(module: str, modules: dict[str, Path]) -> str:
    """The (sub)package a module belongs to: `resources.registry` for resources.registry.shards,
    `resources` for resources.spark, the package itself for a package's `__init__`."""
    if modules[module].name == "__init__.py" or "." not in module:
        return module
    return module.rsplit(".", 1)[0]


def floor_of(module: str, modules: dict[str, Path]) -> int | None:
    """A resources module's floor (RESOURCE_FLOORS): its subpackage's, or the top's for its own
    modules; None outside resources/. An unlisted subpackage counts as the lowest floor."""
    if package_of(module) != "resources":
        return None
    package = package_path(module, modules)
    sub = ".".join(package.split(".")[:2])
    return RESOURCE_FLOORS.index(sub) if sub in RESOURCE_FLOORS else -1


def goes_up(imp: Import, modules: dict[str, Path]) -> bool:
    """An import that climbs the layering: to a higher layer, or inside resources/ to a higher floor."""
    if LAYER[package_of(imp.target)] != LAYER[package_of(imp.source)]:
        return LAYER[package_of(imp.target)] > LAYER[package_of(imp.source)]
    source, target = floor_of(imp.source, modules), floor_of(imp.target, modules)
    return source is not None and target is not None and target > source


def unplaced_subpackages(modules: dict[str, Path]) -> list[str]:
    """Subpackages of resources/ with no floor in RESOURCE_FLOORS."""
    found = {".".join(m.split(".")[:2]) for m in modules if m.startswith("resources.") and modules[m].name == "__init__.py"}
    return sorted(found - set(RESOURCE_FLOORS))


def shared_names(modules: dict[str, Path]) -> list[str]:
    """Names that two product modules or packages share (a module `a/b/name.py`, a package `a/name/`):
    a reader must never wonder which one a name means."""
    places: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        if module == "definitions":
            continue
        name = module.rsplit(".", 1)[-1]
        places[name].add(module)
    return [f"{name}: {', '.join(sorted(found))}" for name, found in sorted(places.items())
            if len(found) > 1 and name not in LAYERS]


def print_packages(modules: dict[str, Path], imports: list[Import]) -> None:
    """Per (sub)package, bottom to top: its modules, what the layering lets it import, what it imports."""
    members: dict[str, list[str]] = defaultdict(list)
    for module in modules:
        if modules[module].name != "__init__.py":
            members[package_path(module, modules)].append(module.rsplit(".", 1)[-1])
    uses: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        source, target = package_path(imp.source, modules), package_path(imp.target, modules)
        if source != target:
            uses[source].add(target)
    print("packages, bottom to top: modules; may import; imports")
    for package in sorted(members, key=lambda p: (LAYER[package_of(p)], p)):
        allowed = ", ".join(LAYERS[: LAYER[package_of(package)] + 1])
        print(f"  {package}: {', '.join(sorted(members[package]))}")
        print(f"      may import: {allowed}")
        print(f"      imports: {', '.join(sorted(uses[package], key=lambda p: (LAYER[package_of(p)], p))) or '(nothing)'}")


def where(imports: list[Import], source: str, target: str, by_package: bool) -> str:
    """The first import statement behind an edge, as file:line."""
    key = package_of if by_package else (lambda m: m)
    for imp in sorted(imports, key=lambda i: (i.path, i.line)):
        if key(imp.source) == source and key(imp.target) == target:
            return f"{imp.path}:{imp.line}"
    return "?"


def print_cycles(title: str, cycles: list[list[str]], total: int, imports: list[Import], by_package: bool) -> None:
    """One line per cycle; for module cycles, the import statement behind each hop below it (a
    package cycle's hops are the upward imports listed further down, or a module cycle)."""
    print(f"{title}: {total}")
    for cycle in cycles:
        print(f"  {' -> '.join(cycle)}")
        if not by_package:
            print("      " + ", ".join(f"{a} -> {b} at {where(imports, a, b, by_package)}" for a, b in zip(cycle, cycle[1:])))
    if total > len(cycles):
        print(f"  ... and {total - len(cycles)} more")


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--graph", action="store_true", help="also print the package and module import graphs")
    options.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's)")
    args = options.parse_args()

    modules, imports = collect(args.root.resolve())
    module_graph: dict[str, set[str]] = {module: set() for module in modules}
    package_graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        module_graph[imp.source].add(imp.target)
        source, target = package_of(imp.source), package_of(imp.target)
        package_graph[source]
        if source != target:
            package_graph[source].add(target)

    if args.graph:
        print("package graph:")
        for package in sorted(package_graph, key=LAYER.get):
            print(f"  {package} -> {', '.join(sorted(package_graph[package], key=LAYER.get)) or '(nothing)'}")
        print("module graph:")
        for module in sorted(module_graph):
            print(f"  {module} -> {', '.join(sorted(module_graph[module])) or '(nothing)'}")
        print()

    print_packages(modules, imports)
    package_cycles, package_total = elementary_cycles(package_graph, MAX_CYCLES)
    module_cycles, module_total = elementary_cycles(module_graph, MAX_CYCLES)
    upward = sorted((imp for imp in imports if goes_up(imp, modules)),
                    key=lambda i: (LAYER[package_of(i.source)], i.path, i.line))
    unplaced = unplaced_subpackages(modules)

    print_cycles("cycles between packages", package_cycles, package_total, imports, by_package=True)
    print_cycles("cycles between modules", module_cycles, module_total, imports, by_package=False)
    print(f"imports up the layering ({' < '.join(LAYERS)}; inside resources: {' < '.join(RESOURCE_FLOORS)}): "
          f"{len(upward)}")
    for imp in upward:
        nested = "  (inside a function)" if imp.nested else ""
        source, target = (package_path(m, modules) if package_of(m) == "resources" else package_of(m)
                          for m in (imp.source, imp.target))
        print(f"  {imp.path}:{imp.line}: {source} -> {target}: {imp.source} imports {imp.target}{nested}")
    for sub in unplaced:
        print(f"  {sub}: a subpackage of resources with no floor (scripts/check_imports.py: RESOURCE_FLOORS)")
    shared = shared_names(modules)
    print(f"names two product modules or packages share: {len(shared)}")
    for line in shared:
        print(f"  {line}")

    found = package_total + module_total + len(upward) + len(unplaced) + len(shared)
    print(f"{'FAIL' if found else 'OK'}: {len(modules)} modules, {len(imports)} project imports; "
          f"{package_total} package cycle(s), {module_total} module cycle(s), {len(upward)} upward import(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
