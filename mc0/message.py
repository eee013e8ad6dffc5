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
