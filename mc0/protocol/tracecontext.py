"""W3C trace context as mc0 carries it: what an operator's view reads of a message's ``traceparent``.

Contract: pure.  The two header names are the model's (``TRACEPARENT``, ``TRACESTATE``: user
headers, carried untouched wherever ``X-`` headers go); the broker never reads them.  This
module is for the views that show them (``mc0 journal get``, the Spark source's ``trace_id``
column reads the same rule with Arrow's kernels): ``trace_id`` is the trace id of a well-formed
``traceparent`` (www.w3.org/TR/trace-context, "traceparent Header"), else None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .model import TRACEPARENT, TRACESTATE

# version "-" trace-id "-" parent-id "-" trace-flags, lowercase hex; version ff is invalid, and a
# later version may add fields after a "-" (a reader of version 00 reads the first four).
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-|$)"
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
INVALID_TRACE_ID = "0" * 32
INVALID_VERSION = "ff"
_IN_ORDER = (TRACEPARENT, TRACESTATE)  # (the model's TRACE_HEADERS, in the order they are written)


def trace_id(headers: Mapping[str, str]) -> str | None:
    """The trace id (32 lowercase hex digits) of ``headers``' ``traceparent``, or None when it has
    none or a malformed one (an all-zero trace id or version ``ff`` included)."""
    value = headers.get(TRACEPARENT)
    if value is None or _TRACEPARENT.match(value) is None:
        return None
    if value[:2] == INVALID_VERSION or (value[:2] == "00" and len(value) != 55):
        return None
    found = value[3:35]
    return None if found == INVALID_TRACE_ID else found


def reply_headers(worker_user: dict[str, str], request_user: dict[str, str]) -> dict[str, str]:
    """The user headers of a reply to a request: the request's (echoed) unless the worker set its
    own, and then still the request's trace context where the worker's set none of its own (a
    broker never drops a trace context)."""
    if not worker_user:
        return request_user
    if not request_user or TRACEPARENT not in request_user or TRACEPARENT in worker_user:
        return worker_user
    return {**trace_context(request_user), **worker_user}


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The trace context headers among ``headers`` (none: an empty dict)."""
    return {key: headers[key] for key in _IN_ORDER if key in headers}


def trace_frames(headers: Mapping[str, str]) -> list[bytes]:
    """The trace context headers among ``headers`` as key, value frames (an ERROR to a request
    carries its request's)."""
    return [frame for key in _IN_ORDER if key in headers for frame in (key.encode(), headers[key].encode())]
