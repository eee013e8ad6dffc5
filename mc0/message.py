"""Message: what a subscriber receives. Frozen, picklable, comparable."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered MESSAGE.

    ``parts`` are the body frames as sent; ``body`` is them joined (the
    common single-frame case costs nothing).  ``sender`` is the identity the
    broker stamped (``anonymous`` without CURVE; ``None`` from a 0.x broker).
    ``headers`` holds the publisher's ``X-`` headers.
    """

    topic: str
    parts: tuple[bytes, ...]
    sender: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply to a request: a PARTIAL or the FINAL.

    ``worker`` names the worker in scatter-gather replies; ``error`` is set
    on a scatter reply whose worker failed (a plain request raises instead).
    A handler may also return a Reply to set its own ``X-`` headers.
    """

    parts: tuple[bytes, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    final: bool = True
    worker: str | None = None
    error: Exception | None = None

    @property
    def body(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


@dataclass(frozen=True, slots=True)
class Request:
    """What a worker's handler receives.

    ``caller`` is the authenticated identity of the client (``anonymous``
    without CURVE); ``deadline`` is in ``time.monotonic()`` seconds.
    """

    id: str
    service: str
    parts: tuple[bytes, ...]
    headers: dict[str, str]
    caller: str
    deadline: float

    @property
    def body(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)

    @property
    def remaining(self) -> float:
        """Seconds left until the deadline (may be negative)."""
        import time

        return self.deadline - time.monotonic()
