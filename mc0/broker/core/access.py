"""Who may be handed a stored or broker-made message: the one rule for dead letters (and the records
the broker hands out without a SUB pattern of the reader's own).

Contract: ``may_read(grants, tokens, headers)`` is :meth:`Grants.may_receive` on the message's topic
and, for a dead letter (``mc0.sys.dead.<journal>.<consumer>``), on the topic it died on too (its
``X-Dead-Topic`` header): a dead letter carries another topic's body, so it reaches only those
allowed that topic, deny lists and peer telemetry's grant included.  A dead letter without a valid
``X-Dead-Topic`` is nobody's.  ``dead_letter_origin`` reads that header.  Peers cannot publish under
``mc0.sys.``, so the header is the broker's own.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import InvalidTopic
from ...permissions import Grants
from ...protocol import DEAD_TOPIC_HEADER, SYS_DEAD_PREFIX
from ...topics import split_pattern, split_topic

DEAD_TOKENS = split_pattern(SYS_DEAD_PREFIX + ">")[:-1]  # ("mc0", "sys", "dead")


def is_dead_letter(tokens: tuple[str, ...]) -> bool:
    return tokens[:3] == DEAD_TOKENS and len(tokens) > 3


def dead_letter_origin(headers: Mapping[str, str]) -> tuple[str, ...] | None:
    """The tokens of the topic a dead letter died on (None: missing or not a topic)."""
    topic = headers.get(DEAD_TOPIC_HEADER)
    if topic is None:
        return None
    try:
        return split_topic(topic)
    except InvalidTopic:
        return None


def may_read(grants: Grants, tokens: tuple[str, ...] | None, headers: Mapping[str, str]) -> bool:
    """``grants`` may be handed this message (its topic's tokens, its headers)."""
    if tokens is None or not grants.may_receive(tokens):
        return False
    return not is_dead_letter(tokens) or origin_allowed(grants, headers)


def origin_allowed(grants: Grants, headers: Mapping[str, str]) -> bool:
    """A dead letter's original topic is one ``grants`` may be handed."""
    origin = dead_letter_origin(headers)
    return origin is not None and grants.may_receive(origin)
