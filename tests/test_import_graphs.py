"""Import graphs the floors of test_architecture do not see.

The client's rooms show their arrows: no circle between the client's modules,
not through an import (at the top, inside a function or kept for types only)
and not through a call back into the client at run time.  A subscription, a
reply stream and a durable consumer are handed their owner (the client)
through a small Protocol that names exactly what they ask of it; they import
nothing of the client and touch nothing private of any object but
themselves.  ``benchmarks/`` has no import circle either."""

from __future__ import annotations

import ast
from pathlib import Path

import mc0.aio

from .test_architecture import CLIENT_SIDE, PACKAGE, modules, private_reaches

# The modules handed an owner instead of importing it, the Protocol naming what they ask of it,
# and the attribute they keep the owner in.
OWNED = {
    "mc0.aio.subscription": ("SubscriptionOwner", "client"),
    "mc0.aio.replies": ("ReplyOwner", "client"),
    "mc0.aio.consumer": ("Requester", "client"),
}


def client_modules() -> dict[str, Path]:
    return {n: p for n, p in modules().items() if any(n == m or n.startswith(m + ".") for m in CLIENT_SIDE)}


def every_import(name: str, path: Path, known: set[str]) -> set[str]:
    """The mc0 modules a file imports anywhere: at the top, in a function, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mc0"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] == "mc0":
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
    return {m for m in found if m != name}


def test_the_client_modules_form_no_circle_even_through_imports_kept_for_types() -> None:
    known = set(modules())
    graph = {n: every_import(n, p, known) & known for n, p in client_modules().items()}
    state: dict[str, int] = {}  # 1 = on the path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(target) :], target]))
            if target not in state:
                visit(target, [*path, target])
        state[node] = 2

    assert "mc0.aio.subscription" in graph and "mc0.aio.client" in graph
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_owned_modules_import_nothing_of_the_client() -> None:
    known = set(modules())
    for name in OWNED:
        path = modules()[name]
        reached = sorted(m for m in every_import(name, path, known) if m.startswith(("mc0.aio", "mc0.client")))
        assert reached == [], f"{name} imports {reached}: it is handed its owner instead"


def test_owned_modules_touch_nothing_private_of_another_object() -> None:
    """(test_architecture's ``private_reaches`` holds this for every module; these above all.)"""
    for name in OWNED:
        assert private_reaches(name, modules()[name].read_text()) == [], name


def protocol_members(path: Path, protocol: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol]
    assert any(isinstance(b, ast.Name) and b.id == "Protocol" for b in cls.bases), f"{protocol} is not a Protocol"
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def owner_uses(path: Path, attribute: str) -> set[str]:
    """The names used on ``self.<attribute>`` (what the module asks of its owner)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == attribute
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            used.add(node.attr)
    return used


def test_each_owner_protocol_names_exactly_what_its_module_asks_and_the_client_has_it() -> None:
    for name, (protocol, attribute) in OWNED.items():
        path = modules()[name]
        members = protocol_members(path, protocol)
        assert owner_uses(path, attribute) == members, name
        missing = sorted(m for m in members if not hasattr(mc0.aio.Client, m))
        assert missing == [], f"mc0.aio.Client lacks {missing} of {protocol}"


def test_the_owned_modules_are_where_this_test_looks() -> None:
    for name in OWNED:
        assert modules()[name].is_relative_to(PACKAGE / "aio")


BENCHMARKS = PACKAGE.parent / "benchmarks"


def test_the_benchmarks_form_no_import_circle() -> None:
    """``benchmarks/`` (outside the package) follows the same rule: its arrows point one way."""
    names = {p.stem: p for p in BENCHMARKS.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [a.name for a in node.names]
                graph[name] |= {t.split(".")[0] for t in targets if t.split(".")[0] in names}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(target) :], target]))
            if target not in state:
                visit(target, [*path, target])
        state[node] = 2

    assert {"frames", "frames_batched", "wire"} <= set(graph)
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
