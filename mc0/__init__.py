"""mc0: a secure pub/sub + RPC message bus over ZeroMQ.

Public names: the sync :class:`Client` (``mc0.aio.Client`` is its asyncio
twin), :class:`Message`, :class:`Broker`, and the error hierarchy rooted at
:class:`Error`.
"""

from .broker import Broker, BrokerThread
from .client import Client, Subscription
from .errors import (
    AuthFailed,
    BadRequest,
    ClosedError,
    ConfigError,
    Error,
    Forbidden,
    InvalidTopic,
    KeyFileError,
    NotConnected,
    OverLimit,
    ProtocolError,
    RemoteError,
    Timeout,
    TooLarge,
    UnsupportedVersion,
)
from .message import Message

__version__ = "0.1.0"

__all__ = [
    "AuthFailed",
    "BadRequest",
    "Broker",
    "BrokerThread",
    "Client",
    "ClosedError",
    "ConfigError",
    "Error",
    "Forbidden",
    "InvalidTopic",
    "KeyFileError",
    "Message",
    "NotConnected",
    "OverLimit",
    "ProtocolError",
    "RemoteError",
    "Subscription",
    "Timeout",
    "TooLarge",
    "UnsupportedVersion",
]
