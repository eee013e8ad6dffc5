"""asyncio API: ``mc0.aio.Client``, ``Worker``, ``Subscription``, ``ReplyStream``, ``PageStream`` and ``Consumer``.

The sync :mod:`mc0.client` mirrors these names.  See :mod:`mc0.aio.client`
for the contract.
"""

from .client import DEFAULT_MAX_OUTGOING, DEFAULT_REQUEST_TIMEOUT, Client, ack_of
from .consumer import ConsumedMessage, Consumer
from .pages import PageStream
from .replies import ReplyStream
from .subscription import DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_BYTES, Subscription
from .worker import DEFAULT_BATCH_MAX, BatchHandler, Handler, Worker

__all__ = [
    "DEFAULT_BATCH_MAX",
    "DEFAULT_MAX_OUTGOING",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "Client",
    "ConsumedMessage",
    "Consumer",
    "BatchHandler",
    "Handler",
    "PageStream",
    "ReplyStream",
    "Subscription",
    "Worker",
    "ack_of",
]
