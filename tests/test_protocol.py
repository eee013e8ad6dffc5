"""The codec: a table of good and bad frame sequences, and encode/decode round trips."""

from __future__ import annotations

import pickle

import pytest

from mc0 import errors
from mc0 import protocol as P
from mc0.protocol import Header, Limits, Side, Status, Verb

B = list[bytes]


def f(*parts: str | bytes) -> B:
    return [p.encode() if isinstance(p, str) else p for p in parts]


GOOD_FROM_PEER = [
    (f("CONNECT", "VERSION", "1.0", "TTL", "1000"), Verb.CONNECT, {"VERSION": "1.0", "TTL": "1000"}, []),
    (f("NOOP"), Verb.NOOP, {}, []),
    (f("NOOP", "ID", ""), Verb.NOOP, {"ID": ""}, []),  # an empty header value is legal
    (f("SUB", "", "a.>", "b"), Verb.SUB, {}, [b"a.>", b"b"]),
    (f("PUT", "TOPIC", "t", "X-A", "", "", b"\x00body"), Verb.PUT, {"TOPIC": "t", "X-A": ""}, [b"\x00body"]),
    (f("PUT", "TOPIC", "t", "", "", ""), Verb.PUT, {"TOPIC": "t"}, [b"", b""]),
    (f("PING", "ID", "7"), Verb.PING, {"ID": "7"}, []),
    (f("DISCONNECT", "ID", "x"), Verb.DISCONNECT, {"ID": "x"}, []),
    (f("CONNECT", "ID", "chattyClient 0"), Verb.CONNECT, {"ID": "chattyClient 0"}, []),  # mc0torture's: defaults
    (f("CONNECT", "VERSION", "0.2"), Verb.CONNECT, {"VERSION": "0.2"}, []),  # no TTL: the default
]


@pytest.mark.parametrize(("frames", "verb", "headers", "payload"), GOOD_FROM_PEER)
def test_decode_accepts_well_formed_peer_commands(frames: B, verb: Verb, headers: dict[str, str], payload: B) -> None:
    command = P.decode(frames, sender=Side.PEER)
    assert command.verb is verb
    assert command.headers == headers
    assert list(command.payload) == payload
    assert P.encode(command.verb, command.headers, command.payload) == frames or frames[-1:] == [b""]


BAD_FROM_PEER = [
    ([], Status.BAD_REQUEST, None),
    (f("BOGUS", "ID", "9"), Status.BAD_REQUEST, "9"),
    (f("put", "TOPIC", "t", "", "x"), Status.BAD_REQUEST, None),
    (f("PUT", "TOPIC"), Status.BAD_REQUEST, None),  # key without value
    (f("PUT", "TOPIC", "t"), Status.BAD_REQUEST, None),  # no body
    (f("PUT", "TOPIC", "t", ""), Status.BAD_REQUEST, None),  # separator, still no body
    (f("PUT", "ID", "1", "", "x"), Status.BAD_REQUEST, "1"),  # no TOPIC
    (f("PUT", "ID", "1", "TOPIC", "t", "SENDER", "me", "", "x"), Status.BAD_REQUEST, "1"),  # SENDER is the broker's
    (f("PUT", "TOPIC", "t", "FOO", "1", "", "x"), Status.BAD_REQUEST, None),  # unknown non-X header
    (f("PUT", "TOPIC", "t", "X-", "1", "", "x"), Status.BAD_REQUEST, None),
    (f("PUT", "TOPIC", "t", "TOPIC", "u", "", "x"), Status.BAD_REQUEST, None),  # repeated
    (f("PUT", "TOPIC", b"\xff", "", "x"), Status.BAD_REQUEST, None),  # value not UTF-8
    (f("PUT", b"X-\xff", "v", "TOPIC", "t", "", "x"), Status.BAD_REQUEST, None),
    (f("NOOP", "", "extra"), Status.BAD_REQUEST, None),
    (f("SUB", "ID", "3"), Status.BAD_REQUEST, "3"),  # no patterns
    (f("CONNECT", "VERSION", "1.0", "TTL"), Status.BAD_REQUEST, None),  # key without value
    (f("CONNECT", "TOPIC", "t", "ID", "c"), Status.BAD_REQUEST, "c"),  # a header CONNECT does not take
    (f("PING"), Status.BAD_REQUEST, None),
    (f("MESSAGE", "TOPIC", "t", "", "x"), Status.BAD_REQUEST, None),  # broker-only verb
    (f("OK", "ID", "1"), Status.BAD_REQUEST, "1"),
    (f("NOOP", "X-A", "1"), Status.BAD_REQUEST, None),  # NOOP takes no user headers
]


@pytest.mark.parametrize(("frames", "code", "request_id"), BAD_FROM_PEER)
def test_decode_rejects_malformed_with_code_and_id(frames: B, code: int, request_id: str | None) -> None:
    with pytest.raises(errors.ProtocolError) as info:
        P.decode(frames, sender=Side.PEER)
    assert info.value.code == code
    assert info.value.request_id == request_id


