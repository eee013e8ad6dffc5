"""Peer names (mc0.protocol.peernames): ``identity#n`` standalone, ``identity#n@BROKER`` in a cluster,
formatted and parsed, one reading per name; and the names a core gives its peers, never those of an
earlier run (a real broker restarted here).  The live test of a scatter over three real brokers is in
tests/test_cluster_live.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mc0
from mc0.broker.core import routeinput
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.protocol.peernames import PeerName, first_serial, parse_peer_name, peer_name


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("alice#5", PeerName("alice", 5, "")),
        ("anonymous#5@b1", PeerName("anonymous", 5, "b1")),
        ("broker:b2#3@b1", PeerName("broker:b2", 3, "b1")),  # a route peer
        ("bob@example#7", PeerName("bob@example", 7, "")),  # '@' in an identity
        ("bob@example#7@web1-61616", PeerName("bob@example", 7, "web1-61616")),
        ("a#1@b#2", PeerName("a#1@b", 2, "")),  # the last '#' is the serial's
        ("x#12345678901234567", PeerName("x", 12345678901234567, "")),
        # not names
        ("", None),
        ("alice", None),
        ("alice#", None),
        ("#5", None),
        ("#5@b1", None),
        ("alice#05", None),  # no leading zero: one spelling per serial
        ("alice#0", None),
        ("alice#-1", None),
        ("alice#5@", None),
        ("alice#5@b 1", None),
        ("alice#5@b.1", None),
        ("alice#5@" + "b" * 65, None),  # a broker name is at most 64
        ("alice#99999999999999999999", None),
        ("alice#5 ", None),
        ("alice#\u0661", None),  # a digit, but not an ASCII one
    ],
)
def test_parse_peer_name(text: str, parsed: PeerName | None) -> None:
    assert parse_peer_name(text) == parsed


@pytest.mark.parametrize(
    ("identity", "serial", "broker", "name"),
    [("alice", 5, "", "alice#5"), ("anonymous", 5, "b1", "anonymous#5@b1"), ("a#b", 1, "c-d_e", "a#b#1@c-d_e")],
)
def test_peer_name(identity: str, serial: int, broker: str, name: str) -> None:
    assert peer_name(identity, serial, broker) == name


@pytest.mark.parametrize(("serial", "broker"), [(0, ""), (-1, "b1"), (1, "b 1"), (1, "b#1"), (1, "b@1")])
def test_peer_name_refuses_a_callers_mistake(serial: int, broker: str) -> None:
    with pytest.raises(ValueError, match="no peer name"):
        peer_name("alice", serial, broker)


@given(
    st.text(min_size=1, max_size=40),
    st.integers(min_value=1, max_value=10**18),
    st.one_of(st.just(""), st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)),
)
def test_a_name_reads_back_as_what_made_it(identity: str, serial: int, broker: str) -> None:
    assert parse_peer_name(peer_name(identity, serial, broker)) == PeerName(identity, serial, broker)


def _names(core: BrokerCore) -> list[str]:
    (out,) = core.handle(b"ask", [b"REQUEST", b"SERVICE", b"mc0.broker", b"ID", b"q", b"", b"peers"], 0.0)
    frames = out[1]
    assert not isinstance(frames, bytes) and frames[0] == b"FINAL"
    return sorted(row["name"] for row in json.loads(frames[-1]))


def _connect(core: BrokerCore, rid: bytes) -> None:
    core.handle(rid, [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"60000"], 0.0)


def test_a_standalone_broker_names_its_peers_identity_n_and_one_of_a_cluster_adds_its_own_name() -> None:
    alone, joined = BrokerCore(CoreSettings()), BrokerCore(CoreSettings())
    routeinput.join(joined.rooms, "b1", route_ttl=1.0)
    for core in (alone, joined):
        for rid in (b"p1", b"p2", b"ask"):
            _connect(core, rid)
    standalone = [parse_peer_name(n) for n in _names(alone)]
    assert all(p is not None and p.identity == "anonymous" and p.broker == "" for p in standalone), standalone
    clustered = [parse_peer_name(n) for n in _names(joined)]
    assert all(p is not None and p.identity == "anonymous" and p.broker == "b1" for p in clustered), clustered
    assert len({p.serial for p in clustered if p is not None}) == 3


def test_a_restarted_core_names_no_peer_as_a_peer_of_its_earlier_run_was_named() -> None:
    """Serials start where the run starts (``first_serial`` of its start, in ms): a name an operator read
    before a restart (``conn close bob#n``) cannot be a new session's, as it was with serials from 1."""
    started = 1_760_000_000.0
    before, after = (BrokerCore(CoreSettings(), first_serial=first_serial(started + t)) for t in (0.0, 0.5))
    for core in (before, after):
        for rid in (b"p1", b"p2", b"ask"):
            _connect(core, rid)
    old, new = _names(before), _names(after)
    assert not set(old) & set(new), (old, new)
    assert min(parse_peer_name(n).serial for n in new) > max(parse_peer_name(n).serial for n in old)  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_broker_restarted_gives_its_peers_names_its_earlier_run_never_gave() -> None:
    from mc0.ports import free_port
    from mc0.process import BrokerProcess

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    names = []
    for _ in range(2):
        with BrokerProcess("--bind", endpoint, insecure=True) as broker, mc0.Client(broker.endpoint) as client:
            names.append({row["name"] for row in json.loads(client.request("mc0.broker", b"peers", timeout=10).body)})
    assert names[0] and names[1] and not names[0] & names[1], names
