"""The sync API (mc0.client) is the asyncio API (mc0.aio), name for name and option for option.

Every public name of an asyncio class is in its sync twin, or listed in ASYNC_ONLY with its reason;
every method both have takes the same parameters: names, kinds (keyword-only included), defaults
and annotations as written (a method made with ``blocking`` / ``viewed`` has them by construction,
one written by hand is held to them here); an ``async def`` is a plain method in the sync class.
So an option added to an async method cannot be forgotten in the sync one: the checker is shown
to catch a planted divergence, and run over the real pairs."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import mc0
import mc0.aio

PAIRS: list[tuple[type, type]] = [
    (mc0.aio.Client, mc0.Client),
    (mc0.aio.Worker, mc0.Worker),
    (mc0.aio.Subscription, mc0.Subscription),
    (mc0.aio.ReplyStream, mc0.ReplyStream),
    (mc0.aio.PageStream, mc0.PageStream),
    (mc0.aio.Consumer, mc0.Consumer),
    (mc0.aio.ConsumedMessage, mc0.ConsumedMessage),
]
# The classes an application constructs (the others are handed out, their sync views made from them).
CONSTRUCTED = {mc0.aio.Client, mc0.aio.Worker}

# Public names of an asyncio class its sync twin leaves out, each with the reason.
_CLIENT_ONLY = {
    "publish_nowait": "what the sync publish calls (the loop-free fire-and-forget path)",
    "request_threadsafe": "what the sync request and submit call (the loop-free path)",
    "ensure_open": "the sync client's own calls check it on the loop",
    "report_fault": "asked by the client's subscriptions (SubscriptionOwner); faults are read as `faults`",
    "stream_ended": "asked by the client's reply streams (ReplyOwner)",
    "cancel_request": "asked by the client's reply streams (ReplyOwner); the sync ReplyStream has cancel()",
}
ASYNC_ONLY: dict[str, dict[str, str]] = {
    "Client": _CLIENT_ONLY,
    "Worker": _CLIENT_ONLY,
    "Subscription": {
        "next_threadsafe": "what the sync next() is (the subscription's buffer read from another thread)",
        "next_batch_threadsafe": "what the sync next_batch() is",
        "offer_run": "called by the asyncio client's reader (messages received), in the loop's thread",
        "mark_ended": "called by the asyncio client when it ends the subscription, in the loop's thread",
    },
    "ReplyStream": {
        "deliver": "called by the asyncio client's reader (an answer received), in the loop's thread",
        "finish": "the stream's own end, called by the asyncio client too when the request could not be sent",
    },
    "Consumer": {"messages": "an async iterator; the sync consumer loops over fetch()"},
    "ConsumedMessage": {"consumer": "the async Consumer it settles through; the sync view settles itself"},
}
# Options of an asyncio method its sync twin does not take, each with the reason.
ASYNC_ONLY_OPTIONS: dict[str, str] = {
    "Client.__init__ context": "a zmq.asyncio.Context belongs to the caller's event loop; the sync client runs its own",
}
# Sync-side names of the asyncio protocols (each sync class iterates and enters as a sync object).
DUNDERS = {"__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__", "__anext__": "__next__"}


def public(cls: type) -> dict[str, Any]:
    """Public names a class has (its own and inherited), as written in the class (not bound)."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        found.update({n: v for n, v in vars(klass).items() if not n.startswith("_")})
    return found


def annotation(text: object) -> object:
    """An annotation as written, less the module a name was reached through (``aio.Handler`` and
    ``Handler``, ``keyfiles.KeyPair`` and ``KeyPair`` are the same type)."""
    return re.sub(r"\b[a-z_][a-z0-9_]*\.(?=[A-Z])", "", text) if isinstance(text, str) else text


def parameters(function: Any, qualname: str) -> list[tuple[str, object, object, object]]:
    """(name, kind, default, annotation) of each parameter but ``self``, less ASYNC_ONLY_OPTIONS."""
    return [
        (p.name, p.kind, p.default, annotation(p.annotation))
        for p in list(inspect.signature(function).parameters.values())[1:]
        if f"{qualname} {p.name}" not in ASYNC_ONLY_OPTIONS
    ]


def divergences(
    async_cls: type, sync_cls: type, async_only: dict[str, str], name: str | None = None, *, constructed: bool = False
) -> list[str]:
    """What the sync class lacks or does differently from its asyncio twin (empty: a mirror);
    ``constructed``: the application calls both constructors, which take the same options."""
    name = name or async_cls.__name__
    wrong: list[str] = []
    theirs, ours = public(async_cls), public(sync_cls)
    for attr, value in theirs.items():
        if attr in async_only:
            continue
        if attr not in ours:
            wrong.append(f"{name}.{attr}: missing in the sync {sync_cls.__name__}")
            continue
        mine = ours[attr]
        if isinstance(value, property):
            if not isinstance(mine, property):
                wrong.append(f"{name}.{attr}: a property in the async class, not in the sync one")
            continue
        if not callable(value) or isinstance(value, type):
            continue
        if inspect.iscoroutinefunction(mine) or inspect.isasyncgenfunction(mine):
            wrong.append(f"{name}.{attr}: the sync method is async")
        if parameters(value, f"{name}.{attr}") != parameters(mine, f"{name}.{attr}"):
            wrong.append(
                f"{name}.{attr}: parameters differ: async {inspect.signature(value)} / sync {inspect.signature(mine)}"
            )
    if constructed and parameters(async_cls.__init__, f"{name}.__init__") != parameters(
        sync_cls.__init__, f"{name}.__init__"
    ):
        wrong.append(f"{name}.__init__: parameters differ")
    for async_name, sync_name in DUNDERS.items():
        if hasattr(async_cls, async_name) and not hasattr(sync_cls, sync_name):
            wrong.append(f"{name}: {async_name} without {sync_name} in the sync class")
    return wrong


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_the_sync_class_mirrors_its_asyncio_twin(async_cls: type, sync_cls: type) -> None:
    async_only = ASYNC_ONLY.get(async_cls.__name__, {})
    assert divergences(async_cls, sync_cls, async_only, constructed=async_cls in CONSTRUCTED) == []


