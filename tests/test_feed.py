"""StreamFeed (mc0/broker/jetstream/feed.py) against a stand-in for nats-py that answers the JetStream API
from a table: what it does with a stream that has no leader, when it calls a consumer stalled, how it
starts on a new stream, asks again for what NATS lost, and tells the loop whether it follows.
The same feed on real nats-server nodes: tests/test_jetstream_live.py and tests/test_jetstream_faults.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import pytest

from mc0.broker.jetstream import feed as feeds
from mc0.broker.jetstream.feed import StreamFeed
from mc0.broker.jetstream.streams import FEED, STATE, FeedStatus, StoreError, parse_inbound

pytestmark = pytest.mark.timeout(30)


class Answer:
    def __init__(self, data: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> None:
        self.data = json.dumps(data or {}).encode()
        self.headers = headers


class Subscription:
    async def unsubscribe(self) -> None:
        pass


class FakeNats:
    """nats-py as the feed uses it: ``request`` answered from ``answers`` (subject -> Answer), each asked
    subject and payload kept in ``asked``."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def request(self, subject: str, payload: bytes, timeout: float) -> Answer:
        self.asked.append((subject, json.loads(payload) if payload else {}))
        if subject not in self.answers:
            raise TimeoutError(subject)
        return self.answers[subject]

    def new_inbox(self) -> str:
        return "_INBOX.feed"

    async def subscribe(self, subject: str, **options: Any) -> Subscription:
        return Subscription()

    async def publish(self, subject: str, payload: bytes) -> None:
        pass


def stream_info(leader: str | None, first: int = 1, last: int = 9, created: str = "made-1") -> Answer:
    cluster = {"name": "mc0", "leader": leader} if leader is not None else {"name": "mc0"}
    state = {"first_seq": first, "last_seq": last}
    return Answer({"created": created, "state": state, "cluster": cluster})


def feed_of(nc: FakeNats, posted: list[Sequence[bytes]], next_seq: int = 10) -> StreamFeed:
    return StreamFeed(nc, posted.append, "main", asyncio.Event(), (next_seq, "made-1"))


@pytest.mark.parametrize(
    ("leader", "starts"),
    [
        ("n2", True),  # a leader: its state is the stream's
        ("", False),  # none (NATS lost its quorum): a replica's own state, maybe behind what was acknowledged
        (None, False),
    ],
)
def test_a_stream_without_a_leader_is_not_measured_against_and_no_consumer_is_made(
    leader: str | None, starts: bool
) -> None:
    created = Answer({"name": "feed-1"})
    nc = FakeNats(
        {"$JS.API.STREAM.INFO.MC0_J_main": stream_info(leader, 1, 4), "$JS.API.CONSUMER.CREATE.MC0_J_main": created}
    )
    posted: list[Sequence[bytes]] = []
    feed = feed_of(nc, posted)  # its copy reaches seq 9: past what the replica says (4)

    async def start() -> None:
        await feed._start()

    if starts:
        asyncio.run(start())
        assert [frames[0] for frames in posted] == [STATE] and feed.next_seq == 1  # (a leader says so: again)
        assert [subject for subject, _ in nc.asked][-1] == "$JS.API.CONSUMER.CREATE.MC0_J_main"
    else:
        with pytest.raises(StoreError) as refused:
            asyncio.run(start())
        assert refused.value.code == 503 and "no leader" in refused.value.description
        assert posted == [] and feed.next_seq == 10  # the copy is left as it is
        assert [subject for subject, _ in nc.asked] == ["$JS.API.STREAM.INFO.MC0_J_main"]


