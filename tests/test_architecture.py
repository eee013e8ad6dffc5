"""The house: the import graph has no cycle and no upward arrow (imports kept for types count: a
type-only arrow is an arrow), the client never loads the broker, the core's rooms do no I/O and
never import the dispatcher or an input module (the machine on top, rooms below), and the seams
hold: no function runs past ~80 lines without a named reason, no class annotates state it never
assigns (a mixin borrowing another class's attributes), no module imports another's private names,
no object reaches into another's private names (``private_reaches``), the pure modules have no
clock, randomness or I/O by any route (``impure_uses``), and record layouts are written and read
only in ``mc0.protocol`` (``record_layouts``; ``batch_layouts`` for batch's own).  (Module sizes are
not counted: a room is split at a seam, never squeezed to meet a number.)

Each rule is a checker over a module's source, shown to catch a planted violation (the
``test_*_catches_*`` tests).
"""

from __future__ import annotations

import ast
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mc0"

# The floors of the house, bottom up, and what each may import (the rules of docs/ARCHITECTURE.md).
# A module belongs to the first floor one of whose prefixes names it or a package above it.  The JetStream
# wing (mc0.broker.jetstream) is one folder whose modules sit on the floors their work puts them: its
# pure rooms on the core's, its journal on storage's, its link-thread parts on the cluster's, the rest
# (the package, journalcopy) on the shell's.
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
    "client": (
        *("mc0.events", "mc0.session", "mc0.pattern_table", "mc0.aio", "mc0.sync_loop", "mc0.client"),
        "mc0.tracing",
    ),
    "storage": ("mc0.broker.storage", "mc0.broker.jetstream.replicated", "mc0.broker.jetstream.copystate"),
    "core": (
        "mc0.broker.core",
        *(f"mc0.broker.jetstream.{m}" for m in ("replication", "storecalls", "storeconsumers", "storedletters")),
        "mc0.broker.jetstream.fromstore",
    ),
    "dialects": ("mc0.broker.dialects",),
    "monitoring": ("mc0.broker.monitoring",),
    "cluster": (
        "mc0.broker.cluster",
        *(f"mc0.broker.jetstream.{m}" for m in ("linkpart", "feed", "storeops", "streams")),
    ),
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
    "mc0.errors",
    "mc0.deadlines",
    "mc0.session",
    "mc0.pattern_table",
    "mc0.events",
    "mc0.trie",
    "mc0.topics",
    "mc0.permissions",
    "mc0.endpoints",
    "mc0.broker.outbox",
    "mc0.broker.storage.port",
    "mc0.broker.storage.memstore",
    "mc0.broker.monitoring.snapshot",
    "mc0.broker.jetstream.copystate",
    "mc0.broker.monitoring.queries",
    "mc0.broker.monitoring.hosts",
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
    return {m for m in inner if m != name}, {m.split(".")[0] for m in outer}


