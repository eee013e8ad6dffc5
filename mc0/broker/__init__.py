"""The mc0 broker: a sans-I/O core split into rooms, and the ROUTER shell around it.

``Broker`` (the shell, :mod:`mc0.broker.server`) and ``BrokerThread``
(:mod:`mc0.broker.embedded`) are imported lazily, so importing a room
(``mc0.broker.core.dispatch`` and below) never loads pyzmq or the shell.
docs/ARCHITECTURE.md draws the floors and their rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .embedded import BrokerThread
    from .server import Broker

__all__ = ["Broker", "BrokerThread"]


def __getattr__(name: str) -> Any:
    if name == "Broker":
        from .server import Broker

        return Broker
    if name == "BrokerThread":
        from .embedded import BrokerThread

        return BrokerThread
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