def test_every_listed_exception_is_still_a_name_of_the_async_class() -> None:
    """ASYNC_ONLY names only what the async class has and the sync one lacks (no stale reasons)."""
    for async_cls, sync_cls in PAIRS:
        for attr in ASYNC_ONLY.get(async_cls.__name__, {}):
            assert attr in public(async_cls) and attr not in public(sync_cls), f"{async_cls.__name__}.{attr}"
    assert "context" in inspect.signature(mc0.aio.Client.__init__).parameters
    assert "context" not in inspect.signature(mc0.Client.__init__).parameters


def test_a_method_made_from_its_async_twin_shows_its_signature_and_blocks() -> None:
    """``blocking``/``viewed`` methods are plain functions whose signature inspect reads as the
    async one's (help() shows the options), the view's name as what ``viewed`` returns."""
    assert not inspect.iscoroutinefunction(mc0.Client.ping)
    assert inspect.signature(mc0.Client.fetch) == inspect.signature(mc0.aio.Client.fetch)
    subscribe = inspect.signature(mc0.Client.subscribe)
    assert subscribe.parameters == inspect.signature(mc0.aio.Client.subscribe).parameters
    assert subscribe.return_annotation == "Subscription"
    assert mc0.Client.ping.__doc__ == mc0.aio.Client.ping.__doc__


# ---------------------------------------------------------------- the checker catches what it is for
class _Async:
    def __init__(self, endpoint: str | None = None, *, ttl: float | None = None) -> None: ...

    async def publish(self, topic: str, body: bytes, *, confirm: bool = False, timeout: float | None = None) -> None:
        pass

    async def ping(self, *, timeout: float | None = None) -> float:
        return 0.0

    @property
    def connected(self) -> bool:
        return True

    async def __aenter__(self) -> _Async:
        return self


class _Mirror:
    def __init__(self, endpoint: str | None = None, *, ttl: float | None = None) -> None: ...

    def publish(self, topic: str, body: bytes, *, confirm: bool = False, timeout: float | None = None) -> None:
        pass

    def ping(self, *, timeout: float | None = None) -> float:
        return 0.0

    @property
    def connected(self) -> bool:
        return True

    def __enter__(self) -> _Mirror:
        return self


def test_the_checker_passes_a_mirror() -> None:
    assert divergences(_Async, _Mirror, {}, "Planted", constructed=True) == []


def test_the_checker_catches_a_constructor_option_added_to_the_async_class_only() -> None:
    class Added(_Async):
        def __init__(self, endpoint: str | None = None, *, ttl: float | None = None, echo: bool = True) -> None: ...

    assert divergences(Added, _Mirror, {}, "Planted", constructed=True) == ["Planted.__init__: parameters differ"]


def test_the_checker_catches_a_keyword_option_added_to_an_async_method_only() -> None:
    class Added(_Async):
        async def publish(
            self, topic: str, body: bytes, *, confirm: bool = False, timeout: float | None = None, msgid: str = ""
        ) -> None:
            pass

    (found,) = divergences(Added, _Mirror, {}, "Planted")
    assert found.startswith("Planted.publish: parameters differ") and "msgid" in found


@pytest.mark.parametrize(
    ("sync_publish_source", "what"),
    [
        ("def publish(self, topic, body, *, confirm=True, timeout=None): pass", "a default"),
        ("def publish(self, topic, body, confirm=False, *, timeout=None): pass", "keyword-only became positional"),
        ("def publish(self, topic: str, body: str, *, confirm: bool = False, timeout: float | None = None): pass",
         "an annotation"),
        ("async def publish(self, topic: str, body: bytes, *, confirm: bool = False, timeout: float | None = None):"
         " pass", "async in the sync class"),
    ],
)  # fmt: skip
def test_the_checker_catches_a_sync_method_that_drifted(sync_publish_source: str, what: str) -> None:
    namespace: dict[str, Any] = {}
    exec("from __future__ import annotations\n" + sync_publish_source, namespace)
    drifted = type("Drifted", (_Mirror,), {"publish": namespace["publish"]})
    assert [d for d in divergences(_Async, drifted, {}, "Planted") if "publish" in d] != [], what


def test_the_checker_catches_a_missing_method_property_or_protocol() -> None:
    missing = type("Missing", (), {"publish": _Mirror.publish})
    found = divergences(_Async, missing, {}, "Planted")
    assert "Planted.ping: missing in the sync Missing" in found
    assert "Planted.connected: missing in the sync Missing" in found
    assert "Planted: __aenter__ without __enter__ in the sync class" in found
    assert divergences(_Async, missing, {"ping": "why", "connected": "why"}, "Planted") == [
        "Planted: __aenter__ without __enter__ in the sync class"
    ]
