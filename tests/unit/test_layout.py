"""The layout holds what the README's map says: which room imports which, and no circles.

Every import counts, at the top of a module or inside a function: a lazy import is still
an arrow from one room to another.
"""

import ast
import graphlib

from ..conftest import ROOT

PACKAGE = ROOT / "resourced"

FLAT = {"__init__", "config", "errors", "exits", "gpuctl", "pytest_plugin"}
"""The public face, what everything shares, and the entry points."""

INTO_THE_DAEMON = {("resourced.cli.resources", "resourced.daemon.health_monitor")}
"""The one arrow into the daemon from outside it: ``gpuctl resources`` measures the health
checks itself, with the daemon's own monitor, when no daemon answers."""


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module of resourced, and the modules of resourced it imports."""
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                submodules = {f"{module}.{a.name}" for a in node.names} & found.keys()
                targets |= submodules   # ``from . import x`` names a module, not its package
                if len(submodules) < len(node.names):
                    targets.add(module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in found and t != name and t != "resourced"}
    return graph


def test_the_walk_reads_the_tree():
    graph = imports()
    assert "resourced.daemon.engine.engine" in graph["resourced.daemon.main"]
    assert "resourced.protocol.names" in graph["resourced.client.calls"]


def test_only_a_handful_of_modules_lie_flat():
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert flat == FLAT


def test_nothing_outside_the_daemon_imports_it():
    arrows = {(a, b) for a, targets in imports().items() for b in targets
              if b.startswith("resourced.daemon") and not a.startswith("resourced.daemon")}
    assert arrows == INTO_THE_DAEMON


def test_the_daemon_imports_no_client_room():
    clients = ("resourced.client", "resourced.cli", "resourced.tui", "resourced.agents",
               "resourced.runner", "resourced.notify", "resourced.slurm")
    arrows = {(a, b) for a, targets in imports().items() if a.startswith("resourced.daemon")
              for b in targets if b.startswith(clients)}
    assert arrows == set()


def test_the_protocol_and_the_core_import_only_each_other_and_the_errors():
    allowed = ("resourced.protocol", "resourced.core", "resourced.errors")
    arrows = {(a, b) for a, targets in imports().items()
              if a.startswith(("resourced.protocol", "resourced.core"))
              for b in targets if not b.startswith(allowed)}
    assert arrows == set()


def test_no_import_circles():
    sorter = graphlib.TopologicalSorter(imports())
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import circle: {' -> '.join(exc.args[1])}") from None
