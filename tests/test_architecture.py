"""The house: the import graph has no cycle and no upward arrow, the client never loads the
broker, the core's rooms do no I/O, and no module grows past its room."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mc0"

# The floors of the house, bottom up, and what each may import (the rules of docs/ARCHITECTURE.md).
# A module belongs to the first floor one of whose prefixes names it or a package above it.
FLOORS: dict[str, tuple[str, ...]] = {
    "base": (
        "mc0.errors",
        "mc0.message",
        "mc0.topics",
        "mc0.trie",
        "mc0.keys",
        "mc0.endpoints",
        "mc0.permissions",
        "mc0.security",
        "mc0.process",
        "mc0.ports",
        "mc0.natsproc",
        "mc0.deadlines",
        "mc0.native",
    ),
    "protocol": ("mc0.protocol",),
    "settings": ("mc0.settings", "mc0.config"),
    "client": ("mc0.events", "mc0.session", "mc0.session_batch", "mc0.aio", "mc0.sync_streams", "mc0.client"),
    "storage": ("mc0.broker.storage",),
    "core": ("mc0.broker.core",),
    "dialects": ("mc0.broker.dialects",),
    "monitoring": ("mc0.broker.monitoring",),
    "cluster": ("mc0.broker.cluster",),
    "shell": (
        "mc0.broker.server",
        "mc0.broker.embedded",
        "mc0.broker.outbox",
        "mc0.broker.nngbridge",
        "mc0.broker.check",
        "mc0.broker",
    ),
    "spark": ("mc0.spark",),
    "app": ("mc0.cli", "mc0.demo", "mc0.cluster_demo", "mc0.__main__"),
}
BELOW_THE_BROKER = ("base", "protocol", "settings")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "base": (),
    "protocol": ("base",),
    "settings": ("base", "protocol"),
    "client": BELOW_THE_BROKER,
    "storage": BELOW_THE_BROKER,
    "core": BELOW_THE_BROKER,  # and, of storage, only the port: CORE_MAY_ALSO_IMPORT
    "dialects": (*BELOW_THE_BROKER, "core"),
    "monitoring": (*BELOW_THE_BROKER, "core"),
    "cluster": BELOW_THE_BROKER,  # the NATS link carries route traffic; what it means is the core's (routes)
    "shell": (*BELOW_THE_BROKER, "storage", "core", "dialects", "monitoring", "cluster"),
    "spark": (*BELOW_THE_BROKER, "client"),
    "app": tuple(FLOORS),  # the CLI, the demo and the package's front door may use anything
}
CORE_MAY_ALSO_IMPORT = {"mc0.broker.storage.port"}


def floor_of(module: str) -> str:
    if module == "mc0":
        return "app"  # the package's front door (mc0.Client, mc0.Broker ...)
    for floor, prefixes in FLOORS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return floor
    raise AssertionError(f"{module} belongs to no floor: add it to FLOORS")


CLIENT_SIDE = FLOORS["client"]
# The sans-I/O modules: no sockets, no clock, no disk (whole floors, and these modules of others).
PURE_FLOORS = ("protocol", "core", "dialects")
PURE_MODULES = (
    "mc0.deadlines",
    "mc0.session",
    "mc0.session_batch",
    "mc0.events",
    "mc0.trie",
    "mc0.topics",
    "mc0.permissions",
    "mc0.endpoints",
    "mc0.broker.outbox",
    "mc0.broker.storage.port",
    "mc0.broker.storage.memstore",
    "mc0.broker.monitoring.snapshot",
)
IMPURE_MODULES = {"zmq", "socket", "time", "os", "pathlib", "io", "select", "selectors", "asyncio", "threading"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(mc0 modules, other top-level modules) imported anywhere in the file, lazily or not."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner: set[str] = set()
    outer: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (inner if alias.name.split(".")[0] == "mc0" else outer).add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "mc0":
                outer.add(target)
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                inner.add(full if full in known else target)
    if TYPE_CHECKING_ONLY := _type_checking_imports(tree, package, known):
        inner -= TYPE_CHECKING_ONLY
    return {m for m in inner if m != name}, {m.split(".")[0] for m in outer}


def _type_checking_imports(tree: ast.Module, package: str, known: set[str]) -> set[str]:
    """Imports under ``if TYPE_CHECKING:`` (types only: no arrow at run time)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom) and sub.level:
                    base = package.split(".")[: len(package.split(".")) - (sub.level - 1)]
                    target = ".".join([*base, *([sub.module] if sub.module else [])])
                    found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in sub.names}
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known)[0] for name, path in found.items()}


def test_every_module_has_a_floor(graph: dict[str, set[str]]) -> None:
    for name in graph:
        floor_of(name)


def test_the_floors_form_a_ladder() -> None:
    """Each floor may import only floors listed before it (no back-arrows between packages)."""
    order = list(FLOORS)
    for floor, allowed in MAY_IMPORT.items():
        if floor == "app":
            continue
        assert all(order.index(other) < order.index(floor) for other in allowed), floor


def test_every_import_follows_the_rules_of_its_floor(graph: dict[str, set[str]]) -> None:
    broken = []
    for source, targets in graph.items():
        here = floor_of(source)
        for target in targets:
            there = floor_of(target)
            if there == here or there in MAY_IMPORT[here]:
                continue
            if here == "core" and target in CORE_MAY_ALSO_IMPORT:
                continue
            broken.append(f"{source} ({here}) -> {target} ({there})")
    assert broken == []


def test_the_import_graph_has_no_cycle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(target) :], target]))
            if target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_client_modules_never_reach_the_broker(graph: dict[str, set[str]]) -> None:
    reached: set[str] = set()
    todo = list(CLIENT_SIDE)
    while todo:
        node = todo.pop()
        for target in graph[node]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert sorted(m for m in reached if m.startswith("mc0.broker")) == []


def test_importing_the_client_loads_no_broker_code() -> None:
    code = "import mc0.client, mc0.aio, sys; print(sorted(m for m in sys.modules if m.startswith('mc0.broker')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _pure() -> list[str]:
    return sorted(m for m in modules() if floor_of(m) in PURE_FLOORS or m in PURE_MODULES)


@pytest.mark.parametrize("name", _pure())
def test_the_core_rooms_do_no_io(name: str) -> None:
    path = modules()[name]
    _, outer = imports(name, path, set(modules()))
    assert sorted(outer & IMPURE_MODULES) == []
    tree = ast.parse(path.read_text())
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "open" not in calls
