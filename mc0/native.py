"""The compiled hot path: which modules mypyc may compile, whether they are, and the pure-Python switch.

Contract: ``HOT_MODULES`` names the modules that every build of mc0 (``pip
install``, ``python -m build``, ``pip install -e .``; ``MC0_PURE_BUILD=1`` or no
C compiler: pure Python) compiles with mypyc (setup.py reads this file; it
imports nothing of mc0): the broker's RPC and fan-out path (core rooms
``rpc``, ``jobs``, ``workers``, ``batched``, ``walks``, ``verbs``, ``pubsub``,
``groups``, ``peers``, ``histogram``, ``traffic``) and what both sides share
(batch records, builders, the topic trie, deadlines), and the client's
per-message path (the session, its pattern table, the topic grammar, the
general decode).  ``CYTHON_MODULES`` names those written in Cython, each a
``.pyx`` beside its ``.py`` (the reference and the fallback, same contract):
the broker loop's socket work (``mc0.broker.routerio``).  Not the shell's outbox and sender:
a compiled class's methods cannot be replaced on an instance, and a test
injects a sending fault that way.
Each compiled module is an extension beside its ``.py`` source, the same
code, type-checked at run time by mypyc; the sources stay the reference and
the fallback.  ``compiled()`` says which of them are loaded compiled.
``MC0_PURE_PYTHON=1`` in the environment (read once, when ``mc0`` is first
imported) makes every one of them load from its ``.py`` even where the
extension exists: that is how CI tests the fallback beside the compiled
build.  So does a source edited after the build (``stale``), with one line
on stderr: a stale extension never runs old code.  ``describe()`` names the
build that runs (``mc0 --version``, the benchmarks' headers).  Measured gain:
docs/PERFORMANCE.md (benchmarks/core_rpc.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

HOT_MODULES: tuple[str, ...] = (
    "mc0.deadlines",
    "mc0.trie",
    "mc0.protocol.batch",
    "mc0.protocol.builders",
    "mc0.broker.core.histogram",
    "mc0.broker.core.traffic",
    "mc0.broker.core.jobs",
    "mc0.broker.core.peers",
    "mc0.broker.core.workers",
    "mc0.broker.core.rpc",
    "mc0.broker.core.groups",
    "mc0.broker.core.pubsub",
    "mc0.broker.core.verbs",
    "mc0.broker.core.walks",
    "mc0.broker.core.batched",
    "mc0.broker.core.journaling",
    # The journal's append path (issue 39): the record codec, the topic index, the file journal (its
    # appends, commits and reads; the sync thread, :mod:`mc0.broker.storage.syncer`, is not: it waits).
    "mc0.protocol.journalrecords",
    "mc0.broker.storage.topicindex",
    "mc0.broker.storage.filestore",
    # The client's per-message path: the session's one decode of a received batch and what it
    # calls per message (the pattern table's match, the topic grammar, the general decode).  Not
    # mc0.message, mc0.events or mc0.protocol.model: mypyc builds a frozen dataclass's __init__
    # through the dataclass's own __setattr__, which refuses it.  Not the public classes
    # (mc0.aio.subscription): a compiled method has no signature for inspect or help().
    "mc0.topics",
    "mc0.protocol.codec",
    "mc0.pattern_table",
    "mc0.session",
)
# Written in Cython (a ``.pyx`` beside the ``.py`` fallback, which is the reference): the broker loop's
# socket work against libzmq through pyzmq's Cython API (setup.py: libzmq's zmq.h needed to build it).
CYTHON_MODULES: tuple[str, ...] = ("mc0.broker.routerio",)
PURE_ENV = "MC0_PURE_PYTHON"
PURE_BUILD_ENV = "MC0_PURE_BUILD"  # read by setup.py at build time: build pure Python on purpose
GROUP = "mc0_native"  # mypyc's group name (setup.py): the compiled modules' shared code is GROUP + "__mypyc"


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds each mc0 module's ``.py`` even where a compiled extension sits beside it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("mc0."):
            return None
        name = fullname.rpartition(".")[2]
        for folder in path or sys.path:
            source = os.path.join(folder, name + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


class ExtensionOrSource(importlib.machinery.ExtensionFileLoader):
    """Loads a Cython module's extension (CYTHON_MODULES) once pyzmq is imported, the extension being
    linked to the libzmq pyzmq loads, found by its name among the libraries already loaded; or, when
    the extension cannot load (built against another pyzmq's libzmq, say), its ``.py`` beside it (the
    same contract), with one line on stderr: a broker never fails to start for want of it."""

    _source: importlib.machinery.SourceFileLoader | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        import zmq  # noqa: F401  (loads the libzmq the extension needs)

        try:
            return super().create_module(spec)
        except ImportError as exc:
            source = os.path.join(os.path.dirname(self.path), spec.name.rpartition(".")[2] + ".py")
            print(f"mc0: the compiled {spec.name} cannot load ({exc}): running {source}", file=sys.stderr)
            self._source = importlib.machinery.SourceFileLoader(spec.name, source)
            return ModuleType(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        if self._source is None:
            super().exec_module(module)
            return
        module.__file__ = self._source.path
        self._source.exec_module(module)


class _NativeOrSource(importlib.abc.MetaPathFinder):
    """Finds each of CYTHON_MODULES where the path finder does, to load its extension through
    :class:`ExtensionOrSource`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in CYTHON_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            spec.loader = ExtensionOrSource(fullname, spec.loader.path)
        return spec


