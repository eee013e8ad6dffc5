"""StreamFeed: a JetStream journal's records, in seq order, from the stream to this broker's local copy.

Contract: ``run()`` (a task of the link thread) waits until the stream exists,
then keeps an *ordered* push consumer of it (ephemeral, R1 in memory, no acks,
flow control, idle heartbeats) starting at the seq the copy needs next, and
posts what it delivers to the broker loop in batches (one post per
turn of the link's event loop).  Before each start it posts ``StreamState``:
where the stream starts and ends and where delivery starts (the stream's
first seq when the copy was made from another stream of the same name, or
ran past this one's end); only from a stream that has a leader (without
one, a replica answers with its own state, which may lag what was
acknowledged: tried again).  A gap in the consumer sequence, a heartbeat that
says something was delivered this side never got, three silent heartbeat
intervals (its server died) or ``restart()`` (NATS failover) recreate the
consumer from the next seq wanted: nothing is skipped, nothing handed twice
(the loop's copy also skips a seq it holds).  A stream nothing was written
to yet (first seq 0) is followed from seq 1.  A start gives up soon on what
NATS lost while it had no quorum (see ``ASK_AGAIN_S``, ``CREATE_PATIENCE``)
and tries again, so the feed follows again within seconds of a leader.
Whether it follows (its consumer made) or not, and why, is posted to the
loop as ``FeedStatus``, once per change (the copy's state: ``copystate``).  So does a consumer that is
alive but stalled: one that heartbeats and delivers nothing while the stream
holds a record past what it delivered (seen after NATS lost its quorum and
got it back: an R1 consumer on a replica that is no longer the stream's
leader went on heartbeating and never delivered again).  While it delivers
nothing (and flow control is not held), the feed asks the stream, every
``STALL_CHECK_S``, for its first record from the next seq wanted on (a
direct get: any replica answers, nothing when there is none); a record the
stream held at one look and the consumer did not deliver by the next is a
stall: counted (``stalls``), logged, recreated.

Every ``LOOK_S`` the feed also looks at the stream's state (its leader's
``STREAM.INFO``): a first seq that moved (a purge nobody told this broker
of: one made with NATS's own tools, or by a broker killed before it carried
it to the others; the stream's own retention) or a last seq that grew is
posted as ``StreamState`` (after what was delivered before it), so the copy
drops what the stream dropped; a stream made anew (another creation time)
recreates the consumer, whose start posts the new stream's state.

Credit: what a feed posts is counted by the link's
:class:`~mc0.broker.cluster.credit.Poster` (bytes of
``Records`` posted and not yet taken by the broker loop, every journal's
together, and the route traffic the link posts beside them).  The
consumer's flow-control requests (and a stalled heartbeat's) are answered
only while that backlog is below its budget (``credit.FEED_BUDGET_BYTES``), so JetStream stops
sending when the broker loop (its disk) falls behind, not when the link
thread does: what waits in the hand-over to the loop stays within the budget plus one
flow-control window of JetStream (a few MiB).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...protocol import jetstream as jsw
from ...protocol.linkframes import NS
from ..cluster.credit import Poster
from .streams import API_TIMEOUT_S, StoreError, ack_tokens, api, feed_frames, records_frames, state_frames

log = logging.getLogger("mc0.broker")

HEARTBEAT_S = 1.0  # the consumer's idle heartbeat; three missed: recreated
RETRY_S = 0.25  # between attempts while the stream or its server is not there
INACTIVE_S = 30.0  # an abandoned consumer of a broker that died goes after this
CREDIT_POLL_S = 0.05  # a held flow-control reply is looked at again this often
STALL_CHECK_S = 2.0  # while nothing is delivered, the stream is asked this often for what it holds beyond
LOOK_S = 5.0  # the stream's state (first and last seq) is looked at this often (a purge made outside mc0)
# A start's JetStream requests.  One sent while the stream has no leader is lost (a leader elected later does
# not answer it), so STREAM.INFO is sent again every ASK_AGAIN_S while none was answered (the first answer
# counts, each send waits API_TIMEOUT_S at most).  A CONSUMER.CREATE sent while the meta group has no
# quorum is lost too, and one whose consumer is placed on a node killed lately is never answered
# (nats-server calls such a node offline only minutes later, and places R1 consumers on it meanwhile): it
# waits CREATE_PATIENCE times what the STREAM.INFO took (at least CREATE_MIN_S), twice that after a create
# that got no answer, four times after two in a row (at most API_TIMEOUT_S: a JetStream slow to answer
# still gets its time), and the start is tried again (the consumer placed anew).
ASK_AGAIN_S = 1.0
CREATE_MIN_S = 1.0
CREATE_PATIENCE = 4


class StreamFeed:
    def __init__(
        self,
        nc: Any,
        post: Callable[[Sequence[bytes]], None],
        journal: str,
        ready: asyncio.Event,
        position: tuple[int, str],
    ) -> None:
        self.nc = nc
        self.post = post
        self.journal = journal
        self.stream = jsw.stream_name(journal)
        self.ready = ready
        self.next_seq, self.created = position
        self.wanted_restart = asyncio.Event()
        self.delivered = 0  # records handed to the loop
        self.starts = 0
        self.held = 0  # times flow control was held while the loop was behind
        self.stalls = 0  # consumers recreated because they delivered nothing the stream held
        self._holding = False
        self._credit = post if isinstance(post, Poster) else None
        self._flow_reply: str | None = None  # a flow-control reply held until the loop catches up
        # One consumer's run (reset at each start).
        self._consumer_seq = 0
        self._broken = asyncio.Event()
        self._seen = 0.0
        self._batch: list[tuple[int, int, str, bytes]] = []
        self._scheduled = False
        self._moved = False  # records delivered since the last look for a stall
        self._look_at = 0.0  # when to look next
        self._held_seq = 0  # a seq the stream held at the last look, not delivered then (0: none)
        self._state = (0, 0)  # the stream's (first, last) as last posted to the loop
        self._state_at = 0.0  # when to look at the stream's state next
        self._forgetting: set[asyncio.Task[None]] = set()  # consumer deletions under way
        self._told: tuple[bool, str] | None = None  # (following, why not) as last posted to the loop
        self._unanswered = 0  # CONSUMER.CREATEs in a row that got no answer (a stream without a leader: 0)

    def restart(self) -> None:
        self.wanted_restart.set()

    async def run(self) -> None:
        self._tell(False, f"waiting for JetStream to make or update stream {self.stream}")
        await self.ready.wait()
        while True:
            sub = None
            consumer = ""
            try:
                sub, consumer = await self._start()
                self._tell(True, "")
                why = await self._follow()
                self._flush()
                self._tell(False, why)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # (StoreError, or the connection lost mid-way): again from next_seq
                log.debug("journal %s: delivery from %s stopped: %r", self.journal, self.stream, exc)
                self._tell(False, exc.description if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(RETRY_S)
            finally:
                if sub is not None:
                    try:
                        await sub.unsubscribe()
                    except Exception:
                        pass
                if consumer:
                    forgetting = asyncio.get_running_loop().create_task(self._forget(consumer))
                    self._forgetting.add(forgetting)  # (held until done: the loop's reference is weak)
                    forgetting.add_done_callback(self._forgetting.discard)

    async def _follow(self) -> str:
        """Run the consumer just made until it cannot be trusted to go on: why it is made again."""
        while True:
            if self._broken.is_set():
                return "its consumer skipped what it delivered (a gap in its sequence): made again"
            if self.wanted_restart.is_set():
                return "the link to NATS failed over: its consumer is made again"
            try:
                await asyncio.wait_for(self.wanted_restart.wait(), CREDIT_POLL_S)
            except TimeoutError:
                pass
            await self._answer_flow()
            if time.monotonic() - self._seen > 3 * HEARTBEAT_S:  # its server is gone, or the consumer is
                return (
                    f"its consumer sent nothing for {3 * HEARTBEAT_S:g} s (its NATS server or it is gone): made again"
                )
            stalled = await self._stalled()
            if stalled:
                return stalled
            if await self._looked_made_anew():
                return f"stream {self.stream} was made anew: its consumer is made again"

    def _tell(self, following: bool, reason: str) -> None:
        """The loop learns whether this feed follows the stream (and why not), once per change."""
        if (following, reason) != self._told:
            self._told = (following, reason)
            self.post(feed_frames(self.journal, following, reason))

    async def _stream_info(self) -> tuple[Any, float]:
        """The stream's STREAM.INFO for a start, asked again every ASK_AGAIN_S while no answer came: the
        first answer, and how long it took."""
        subject = f"STREAM.INFO.{self.stream}"
        sent: dict[asyncio.Task[Any], float] = {}
        try:
            for _ in range(int(API_TIMEOUT_S / ASK_AGAIN_S)):
                sent[asyncio.get_running_loop().create_task(api(self.nc, subject))] = time.monotonic()
                done, _ = await asyncio.wait(sent, timeout=ASK_AGAIN_S, return_when=asyncio.FIRST_COMPLETED)
                answers = [(task, sent.pop(task), task.exception()) for task in done]  # (each one's fault seen)
                for task, asked, failed in answers:
                    if failed is None:
                        return task.result(), time.monotonic() - asked
                for _, _, failed in answers:
                    if failed is not None and not (isinstance(failed, StoreError) and failed.unanswered):
                        raise failed
            raise StoreError(503, f"JetStream did not answer STREAM.INFO within {API_TIMEOUT_S:g} s", unanswered=True)
        finally:
            for task in sent:
                task.cancel()

    async def _create(self, config: dict[str, Any], answered_in: float) -> Any:
        """CONSUMER.CREATE, waiting for its answer as long as the comment on CREATE_PATIENCE says."""
        patience = max(CREATE_MIN_S, CREATE_PATIENCE * answered_in) * 2 ** min(self._unanswered, 2)
        request = {"stream_name": self.stream, "config": config}
        try:
            made = await api(self.nc, f"CONSUMER.CREATE.{self.stream}", request, timeout=min(API_TIMEOUT_S, patience))
        except StoreError as exc:
            self._unanswered = self._unanswered + 1 if exc.unanswered else 0
            raise
        self._unanswered = 0
        return made

    async def _start(self) -> tuple[Any, str]:
        try:
            info, answered_in = await self._stream_info()
        except StoreError:
            self._unanswered = 0  # (the creates that went unanswered before were lost to this, not slow)
            raise
        cluster = info.get("cluster")
        if isinstance(cluster, dict) and not cluster.get("leader"):
            # No leader (NATS lost its quorum): a replica answered with its own state, which may lag what
            # was acknowledged; the copy must not be measured against it (it would start again, empty).
            self._unanswered = 0  # (the creates that went unanswered before were lost to this, not slow)
            raise StoreError(503, f"stream {self.stream} has no leader now")
        state = info["state"]
        first, last, made = int(state["first_seq"]), int(state["last_seq"]), str(info.get("created", ""))
        # A stream never written to says first seq 0; its first record will be seq 1 (and a consumer
        # by start sequence 0 is refused: the feed of a new stream would wait for its first record).
        first = max(first, 1)
        start = first if made != self.created or self.next_seq > last + 1 else max(self.next_seq, first)
        self.post(state_frames(self.journal, first, last, made, start))
        self.created, self.next_seq = made, start
        self._state, self._state_at = (first, last), time.monotonic() + LOOK_S
        self._consumer_seq = 0
        self._flow_reply = None
        self._moved, self._held_seq, self._look_at = False, 0, time.monotonic() + STALL_CHECK_S
        self._broken.clear()
        self.wanted_restart.clear()
        self._seen = time.monotonic()
        deliver = self.nc.new_inbox()
        sub = await self.nc.subscribe(deliver, cb=self._on_message, pending_msgs_limit=1 << 20, pending_bytes_limit=-1)
        config = {
            "deliver_subject": deliver,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": start,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(HEARTBEAT_S * NS),
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": int(INACTIVE_S * NS),
            "replay_policy": "instant",
        }
        try:
            made_consumer = await self._create(config, answered_in)
        except StoreError:
            await sub.unsubscribe()
            raise
        self.starts += 1
        return sub, str(made_consumer.get("name", ""))

    async def _on_message(self, msg: Any) -> None:
        self._seen = time.monotonic()
        headers = msg.headers
        if headers and headers.get("Status") == "100":  # a heartbeat or a flow-control request
            # A flow-control request, or a heartbeat saying the consumer waits for its reply: answered
            # while the loop keeps up, else held (JetStream then stops sending) until it caught up.
            reply = msg.reply or headers.get("Nats-Consumer-Stalled")
            if reply:
                self._flow_reply = reply
                await self._answer_flow()
            last = headers.get("Nats-Last-Consumer")
            if last is not None and int(last) != self._consumer_seq:
                self._broken.set()  # it delivered something this side never got
            return
        tokens = ack_tokens(msg.reply or "")
        if tokens is None:
            return
        _, seq, consumer_seq, ts = tokens
        if consumer_seq != self._consumer_seq + 1:
            self._broken.set()
            return
        self._consumer_seq = consumer_seq
        if seq < self.next_seq:
            return
        self.next_seq = seq + 1
        self._moved = True
        origin = headers.get(jsw.ORIGIN, "") if headers else ""
        self._batch.append((seq, ts, origin, msg.data))
        self.delivered += 1
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _stalled(self) -> str:
        """The consumer delivers nothing the stream holds (see the module doc): look every STALL_CHECK_S
        while it delivers nothing; a record held at one look and still not delivered at the next: why
        it is made again ("" while it is not stalled)."""
        now = time.monotonic()
        if now < self._look_at:
            return ""
        self._look_at = now + STALL_CHECK_S
        if self._moved or self._holding or self._flow_reply is not None:
            self._moved, self._held_seq = False, 0  # it delivers, or waits for the loop: nothing to suspect
            return ""
        if self._held_seq and self.next_seq <= self._held_seq:
            self.stalls += 1
            why = f"its consumer stalled at seq {self.next_seq} (the stream holds seq {self._held_seq}): made again"
            log.warning("journal %s: delivery from %s: %s", self.journal, self.stream, why)
            return why
        self._held_seq = await self._first_held()
        return ""

    async def _looked_made_anew(self) -> bool:
        """Every LOOK_S, the stream's state: a first or last seq that moved is posted to the loop (after
        the records delivered before the look); True when the stream is another one now (made anew, or
        it ends before what was delivered): the consumer is made again, whose start posts its state."""
        now = time.monotonic()
        if now < self._state_at:
            return False
        self._state_at = now + LOOK_S
        delivered = self.next_seq  # (what the consumer delivers while the answer comes is not in it)
        try:
            info = await api(self.nc, f"STREAM.INFO.{self.stream}", timeout=1.0)
        except StoreError:
            return False  # (no answer, or no stream now: the consumer's silence says so soon enough)
        cluster = info.get("cluster")
        if isinstance(cluster, dict) and not cluster.get("leader"):
            return False  # a replica's own state may lag what was acknowledged: not measured against it
        state = info.get("state") or {}
        first, last = max(int(state.get("first_seq", 0)), 1), int(state.get("last_seq", 0))
        if str(info.get("created", "")) != self.created or last + 1 < delivered:
            return True
        if (first, last) != self._state:
            self._state = (first, last)
            self._flush()  # (what was delivered before the look reaches the copy before the state)
            last = max(last, self.next_seq - 1)  # (the stream holds at least what it delivered since)
            self.post(state_frames(self.journal, first, last, self.created, self.next_seq))
        return False

    async def _first_held(self) -> int:
        """The seq of the stream's first record at or past ``next_seq`` (0: none, or no answer)."""
        get = {"seq": self.next_seq, "next_by_subj": jsw.subjects(self.journal)}
        try:
            msg = await self.nc.request(f"$JS.API.DIRECT.GET.{self.stream}", json.dumps(get).encode(), timeout=1.0)
        except Exception:  # no answer (no replica now): nothing to suspect
            return 0
        headers = msg.headers or {}
        if headers.get("Status"):  # 404: none past it (408, ...: nothing to say)
            return 0
        try:
            return int(headers.get("Nats-Sequence", "0"))
        except ValueError:
            return 0

    async def _answer_flow(self) -> None:
        reply = self._flow_reply
        if reply is None:
            return
        if self._credit is not None and self._credit.over:
            self.held += not self._holding
            self._holding = True
            return
        self._flow_reply = None
        self._holding = False
        await self.nc.publish(reply, b"")

    def _flush(self) -> None:
        self._scheduled = False
        if self._batch:
            batch, self._batch = self._batch, []
            self.post(records_frames(self.journal, batch))

    async def _forget(self, consumer: str) -> None:
        try:
            await api(self.nc, f"CONSUMER.DELETE.{self.stream}.{consumer}", timeout=1.0)
        except StoreError:
            pass  # it goes by itself after its inactive threshold