# Functions that need more than MAX_FUNCTION_LINES, each with its reason ("module:qualname": why).
LONG_FUNCTIONS: dict[str, str] = {}
MAX_FUNCTION_LINES = 80


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Every import arrow, at the top, in a function or kept for types only."""
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


# The machine on top, rooms below: the core's dispatcher and the modules that turn input into calls on
# the rooms (each handed the rooms, never the dispatcher); every other module of the core floor is a
# room, and a room imports neither (it never calls back up).
DISPATCHER = "mc0.broker.core.dispatch"
INPUT_MODULES = {
    f"mc0.broker.core.{m}" for m in ("verbs", "sessions", "batched", "dialect_ops", "routeinput", "admin")
} | {"mc0.broker.jetstream.fromstore"}


def rooms_calling_up(graph: dict[str, set[str]]) -> list[str]:
    """``room -> module`` for each import of the dispatcher or an input module by a room of the core floor."""
    above = INPUT_MODULES | {DISPATCHER}
    rooms = [m for m in graph if floor_of(m) == "core" and m not in above]
    return sorted(f"{room} -> {target}" for room in rooms for target in graph[room] & above)


def test_the_rooms_never_call_back_up(graph: dict[str, set[str]]) -> None:
    assert {DISPATCHER, *INPUT_MODULES} <= set(graph)
    assert rooms_calling_up(graph) == []


def test_rooms_calling_up_catches_a_planted_arrow() -> None:
    planted = {
        "mc0.broker.core.pubsub": {"mc0.broker.core.verbs", "mc0.broker.core.peers"},
        "mc0.broker.core.rooms": {"mc0.broker.core.dispatch"},
        "mc0.broker.core.verbs": {"mc0.broker.core.rooms", "mc0.broker.core.admin"},  # input -> input: fine
        "mc0.broker.core.dispatch": {"mc0.broker.core.verbs"},
    }
    assert rooms_calling_up(planted) == [
        "mc0.broker.core.pubsub -> mc0.broker.core.verbs",
        "mc0.broker.core.rooms -> mc0.broker.core.dispatch",
    ]


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


# Routes to a clock, randomness or I/O other than importing an impure module: each a dotted name as it
# resolves through the module's imports and assignments (``from datetime import datetime as D; D.now()``
# is ``datetime.datetime.now``; a bare builtin is ``builtins.NAME``; ``getattr(x, "now")`` is ``x.now``).
IMPURE_NAMES = {
    *(f"datetime.datetime.{m}" for m in ("now", "utcnow", "today")),
    "datetime.date.today",
    *(f"uuid.uuid{n}" for n in (1, 4)),  # (uuid3/uuid5 hash their input: pure)
    "os.urandom",
    "sys.modules",  # sys.modules["time"]: an import by another name
    *(f"sys.{stream}" for stream in ("stdin", "stdout", "stderr")),
    *(f"builtins.{f}" for f in ("open", "__import__", "input", "print", "breakpoint", "exec", "eval")),
    "importlib.import_module",
}
# Modules whose every use is a clock, randomness, I/O or an import by name, in a pure module.
IMPURE_ANYWHERE = IMPURE_MODULES | {
    *("random", "secrets", "importlib", "subprocess", "shutil", "tempfile", "signal", "ssl", "mmap"),
    *("http.client", "http.server", "urllib.request", "socketserver", "multiprocessing", "concurrent"),
}


def _in_impure_module(dotted: str) -> bool:
    return any(dotted == m or dotted.startswith(m + ".") for m in IMPURE_ANYWHERE)


def _aliases(tree: ast.AST, name: str = "", *, is_package: bool = False) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import (relative ones resolved from
    module ``name``) and plain ``name = dotted`` in the file."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    found[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            target = _target(name, is_package, node)
            for alias in node.names:
                found[alias.asname or alias.name] = f"{target}.{alias.name}"
    for _ in range(3):  # (assignments of assignments: a few rounds reach a fixed point in practice)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                dotted = _dotted(node.value, found)
                if dotted is not None and node.targets[0].id != dotted:
                    found[node.targets[0].id] = dotted
    return found


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression stands for (``a.b.c``, ``getattr(a.b, "c")``), resolved through
    ``aliases``; a name nothing binds is a builtin's.  None when it is no such chain."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, f"builtins.{node.id}")
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        base = _dotted(node.args[0], aliases)
        return None if base is None else f"{base}.{node.args[1].value}"
    return None


def impure_uses(name: str, source: str) -> set[str]:
    """``module: what`` for each route to a clock, randomness or I/O in a module's source: an import of
    an impure module (``import time``, ``from time import monotonic``, ``__import__("time")``,
    ``importlib.import_module("time")``), or a use of an impure name however it was imported or renamed
    (``datetime.datetime.now()``, ``date.today()``, ``uuid.uuid4()``, ``open(...)``, ``print(...)``)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {f"{name}: import {a.name}" for a in node.names if _in_impure_module(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if _in_impure_module(node.module):
                found.add(f"{name}: from {node.module} import ...")
            found |= {
                f"{name}: {node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in IMPURE_NAMES
            }
        elif isinstance(node, ast.Name | ast.Attribute | ast.Call):
            dotted = _dotted(node, aliases)
            if dotted is not None and (dotted in IMPURE_NAMES or _in_impure_module(dotted)):
                found.add(f"{name}: {dotted}")
        if isinstance(node, ast.Call) and _dotted(node.func, aliases) in (
            "builtins.__import__",
            "importlib.import_module",
        ):
            found |= {f"{name}: import {a.value}" for a in node.args[:1] if isinstance(a, ast.Constant)}
    return found


@pytest.mark.parametrize("name", _pure())
def test_the_core_rooms_do_no_io(name: str) -> None:
    """No clock, randomness or I/O by any route (time is passed in)."""
    assert sorted(impure_uses(name, modules()[name].read_text())) == []


# ---------------------------------------------------------------- the seams
def long_functions(name: str, source: str) -> set[str]:
    """``module:qualname`` of every function (method, nested function) over MAX_FUNCTION_LINES lines."""
    return {f"{name}:{qualname}" for lines, _, qualname in function_sizes(source) if lines > MAX_FUNCTION_LINES}


# Classes whose annotations declare fields something else assigns (their generated __init__, a
# structural type): not state borrowed from another class.
_DECLARING_BASES = ("Protocol", "NamedTuple", "TypedDict", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag")


def borrowed_state(name: str, source: str) -> set[str]:
    """``module:Class.attr`` for each attribute a class annotates (``attr: T`` with no value, not a
    ClassVar) and never assigns (``self.attr = ...`` or ``cls.attr = ...`` in its own body): a mixin
    borrowing another class's state.  Protocols, dataclasses, NamedTuples, TypedDicts, enums excepted."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b).rpartition(".")[2].partition("[")[0] for b in node.bases]
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if any(b in _DECLARING_BASES for b in bases) or any("dataclass" in d for d in decorators):
            continue
        annotated = {
            s.target.id
            for s in node.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and s.value is None
            and "ClassVar" not in ast.unparse(s.annotation)
        }
        assigned: set[str] = set()
        for sub in ast.walk(node):
            targets: list[ast.expr] = []
            if isinstance(sub, ast.Assign):
                targets = list(sub.targets)
            elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
                targets = [sub.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name):
                        if part.value.id in ("self", "cls"):
                            assigned.add(part.attr)
        found |= {f"{name}:{node.name}.{attr}" for attr in annotated - assigned}
    return found


def _target(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if is_package else name.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_imports(name: str, source: str, *, is_package: bool = False) -> set[str]:
    """``module -> target.name`` for each ``_private`` name (not a dunder) imported from another mc0 module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = _target(name, is_package, node)
            if target.split(".")[0] != "mc0" or target == name:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{name} -> {target}.{alias.name}")
    return found


# Names with a leading underscore that Python documents as public: a namedtuple's own API, and
# ``os._exit`` (leave at once, without cleanup).  Reading them reaches into nothing.
DOCUMENTED_UNDERSCORE_NAMES = {"_fields", "_field_defaults", "_replace", "_asdict", "_make"}
DOCUMENTED_UNDERSCORE_CALLS = {"os._exit"}


def _private(attr: object) -> bool:
    return isinstance(attr, str) and attr.startswith("_") and not attr.startswith("__")


class _Reaches(ast.NodeVisitor):
    """Walks a module keeping the enclosing classes and functions (see ``private_reaches``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.classes: list[str] = []
        self.scopes: list[str] = []
        self.same_class: list[set[str]] = [set()]  # per function: names known to hold this class's instances
        self.found: list[str] = []

    def _report(self, node: ast.AST) -> None:
        where = ".".join(self.scopes) or "<module>"
        self.found.append(f"{self.name}:{where}: {ast.unparse(node)}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.scopes.append(node.name)
        self.generic_visit(node)
        self.scopes.pop()
        self.classes.pop()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        own = self.classes[-1] if self.classes else None
        names = set(self.same_class[-1])
        if own is not None:
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for arg in args:  # ``other: Own`` (or ``"Own"``, ``Own | None``)
                text = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if own in text.replace('"', "").replace("'", "").replace(" ", "").split("|"):
                    names.add(arg.arg)
            for sub in ast.walk(node):  # ``isinstance(other, Own)``: narrowed to this class
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Name)
                    and sub.func.id == "isinstance"
                    and len(sub.args) == 2
                    and isinstance(sub.args[0], ast.Name)
                    and isinstance(sub.args[1], ast.Name)
                    and sub.args[1].id == own
                ):
                    names.add(sub.args[0].id)
        self.scopes.append(node.name)
        self.same_class.append(names)
        self.generic_visit(node)
        self.same_class.pop()
        self.scopes.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _own(self, value: ast.expr) -> bool:
        """Whether ``value`` is this object, its class, or another instance of its class."""
        if isinstance(value, ast.Name):
            return value.id in ("self", "cls") or value.id in self.classes or value.id in self.same_class[-1]
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id == "super":
                return True
            if value.func.id == "type" and len(value.args) == 1:  # type(self)._x
                return isinstance(value.args[0], ast.Name) and value.args[0].id == "self"
        return False

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr) and node.attr not in DOCUMENTED_UNDERSCORE_NAMES and not self._own(node.value):
            if ast.unparse(node) not in DOCUMENTED_UNDERSCORE_CALLS:
                self._report(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(x, "_name"), setattr(...), hasattr(...), delattr(...)
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and _private(node.args[1].value)
            and not self._own(node.args[0])
        ):
            self._report(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # vars(x)["_name"], x.__dict__["_name"]
        key = node.slice
        owner = node.value
        through = None
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "vars" and owner.args:
            through = owner.args[0]
        elif isinstance(owner, ast.Attribute) and owner.attr == "__dict__":
            through = owner.value
        if through is not None and isinstance(key, ast.Constant) and _private(key.value) and not self._own(through):
            self._report(node)
        self.generic_visit(node)


def private_reaches(name: str, source: str) -> list[str]:
    """``module:Class.function: expr`` for each reach into another object's private name: ``other._x``
    and ``self.part._x`` (a read, a write or a call), ``getattr``/``setattr``/``hasattr``/``delattr`` of
    ``"_x"``, ``vars(other)["_x"]`` / ``other.__dict__["_x"]``.  Dunders are not private, a module's own
    module-level privates are names (never reached through an object), and these are one's own:
    ``self``, ``cls``, ``super()``, ``type(self)``, the enclosing class by name, and another instance of
    the same class where the code says so (a parameter annotated with the class, or a name checked with
    ``isinstance(name, Class)`` in the function: what a type checker would narrow to it).  A list: a
    reach written twice is counted twice."""
    walker = _Reaches(name)
    walker.visit(ast.parse(source))
    return walker.found


def test_no_object_reaches_into_anothers_private_names() -> None:
    """Over all of mc0, nothing excepted."""
    found: list[str] = []
    for name, path in modules().items():
        found += private_reaches(name, path.read_text())
    assert sorted(found) == []


def _batch_layouts() -> set[str]:
    from mc0.protocol import batch

    return {n for n, v in vars(batch).items() if isinstance(v, struct.Struct)}


def batch_layouts(name: str, source: str, *, is_package: bool = False) -> set[str]:
    """``module: batch.NAME`` for each batch-record layout (a ``struct.Struct`` of mc0.protocol.batch)
    a module outside ``mc0.protocol`` reaches: records are read only through batch's functions."""
    if name == "mc0.protocol" or name.startswith("mc0.protocol."):
        return set()
    layouts = _batch_layouts()
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in layouts:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "batch") or (
                isinstance(owner, ast.Attribute) and owner.attr == "batch"
            ):
                found.add(f"{name}: batch.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and _target(name, is_package, node) == "mc0.protocol.batch":
            found |= {f"{name}: batch.{a.name}" for a in node.names if a.name in layouts}
    return found


def _protocol_layouts() -> set[str]:
    """``mc0.protocol.M.NAME`` (and ``mc0.protocol.NAME`` when the package exports it) for every
    ``struct.Struct`` a module of mc0.protocol defines."""
    import importlib

    found: set[str] = set()
    for name in modules():
        if name == "mc0.protocol" or name.startswith("mc0.protocol."):
            for attr, value in vars(importlib.import_module(name)).items():
                if isinstance(value, struct.Struct):
                    found.add(f"{name}.{attr}")
    return found


def record_layouts(name: str, source: str, *, is_package: bool = False, layouts: set[str] | None = None) -> set[str]:
    """``module: what`` for each record layout written or read outside ``mc0.protocol``: any use of
    ``struct`` but its ``error`` however imported (``struct.Struct(...)``, ``pack``, ``unpack_from``,
    ``calcsize``, ``from struct import Struct``), ``int.from_bytes`` (a number parsed out of bytes), and
    any reach to a ``struct.Struct`` of mc0.protocol (``layouts``: ``_protocol_layouts()``): records are
    built and read only through mc0.protocol's functions."""
    if name == "mc0.protocol" or name.startswith("mc0.protocol."):
        return set()
    layouts = _protocol_layouts() if layouts is None else layouts
    tree = ast.parse(source)
    aliases = _aliases(tree, name, is_package=is_package)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            target = _target(name, is_package, node)
            for alias in node.names:
                dotted = f"{target}.{alias.name}"
                if (target == "struct" and alias.name != "error") or dotted in layouts:
                    found.add(f"{name}: {dotted}")
        elif isinstance(node, ast.Name | ast.Attribute):
            dotted = _dotted(node, aliases)
            if dotted is None:
                continue
            if (dotted.startswith("struct.") and dotted != "struct.error") or dotted == "builtins.int.from_bytes":
                found.add(f"{name}: {dotted}")
            elif any(dotted == layout or dotted.startswith(layout + ".") for layout in layouts):
                found.add(f"{name}: {dotted}")
    return found


def _found_in_the_tree(rule: str) -> set[object]:
    found: set[object] = set()
    layouts = _protocol_layouts()
    for name, path in modules().items():
        source = path.read_text()
        if rule == "long_functions":
            found |= long_functions(name, source) - set(LONG_FUNCTIONS)
        elif rule == "borrowed_state":
            found |= borrowed_state(name, source)
        elif rule == "private_imports":
            found |= private_imports(name, source, is_package=path.name == "__init__.py")
        elif rule == "record_layouts":
            found |= record_layouts(name, source, is_package=path.name == "__init__.py", layouts=layouts)
        else:
            found |= batch_layouts(name, source, is_package=path.name == "__init__.py")
    return found


SEAM_RULES = ["long_functions", "borrowed_state", "private_imports", "batch_layouts", "record_layouts"]


@pytest.mark.parametrize("rule", SEAM_RULES)
def test_the_seams_hold(rule: str) -> None:
    """No rule finds anything in the tree (a long function needs its reason in LONG_FUNCTIONS)."""
    assert sorted(map(str, _found_in_the_tree(rule))) == [], rule


def test_every_long_function_has_a_reason() -> None:
    everything = set().union(*(long_functions(n, p.read_text()) for n, p in modules().items()))
    assert sorted(set(LONG_FUNCTIONS) - everything) == [], "reasons for functions no longer long"
    assert all(reason.strip() for reason in LONG_FUNCTIONS.values())


# Planted violations: each checker catches what it is for, and passes what is fine.
def _src(text: str) -> str:
    return textwrap.dedent(text)


def test_long_functions_catches_a_planted_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f"def short():\n    return 1\n\nclass C:\n    def long(self):\n{textwrap.indent(body, '    ')}\n"
    assert long_functions("mc0.planted", source) == {"mc0.planted:C.long"}


def test_borrowed_state_catches_a_planted_mixin() -> None:
    source = _src(
        """
        from typing import ClassVar, Protocol
        from dataclasses import dataclass

        class Mixin:
            _owner_socket: object        # borrowed: assigned by the class it is mixed into
            own: int
            shared: ClassVar[int]

            def set(self) -> None:
                self.own = 1

        class Owner(Protocol):
            endpoint: str

        @dataclass
        class Value:
            n: int
        """
    )
    assert borrowed_state("mc0.planted", source) == {"mc0.planted:Mixin._owner_socket"}


def test_private_imports_catches_a_planted_import() -> None:
    source = _src(
        """
        from .base import _helper, public, __version__
        from mc0.other import _secret
        from . import _own_module_private
        import json
        """
    )
    assert private_imports("mc0.cli.planted", source) == {
        "mc0.cli.planted -> mc0.cli.base._helper",
        "mc0.cli.planted -> mc0.other._secret",
        "mc0.cli.planted -> mc0.cli._own_module_private",
    }


def test_private_reaches_catches_planted_reaches_and_passes_what_is_ones_own() -> None:
    source = _src(
        """
        import os
        _LIMIT = 3

        class Journaling:
            def forget(self, peer: Peer) -> None:
                self.pubsub._topics.clear()          # a call on a sibling's private state
                self.pubsub._version += 1            # a write into it
                peer._queue = []                     # a write into another object
                seen = self.rpc._finished            # a read
                getattr(self.workers, "_idle")       # by name
                setattr(peer, "_ttl", 0)
                vars(peer)["_closed"] = True
                peer.__dict__["_closed"] = True
                self._own.clear()                    # one's own: fine
                self._count += _LIMIT                # a module-level private is a name: fine
                type(self)._made += 1                # one's class: fine
                Journaling._made += 1
                super()._forget(peer)
                peer.__class__, peer.name            # dunders and public names: fine
                os._exit(1)                          # documented public: fine
                return peer.fields._replace(n=1), peer.fields._fields

            def __eq__(self, other: object) -> bool:
                return isinstance(other, Journaling) and self._key == other._key   # the same class: fine

            def merge(self, other: "Journaling | None", peer: Peer) -> None:
                self._seen |= other._seen            # annotated with the class: fine
                peer._seen                           # but not another class's

            @classmethod
            def make(cls) -> Journaling:
                return cls._cache
        """
    )
    where = "mc0.broker.core.planted:Journaling"
    assert sorted(private_reaches("mc0.broker.core.planted", source)) == sorted(
        [
            f"{where}.forget: self.pubsub._topics",
            f"{where}.forget: self.pubsub._version",
            f"{where}.forget: peer._queue",
            f"{where}.forget: self.rpc._finished",
            f"{where}.forget: getattr(self.workers, '_idle')",
            f"{where}.forget: setattr(peer, '_ttl', 0)",
            f"{where}.forget: vars(peer)['_closed']",
            f"{where}.forget: peer.__dict__['_closed']",
            f"{where}.merge: peer._seen",
        ]
    )
    assert private_reaches("mc0.planted", "def f(a, b):\n    return a._x, a._x\n") == ["mc0.planted:f: a._x"] * 2


def test_batch_layouts_catches_a_planted_parse() -> None:
    source = _src(
        """
        from mc0.protocol import batch
        from mc0 import protocol as P
        from ..protocol.batch import U16, records

        def parse(blob):
            (n,) = batch.U16.unpack_from(blob, 0)
            fields = P.batch.WORK_FIELDS.unpack_from(blob, 2)
            return list(batch.records(blob)), n, fields
        """
    )
    assert batch_layouts("mc0.aio.planted", source, is_package=False) == {
        "mc0.aio.planted: batch.U16",
        "mc0.aio.planted: batch.WORK_FIELDS",
    }
    assert batch_layouts("mc0.protocol.planted", source) == set()


def test_impure_uses_catches_a_planted_clock_randomness_and_io_by_every_route() -> None:
    """Each route is one line of a room; what is pure (a timedelta, uuid5, urllib.parse, a local
    called ``now``) passes."""
    planted = {
        "import time": "import time",
        "import time as clock": "import time",
        "from time import monotonic": "from time import ...",
        'clock = __import__("time")': "import time",
        'import importlib\nclock = importlib.import_module("time")': "import importlib",
        "import datetime\nstamp = datetime.datetime.now()": "datetime.datetime.now",
        "from datetime import datetime\nstamp = datetime.utcnow()": "datetime.datetime.utcnow",
        "from datetime import datetime as D\nwhen = D\nstamp = when.today()": "datetime.datetime.today",
        "from datetime import date\nday = date.today()": "datetime.date.today",
        'import datetime\nstamp = getattr(datetime.datetime, "now")()': "datetime.datetime.now",
        "import random\nn = random.random()": "import random",
        "from secrets import token_bytes": "from secrets import ...",
        "import uuid\nkey = uuid.uuid4()": "uuid.uuid4",
        "from uuid import uuid1": "uuid.uuid1",
        "import os\nnoise = os.urandom(8)": "import os",
        'data = open("journal").read()': "builtins.open",
        'import builtins\ndata = builtins.open("journal")': "builtins.open",
        'print("hello")': "builtins.print",
        'import sys\nclock = sys.modules["time"]': "sys.modules",
        'exec("import time")': "builtins.exec",
    }
    for line, what in planted.items():
        found = impure_uses("mc0.broker.core.planted", f"def turn(now: float) -> None:\n    pass\n\n{line}\n")
        assert f"mc0.broker.core.planted: {what}" in found, line
    pure = _src(
        """
        import datetime
        import uuid
        from urllib.parse import parse_qsl

        def turn(now: float, rooms) -> float:
            later = now + datetime.timedelta(seconds=1).total_seconds()
            stamp = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
            key = uuid.uuid5(uuid.NAMESPACE_URL, "mc0")
            return rooms.now(later), stamp, key, parse_qsl("a=1")
        """
    )
    assert impure_uses("mc0.broker.core.planted", pure) == set()


def test_record_layouts_catches_a_planted_layout_by_every_route() -> None:
    """A private ``struct.Struct`` parsing batch records in ``aio/link.py`` (the hole the batch rule
    left), and each other way of writing or reading a layout outside mc0.protocol."""
    link = _src(
        """
        import struct

        _RECORD = struct.Struct("!HI")  # a private layout of batch records

        def records(blob: bytes):
            pos = 0
            while pos < len(blob):
                kind, size = _RECORD.unpack_from(blob, pos)
                yield kind, blob[pos + 6 : pos + 6 + size]
                pos += 6 + size
        """
    )
    assert record_layouts("mc0.aio.link", link, layouts=set()) == {"mc0.aio.link: struct.Struct"}
    layouts = {"mc0.protocol.batch.U16", "mc0.protocol.journalrecords.HEAD"}
    planted = {
        "import struct as s\nn = s.unpack('<H', b'xx')": "struct.unpack",
        "from struct import unpack_from": "struct.unpack_from",
        "from struct import Struct\nHEAD = Struct('<I')": "struct.Struct",
        "import struct\nsize = struct.calcsize('<I')": "struct.calcsize",
        "import struct\nblob = struct.pack('<I', 1)": "struct.pack",
        "seq = int.from_bytes(frame, 'big')": "builtins.int.from_bytes",
        "from mc0.protocol.journalrecords import HEAD": "mc0.protocol.journalrecords.HEAD",
        "from ...protocol import journalrecords\nhead = journalrecords.HEAD.unpack_from(b'', 0)": (
            "mc0.protocol.journalrecords.HEAD"
        ),
        "from mc0 import protocol as P\nn = P.batch.U16.unpack(b'xx')": "mc0.protocol.batch.U16",
    }
    for line, what in planted.items():
        found = record_layouts("mc0.broker.storage.planted", line + "\n", layouts=layouts)
        assert f"mc0.broker.storage.planted: {what}" in found, line
    fine = "import struct\nfrom mc0.protocol import journalrecords\ntry:\n    pass\nexcept struct.error:\n    pass\n"
    fine += "n = journalrecords.read_head(b'', 0)\nsize = journalrecords.HEAD_BYTES\nserial = (5).to_bytes(8, 'big')\n"
    assert record_layouts("mc0.broker.storage.planted", fine, layouts=layouts) == set()
    assert record_layouts("mc0.protocol.planted", link, layouts=layouts) == set()


def test_the_import_rules_catch_a_planted_type_only_arrow(tmp_path: Path) -> None:
    """An import kept for types only is an arrow: a room that imports its dispatcher under
    TYPE_CHECKING closes a circle the cycle test sees."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .dispatch import BrokerCore\n"
    path = tmp_path / "planted.py"
    path.write_text(source)
    known = {"mc0.broker.core.dispatch", "mc0.broker.core.planted"}
    assert imports("mc0.broker.core.planted", path, known)[0] == {"mc0.broker.core.dispatch"}


def function_sizes(source: str) -> list[tuple[int, int, str]]:
    """(lines, parameters, qualname) of every function, method and nested function in ``source``."""
    sizes: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = prefix + child.name
                a = child.args
                named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                parameters = len([p for p in named if p.arg not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)
                sizes.append(((child.end_lineno or child.lineno) - child.lineno + 1, parameters, qualname))
                walk(child, qualname + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return sizes


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_planted_circle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(planted) == [["a", "b", "c"]]


def test_the_house_in_figures(graph: dict[str, set[str]]) -> None:
    """The figures a review quotes, printed (``pytest -s tests/test_architecture.py -k figures``), and the
    ones that must be zero held at zero: modules and import arrows; arrows up a floor; rooms calling up;
    the longest functions and those taking 10 or more parameters."""
    up_a_floor = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if floor_of(target) != floor_of(source)
        and floor_of(target) not in MAY_IMPORT[floor_of(source)]
        and not (floor_of(source) == "core" and target in CORE_MAY_ALSO_IMPORT)
    ]
    sizes = [
        (lines, parameters, f"{name}:{qualname}")
        for name, path in modules().items()
        for lines, parameters, qualname in function_sizes(path.read_text())
    ]
    longest = sorted(sizes, reverse=True)[:5]
    widest = sorted(((p, f"{q} ({n} lines)") for n, p, q in sizes if p >= 10), reverse=True)
    print(f"\nmodules {len(graph)}, import arrows {sum(map(len, graph.values()))}, cycles {len(cycles(graph))},"
          f" up a floor {len(up_a_floor)},"
          f" rooms calling up {len(rooms_calling_up(graph))}, functions {len(sizes)}")  # fmt: skip
    print("longest: " + "; ".join(f"{q} {n} lines" for n, _, q in longest))
    print(f"10+ parameters ({len(widest)}): " + "; ".join(f"{q} {p}" for p, q in widest))
    assert up_a_floor == [] and rooms_calling_up(graph) == [] and cycles(graph) == []
    assert longest[0][0] <= MAX_FUNCTION_LINES or longest[0][2] in LONG_FUNCTIONS
