"""The cluster link's JetStream part: journals, consumers and mailboxes kept by JetStream.

Contract: runs on the cluster link's thread and asyncio loop, over its nats-py
connection (:mod:`mc0.broker.cluster.link`), and speaks to the broker loop only through the
link's hand-over to the loop (``post``; what crosses: :mod:`.streams`).  Nothing of mc0's
semantics is decided here: it does what the core asked and reports what
JetStream answered.

- Streams: each ``store = "jetstream"`` journal's stream (:mod:`mc0.protocol.jetstream`)
  is created, or updated to its config, retried while the cluster is not
  ready (no meta leader, no peers for placement, timeouts).
- Publishing: ``publish`` sends a proposal with a reply subject under one
  inbox subscription (and a ``Nats-Msg-Id`` when the publisher gave a MSGID);
  a PubAck becomes ``Acks``, a refusal ``Failed`` (429 for JetStream's limits,
  413 for a record larger than the stream can ever hold, 507 otherwise).  A
  proposal larger than the NATS servers' ``max_payload`` (its headers
  counted, as the server counts them) fails 413 at once, naming the limit:
  sent, it could never be stored, and the server would close the connection.
  No responders (the stream has no leader now: not stored) and "this id is
  being stored" are retried; after a NATS failover a pending
  proposal with a MSGID is sent again (JetStream stores it once) and one
  without fails 504 (it may or may not have been stored: sending it again could
  store it twice); a proposal without a PubAck after ``timeout_s`` fails 504:
  the outcome is unknown, unless every send of it was answered "no
  responders" (or it was never sent): then it is certainly not stored, 507
  naming the stream.  So an OK means JetStream's
  acknowledgement: a quorum of the replicas holds the record (on disk first
  when the nodes run ``sync_interval: always``).
- A stream changed under the brokers: ``NO_STREAM_AFTER`` "no responders" in
  a row for a journal whose stream was ready make the part look at the
  stream (``STREAM.INFO``, at most once per ``LOOK_AGAIN_S``): one deleted
  (by an operator, ``nats stream rm``) is made again and the proposals
  waiting are then stored; one whose subjects no longer take the journal's
  (an operator's choice, not undone here) fails its proposals 507 naming the
  stream, those waiting and each later one at its first "no responders",
  until a PubAck (the subjects put back, or a broker restarted: each puts
  its config back at its start).  Logged once each.
- Delivery: a :class:`~.feed.StreamFeed` per journal (not the one that keeps
  mailboxes) fills this broker's local copy, in seq order.
- Calls: ``call`` runs one store op (:class:`~.storeops.StoreOps`) and posts
  exactly one ``Answer``, an error too (``{"error": {"code", "description"}}``
  in mc0's status codes; 503 when JetStream did not answer in time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ...protocol import jetstream as jsw
from ...protocol import linkframes
from .feed import StreamFeed
from .storeops import StoreOps
from .streams import ACKS, ANSWER, FAILED, StoreError, StreamSpec, api

log = logging.getLogger("mc0.broker")

READY_RETRY_S = 0.25  # between attempts to create a stream while the cluster is not ready
RETRY_S = 0.1  # a proposal JetStream could not take yet (no leader) is sent again after this
SWEEP_S = 0.02
# JetStream error codes: its limits (429); a proposal still being stored under the same id (retry).
LIMIT_ERRORS = {10077, 10078, 10027, 10047}
TOO_LARGE_ERRORS = {10054}  # JetStream: message size exceeds the stream's maximum (refused whatever is retried)
IN_PROCESS = 10158
STREAM_IN_USE = 10058  # a stream of that name with another config: updated to this one
NO_STREAM_AFTER = 3  # "no responders" in a row for a ready journal before its stream is looked at
LOOK_AGAIN_S = 2.0  # a stream found not taking its journal's subjects is looked at again at most this often


def message_size(payload: bytes, headers: dict[str, str]) -> int:
    """What a NATS server counts against its ``max_payload`` for this message: the payload and the
    header block nats-py writes (``NATS/1.0``, a ``Key: Value`` line each, an empty line)."""
    if not headers:
        return len(payload)
    block = len(b"NATS/1.0\r\n\r\n") + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(payload) + block


def too_large(size: int, limit: int) -> str:
    """Why a record over ``limit`` (the max_payload of the NATS server this connection is on) is refused:
    that server cannot take it, whatever is retried; another server of the cluster may have a larger
    limit, so nothing is said of JetStream as a whole."""
    return (
        f"the record is {size} bytes as a NATS message, over the connected NATS server's max_payload ({limit} "
        "bytes): that server refuses it, so sending it again through it is no use (a record of this journal, "
        f"with its topic, sender and headers, is at most {limit} bytes there; raise max_payload in every "
        "nats-server's config, up to 64 MiB, for larger)"
    )


class _Pending:
    __slots__ = ("journal", "token", "subject", "headers", "payload", "deadline", "attempts", "unanswered")

    def __init__(
        self, journal: str, token: int, subject: str, headers: dict[str, str], payload: bytes, deadline: float
    ) -> None:
        self.journal = journal
        self.token = token
        self.subject = subject
        self.headers = headers
        self.payload = payload
        self.deadline = deadline
        self.attempts = 0
        self.unanswered = 0  # sends not answered "no responders" (each may have been stored)


class JetStreamPart:
    def __init__(
        self,
        nc: Any,
        post: Callable[[Sequence[bytes]], None],
        specs: dict[str, StreamSpec],
        positions: dict[str, tuple[int, str]],
        *,
        broker: str,
        epoch: int,
        timeout_s: float,
    ) -> None:
        self.nc = nc
        self.post = post
        self.specs = specs
        self.broker = broker
        self.epoch = epoch
        self.timeout_s = timeout_s
        self.ready = {name: asyncio.Event() for name in specs}
        self.feeds = {
            name: StreamFeed(nc, post, name, self.ready[name], positions.get(name, (1, "")))
            for name, spec in specs.items()
            if not spec.mailboxes
        }
        self.ops = StoreOps(nc, specs)
        self.counters: dict[str, int] = {
            "published": 0,
            "acked": 0,
            "retried": 0,
            "failed": 0,
            "streams_made_again": 0,
            "streams_not_taking": 0,
        }
        self._pending: OrderedDict[int, _Pending] = OrderedDict()  # by serial: the oldest (first deadline) first
        self._retry: dict[int, float] = {}  # serial -> when to send it again
        self._serial = 0
        self._inbox = ""
        self._acks: dict[str, list[bytes]] = {}
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._calls: set[asyncio.Task[None]] = set()  # store calls under way
        self._unheard: dict[str, int] = {}  # journal -> "no responders" since its last PubAck
        self._looking: set[str] = set()  # journals whose stream is being looked at (or made again)
        self._looked: dict[str, float] = {}  # journal -> when its stream was last looked at
        self._not_taking: dict[str, str] = {}  # journal -> why its stream takes none of its PUTs (507)
        self._sweeper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Once connected: the PubAck inbox, the streams, the feeds, the sweeper."""
        self._inbox = self.nc.new_inbox()
        await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_ack, pending_msgs_limit=1 << 20, pending_bytes_limit=-1)
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._ensure(spec)) for spec in self.specs.values()]
        self._tasks += [loop.create_task(feed.run()) for feed in self.feeds.values()]
        self._sweeping()

    def _sweeping(self) -> None:
        """The sweeper runs from the first proposal on, connected or not: a PUT made while NATS has
        never answered still fails 504 after ``timeout_s`` (it would otherwise wait for good)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            self._tasks.append(self._sweeper)

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def reconnected(self) -> None:
        """After a failover: what is pending may have died with the old connection.  A proposal with a
        MSGID is sent again (what JetStream stored already is not stored twice); one without cannot be
        sent again safely: it fails 504 (stored or not is unknown).  The feeds start again."""
        unknown = (
            "the connection to NATS was lost before JetStream acknowledged it: stored or not is unknown "
            "(a PUT with a MSGID is sent again by the broker, and stored once)"
        )
        for serial, pending in list(self._pending.items()):
            if jsw.MSG_ID in pending.headers or pending.unanswered == 0:  # (the latter certainly not stored)
                self._retry[serial] = 0.0
            else:
                self._fail(serial, pending, 504, unknown)
        for feed in self.feeds.values():
            feed.restart()

    def status(self) -> dict[str, object]:
        return {
            **self.counters,
            "pending": len(self._pending),
            "streams_ready": sorted(n for n, e in self.ready.items() if e.is_set()),
            "delivered": {n: f.delivered for n, f in self.feeds.items()},
            "stalls": {n: f.stalls for n, f in self.feeds.items()},
        }

    async def _ensure(self, spec: StreamSpec) -> None:
        """Create (or update to its config) the journal's stream, retrying until the cluster is ready."""
        config = spec.config()
        name = config["name"]
        started = time.monotonic()
        for attempt in range(1, 10_000_000):
            try:
                try:
                    await api(self.nc, f"STREAM.CREATE.{name}", config)
                except StoreError as exc:
                    if exc.err_code != STREAM_IN_USE:
                        raise
                    await api(self.nc, f"STREAM.UPDATE.{name}", config)
                self.ready[spec.journal].set()
                log.info(
                    "journal %s: JetStream stream %s (R%d) ready; a record is at most %d bytes (NATS max_payload)",
                    spec.journal,
                    name,
                    spec.replicas,
                    self.nc.max_payload,
                )
                return
            except StoreError as exc:
                if attempt == 1 or attempt % 40 == 0:
                    waited = time.monotonic() - started
                    log.warning("journal %s: stream %s not ready after %.1f s: %s", spec.journal, name, waited, exc)
                await asyncio.sleep(READY_RETRY_S)

    # ------------------------------------------------------------ publishing
    async def publish(self, journal: str, token: int, subject: str, msgid: str, origin: str, payload: bytes) -> None:
        self._sweeping()
        self._serial += 1
        serial = self._serial
        headers = {jsw.MSG_ID: msgid} if msgid else {}  # (none on most: nothing for NATS to write or parse)
        if origin:
            headers[jsw.ORIGIN] = origin
        pending = _Pending(journal, token, subject, headers, payload, time.monotonic() + self.timeout_s)
        self._pending[serial] = pending
        self.counters["published"] += 1
        ready = self.ready.get(journal)
        if ready is None:
            self._fail(serial, pending, 507, f"no JetStream stream is configured for journal {journal}")
        elif ready.is_set() and self.nc.is_connected:
            await self._send(serial, pending)
        else:
            self._retry[serial] = 0.0

    async def _send(self, serial: int, pending: _Pending) -> None:
        limit = int(self.nc.max_payload)  # (the connected server's: what its INFO said)
        size = message_size(pending.payload, pending.headers)
        if size > limit:
            self._fail(serial, pending, 413, too_large(size, limit))
            return
        pending.attempts += 1
        reply = f"{self._inbox}.{serial}"
        try:
            await self.nc.publish(pending.subject, pending.payload, reply=reply, headers=pending.headers or None)
        except Exception:  # disconnected with a full buffer: sent again later
            self._retry[serial] = time.monotonic() + RETRY_S
        else:
            pending.unanswered += 1

    async def _on_ack(self, msg: Any) -> None:
        try:
            serial = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        pending = self._pending.get(serial)
        if pending is None:
            return  # answered already (the second answer of a retry)
        headers = msg.headers
        if headers and headers.get("Status") == "503":  # no responders: no stream took it (no leader now?)
            pending.unanswered = max(0, pending.unanswered - 1)  # (that send was certainly not stored)
            self._retry[serial] = time.monotonic() + RETRY_S
            self.counters["retried"] += 1
            self._unheard_by(pending.journal)
            why = self._not_taking.get(pending.journal)
            if why is not None and pending.unanswered == 0:  # (an earlier send may be stored: not "not stored")
                self._fail(serial, pending, 507, why)
            return
        self._unheard.pop(pending.journal, None)
        self._not_taking.pop(pending.journal, None)
        try:
            answer = json.loads(msg.data)
        except ValueError:
            answer = {"error": {"code": 500, "description": "not a PubAck"}}
        error = answer.get("error") if isinstance(answer, dict) else {"description": "not a PubAck"}
        if isinstance(error, dict):
            err_code = int(error.get("err_code") or 0)
            if err_code == IN_PROCESS:  # the same id is being stored (an earlier attempt): ask again
                self._retry[serial] = time.monotonic() + RETRY_S
                return
            code = 429 if err_code in LIMIT_ERRORS else 413 if err_code in TOO_LARGE_ERRORS else 507
            self._fail(serial, pending, code, str(error.get("description") or "JetStream refused the record"))
            return
        del self._pending[serial]
        self._retry.pop(serial, None)
        # A duplicate after this broker's own retry is its own first attempt, not the publisher's repeat.
        duplicate = bool(answer.get("duplicate")) and pending.attempts == 1
        self._acks.setdefault(pending.journal, []).append(linkframes.ack(pending.token, int(answer["seq"]), duplicate))
        self.counters["acked"] += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._flush_scheduled = False
        acks, self._acks = self._acks, {}
        for journal, packed in acks.items():
            self.post((ACKS, journal.encode(), b"".join(packed)))

    def _unheard_by(self, journal: str) -> None:
        """A "no responders" for ``journal``: after NO_STREAM_AFTER in a row on a stream that was ready, the
        stream is looked at (deleted or changed under the brokers?), at most once per LOOK_AGAIN_S."""
        unheard = self._unheard[journal] = self._unheard.get(journal, 0) + 1
        spec = self.specs.get(journal)
        if unheard < NO_STREAM_AFTER or spec is None or journal in self._looking or not self.ready[journal].is_set():
            return
        now = time.monotonic()
        if now - self._looked.get(journal, -LOOK_AGAIN_S) < LOOK_AGAIN_S:
            return
        self._looked[journal] = now
        self._looking.add(journal)
        task = asyncio.get_running_loop().create_task(self._look_at_stream(spec))
        self._calls.add(task)  # (held until done, as a store call is)
        task.add_done_callback(self._calls.discard)

    async def _look_at_stream(self, spec: StreamSpec) -> None:
        """A journal's stream answers nothing: deleted under the brokers, it is made again; its subjects
        changed so that it no longer takes the journal's, the proposals fail 507 naming it (an operator's
        change is not undone here).  Else (no leader now) the proposals go on being retried."""
        journal, name = spec.journal, jsw.stream_name(spec.journal)
        try:
            try:
                info = await api(self.nc, f"STREAM.INFO.{name}")
            except StoreError as exc:
                if exc.code != 404:
                    return  # (no answer now: nothing to conclude)
                log.warning("journal %s: stream %s was deleted outside mc0: made again", journal, name)
                self.counters["streams_made_again"] += 1
                self._not_taking.pop(journal, None)
                self.ready[journal].clear()
                await self._ensure(spec)
                return
            subjects = (info.get("config") or {}).get("subjects") or []
            if jsw.subjects(journal) in subjects:
                self._not_taking.pop(journal, None)
                return
            why = (
                f"not stored: JetStream stream {name} no longer takes {jsw.subjects(journal)} (its subjects were "
                f"set to {subjects[:4]} outside mc0); put its subjects back, or restart a broker (it puts the "
                "journal's config back)"
            )
            if journal not in self._not_taking:
                log.error("journal %s: %s", journal, why)
                self.counters["streams_not_taking"] += 1
            self._not_taking[journal] = why
            for serial, pending in list(self._pending.items()):
                if pending.journal == journal and pending.unanswered == 0:  # (none of its sends was stored)
                    self._fail(serial, pending, 507, why)
        finally:
            self._looking.discard(journal)
            self._unheard.pop(journal, None)

    def _fail(self, serial: int, pending: _Pending, code: int, reason: str) -> None:
        self._pending.pop(serial, None)
        self._retry.pop(serial, None)
        self.counters["failed"] += 1
        self.post((FAILED, pending.journal.encode(), linkframes.failure(pending.token, code), reason.encode()))

    async def _sweep(self) -> None:
        """Proposals past their time fail 504; those due for another attempt are sent again."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            while self._pending:
                serial, pending = next(iter(self._pending.items()))
                if pending.deadline > now:
                    break
                if pending.unanswered == 0:  # never sent, or each send answered "no responders"
                    reason = (
                        f"not stored: no JetStream stream took {pending.subject} within {self.timeout_s:g} s "
                        f"(stream {jsw.stream_name(pending.journal)} has no leader, or is not there); send it again"
                    )
                    self._fail(serial, pending, 507, reason)
                    continue
                reason = (
                    f"no acknowledgement from JetStream within {self.timeout_s:g} s: stored or not is unknown; "
                    "send it again with the same MSGID (it is stored once)"
                )
                self._fail(serial, pending, 504, reason)
            if self._retry and self.nc.is_connected:
                for serial, when in list(self._retry.items()):
                    again = self._pending.get(serial)
                    if again is None:
                        del self._retry[serial]
                    elif when <= now and self.ready[again.journal].is_set():
                        del self._retry[serial]
                        self.counters["retried"] += 1
                        await self._send(serial, again)

    # ------------------------------------------------------------ calls
    def call(self, token: int, request: dict[str, Any]) -> None:
        # Held until done: the event loop keeps only a weak reference to a task, and a call collected
        # mid-flight would never be answered (the core counts every call until its answer).
        task = asyncio.get_running_loop().create_task(self._call(token, request))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, token: int, request: dict[str, Any]) -> None:
        op = str(request.get("op", ""))
        handler = getattr(self.ops, f"op_{op}", None)
        payloads: list[bytes] = []
        try:
            if handler is None:
                raise StoreError(400, f"unknown store op {op!r}")
            wait = float(request.get("wait_ms", 0)) / 1000.0
            data, payloads = await asyncio.wait_for(handler(request), self.timeout_s + wait + 1.0)
        except StoreError as exc:
            data = {"error": {"code": exc.code, "description": exc.description}}
        except TimeoutError:
            data = {"error": {"code": 503, "description": f"JetStream did not answer within {self.timeout_s:g} s"}}
        except Exception as exc:  # a bug here must still answer
            log.exception("cluster: JetStream call %s failed", op)
            data = {"error": {"code": 503, "description": f"JetStream call failed: {type(exc).__name__}"}}
        self.post((ANSWER, linkframes.number_frame(token), json.dumps(data).encode(), *payloads))
