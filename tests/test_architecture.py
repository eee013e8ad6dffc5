"""The house: the import graph has no cycle and no upward arrow, the client never loads the
broker, the core's rooms do no I/O, and no module grows past its room."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mc0"

# Lower layers first: a module may import only modules of strictly lower layers.
LAYERS: list[list[str]] = [
    ["mc0.errors", "mc0.message"],
    ["mc0.topics", "mc0.keys", "mc0.endpoints"],
    ["mc0.protocol.model", "mc0.trie", "mc0.permissions", "mc0.security"],
    ["mc0.protocol.codec", "mc0.protocol.bodies"],
    ["mc0.protocol.batch"],
    ["mc0.protocol.builders"],  # renders batch records for batched peers
    ["mc0.protocol"],
    ["mc0.settings", "mc0.events", "mc0.broker.histogram"],
    ["mc0.session_batch"],
    [
        "mc0.config",
        "mc0.session",
        "mc0.broker.jobs",
        "mc0.broker.peers",
        "mc0.broker.loglimit",
        "mc0.broker.telemetry",
        "mc0.broker.store",
        "mc0.broker.consumerfiles",
    ],
    [
        "mc0.aio.streams",
        "mc0.aio.consumer",
        "mc0.broker.pubsub",
        "mc0.broker.mailboxes",
        "mc0.broker.consumers",
        "mc0.broker.rpc",
        "mc0.broker.streams",
        "mc0.broker.journal",
        "mc0.broker.mdp",
        "mc0.broker.seed000",
        "mc0.broker.emqp",
        "mc0.broker.dcp",
        "mc0.broker.memodb",
        "mc0.broker.outbox",
        "mc0.aio.link",
    ],
    ["mc0.aio.connection", "mc0.broker.dialects"],
    ["mc0.aio.client", "mc0.broker.builtins", "mc0.broker.sysbus", "mc0.process"],
    ["mc0.broker.verbs", "mc0.broker.batched"],
    ["mc0.aio.worker"],
    ["mc0.aio"],
    ["mc0.client"],
    ["mc0.broker.core", "mc0.spark.options"],
    ["mc0.broker.monitor"],
    ["mc0.broker.httpd", "mc0.broker.nngbridge"],
    ["mc0.broker.check", "mc0.broker.delivery"],
    ["mc0.broker.server", "mc0.spark.sink", "mc0.spark.report", "mc0.spark.probe", "mc0.demo"],
    ["mc0.broker", "mc0.spark.source", "mc0.spark.pipeline"],
    ["mc0", "mc0.spark", "mc0.cli.base"],
    ["mc0.cli.load"],
    ["mc0.cli.bus", "mc0.cli.keys", "mc0.cli.ops"],
    ["mc0.cli"],
    ["mc0.__main__", "mc0.spark.submit"],
]
LAYER = {module: i for i, layer in enumerate(LAYERS) for module in layer}

CLIENT_SIDE = (
    "mc0.client",
    "mc0.aio",
    "mc0.aio.client",
    "mc0.aio.connection",
    "mc0.aio.link",
    "mc0.aio.worker",
    "mc0.aio.streams",
    "mc0.session",
)
# The sans-I/O rooms: no sockets, no clock, no disk.
PURE = (
    "mc0.protocol",
    "mc0.protocol.model",
    "mc0.protocol.codec",
    "mc0.protocol.builders",
    "mc0.protocol.bodies",
    "mc0.protocol.batch",
    "mc0.session",
    "mc0.session_batch",
    "mc0.events",
    "mc0.trie",
    "mc0.topics",
    "mc0.permissions",
    "mc0.broker.core",
    "mc0.broker.peers",
    "mc0.broker.loglimit",
    "mc0.broker.pubsub",
    "mc0.broker.mailboxes",
    "mc0.broker.consumers",
    "mc0.broker.rpc",
    "mc0.broker.jobs",
    "mc0.broker.streams",
    "mc0.broker.store",
    "mc0.broker.builtins",
    "mc0.broker.telemetry",
    "mc0.broker.sysbus",
    "mc0.broker.mdp",
    "mc0.broker.seed000",
    "mc0.broker.emqp",
    "mc0.broker.dcp",
    "mc0.broker.memodb",
    "mc0.broker.dialects",
    "mc0.broker.outbox",
    "mc0.broker.verbs",
    "mc0.broker.batched",
    "mc0.broker.histogram",
    "mc0.broker.monitor",
    "mc0.endpoints",
)
IMPURE_MODULES = {"zmq", "socket", "time", "os", "pathlib", "io", "select", "selectors", "asyncio", "threading"}
MAX_LINES = 600


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


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert sorted(set(graph) - set(LAYER)) == [], "add new modules to LAYERS"
    assert sorted(set(LAYER) - set(graph)) == [], "remove deleted modules from LAYERS"


def test_no_import_points_up_or_sideways(graph: dict[str, set[str]]) -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if LAYER[target] >= LAYER[source]
    ]
    assert upward == []


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


@pytest.mark.parametrize("name", PURE)
def test_the_core_rooms_do_no_io(name: str) -> None:
    path = modules()[name]
    _, outer = imports(name, path, set(modules()))
    assert sorted(outer & IMPURE_MODULES) == []
    tree = ast.parse(path.read_text())
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "open" not in calls


def test_no_module_grows_past_its_room() -> None:
    big = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert big == {}
