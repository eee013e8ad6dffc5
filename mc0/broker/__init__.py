"""The mc0 broker: a sans-I/O core split into rooms, and the ROUTER shell around it.

``Broker`` and ``BrokerThread`` (the shell, :mod:`mc0.broker.server`) are
imported lazily, so importing a room (``mc0.broker.core.dispatch`` and below) never
loads pyzmq or the shell.  docs/ARCHITECTURE.md draws the rooms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Broker, BrokerThread

__all__ = ["Broker", "BrokerThread"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
