"""OpenTelemetry spans for the clients and workers, by the messaging and RPC semantic conventions.

Contract: ``tracing_for(provider)`` is the whole switch.  It returns None (tracing off) when no
provider is given and the application has not set a global one through OpenTelemetry's API
(``opentelemetry.trace`` not even imported: then nothing of OpenTelemetry is imported here
either), so the clients' per-message paths test one attribute (``is None``) and allocate nothing.
Otherwise a :class:`Tracing` makes the spans, and each hook the clients call is one of its methods:

- ``publish``: a PRODUCER span ``publish {topic}`` (``messaging.operation.type`` send) whose
  context is injected into the message's headers as W3C ``traceparent`` / ``tracestate`` (the
  creation context; a ``traceparent`` the application set itself is kept, and linked);
- ``consume``: a CONSUMER span ``process {topic}`` per message handed to the application, the
  child of its creation context, or (``linked``: a replayed or pulled record, which may be read
  hours later) only a LINK to it, the span's parent being whatever is current; ``process_batch``
  one span for a batch, linking each message; ``pulling``: a durable consumer's pull (CLIENT,
  ``pull {journal}``, operation type receive), linking each record it brought;
- ``request``: a CLIENT span named by the service (``rpc.method``), injected into the REQUEST; the
  worker's ``serving`` a SERVER span, the child of the caller's, current while its handler runs
  (so the handler's own spans nest under it); a batch service's call, ``batch_spans``: a SERVER span
  per request it serves (operation ``batch``, the call's size), none current, each ended by
  ``batch_ended`` with its request's outcome.

A span handed to the application (``consume``) is current in the task or thread that took the
message until that task or thread takes the next one, or the subscription ends (``Held``).  Every
span carries ``messaging.system`` (``SYSTEM``: "mc0"), ``messaging.destination.name`` (the topic,
the service, or the journal), ``messaging.operation.type`` and ``.name``, ``messaging.message.id``
where mc0 has one (a publish's or a pulled record's MSGID, a request's ID), and the identity mc0
authenticated: ``messaging.mc0.sender`` (who published), ``messaging.mc0.caller`` (who called).
Only the W3C trace context crosses the bus: OpenTelemetry's baggage is not carried (the wire takes
no ``baggage`` header).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .message import Message, Record, Request
from .protocol import TRACEPARENT

if TYPE_CHECKING:  # (never imported at run time unless tracing is on)
    from opentelemetry.trace import Link, Span, TracerProvider

SYSTEM = "mc0"  # messaging.system and rpc.system.name
INSTRUMENTATION = "mc0"  # the tracer's (instrumentation scope's) name
# Attribute keys (semantic conventions: messaging, rpc; mc0's own under messaging.mc0.*).
SYSTEM_KEY = "messaging.system"
DESTINATION = "messaging.destination.name"
SUBSCRIPTION = "messaging.destination.subscription.name"
CONSUMER_GROUP = "messaging.consumer.group.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
SENDER = "messaging.mc0.sender"
CALLER = "messaging.mc0.caller"
TO = "messaging.mc0.to"
JOURNAL = "messaging.mc0.journal"
SEQ = "messaging.mc0.seq"
RPC_SYSTEM = "rpc.system.name"
RPC_METHOD = "rpc.method"
RPC_STATUS = "rpc.status_code"
ERROR_TYPE = "error.type"
MSGID = "MSGID"  # a journal record's header: the publisher's message id


def tracing_for(provider: TracerProvider | None) -> Tracing | None:
    """The tracing of a client made with ``provider`` (None: the global one, if the application
    set one), or None when there is none to use.  Imports nothing of OpenTelemetry that the
    application has not imported already, unless ``provider`` is given."""
    if provider is None:
        api = sys.modules.get("opentelemetry.trace")
        if api is None:
            return None
        provider = api.get_tracer_provider()
        if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
            return None  # the API is there, nobody configured a provider: off
    return Tracing(provider)


class Held:
    """The span of the message (or batch) an application holds, current where it was taken."""

    __slots__ = ("span", "token", "owner", "ended")

    def __init__(self, span: Span, token: Any, owner: object) -> None:
        self.span = span
        self.token = token
        self.owner = owner
        self.ended = False


def _version() -> str | None:
    """mc0's version as installed (the instrumentation scope's), if it is."""
    from importlib import metadata

    try:
        return metadata.version("mc0")
    except metadata.PackageNotFoundError:
        return None


def _owner() -> object:
    """Who takes messages: the asyncio task, else the thread (a context is detached only where it
    was attached)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


