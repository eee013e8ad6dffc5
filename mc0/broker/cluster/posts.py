"""What the cluster link's thread posts to the broker loop about routes and its NATS connection, and what the
loop reads back: the frames' kinds, their layout, and the items they become.

Contract: pure data and codecs.  Each post is one tuple of frames whose first
frame is its kind (JetStream's kinds are in :mod:`mc0.broker.jetstream.streams`; none is shared):

- ``Hello(name, epoch)``: another broker's beacon;
- ``RouteBlob(name, epoch, blob)``: route traffic from it (batched-wire records);
- ``LinkChange(up)``: NATS reachable again / lost (``up`` False: forget every route now);
- ``RoutesDropped(count)``: route traffic to this broker was dropped (the loop fell
  behind): every route is opened afresh;
- ``RouteResync(name)``: what crossed between this broker and ``name`` lost a
  message (a publish that failed, a chunk missing): that route is opened afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...protocol.linkframes import frame_number, number_frame

HELLO, ROUTE, UP, DOWN, DROPPED, RESYNC = b"H", b"R", b"U", b"D", b"X", b"Y"
KINDS = frozenset({HELLO, ROUTE, UP, DOWN, DROPPED, RESYNC})


@dataclass(frozen=True, slots=True)
class Hello:
    name: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RouteBlob:
    name: str
    epoch: int
    blob: bytes


@dataclass(frozen=True, slots=True)
class LinkChange:
    up: bool


@dataclass(frozen=True, slots=True)
class RoutesDropped:
    """Route messages to this broker were dropped (``count`` since the last notice): what the other
    brokers announced may be lost, so every route is opened afresh (each sends its whole state again)."""

    count: int


@dataclass(frozen=True, slots=True)
class RouteResync:
    """A message between this broker and broker ``name`` was lost on the way (counted where it was):
    it may have been an announcement, a request or a reply, so that route is opened afresh."""

    name: str


RouteNews = Hello | RouteBlob | LinkChange | RoutesDropped | RouteResync


def hello(name: str, epoch: int) -> tuple[bytes, ...]:
    return (HELLO, name.encode(), number_frame(epoch))


def route(name: str, epoch: int, blob: bytes) -> tuple[bytes, ...]:
    return (ROUTE, name.encode(), number_frame(epoch), blob)


def dropped(count: int) -> tuple[bytes, ...]:
    return (DROPPED, number_frame(count))


def resync(name: str) -> tuple[bytes, ...]:
    return (RESYNC, name.encode())


def parse(frames: Sequence[bytes]) -> RouteNews | None:
    """The item a post of one of these kinds is (None for any other kind)."""
    kind = frames[0]
    if kind == ROUTE:
        return RouteBlob(frames[1].decode(), frame_number(frames[2]), frames[3])
    if kind == HELLO:
        return Hello(frames[1].decode(), frame_number(frames[2]))
    if kind == UP or kind == DOWN:
        return LinkChange(kind == UP)
    if kind == DROPPED:
        return RoutesDropped(frame_number(frames[1]))
    if kind == RESYNC:
        return RouteResync(frames[1].decode())
    return None