def in_checkout() -> bool:
    """Whether this mc0 is a source checkout's (run from it, or an editable install linking to it),
    where a source may be edited after its build; not an installed wheel, whose files all carry
    the install's time, in whatever order the installer wrote them."""
    source = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return os.path.isfile(os.path.join(source, "pyproject.toml")) and os.path.isfile(os.path.join(source, "setup.py"))


def stale(folder: str | None = None, library: str = GROUP + "__mypyc", *, checkout: bool | None = None) -> list[str]:
    """Modules whose extension would run other code than their source: built before the source's
    last change (in a checkout: ``checkout``, by default :func:`in_checkout`), or left over from a
    build that compiled a module no longer in ``HOT_MODULES``; or every module that has an
    extension when the shared library they all need cannot be found (a later plain ``pip install
    -e .`` drops it from the path and leaves the extensions).
    ``folder`` (the package's own by default) and ``library`` are for tests."""
    here = folder or os.path.dirname(os.path.abspath(__file__))
    edited = in_checkout() if checkout is None else checkout
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    built = []
    for directory, _, files in os.walk(here):
        for file in files:
            if not file.endswith(suffixes):
                continue
            stem = file.split(".", 1)[0]
            relative = os.path.relpath(os.path.join(directory, stem), here)
            name = ".".join(("mc0", *relative.split(os.sep)))
            sources = [os.path.join(directory, stem + ".py")]
            if name in CYTHON_MODULES:
                sources.append(os.path.join(directory, stem + ".pyx"))  # (the .py beside it is the fallback)
            try:
                built_at = os.path.getmtime(os.path.join(directory, file))
                newer = any(os.path.getmtime(source) > built_at for source in sources)
            except OSError:
                continue  # no source beside it: not one of ours
            built.append(name)
            if (newer and edited) or name not in HOT_MODULES + CYTHON_MODULES:
                out.append(name)
    if built and not out and importlib.util.find_spec(library) is None:
        return sorted(built)
    return sorted(out)


def install() -> None:
    """Run when this module is imported (first thing, by ``mc0/__init__.py``): the hot path loads
    from its sources, all of it,
    when ``MC0_PURE_PYTHON`` is set or when any source is newer than its extension (an edit
    since the last build: a stale extension would run old code, and compiled modules call
    each other directly, so it is all or nothing)."""
    global _from_sources
    if any(isinstance(f, (_SourceFirst, _NativeOrSource)) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _NativeOrSource())  # (a _SourceFirst put before it wins)
    if pure_requested():
        _from_sources = f"{PURE_ENV}=1"
        sys.meta_path.insert(0, _SourceFirst())
        return
    changed = stale()
    if changed:
        print(
            f"mc0: the compiled {changed[0]} cannot run as built (its source changed since, or the "
            f"shared {GROUP}__mypyc is not installed): running the sources "
            "(rebuild: ./run test, or pip install -e . again)",
            file=sys.stderr,
        )
        _from_sources = f"the compiled {changed[0]} is stale"
        sys.meta_path.insert(0, _SourceFirst())


_from_sources: str | None = None  # why install() made the hot path load from its sources, if it did


def compiled() -> dict[str, bool]:
    """Each hot module, mypyc's and Cython's (importing it) -> whether it was loaded from a compiled extension."""
    loaded = {}
    for name in HOT_MODULES + CYTHON_MODULES:
        module = importlib.import_module(name)
        loaded[name] = not (getattr(module, "__file__", "") or "").endswith(".py")
    return loaded


def describe() -> str:
    """The build that runs, in a few words: ``compiled: 19 of 19 hot modules, mypyc; socket loop
    native``, ``compiled: ...; socket loop pure Python`` (built without libzmq's header), ``pure
    Python`` (as built), ``pure Python: MC0_PURE_PYTHON=1`` (a compiled build, not used)."""
    loaded = compiled()
    mypyc = [loaded[name] for name in HOT_MODULES]
    native = all(loaded[name] for name in CYTHON_MODULES)
    loop = "socket loop native" if native else "socket loop pure Python"
    count = sum(mypyc)
    if count == len(mypyc):
        return f"compiled: {count} of {count} hot modules, mypyc; {loop}"
    if count or native:
        return f"partly compiled: {count} of {len(mypyc)} hot modules, mypyc; {loop}"
    return "pure Python" if _from_sources is None else f"pure Python: {_from_sources}"


install()  # at import: mc0/__init__.py imports this module before anything else of mc0
