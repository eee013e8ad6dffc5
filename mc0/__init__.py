"""mc0: a secure pub/sub + RPC message bus over ZeroMQ.

Public names: the sync :class:`Client` and :class:`Worker` (``mc0.aio``
has their asyncio twins under the same names), the values :class:`Message`,
:class:`Reply` and :class:`Request`, :class:`Broker`, and the error hierarchy
rooted at :class:`Error`.
"""

from typing import TYPE_CHECKING, Any

# First (sorted first, too): importing mc0.native decides where the compiled hot path loads from.
from . import native  # noqa: F401
from .client import Client, ConsumedMessage, Consumer, PageStream, ReplyStream, Subscription, Worker
from .errors import (
    AuthFailed,
    BadRequest,
    Cancelled,
    ClosedError,
    ConfigError,
    Conflict,
    DeadlineExceeded,
    Error,
    Forbidden,
    Gone,
    HandlerFailed,
    InvalidTopic,
    KeyFileError,
    NoResponders,
    NotConnected,
    NotFound,
    OverLimit,
    ProtocolError,
    RemoteError,
    SlowConsumer,
    StorageFailed,
    Timeout,
    TooLarge,
    Unreachable,
    UnsupportedVersion,
    WorkerLost,
)
from .message import Ack, FetchResult, Message, Record, Reply, Request

if TYPE_CHECKING:
    from .broker import Broker, BrokerThread

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The broker loads on first use: a client process never imports it.
    if name in ("Broker", "BrokerThread"):
        from . import broker

        return getattr(broker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Ack",
    "FetchResult",
    "Gone",
    "NotFound",
    "Record",
    "StorageFailed",
    "AuthFailed",
    "BadRequest",
    "Broker",
    "BrokerThread",
    "Cancelled",
    "Client",
    "ConsumedMessage",
    "Consumer",
    "ClosedError",
    "ConfigError",
    "Conflict",
    "DeadlineExceeded",
    "Error",
    "Forbidden",
    "HandlerFailed",
    "InvalidTopic",
    "KeyFileError",
    "Message",
    "NoResponders",
    "NotConnected",
    "OverLimit",
    "ProtocolError",
    "RemoteError",
    "SlowConsumer",
    "Reply",
    "PageStream",
    "ReplyStream",
    "Request",
    "Subscription",
    "Timeout",
    "TooLarge",
    "Unreachable",
    "UnsupportedVersion",
    "Worker",
    "WorkerLost",
]
