"""The ``mc0.admin`` service's wire: its operations, their arguments, and how a session is named.

Contract: pure, no I/O.  ``mc0.admin`` is the broker's own service of an
operator's actions, callable only by identities granted ``call =
["mc0.admin"]`` by name (:mod:`mc0.permissions`).  A request's body is a JSON
object ``{"op": OP, ...its arguments}``; :func:`parse_request` checks it
whole (ProtocolError 400 naming the field, nothing else changes).  The
actions (:data:`ACTIONS`, also ``POST /admin/OP`` on the monitoring
listener) and their arguments::

    conn.close     {"id": "bob#2"}                      end exactly that session
    consumer.rm    {"journal": "main", "name": "inv"}   remove a durable consumer
    journal.purge  {"journal": "main"}                  drop every record kept

and one listing (over the bus only), ``consumer.ls {"journal": "main"}``
(the journal optional): every durable consumer, whoever owns it.

A session is named ``identity#n`` on a standalone broker and
``identity#n@BROKER`` in a cluster (BROKER: the cluster name of the broker
the session is on): :mod:`.peernames` makes and reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ProtocolError, quoted
from .model import Status
from .peernames import parse_peer_name

ADMIN_SERVICE = "mc0.admin"
CONN_CLOSE, CONSUMER_RM, JOURNAL_PURGE, CONSUMER_LS = "conn.close", "consumer.rm", "journal.purge", "consumer.ls"
ACTIONS = (CONN_CLOSE, CONSUMER_RM, JOURNAL_PURGE)  # what changes something (over HTTP too)
OPS = (*ACTIONS, CONSUMER_LS)
# The arguments of each op: required, then optional.
ARGUMENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    CONN_CLOSE: (("id",), ()),
    CONSUMER_RM: (("journal", "name"), ()),
    JOURNAL_PURGE: (("journal",), ()),
    CONSUMER_LS: ((), ("journal",)),
}
MAX_NAME_BYTES = 1024  # an id, a journal's or a consumer's name (longer is refused: 400)


def parse_request(query: object, rid: str | None) -> tuple[str, dict[str, str]]:
    """A request's ``(op, arguments)``, checked whole; ProtocolError 400 naming what is wrong."""
    if not isinstance(query, dict):
        raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
    op = query.get("op")
    if op not in OPS:
        raise ProtocolError(Status.BAD_REQUEST, f"unknown op {quoted(str(op))}; ops: {', '.join(OPS)}", rid)
    return op, parse_arguments(op, {k: v for k, v in query.items() if k != "op"}, rid)


def parse_arguments(op: str, args: Mapping[str, Any], rid: str | None) -> dict[str, str]:
    """The arguments of ``op`` (an op of :data:`OPS`), checked: each a non-empty string, none unknown."""
    required, optional = ARGUMENTS[op]
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        known = ", ".join((*required, *optional)) or "none"
        raise ProtocolError(
            Status.BAD_REQUEST, f"{op}: unknown argument {quoted(unknown[0])} (arguments: {known})", rid
        )
    checked: dict[str, str] = {}
    for key in (*required, *optional):
        value = args.get(key)
        if value is None and key in optional:
            continue
        if not isinstance(value, str) or not value or len(value.encode("utf-8", "replace")) > MAX_NAME_BYTES:
            raise ProtocolError(
                Status.BAD_REQUEST, f"{op}: {key} must be a non-empty string of at most {MAX_NAME_BYTES} bytes", rid
            )
        checked[key] = value
    if op == CONN_CLOSE and parse_peer_name(checked["id"]) is None:
        reason = f"{op}: id {quoted(checked['id'], 80)} is not a session's name (identity#n, or identity#n@BROKER)"
        raise ProtocolError(Status.BAD_REQUEST, reason, rid)
    return checked
