"""DCP v1 (seed 001, header DGBX): the core's table, a malformed table, and live peers written
from the seed text (raw DEALERs) with mc0, eMQP and seed-000 peers on the same broker."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pytest
import zmq

import mc0
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import dcp as D
from mc0.broker.dialects import emqp as E
from mc0.broker.dialects import recognise
from mc0.process import BrokerProcess

from .conftest import RawPeer

H = [b"", D.PROTOCOL]


class Core:
    def __init__(self, **settings: Any) -> None:
        self.core = BrokerCore(CoreSettings(**settings), dialects=recognise)
        self.now = 0.0

    def send(self, who: bytes, *frames: bytes) -> list[tuple[bytes, list[bytes]]]:
        return [(rid, list(fr)) for rid, fr in self.core.handle(who, list(frames), self.now)]  # type: ignore[arg-type]

    def dcp(self, who: bytes, kind: bytes, *rest: bytes) -> list[tuple[bytes, list[bytes]]]:
        return self.send(who, *H, kind, *rest)

    def mc0(self, who: bytes, *frames: str) -> list[tuple[bytes, list[bytes]]]:
        return self.send(who, *(x.encode() for x in frames))

    def register(self, who: bytes, service: bytes) -> None:
        assert self.dcp(who, D.REGISTER, service) == [(who, [*H, D.REGISTER, service])]  # echoed


def request_for(out: list[tuple[bytes, list[bytes]]], worker: bytes, service: bytes) -> tuple[bytes, list[bytes]]:
    """(address, the rest) of the one request ``out`` gives ``worker``."""
    ((rid, frames),) = out
    assert rid == worker and frames[:4] == [*H, D.REQUEST, service] and frames[5] == b""
    return frames[4], frames[6:]


def test_register_request_reply_with_metadata_byte_for_byte_and_address_insertion() -> None:
    net = Core()
    net.register(b"w", b"svc")
    # The client leaves the address out: the broker inserts one; metadata reaches the worker unmodified.
    address, rest = request_for(net.dcp(b"c", D.REQUEST, b"svc", b"", b"m1", b"\x00\xff", b"", b"data"), b"w", b"svc")
    assert address and rest == [b"m1", b"\x00\xff", b"", b"data"]
    # One request at a time: the next waits until the worker replies (or pings for more).
    assert net.dcp(b"c", D.REQUEST, b"svc", b"my-addr", b"", b"m2", b"", b"two") == []
    # The worker's reply (metadata copied): the client gets its metadata back byte for byte.
    out = net.dcp(b"w", D.REPLY, address, b"", b"m1", b"\x00\xff", b"", b"done")
    ((rid, frames), (rid2, frames2)) = out
    assert rid == b"c" and frames[:3] == [*H, D.REPLY] and frames[4:] == [b"", b"m1", b"\x00\xff", b"", b"done"]
    assert frames[3].startswith(b"dcp-")  # it left the address out: the broker's id for the request
    address2, rest2 = request_for([(rid2, frames2)], b"w", b"svc")
    assert rest2 == [b"m2", b"", b"two"]
    assert net.dcp(b"w", D.REPLY, address2, b"", b"m2", b"", b"2") == [
        (b"c", [*H, D.REPLY, b"my-addr", b"", b"m2", b"", b"2"])  # the address it gave comes back
    ]


def test_ping_pong_ping_for_more_work_and_reconnect_for_an_unregistered_heartbeat() -> None:
    net = Core()
    assert net.dcp(b"ghost", D.PING) == [(b"ghost", [*H, D.RECONNECT])]
    net.register(b"w", b"svc")
    assert net.dcp(b"w", D.PING) == [(b"w", [*H, D.PONG])]
    request_for(net.dcp(b"c", D.REQUEST, b"svc", b"", b"", b"1"), b"w", b"svc")
    assert net.dcp(b"c", D.REQUEST, b"svc", b"", b"", b"2") == []  # busy
    out = net.dcp(b"w", D.PING)  # "respond with a heartbeat to ask for more work"
    assert out[-1] == (b"w", [*H, D.PONG]) and len(out) == 2
    request_for(out[:1], b"w", b"svc")
    net.now = 60.0
    net.core.tick(net.now)
    assert b"w" not in net.core.sessions  # no ping for liveness x TTL: forgotten


def test_a_hand_off_reaches_the_original_client_with_its_metadata() -> None:
    net = Core()
    net.register(b"w1", b"parse")
    net.register(b"w2", b"render")
    address, _ = request_for(net.dcp(b"c", D.REQUEST, b"parse", b"", b"trace-7", b"", b"raw"), b"w1", b"parse")
    # w1 does part of the work and passes it on under the address it was given.
    out = net.dcp(b"w1", D.REQUEST, b"render", address, b"", b"trace-7", b"", b"parsed")
    address2, rest = request_for(out, b"w2", b"render")
    assert rest == [b"trace-7", b"", b"parsed"]
    # w1 is free again at once.
    request_for(net.dcp(b"c", D.REQUEST, b"parse", b"", b"", b"next"), b"w1", b"parse")
    ((rid, frames),) = net.dcp(b"w2", D.REPLY, address2, b"", b"trace-7", b"", b"html")
    assert rid == b"c" and frames[4:] == [b"", b"trace-7", b"", b"html"]
    assert net.core.counters["handed_off"] == 1


def test_service_names_of_any_bytes_map_into_their_own_space() -> None:
    cases = [
        (b"echo", "echo"),
        (b"a.b", "a.b"),
        (b"a b", "dcp.x.612062"),
        (b"a..b", "dcp.x.612e2e62"),
        (b"*", "dcp.x.2a"),
        (b">", "dcp.x.3e"),
        (b"\xff", "dcp.x.ff"),
        (b"dcp.x.61", "dcp.x.6463702e782e3631"),  # a DCP name that looks escaped is escaped too
    ]
    for raw, name in cases:
        assert D.service_name(raw) == name
        assert D.raw_service(name) == raw
    with pytest.raises(P.ProtocolError):
        D.service_name(b"\xff" * 125)  # 6 + 250 hex digits: over 255
    net = Core()
    net.register(b"w", b"a b")
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    address, rest = request_for(net.mc0(b"m", "REQUEST", "SERVICE", "dcp.x.612062", "ID", "r", "", "hi"), b"w", b"a b")
    assert rest == [b"", b"hi"]
    ((rid, frames),) = net.dcp(b"w", D.REPLY, address, b"", b"", b"yo")
    assert rid == b"m" and frames[0] == b"FINAL" and frames[-1] == b"yo"


def test_errors_reach_a_dcp_client_as_a_reply_with_its_metadata() -> None:
    net = Core(request_timeout_ms=1000)
    # No address given: the reply's address is the broker's id for the request.
    ((rid, frames),) = net.dcp(b"c", D.REQUEST, b"nobody", b"", b"tag", b"", b"x")
    assert frames[3].startswith(b"dcp-") and frames[4:] == [b"", b"tag", b"", b"ERROR", b"503", b"no worker for nobody"]
    ((rid, frames),) = net.dcp(b"c", D.REQUEST, b"nobody", b"addr", b"", b"tag", b"", b"x")
    assert frames == [*H, D.REPLY, b"addr", b"", b"tag", b"", b"ERROR", b"503", b"no worker for nobody"]
    net.mc0(b"mw", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mw", "READY", "", "slow")
    net.dcp(b"c", D.REQUEST, b"slow", b"a2", b"", b"t2", b"", b"x")
    net.now = 1.01
    out = [(rid, list(fr)) for rid, fr in net.core.tick(net.now)]
    assert (b"c", [*H, D.REPLY, b"a2", b"", b"t2", b"", b"ERROR", b"504"]) in [(r, fr[:9]) for r, fr in out]


@pytest.mark.parametrize("address", [b"\xff\xff\xff", b"\xfb\xef\xbe/", b"a|b", b"a,b", b"x"])
def test_addresses_and_metadata_whose_base64_has_slashes_come_back_byte_for_byte(address: bytes) -> None:
    """Regression (found by the fuzzer): the reply head was parsed back out of the request id at
    "/", which base64 uses, so such an address or metadata part broke the reply (an IndexError)."""
    net = Core()
    meta = [b"\xff\xfe\xfd", b"+/=", b"m"]
    ((_, frames),) = net.dcp(b"c", D.REQUEST, b"nobody", address, b"", *meta, b"", b"x")
    assert frames == [*H, D.REPLY, address, b"", *meta, b"", b"ERROR", b"503", b"no worker for nobody"]
    net.register(b"w", b"svc")
    given, rest = request_for(net.dcp(b"c", D.REQUEST, b"svc", address, b"", *meta, b"", b"x"), b"w", b"svc")
    assert rest == [*meta, b"", b"x"]  # the worker is given the broker's id for it as the address
    assert net.dcp(b"w", D.REPLY, given, b"", *meta, b"", b"done") == [
        (b"c", [*H, D.REPLY, address, b"", *meta, b"", b"done"])
    ]


def test_cross_dialect_dcp_client_to_emqp_worker_and_mc0_client_to_dcp_worker() -> None:
    net = Core()
    net.send(b"ew", b"", E.VERSION, E.INFORM, b"i", b"eq")
    net.send(b"ew", b"", E.VERSION, E.READY, b"r")
    ((rid, frames),) = net.dcp(b"c", D.REQUEST, b"eq", b"", b"meta", b"", b"job")
    assert rid == b"ew" and frames[2] == E.REQUEST and frames[-1] == b"job"
    ((rid, frames),) = net.send(b"ew", b"", E.VERSION, E.REPLY, frames[3], b"result")
    assert rid == b"c" and frames[4:] == [b"", b"meta", b"", b"result"]
    # An mc0 client gives metadata through X-Dcp-Meta; it comes back in the FINAL's headers.
    net.register(b"dw", b"d")
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    meta = base64.b64encode(b"\x01m").decode()
    out = net.mc0(b"m", "REQUEST", "SERVICE", "d", "ID", "r", D.META_HEADER, meta, "", "q")
    address, rest = request_for(out, b"dw", b"d")
    assert rest == [b"\x01m", b"", b"q"]
    ((rid, frames),) = net.dcp(b"dw", D.REPLY, address, b"", b"\x01m", b"", b"a")
    assert rid == b"m" and D.META_HEADER.encode() in frames and frames[-1] == b"a"


MALFORMED: list[tuple[str, bytes, tuple[bytes, ...]]] = [
    ("version 2", b"c", (b"", b"DGBX\x02", D.REQUEST, b"svc", b"", b"", b"x")),
    ("version 0", b"w", (b"", b"DGBX\x00", D.PING)),
    ("unknown type", b"c", (*H, b"\x09")),
    ("type two bytes", b"c", (*H, b"\x04\x04", b"svc")),
    ("pong from a peer", b"w", (*H, D.PONG)),
    ("reconnect from a peer", b"w", (*H, D.RECONNECT)),
    ("ping with a part", b"w", (*H, D.PING, b"x")),
    ("register no service", b"n", (*H, D.REGISTER)),
    ("register two parts", b"n", (*H, D.REGISTER, b"a", b"b")),
    ("register empty name", b"n", (*H, D.REGISTER, b"")),
    ("register name too long", b"n", (*H, D.REGISTER, b"\xff" * 200)),
    ("register reserved", b"n", (*H, D.REGISTER, b"mc0.broker")),
    ("request short", b"c", (*H, D.REQUEST, b"svc", b"")),
    ("request no metadata delimiter", b"c", (*H, D.REQUEST, b"svc", b"", b"meta", b"data")),
    ("request address no delimiter", b"c", (*H, D.REQUEST, b"svc", b"addr", b"x", b"", b"d")),
    ("request empty service", b"c", (*H, D.REQUEST, b"", b"", b"", b"d")),
    ("reply from a client", b"c", (*H, D.REPLY, b"1", b"", b"", b"x")),
    ("reply empty address", b"w", (*H, D.REPLY, b"", b"", b"", b"x")),
    ("reply no delimiter", b"w", (*H, D.REPLY, b"1", b"x", b"", b"y")),
    ("reply no metadata delimiter", b"w", (*H, D.REPLY, b"1", b"", b"meta")),
    ("reply for nothing held", b"w", (*H, D.REPLY, b"999", b"", b"", b"x")),
    ("header only", b"c", (b"", D.PROTOCOL)),
]


@pytest.mark.parametrize(("case", "who", "frames"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_dcp_is_dropped_and_everyone_is_still_answered(
    case: str, who: bytes, frames: tuple[bytes, ...]
) -> None:
    net = Core()
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.register(b"w", b"svc")
    request_for(net.dcp(b"c0", D.REQUEST, b"svc", b"", b"", b"held"), b"w", b"svc")
    net.dcp(b"w", D.PING)  # busy, it asks for more: room for one more
    out = net.send(who, *frames)  # must not raise
    if case == "request empty service":  # well-formed, but no such service can exist: an error reply
        ((rid, answer),) = out
        assert rid == who and answer[-3:-1] == [b"ERROR", b"400"]
    else:
        assert out == []
    assert net.mc0(b"m", "PING", "ID", "p")[0][1][0] == b"PONG"
    address, _ = request_for(net.dcp(b"c9", D.REQUEST, b"svc", b"a9", b"", b"t", b"", b"y"), b"w", b"svc")
    assert net.dcp(b"w", D.REPLY, address, b"", b"t", b"", b"ok") == [
        (b"c9", [*H, D.REPLY, b"a9", b"", b"t", b"", b"ok"])
    ]


# ------------------------------------------------------------------ live


def _wait_served(client: mc0.Client, service: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # bounded: poll the broker's MMI until the worker registered
        if client.request(P.MMI_SERVICE, service.encode(), timeout=2).body == b"200":
            return
        time.sleep(0.02)
    raise AssertionError(f"{service} never served")


def test_live_dcp_worker_and_client_with_mc0_peers(broker: BrokerProcess, zctx: zmq.Context[Any]) -> None:
    def dcp_worker(requests: int) -> None:
        """A DCP worker from the seed text: register (echoed), ping (pong), reply copying the metadata."""
        peer = RawPeer(broker.endpoint, zctx)
        try:
            peer.send(*H, D.REGISTER, b"up per")
            assert peer.recv() == [*H, D.REGISTER, b"up per"]
            peer.send(*H, D.PING)
            assert peer.recv() == [*H, D.PONG]
            for _ in range(requests):
                frames = peer.recv(10)
                assert frames[:4] == [*H, D.REQUEST, b"up per"]
                address, rest = frames[4], frames[6:]
                split = rest.index(b"")
                meta, data = rest[:split], rest[split + 1 :]
                peer.send(*H, D.REPLY, address, b"", *meta, b"", *(d.upper() for d in data))
        finally:
            peer.close()

    thread = threading.Thread(target=dcp_worker, args=(2,), daemon=True)
    thread.start()
    worker = mc0.Worker(broker.endpoint)
    worker.service("mc0-rev")(lambda r: r.body[::-1])
    client_peer = RawPeer(broker.endpoint, zctx)
    try:
        with worker, mc0.Client(broker.endpoint) as client:
            _wait_served(client, "dcp.x.757020706572")  # b"up per" as mc0 names it
            assert client.request("dcp.x.757020706572", b"from mc0", timeout=5).body == b"FROM MC0"
            _wait_served(client, "mc0-rev")
            # A DCP client: two requests without waiting, told apart by their metadata.
            client_peer.send(*H, D.REQUEST, b"up per", b"", b"req-1", b"", b"abc")
            client_peer.send(*H, D.REQUEST, b"mc0-rev", b"", b"req-2", b"", b"xyz")
            got = {}
            for _ in range(2):
                frames = client_peer.recv(10)
                assert frames[:3] == [*H, D.REPLY] and frames[4] == b""
                got[frames[5]] = frames[7:]
            assert got == {b"req-1": [b"ABC"], b"req-2": [b"zyx"]}
            peers = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
            assert "dcp-client" in {p["kind"] for p in peers}
    finally:
        client_peer.close()
    thread.join(10)
    assert not thread.is_alive()


def test_foreign_dialects_false_refuses_every_foreign_dialect_with_one_setting() -> None:
    net = Core(foreign_dialects=False)
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"m", "READY", "", "svc")
    refused = [
        (*H, D.REQUEST, b"svc", b"", b"", b"dcp"),
        (*H, D.REGISTER, b"svc"),
        (b"", E.VERSION, E.REQUEST, b"m", b"svc", b"", b"emqp"),
        (b"MDPXC01", b"\x01", b"svc", b"r", b"seed000"),
        (b"MDPXW01", b"\x01", b"svc"),
        (b"", b"MDPC02", b"\x02", b"svc", b"mdp"),
        (b"MDPW02", b"\x01", b"svc"),
    ]
    for frames in refused:
        assert net.send(b"f", *frames) == []
    assert net.core.counters["foreign_refused"] == len(refused)
    assert list(net.core.sessions) == [b"m"]
    assert net.mc0(b"m", "PING", "ID", "p")[0][1][0] == b"PONG"


def test_live_dcp_hand_off_from_a_dcp_worker_to_an_mc0_worker_answers_an_emqp_client(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    def parse_worker() -> None:
        """A DCP worker that does half the work and hands the rest to service "render"."""
        peer = RawPeer(broker.endpoint, zctx)
        try:
            peer.send(*H, D.REGISTER, b"parse")
            assert peer.recv() == [*H, D.REGISTER, b"parse"]
            frames = peer.recv(10)
            assert frames[:4] == [*H, D.REQUEST, b"parse"]
            address, meta_and_data = frames[4], frames[6:]
            split = meta_and_data.index(b"")
            meta, data = meta_and_data[:split], meta_and_data[split + 1 :]
            peer.send(*H, D.REQUEST, b"render", address, b"", *meta, b"", b"parsed:" + data[0])
        finally:
            peer.close()

    thread = threading.Thread(target=parse_worker, daemon=True)
    thread.start()
    worker = mc0.Worker(broker.endpoint)
    worker.service("render")(lambda r: b"<p>" + r.body + b"</p>")
    emqp_client = RawPeer(broker.endpoint, zctx)
    try:
        with worker, mc0.Client(broker.endpoint) as client:
            _wait_served(client, "parse")
            _wait_served(client, "render")
            emqp_client.send(b"", E.VERSION, E.REQUEST, b"job-1", b"parse", b"reply-requested", b"text")
            assert emqp_client.recv(10) == [b"", E.VERSION, E.REPLY, b"job-1", b"<p>parsed:text</p>"]
    finally:
        emqp_client.close()
    thread.join(10)
    assert not thread.is_alive()