# An error text names what was on the wire, never a Python repr (issue 41): verbs and keys bare, values
# quoted, printable UTF-8 as it is, any other byte as \xNN, a backslash doubled.
ERROR_TEXTS = [
    (f("NOOP", "FOO", "1"), "unknown header FOO"),
    (f("NOOP", "x-trace", "1"), "unknown header x-trace"),
    (f("NOOP", b"X-\xff", "1"), "unknown header X-\\xff"),
    (f("connect", "ID", "c"), "unknown verb connect"),
    (f(b"\x00ab"), "unknown verb \\x00ab"),
    (f("NOOP", "ID", "1", "TOPIC"), "header TOPIC has no value"),
    (f("NOOP", "ID", "1", b"K\\"), "header K\\\\ has no value"),
    (f("PUT", "TOPIC", "t", "SENDER", "me", "", "x"), "PUT does not take header SENDER"),
    (f("NOOP", "ID", "1", "ID", "2"), "header ID repeated"),
    (f("PUT", "TOPIC", b"\xff", "", "x"), "header TOPIC is not UTF-8"),
]


@pytest.mark.parametrize(("frames", "reason"), ERROR_TEXTS)
def test_decode_error_texts_show_the_wire_bytes(frames: B, reason: str) -> None:
    with pytest.raises(errors.ProtocolError) as info:
        P.decode(frames, sender=Side.PEER)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (b"FOO", "FOO"),
        ("é☃", "é☃"),
        (b"\xe2\x98", "\\xe2\\x98"),  # not UTF-8 (a character cut short)
        (b"a\tb\x00", "a\\x09b\\x00"),
        ("\u2028", "\\xe2\\x80\\xa8"),  # printable nowhere: its UTF-8 bytes
        (b"back\\slash", "back\\\\slash"),
        ("it's", "it's"),
        ("x" * 41, "x" * 40 + "..."),
        (b"", ""),
    ],
)
def test_wire_text_shows_bytes_as_text_never_a_repr(value: bytes | str, shown: str) -> None:
    assert P.wire_text(value) == shown
    assert P.quoted(value) == f"'{shown}'"


def test_a_number_that_is_not_one_is_quoted_as_sent() -> None:
    command = P.decode(f("CONNECT", "TTL", "1e3", "ID", "c"), sender=Side.PEER)
    with pytest.raises(errors.ProtocolError) as info:
        P.parse_int(command, Header.TTL)
    assert info.value.reason == "TTL must be a decimal integer, got '1e3'"


@pytest.mark.parametrize(
    ("limits", "frames", "code"),
    [
        (Limits(max_frames=3), f("PUT", "TOPIC", "t", "ID", "5", "", "a"), Status.TOO_LARGE),
        (Limits(max_message_bytes=20), f("PUT", "ID", "5", "TOPIC", "t", "", "x" * 20), Status.TOO_LARGE),
        (Limits(max_headers=2), f("PUT", "ID", "5", "TOPIC", "t", "X-A", "1", "", "x"), Status.TOO_LARGE),
    ],
)
def test_limits_are_checked_first_and_keep_the_id(limits: Limits, frames: B, code: int) -> None:
    with pytest.raises(errors.ProtocolError) as info:
        P.decode(frames, sender=Side.PEER, limits=limits)
    assert info.value.code == code
    assert info.value.request_id == "5"


def test_broker_messages_decode_on_the_client_side() -> None:
    frames = P.message(b"a.b", b"alice", [b"X-K", b"v"], [b"body"])
    command = P.decode(frames, sender=Side.BROKER)
    assert command.verb is Verb.MESSAGE
    assert command.headers == {"TOPIC": "a.b", "SENDER": "alice", "X-K": "v"}
    seed = P.decode(P.message(b"a.b", None, [], [b"x"]), sender=Side.BROKER)
    assert Header.SENDER not in seed.headers
    error = P.decode(P.error(Status.FORBIDDEN, "no", "7"), sender=Side.BROKER)
    assert error.headers == {"ID": "7", "CODE": "403", "MESSAGE": "no"}


@pytest.mark.parametrize("code", [400, 401, 403, 413, 429, 505, 599])
def test_every_status_maps_to_a_picklable_remote_error(code: int) -> None:
    error = P.remote_error(code, "why")
    assert isinstance(error, errors.RemoteError) and isinstance(error, errors.Error)
    assert (error.code, error.reason) == (code, "why")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.code == code
    if code in P.REMOTE_ERRORS:
        assert type(error) is not errors.RemoteError


def test_errors_inherit_matching_builtins() -> None:
    assert issubclass(errors.Timeout, TimeoutError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.KeyFileError, OSError)
    assert issubclass(errors.Forbidden, PermissionError)
    assert issubclass(errors.NotConnected, ConnectionError)


def test_grammar_covers_every_verb() -> None:
    assert set(P.PEER_GRAMMAR) | set(P.BROKER_GRAMMAR) == set(Verb)
