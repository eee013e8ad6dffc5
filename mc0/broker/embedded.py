"""BrokerThread: a broker embedded in a program, running in a background thread.

Contract: ``start()`` binds (raising what ``Broker.bind`` raises: a bad
config, a taken port) and returns the endpoints once the loop runs in a
daemon thread; ``stop(timeout)`` asks the loop to finish and joins it;
a context manager.  Signals stay with the embedding program.
"""

from __future__ import annotations

import threading

from ..settings import Config
from .server import Broker


class BrokerThread:
    """A broker running in a background thread (for embedding)."""

    def __init__(self, config: Config | None = None) -> None:
        self.broker = Broker(config)
        self._thread: threading.Thread | None = None

    def start(self) -> list[str]:
        endpoints = self.broker.bind()
        self._thread = threading.Thread(
            target=self.broker.run, kwargs={"install_signals": False}, name="mc0-broker", daemon=True
        )
        self._thread.start()
        return endpoints

    def stop(self, timeout: float = 5.0) -> None:
        self.broker.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> BrokerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["BrokerThread"]
