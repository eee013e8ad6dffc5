"""Batch walks under way: where each peer's ``BATCH`` walk stands, and what the peer sent after it.

Contract: :class:`BatchCursor` is one walk's state (the blob, the position
reached, the refusals counted so far, the messages waiting behind it); the
rooms (:class:`~mc0.broker.core.rooms.Rooms`) keep every peer's cursor by
routing id while there is work, so that forgetting a peer cuts the rest of
its batch, and the batched input (:mod:`.batched`) walks them.  Plain data.
Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ...errors import ProtocolError
from .peers import Peer

# A message that waited behind its peer's batch, handed back when its turn comes:
# (routing id, frames, identity, fd), as the shell first handed it in.
Waited = tuple[bytes, Sequence[bytes], str, int | None]


class BatchCursor:
    """Where a peer's batch walk stands, and what the peer sent after it (handled once it is done)."""

    __slots__ = ("peer", "blob", "pos", "deferred", "deferred_bytes", "refused", "first_refusal")

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.blob = b""  # b"": no records left to walk
        self.pos = 0
        self.deferred: deque[tuple[Sequence[bytes], str, int | None]] = deque()  # (frames, identity, fd)
        self.deferred_bytes = 0
        self.refused = 0  # records of this blob refused (and internal errors)
        self.first_refusal: ProtocolError | None = None  # the first one not answered on its own