@pytest.mark.parametrize(
    ("looks", "stalled"),
    [
        # (what the stream holds from the next seq wanted on at each look, records delivered before it)
        ([(12, 0), (12, 0)], True),  # held at one look, still not delivered at the next: a stall
        ([(0, 0), (0, 0), (0, 0)], False),  # nothing held: an idle stream
        ([(12, 0), (12, 1)], False),  # it delivered meanwhile: nothing to suspect
        ([(12, 1), (12, 0), (12, 0)], True),
    ],
)
def test_a_consumer_is_stalled_when_a_record_the_stream_held_at_one_look_is_not_delivered_by_the_next(
    looks: list[tuple[int, int]], stalled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = FakeNats({})
    feed = feed_of(nc, [])
    clock = [1000.0]
    monkeypatch.setattr(feeds.time, "monotonic", lambda: clock[0])
    verdicts = []

    async def look() -> None:
        for held, delivered in looks:
            if held:
                nc.answers["$JS.API.DIRECT.GET.MC0_J_main"] = Answer(headers={"Nats-Sequence": str(held)})
            else:
                nc.answers["$JS.API.DIRECT.GET.MC0_J_main"] = Answer(headers={"Status": "404"})
            feed._moved = feed._moved or bool(delivered)
            clock[0] += feeds.STALL_CHECK_S
            verdicts.append(await feed._stalled())

    asyncio.run(look())
    assert any(verdicts) == stalled and verdicts[:-1] == [""] * (len(verdicts) - 1)
    assert feed.stalls == int(stalled)
    asked = [request for subject, request in nc.asked if subject == "$JS.API.DIRECT.GET.MC0_J_main"]
    assert all(request == {"seq": 10, "next_by_subj": "mc0.j.main.>"} for request in asked)


@pytest.mark.parametrize(
    ("info", "posted", "again"),
    [
        # (what STREAM.INFO says at the look, the StreamState posted (first, last, start), made again)
        (stream_info("n2", 1, 9), None, False),  # as posted at the start: nothing to say
        (stream_info("n2", 6, 9), (6, 9, 10), False),  # purged outside mc0: the copy is told
        (stream_info("n2", 1, 12), (1, 12, 10), False),  # grew: how far it reaches
        (stream_info("", 6, 9), None, False),  # no leader: a replica's own state is not measured against
        (stream_info("n1", 1, 3, created="made-2"), None, True),  # deleted and made again
        (stream_info("n2", 1, 5), None, True),  # it ends before what was delivered: another stream now
        (Answer({"error": {"code": 404, "err_code": 10059, "description": "stream not found"}}), None, False),
    ],
)
def test_the_feed_looks_at_the_streams_state_and_tells_the_copy_a_first_seq_that_moved(
    info: Answer, posted: tuple[int, int, int] | None, again: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = FakeNats({"$JS.API.STREAM.INFO.MC0_J_main": stream_info("n2", 1, 9)})
    frames: list[Sequence[bytes]] = []
    feed = feed_of(nc, frames)
    clock = [1000.0]
    monkeypatch.setattr(feeds.time, "monotonic", lambda: clock[0])
    verdicts = []

    async def look() -> None:
        nc.answers["$JS.API.CONSUMER.CREATE.MC0_J_main"] = Answer({"name": "feed-1"})
        await feed._start()
        verdicts.append(await feed._looked_made_anew())  # (not due yet: asks nothing)
        nc.answers["$JS.API.STREAM.INFO.MC0_J_main"] = info
        clock[0] += feeds.LOOK_S
        verdicts.append(await feed._looked_made_anew())

    asyncio.run(look())
    states = [json.loads(f[2]) for f in frames if f[0] == STATE]
    assert states[0] == {"first": 1, "last": 9, "created": "made-1", "start": 10}  # (the start's)
    want = [] if posted is None else [dict(zip(("first", "last", "start"), posted, strict=True))]
    assert [{k: s[k] for k in ("first", "last", "start")} for s in states[1:]] == want
    assert verdicts == [False, again]
    assert [s for s, _ in nc.asked].count("$JS.API.STREAM.INFO.MC0_J_main") == 2


def test_a_stream_never_written_to_is_followed_from_seq_1() -> None:
    """JetStream says first seq 0 of a stream nothing was ever written to, and refuses a consumer by start
    sequence 0: the feed of a new stream must still follow it before its first record (issue 40: a copy
    that never followed its new stream handed a replay nothing)."""
    nc = FakeNats(
        {
            "$JS.API.STREAM.INFO.MC0_J_main": stream_info("n1", 0, 0),
            "$JS.API.CONSUMER.CREATE.MC0_J_main": Answer({"name": "feed-1"}),
        }
    )
    posted: list[Sequence[bytes]] = []
    feed = StreamFeed(nc, posted.append, "main", asyncio.Event(), (1, ""))  # a new broker: an empty copy
    asyncio.run(feed._start())
    assert json.loads(posted[0][2]) == {"first": 1, "last": 0, "created": "made-1", "start": 1}
    create = nc.asked[-1][1]
    assert create["config"]["opt_start_seq"] == 1 and create["config"]["deliver_policy"] == "by_start_sequence"


class Lagging(FakeNats):
    """A NATS whose first ``lost`` STREAM.INFO requests are never answered (sent while the stream had no
    leader), and whose CONSUMER.CREATE requests are answered or not as ``creates`` says; each request's
    timeout is kept."""

    def __init__(self, lost: int, creates: list[bool]) -> None:
        super().__init__({"$JS.API.STREAM.INFO.MC0_J_main": stream_info("n2", 1, 4)})
        self.lost = lost
        self.creates = creates
        self.timeouts: list[tuple[str, float]] = []

    async def request(self, subject: str, payload: bytes, timeout: float) -> Answer:
        self.timeouts.append((subject.split(".")[2], timeout))
        if subject.startswith("$JS.API.STREAM.INFO") and self.lost > 0:
            self.lost -= 1
            await asyncio.sleep(timeout)
            raise TimeoutError(subject)
        if subject.startswith("$JS.API.CONSUMER.CREATE") and not self.creates.pop(0):
            raise TimeoutError(subject)  # (as nats-py says after the timeout: placed on a dead node)
        return await super().request(subject, payload, timeout)


def test_a_start_asks_again_for_a_stream_info_lost_while_the_stream_had_no_leader_and_takes_the_first_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feeds, "ASK_AGAIN_S", 0.05)
    nc = Lagging(lost=2, creates=[True])
    nc.answers["$JS.API.CONSUMER.CREATE.MC0_J_main"] = Answer({"name": "feed-1"})
    feed = feed_of(nc, [], next_seq=5)

    async def start() -> float:
        began = asyncio.get_running_loop().time()
        await feed._start()
        return asyncio.get_running_loop().time() - began

    took = asyncio.run(start())
    infos = [t for kind, t in nc.timeouts if kind == "STREAM"]
    assert len(infos) == 3 and took < feeds.API_TIMEOUT_S  # the third send answered: the lost ones not waited out


@pytest.mark.parametrize(
    ("creates", "patience"),
    [
        # (CONSUMER.CREATEs answered in turn, the timeout each was given): a lost one (placed on a node killed
        # lately) is given up after CREATE_MIN_S, then twice, four times that; an answer sets it back.
        ([True], [1.0]),
        ([False, True], [1.0, 2.0]),
        ([False, False, False, True, True], [1.0, 2.0, 4.0, 4.0, 1.0]),
    ],
)
def test_a_consumer_create_that_gets_no_answer_is_given_up_soon_and_tried_again_a_little_longer(
    creates: list[bool], patience: list[float]
) -> None:
    nc = Lagging(lost=0, creates=list(creates))
    nc.answers["$JS.API.CONSUMER.CREATE.MC0_J_main"] = Answer({"name": "feed-1"})
    feed = feed_of(nc, [], next_seq=5)

    async def starts() -> None:
        for _ in creates:
            try:
                await feed._start()
            except StoreError as exc:
                assert exc.unanswered

    asyncio.run(starts())
    assert [t for kind, t in nc.timeouts if kind == "CONSUMER"] == patience


def test_the_feed_tells_the_loop_whether_it_follows_the_stream_once_per_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Waiting for the stream, no leader (asked again and again: told once), following: the loop gets
    three FeedStatus posts, in order, each with its reason."""
    monkeypatch.setattr(feeds, "RETRY_S", 0.01)
    nc = FakeNats({"$JS.API.STREAM.INFO.MC0_J_main": stream_info("", 1, 4)})
    posted: list[Sequence[bytes]] = []
    ready = asyncio.Event()
    feed = StreamFeed(nc, posted.append, "main", ready, (5, "made-1"))

    async def run() -> None:
        task = asyncio.get_running_loop().create_task(feed.run())
        await asyncio.sleep(0.05)
        ready.set()
        for _ in range(500):  # (bounded) until it asked several times
            await asyncio.sleep(0.01)
            if [s for s, _ in nc.asked].count("$JS.API.STREAM.INFO.MC0_J_main") >= 3:
                break
        nc.answers["$JS.API.STREAM.INFO.MC0_J_main"] = stream_info("n1", 1, 4)
        nc.answers["$JS.API.CONSUMER.CREATE.MC0_J_main"] = Answer({"name": "feed-1"})
        for _ in range(500):
            await asyncio.sleep(0.01)
            if feed.starts:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    told = [parse_inbound(frames) for frames in posted if frames[0] == FEED]
    assert told == [
        FeedStatus("main", False, "waiting for JetStream to make or update stream MC0_J_main"),
        FeedStatus("main", False, "stream MC0_J_main has no leader now"),
        FeedStatus("main", True, ""),
    ]
