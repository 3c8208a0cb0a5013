"""No import cycles among tailsight's modules and no import against the layer order, counting
every import: at module top, inside functions and under ``TYPE_CHECKING``. A cycle closed by a
function-local import never fails at run time, which is how ``probes/offsets.py`` <->
``probes/features.py`` went unnoticed; this reads the graph from the sources instead."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LAYERS = (
    ("core", ()),  # the modules in tailsight/ itself: hist, intervals, cgroups, stages
    ("probes", ("tailsight.probes",)),
    ("collector", ("tailsight.collector",)),
    ("analysis", ("tailsight.analysis",)),
    ("dashboards", ("tailsight.dashboards",)),
    ("testing", ("tailsight.testing",)),  # workloads, injections, synthetic models: known truth
    ("application", ("tailsight.cli",)),  # the commands, their wiring, the demo
)
"""Lowest first: a module may import its own layer and those below it, never one above."""
INSTRUMENTED = "tailsight.trading_core"
"""The trading system tailsight is shown on: only the application imports it, and it uses no
more of tailsight than the core and the probes (its XDP program compiles with their loader)."""
INSTRUMENTED_USES = "probes"


def package_dirs() -> dict[str, Path]:
    """Import name -> folder, as pyproject.toml installs them (probes/ is tailsight.probes)."""
    with open(REPO / "pyproject.toml", "rb") as file:
        mapping = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {name: REPO / folder for name, folder in mapping.items()}


def modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    roots = package_dirs()
    nested = {folder.resolve() for name, folder in roots.items() if name != "tailsight"}
    found: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "tailsight" and (folder / parts[0]).resolve() in nested:
                continue  # mapped under its own name
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every name an import statement anywhere in the module may refer to."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module -> the tailsight modules it imports (a name resolves to its longest module)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def layer_of(module: str, path: Path) -> str | None:
    """The module's layer (``trading_core`` for the instrumented system), None if unassigned."""
    if module == INSTRUMENTED or module.startswith(INSTRUMENTED + "."):
        return "trading_core"
    for layer, packages in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in packages):
            return layer
    if module == "tailsight" or (module.count(".") == 1 and path.name != "__init__.py"):
        return "core"
    return None


def layer_violations(graph: Mapping[str, set[str]], layers: Mapping[str, str]) -> list[str]:
    """Every import of a higher layer, and of trading_core from outside the application."""
    rank = {layer: n for n, (layer, _) in enumerate(LAYERS)}
    rank["trading_core"] = rank[INSTRUMENTED_USES]
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            source_layer, target_layer = layers[module], layers[target]
            if target_layer == "trading_core":
                bad = source_layer not in ("trading_core", "application")
            else:
                bad = rank[target_layer] > rank[source_layer]
            if bad:
                found.append(f"{module} ({source_layer}) -> {target} ({target_layer})")
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert cycles(graph) == []


def test_every_module_has_a_layer() -> None:
    unassigned = [m for m, path in modules().items() if layer_of(m, path) is None]
    assert unassigned == []


def test_no_module_imports_a_higher_layer() -> None:
    layers = {module: layer_of(module, path) or "?" for module, path in modules().items()}
    violations = layer_violations(import_graph(), layers)
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_commands_do_not_import_each_other() -> None:
    # What two commands share lives in a shared module (cli/shared.py, cli/wiring.py, ...).
    main = modules()["tailsight.cli.main"]
    commands = {
        f"tailsight.cli.{alias.name}"
        for node in ast.walk(ast.parse(main.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "tailsight.cli"
        for alias in node.names
    }
    assert "tailsight.cli.serve" in commands
    graph = import_graph()
    crossing = sorted(f"{c} -> {t}" for c in commands for t in graph[c] & commands)
    assert crossing == []


def test_layer_violations_are_found() -> None:
    # A collector module reaching up into analysis, and analysis into trading_core: both named.
    layers = {
        "tailsight.hist": "core",
        "tailsight.collector.agent": "collector",
        "tailsight.analysis.jumps": "analysis",
        "tailsight.cli.main": "application",
        "tailsight.trading_core.timing": "trading_core",
    }
    graph = {
        "tailsight.hist": set(),
        "tailsight.collector.agent": {"tailsight.hist", "tailsight.analysis.jumps"},
        "tailsight.analysis.jumps": {"tailsight.trading_core.timing"},
        "tailsight.cli.main": {"tailsight.analysis.jumps", "tailsight.trading_core.timing"},
        "tailsight.trading_core.timing": {"tailsight.hist"},
    }
    assert layer_violations(graph, layers) == [
        "tailsight.analysis.jumps (analysis) -> tailsight.trading_core.timing (trading_core)",
        "tailsight.collector.agent (collector) -> tailsight.analysis.jumps (analysis)",
    ]


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    # Not vacuous: the subpackages are found under their import names, with edges from
    # module-top imports (features -> loader), function-local ones (cli.trace -> collector)
    # and relative or TYPE_CHECKING ones alike.
    assert len(graph) > 80
    assert "tailsight.probes.loader" in graph["tailsight.probes.features"]
    assert "tailsight.cgroups" in graph["tailsight.probes.offsets"]
    assert any(t.startswith("tailsight.collector.") for t in graph["tailsight.cli.serve"])


def test_cycles_are_found_through_function_local_imports(tmp_path: Path) -> None:
    # The shape the check exists for: a top-level import one way, a local one back.
    (tmp_path / "a.py").write_text("import tailsight.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from tailsight import a\n")
    (tmp_path / "c.py").write_text("from tailsight.b import f\n")
    graph = {
        f"tailsight.{name}": {
            target
            for target in imported_names(f"tailsight.{name}", tmp_path / f"{name}.py")
            if target in {"tailsight.a", "tailsight.b"} and target != f"tailsight.{name}"
        }
        for name in "abc"
    }
    assert cycles(graph) == [["tailsight.a", "tailsight.b"]]