class Tracing:
    """The spans of one client (see the module's contract)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._context = context
        self._kind = trace.SpanKind
        self._propagator = TraceContextTextMapPropagator()  # W3C only: no baggage on the wire
        self.tracer = provider.get_tracer(INSTRUMENTATION, _version())

    # ------------------------------------------------------------ context on the wire
    def inject(self, span: Span, headers: Mapping[str, str] | None) -> dict[str, str]:
        """``headers`` with ``span``'s context as ``traceparent`` (and ``tracestate``), unless they carry
        a ``traceparent`` of the application's own (kept: it is the creation context)."""
        carrier = dict(headers) if headers else {}
        if TRACEPARENT not in carrier:
            self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def extract(self, headers: Mapping[str, str]) -> Any:
        """The context ``headers`` carry (an empty context when none: the span is then a root)."""
        return self._propagator.extract(headers) if TRACEPARENT in headers else self._context.Context()

    def _links(self, headers: Mapping[str, str], attributes: dict[str, Any] | None = None) -> list[Link]:
        """A link to the context ``headers`` carry, or none when they carry no valid one."""
        if TRACEPARENT not in headers:
            return []
        context = self._trace.get_current_span(self._propagator.extract(headers)).get_span_context()
        return [self._trace.Link(context, attributes)] if context.is_valid else []

    # ------------------------------------------------------------ publishing
    def publish(
        self,
        topic: str,
        headers: Mapping[str, str] | None,
        *,
        msgid: str | None,
        sender: str | None,
        to: str | None = None,
    ) -> tuple[Span, dict[str, str]]:
        """A PRODUCER span for one publish (its caller ends it), and the headers to send."""
        attributes: dict[str, Any] = {
            SYSTEM_KEY: SYSTEM,
            DESTINATION: topic,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "publish" if to is None else "send_to",
        }
        if msgid is not None:
            attributes[MESSAGE_ID] = msgid
        if sender is not None:
            attributes[SENDER] = sender
        if to is not None:
            attributes[TO] = to
        links = self._links(headers) if headers else []  # the application's own creation context
        span = self.tracer.start_span(
            f"{attributes[OPERATION_NAME]} {topic}", kind=self._kind.PRODUCER, attributes=attributes, links=links
        )
        return span, self.inject(span, headers)

    def stored(self, span: Span, journal: str | None, seq: int | None) -> None:
        """A confirmed publish's OK named where a journal keeps it."""
        if journal is not None and seq is not None:
            span.set_attributes({JOURNAL: journal, SEQ: seq})

    def failed(self, span: Span, error: BaseException) -> None:
        """``span``'s operation failed with ``error`` (its status, ``error.type``, the exception event)."""
        code = getattr(error, "code", None)
        span.set_attribute(ERROR_TYPE, str(code) if isinstance(code, int) else type(error).__qualname__)
        if isinstance(code, int):
            span.set_attribute(RPC_STATUS, str(code))
        span.record_exception(error)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)[:200]))

    # ------------------------------------------------------------ consuming
    def _consume_attributes(self, message: Message, subscription: str | None, group: str | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            SYSTEM_KEY: SYSTEM,
            DESTINATION: message.topic,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
        }
        if message.sender is not None:
            attributes[SENDER] = message.sender
        if subscription is not None:
            attributes[SUBSCRIPTION] = subscription
        if group is not None:
            attributes[CONSUMER_GROUP] = group
        if message.journal is not None and message.seq is not None:
            attributes[JOURNAL] = message.journal
            attributes[SEQ] = message.seq
        msgid = message.headers.get(MSGID)
        if msgid is not None:
            attributes[MESSAGE_ID] = msgid
        return attributes

    def consume(
        self,
        message: Message,
        held: Held | None,
        *,
        subscription: str | None,
        group: str | None = None,
        linked: bool = False,
    ) -> Held:
        """The CONSUMER span of ``message``, handed to the application now: ``held`` (the previous
        one) ends, this one is current where it was taken until the next (``release``).  A child of
        the message's creation context, or (``linked``) linked to it alone."""
        self.release(held)
        attributes = self._consume_attributes(message, subscription, group)
        name = f"process {message.topic}"
        headers = message.headers
        if TRACEPARENT not in headers:  # no creation context: a root (or the current span's child)
            return self._hold(self.tracer.start_span(name, kind=self._kind.CONSUMER, attributes=attributes))
        creation = self._propagator.extract(headers)  # (read once: the parent and the link)
        found = self._trace.get_current_span(creation).get_span_context()
        links = [self._trace.Link(found)] if found.is_valid else []
        parent = None if linked or not found.is_valid else creation
        kind = self._kind.CONSUMER
        return self._hold(self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes, links=links))

    def process_batch(
        self, messages: Sequence[Message], held: Held | None, *, subscription: str | None, destination: str
    ) -> Held:
        """One CONSUMER span for a batch of messages handed to the application at once, linking each."""
        self.release(held)
        links: list[Link] = []
        for message in messages:
            links += self._links(message.headers, {SEQ: message.seq} if message.seq is not None else None)
        attributes: dict[str, Any] = {
            SYSTEM_KEY: SYSTEM,
            DESTINATION: destination,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            BATCH_COUNT: len(messages),
        }
        if subscription is not None:
            attributes[SUBSCRIPTION] = subscription
        span = self.tracer.start_span(
            f"process {destination}", kind=self._kind.CONSUMER, attributes=attributes, links=links
        )
        return self._hold(span)

    def _hold(self, span: Span) -> Held:
        token = self._context.attach(self._trace.set_span_in_context(span))
        return Held(span, token, _owner())

    def release(self, held: Held | None) -> bool:
        """End the held span, and where it was made current, stop its being current (if it still is:
        else the application moved on).  False when called elsewhere: the span ended, but its
        context is left for its reader to release (its next read)."""
        if held is None:
            return True
        if not held.ended:
            held.ended = True
            held.span.end()
        if held.owner != _owner():
            return False
        if self._trace.get_current_span() is held.span:
            self._context.detach(held.token)
        return True

    @contextmanager
    def pulling(self, journal: str, consumer: str) -> Iterator[Span]:
        """A durable consumer's pull (CLIENT ``pull {journal}``, current inside the block: the request
        it makes is its child); ``pulled`` names the records it brought."""
        attributes: dict[str, Any] = {
            SYSTEM_KEY: SYSTEM,
            DESTINATION: journal,
            SUBSCRIPTION: consumer,
            CONSUMER_GROUP: consumer,
            OPERATION_TYPE: "receive",
            OPERATION_NAME: "pull",
        }
        span = self.tracer.start_span(f"pull {journal}", kind=self._kind.CLIENT, attributes=attributes)
        with self._trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
            yield span

    def pulled(self, span: Span, records: Sequence[Record]) -> None:
        """The records a pull brought, each linked to the context it was published with (never a parent)."""
        span.set_attribute(BATCH_COUNT, len(records))
        for record in records:
            attributes: dict[str, Any] = {SEQ: record.seq, SENDER: record.sender, DESTINATION: record.topic}
            msgid = record.headers.get(MSGID)
            if msgid is not None:
                attributes[MESSAGE_ID] = msgid
            for link in self._links(record.headers, attributes):
                span.add_link(link.context, link.attributes)

    # ------------------------------------------------------------ requests
    def request(
        self, service: str, headers: Mapping[str, str] | None, *, request_id: str, caller: str | None, how: str
    ) -> tuple[Span, dict[str, str]]:
        """A CLIENT span for one request (its caller ends it at the answer), and the headers to send."""
        attributes: dict[str, Any] = {
            RPC_SYSTEM: SYSTEM,
            RPC_METHOD: service,
            SYSTEM_KEY: SYSTEM,
            DESTINATION: service,
            OPERATION_TYPE: "send",
            OPERATION_NAME: how,
            MESSAGE_ID: request_id,
        }
        if caller is not None:
            attributes[CALLER] = caller
        span = self.tracer.start_span(service, kind=self._kind.CLIENT, attributes=attributes)
        return span, self.inject(span, headers)

    def answered(self, span: Span, error: BaseException | None = None) -> None:
        """End a request's span: answered (``error`` None), failed, timed out or given up."""
        if error is None:
            span.set_attribute(RPC_STATUS, "200")
        else:
            self.failed(span, error)
        span.end()

    def server_span(self, request: Request, *, how: str = "handle") -> Span:
        """The SERVER span of one request a worker handles (started, not current: ``serving`` makes it
        current around a handler; a batch handler may end each itself)."""
        attributes: dict[str, Any] = {
            RPC_SYSTEM: SYSTEM,
            RPC_METHOD: request.service,
            SYSTEM_KEY: SYSTEM,
            DESTINATION: request.service,
            OPERATION_TYPE: "process",
            OPERATION_NAME: how,
            MESSAGE_ID: request.id,
            CALLER: request.caller,
        }
        return self.tracer.start_span(
            request.service, context=self.extract(request.headers), kind=self._kind.SERVER, attributes=attributes
        )

    def batch_spans(self, requests: Sequence[Request]) -> list[Span]:
        """The SERVER span of each request one call of a batch handler serves (``messaging.operation.name``
        ``batch``, the call's size as ``messaging.batch.message_count``), started and none current: the
        call serves them all, so a handler's own spans nest under none of them.  ``batch_ended`` ends them."""
        spans = [self.server_span(request, how="batch") for request in requests]
        for span in spans:
            span.set_attribute(BATCH_COUNT, len(requests))
        return spans

    def batch_ended(
        self,
        spans: Sequence[Span],
        requests: Sequence[Request],
        answered: Collection[str],
        failures: Mapping[str, BaseException],
    ) -> None:
        """End each request's span: ``answered`` by this worker (a FINAL, or an ERROR for what ``failures``
        names), else ``error.type`` ``cancelled`` (the broker answered it first: its CANCEL, its deadline,
        the worker closing)."""
        for request, span in zip(requests, spans, strict=True):
            if request.id not in answered:
                span.set_attribute(ERROR_TYPE, "cancelled")
            elif (error := failures.get(request.id)) is not None:
                self.failed(span, error)
            span.end()

    @contextmanager
    def serving(self, request: Request) -> Iterator[Span]:
        """The SERVER span of ``request``, current inside the block (a handler's own spans are its
        children), ended at the block's end; ``failed`` marks a handler's failure."""
        span = self.server_span(request)
        with self._trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            yield span
